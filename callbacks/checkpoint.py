"""Checkpointing: the best checkpoint by validation NDCG@10 plus a resumable `last.ckpt`.

Lightning's ModelCheckpoint writes `last.ckpt` only when it validates, so a run that stops on `max_steps`
between validations would resume from an older state. Here `last.ckpt` is also written after the final
training step. It is written from `on_train_batch_end`, not `on_train_end`: by then Lightning has marked a
cut-short epoch as finished, and a resume would skip the rest of that epoch's batches.
"""
from __future__ import annotations

from pathlib import Path

from pytorch_lightning.callbacks import ModelCheckpoint


class RankingCheckpoint(ModelCheckpoint):
    def __init__(self, dirpath: str, monitor: str = "val/ndcg_cut_10"):
        super().__init__(
            dirpath=dirpath, filename="best-{step}", monitor=monitor, mode="max", save_last=True, save_top_k=1,
            auto_insert_metric_name=False,
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if 0 < trainer.max_steps <= trainer.global_step:
            last = Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
            trainer.save_checkpoint(str(last))
            self.last_model_path = str(last)
