"""Checkpoint files written atomically: a temp file in the same folder, fsync, then rename over the target.

A job killed while writing `last.ckpt` (pre-emption, OOM killer, a full disk) leaves the previous `last.ckpt`
complete, never a truncated one; at most a `.last.ckpt.*.tmp` file stays behind, which nothing reads (resume, the
grid runner and evaluate.py all look for `*.ckpt`).
"""

from __future__ import annotations

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from core.checkpoints import check_finite
from core.io import atomic_open


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO that writes each checkpoint atomically (temp file, fsync, rename over the target).

    Give it to the Trainer as a plugin: an interrupted save then leaves the previous checkpoint intact.
    """

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        """Write `checkpoint` to `path` atomically, refusing one with NaN/inf weights.

        Raises
        ------
        TypeError
            If `storage_options` is given: this IO takes none.
        TrainingStopped
            If the state dict holds non-finite parameters; nothing is written then (`core.checkpoints.check_finite`).
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options}")
        check_finite(
            checkpoint.get("state_dict", {}), path, "the model"
        )  # a checkpoint is never written with NaN/inf weights
        with atomic_open(path, "wb") as f:
            torch.save(checkpoint, f)
