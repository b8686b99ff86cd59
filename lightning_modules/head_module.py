"""The LightningModule of the post-hoc head stage: a frozen fine-tuned ranker with an isotropy head attached.

Isotropy paper Fig. 2(b)-(c): the ranker's weights stay as fine-tuned; only the head trains, unsupervised, by
maximum likelihood of the ranker's representations (Eq. 5) read from the on-disk cache. Validation and test are
the ranker's own re-ranking evaluation (RankingModule), now scoring the head's outputs, so the best epoch is chosen
by validation NDCG@10 (not the last epoch, as the paper's code does).

Checkpoints hold the head only (plus optimiser, loop state and `base_ckpt`, the ranker checkpoint it belongs to):
the frozen ranker is rebuilt from `base_ckpt`, never copied into every head checkpoint.
"""
from __future__ import annotations

import warnings

import torch
from omegaconf import OmegaConf

from lightning_modules.heads import HEADS, build_head
from lightning_modules.module import RankingModule
from pipeline.errors import InputError

HEAD_PREFIXES = ("ranker.token_head.", "ranker.sequence_head.")


def head_config(head: dict):
    schema = HEADS.get(head["name"], "head.name").schema
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), head))


class HeadModule(RankingModule):
    def __init__(self, model: dict, optim: dict, measures: list[str] | None, head: dict, base_ckpt: str):
        super().__init__(model, optim, measures)
        self.save_hyperparameters()
        self.head_cfg = head_config(head)
        if self.ranker.kind != "bi":
            raise InputError("head", f"isotropy heads act on bi-encoder representations; '{self.model_cfg.name}' is a cross-encoder")
        if self.head_cfg.granularity == "sequence" and self.model_cfg.name == "colbert":
            raise InputError("head.granularity", "'sequence' needs a single-vector ranker; ColBERT scores token vectors (use 'token')")
        head_module = build_head(self.head_cfg, self.ranker_dim())
        if head_module is None:
            raise InputError("head", "stage=head needs a head: whitening, nice or glow")
        # Registered once, inside the ranker (where encode() applies it); this list keeps a handle while detached.
        self._head = [head_module]
        self.attach(True)
        for name, p in self.named_parameters():
            p.requires_grad = name.startswith(HEAD_PREFIXES)
        self.strict_loading = False  # head checkpoints carry the head only
        self.nonfinite_batches = 0

    @property
    def head(self):
        return self._head[0]

    def ranker_dim(self) -> int:
        compress = getattr(self.model_cfg, "compress_dim", None)
        return int(compress or self.ranker.hidden_size)

    def attach(self, on: bool) -> None:
        """Put the head where the granularity says (on=False: score with the raw representations)."""
        slot = "token_head" if self.head_cfg.granularity == "token" else "sequence_head"
        setattr(self.ranker, slot, self.head if on else None)

    def load_base(self, base_state: dict) -> None:
        ranker_state = {k: v for k, v in base_state.items() if not k.startswith(HEAD_PREFIXES)}
        missing, unexpected = self.load_state_dict(ranker_state, strict=False)
        missing = [k for k in missing if not k.startswith(HEAD_PREFIXES)]
        if missing or unexpected:
            raise InputError("ckpt", f"does not match ranker '{self.model_cfg.name}' (missing {missing[:3]}, unexpected {unexpected[:3]})")

    # ---- training: maximum likelihood of cached representations (flows) -----------------------------------
    def training_step(self, batch: torch.Tensor, batch_idx: int):
        loss = self.head.nll(batch.float()).mean()
        if not torch.isfinite(loss):
            # skip the batch: no step on a NaN/inf loss (an exploding log-det), counted and logged
            self.nonfinite_batches += 1
            warnings.warn(f"non-finite head loss at step {self.global_step}; batch skipped ({self.nonfinite_batches} so far)")
            self.log("train/nonfinite_batches", float(self.nonfinite_batches))
            return None
        self.log("train/nll", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.head_cfg.lr)

    # ---- head-only checkpoints ------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith(HEAD_PREFIXES)}
        checkpoint["base_ckpt"] = self.hparams.base_ckpt
