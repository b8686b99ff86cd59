"""The LightningModule of the post-hoc head stage: a frozen fine-tuned ranker with an isotropy head attached.

Isotropy paper Fig. 2(b)-(c): the ranker's weights stay as fine-tuned; only the head trains, unsupervised, by
maximum likelihood of the ranker's representations (Eq. 5) read from the on-disk cache. Validation and test are
the ranker's own re-ranking evaluation (RankingModule), now scoring the head's outputs, so the best epoch is chosen
by validation NDCG@10 (not the last epoch, as the paper's code does).

The frozen backbone runs once per evaluation text: a split's token representations are computed once and the head
is applied on top (`BiEncoder.finish`). Validation keeps them in memory, so the validation after every epoch
costs the head alone; a test scores "Ft" (`results["test_raw"]`) and "Ft -> head" (`results["test"]`) from the
same pass.

Checkpoints hold the head only (plus optimiser, loop state and `base_ckpt`, the ranker checkpoint it belongs to):
the frozen ranker is rebuilt from `base_ckpt`, never copied into every head checkpoint.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from core.errors import InputError
from lightning_modules.module import RankingModule
from models.encoding import RAW, WITH_HEAD
from models.heads import HEAD_SLOTS, IsotropyHead, attach_head, build_head, head_config, head_input_dim
from models.rankers import rankers_with
from models.rankers.base import Encoded, Ranker
from models.rankers.capabilities import RankerCapabilities, capabilities_of

HEAD_PREFIXES = tuple(f"ranker.{slot}." for slot in HEAD_SLOTS.values())


def check_head_fits(name: str, caps: RankerCapabilities, granularity: str) -> None:
    """Raise InputError unless ranker `name` (of capabilities `caps`) has the vectors a head of `granularity` acts on.

    Called from a checkpoint's header before any data is read (pipeline/head_stage.py), and by the module itself.
    """
    if not caps.token_vectors and not caps.sequence_vectors:
        raise InputError(
            "head",
            f"isotropy heads act on bi-encoder representations; '{name}' has neither token nor sequence vectors "
            "(a cross-encoder)",
        )
    if granularity == "sequence" and not caps.sequence_vectors:
        raise InputError(
            "head.granularity",
            f"'sequence' needs a ranker with one vector per text; '{name}' has none (it scores token vectors; "
            f"use 'token', or a ranker with sequence vectors: {rankers_with(lambda c: c.sequence_vectors)})",
        )
    if granularity == "token" and not caps.token_vectors:
        raise InputError(
            "head.granularity", f"'token' needs a ranker with token vectors; '{name}' has none (use 'sequence')"
        )


class HeadModule(RankingModule):
    """A frozen fine-tuned bi-encoder with an isotropy head (whitening, NICE or Glow) attached, training the head only.

    `model`, `optim` and `measures` are those of the fine-tuned ranker (`RankingModule`); `head` is the head's config
    (`configs/head/*.yaml`) and `base_ckpt` the ranker checkpoint the head belongs to. `ranker` and `head_module`: the
    ranker (and head) `models.loading.load_ranker` loaded, wrapped instead of fresh ones. See the module docstring for
    training, evaluation and checkpoints.
    """

    def __init__(
        self,
        model: dict,
        optim: dict,
        measures: list[str] | None,
        head: dict,
        base_ckpt: str,
        ranker: Ranker | None = None,
        head_module: IsotropyHead | None = None,
    ):
        super().__init__(model, optim, measures, ranker=ranker)
        self.save_hyperparameters(ignore=["ranker", "head_module"])
        self.head_cfg = head_config(head)
        self.check_capabilities()
        if head_module is None:
            head_module = build_head(self.head_cfg, self.ranker_dim())
        if head_module is None:
            raise InputError("head", "stage=head needs a head: whitening, nice or glow")
        # Registered once, inside the ranker (where encode() applies it); this list keeps a handle while detached.
        self._head = [head_module]
        self.attach(True)
        for name, p in self.named_parameters():
            p.requires_grad = name.startswith(HEAD_PREFIXES)
        self.strict_loading = False  # head checkpoints carry the head only
        self.runs["test_raw"] = type(self.runs["test"])()
        self._val_memo: dict = {}  # "q" -> the validation queries' raw Encoded; batch_idx -> (didx, raw docs)
        self._val_memo_bytes = 0

    def check_capabilities(self) -> None:
        """Raise InputError unless the ranker has the vectors `head.granularity` acts on (`check_head_fits`)."""
        check_head_fits(self.model_cfg.name, capabilities_of(self.ranker), self.head_cfg.granularity)

    @property
    def head(self):
        """The isotropy head, whether or not it is attached to the ranker."""
        return self._head[0]

    def ranker_dim(self) -> int:
        """Width of the ranker's output vectors, which the head transforms (`compress_dim` where the ranker has one)."""
        return head_input_dim(self.ranker)

    def attach(self, on: bool) -> None:
        """Put the head where the granularity says (on=False: score with the raw representations)."""
        attach_head(self.ranker, self.head if on else None, self.head_cfg.granularity)

    compiles_backbone = False  # the frozen backbone encodes the cache once; only the head trains

    # ---- training: maximum likelihood of cached representations (flows) -----------------------------------
    def training_step(self, batch: torch.Tensor, batch_idx: int):
        """Return the head's mean negative log-likelihood (isotropy paper Eq. 5) of cached representations [B, d].

        A non-finite loss (an exploding log-det) is returned too: `optim.nonfinite` of the run applies at the optimiser
        step, on the device (`RankingModule.watch_loss`).
        """
        loss = self.head.nll(batch.float()).mean()
        if self.logs_this_step():  # not prog_bar (a host sync per batch): the bar shows it at log steps
            self.log("train/nll", loss)
        return self.watch_loss(loss)

    def configure_optimizers(self):
        """Return Adam at `head.lr` over the head's parameters only (the ranker is frozen)."""
        params = [p for p in self.parameters() if p.requires_grad]
        # fused: one kernel for all of the flow's tensors (~10 % of a Glow step at 768 dims on CPU); the same update
        return torch.optim.Adam(params, lr=self.head_cfg.lr, fused=self.fused_optimizer(params))

    # ---- evaluation from one backbone pass -----------------------------------------------------------------
    def _raw_queries(self, split: str) -> Encoded:
        if split == "val" and "q" in self._val_memo:
            return self._val_memo["q"]
        texts = self.trainer.datamodule.eval_splits[split].qtexts
        raw = self.encode_query_texts(
            texts,
            encode=lambda b: self.ranker.token_representations(b["q_input_ids"], b["q_attention_mask"], side="query"),
        )
        if split == "val":
            self._val_memo["q"] = raw
        return raw

    def _raw_docs(self, batch: dict[str, Tensor], batch_idx: int, split: str) -> Encoded:
        if split == "val":
            # keyed by position and checked against the batch's passages: evaluation loaders are not shuffled, and a
            # changed split (a new datamodule) is re-encoded rather than scored with stale vectors
            hit = self._val_memo.get(batch_idx)
            if hit is not None and torch.equal(hit[0], batch["didx"]):
                return hit[1]
        docs = {k: v for k, v in batch.items() if k.startswith("d_")}
        raw = self.with_oom_retry(
            lambda b: self.ranker.token_representations(b["d_input_ids"], b["d_attention_mask"], side="doc"),
            docs,
            "encoding passages",
        )
        size = raw.tokens.numel() * raw.tokens.element_size()
        if split == "val" and self._val_memo_bytes + size <= self.head_cfg.val_memory_gib * 2**30:
            self._val_memo[batch_idx] = (batch["didx"].clone(), raw)
            self._val_memo_bytes += size
        return raw

    kept_variants = (WITH_HEAD, RAW)  # one backbone pass, finished with and without the head

    def _eval_epoch_start(self, split: str) -> None:
        self._start_keeping(split)
        raw = self._raw_queries(split)
        self._eval_queries = self.ranker.finish(raw)
        self._eval_queries_raw = self.ranker.finish(raw, heads=False) if split == "test" else None
        self._keep(
            split, "query", np.arange(len(raw.mask)), self._variants(raw, self._eval_queries, self._eval_queries_raw)
        )

    def _variants(self, raw: Encoded, heads: Encoded, without: Encoded | None) -> dict[str, Encoded]:
        return {WITH_HEAD: heads, RAW: without if without is not None else self.ranker.finish(raw, heads=False)}

    def _eval_step(self, batch: dict[str, Tensor], batch_idx: int, split: str) -> None:
        raw = self._raw_docs(batch, batch_idx, split)
        docs = self.ranker.finish(raw)
        scores = self.score_chunk(self._eval_queries, batch, docs=docs)
        self.runs[split].update(batch["qidx"], batch["didx"], scores.float())
        docs_raw = None
        if split == "test":
            docs_raw = self.ranker.finish(raw, heads=False)
            scores = self.score_chunk(self._eval_queries_raw, batch, docs=docs_raw)
            self.runs["test_raw"].update(batch["qidx"], batch["didx"], scores.float())
        if split in self._kept:
            self._keep(split, "passage", batch["dpos"], self._variants(raw, docs, docs_raw))

    def on_test_epoch_end(self) -> None:
        """Evaluate both test runs: without the head ("Ft", `test_raw`) and with it ("Ft -> head", `test`)."""
        self._eval_epoch_end("test", "test_raw")
        self._eval_epoch_end("test")
        self._eval_queries_raw = None

    def results_without_head(self) -> dict:
        """Test metrics of the ranker's own representations ("Ft"), from the test that also scored the head."""
        iso = self.results["test"].get("isotropy", {})
        return {
            **self.results["test_raw"]["metrics"],
            **{k[: -len("_raw")]: v for k, v in iso.items() if k.endswith("_raw")},
        }

    # ---- head-only checkpoints ------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep the head's weights only in the checkpoint, with `base_ckpt` naming the ranker to rebuild it on."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith(HEAD_PREFIXES)}
        checkpoint["base_ckpt"] = self.hparams.base_ckpt
