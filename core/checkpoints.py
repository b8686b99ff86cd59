"""Reading a checkpoint of this pipeline: one clear line for a missing, truncated or foreign file."""
from __future__ import annotations

from pathlib import Path

import torch

from core.errors import InputError


def read_checkpoint(path: str, key: str) -> dict:
    """The checkpoint dict at `path` (named by config key `key` in errors); it must hold a ranker's hyper-parameters."""
    p = Path(path)
    if not p.is_file():
        raise InputError(key, f"checkpoint '{path}' does not exist")
    try:
        # Our checkpoints carry RNG states (numpy arrays), which the weights-only unpickler refuses.
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:
        raise InputError(key, f"cannot read checkpoint '{path}' ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); it is truncated or not a torch file") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "model" not in ckpt.get("hyper_parameters", {}):
        raise InputError(key, f"'{path}' is not a checkpoint of this pipeline (no ranker hyper-parameters)")
    return ckpt


def check_same_ranker(ckpt: dict, cfg, key: str, path: str) -> None:
    """The checkpoint holds the ranker that `cfg.model.name` asks for."""
    saved = ckpt["hyper_parameters"]["model"]["name"]
    if saved != cfg.model.name:
        raise InputError(key, f"checkpoint '{path}' holds ranker '{saved}' but model.name is '{cfg.model.name}'")
