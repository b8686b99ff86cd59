"""Log ATS per positional delta and MATS (position-bias paper Eq. 8-9) at every validation and test.

ATS and MATS (position-bias paper Eq. 8-9, Figure 2, Table 2) measure how much a ranker's passage term vectors
depend on their absolute position.

Passages: a fixed, seeded sample of `eval.ats_passages` passages of the split being evaluated (validation
candidates at validation, test candidates at test, as the data module gives them: rotated with
`data.rotate_eval=true`); cross-encoders pair passage i with a seeded sample of the split's queries, cycled. The
same passages at every validation, so the curves over training compare like with like.
MATS: as `eval.mats` says (metrics/ats.py): `paper` (default), Eq. 9 as printed, 1/(max da - 1) times the sum of the
max da drops ATS(0) - ATS(i); `mean`, their plain mean. `mats_std`: the standard deviation of those drops.
Logged: `<split>/mats`, `<split>/mats_std`, `<split>/ats0` (scalars, every logger), the curve as a W&B line plot
`<split>/ats_curve` (delta vs ATS) when the logger is W&B; `module.results[split]["ats"]` holds the scalars, so
`metrics.json` and the grids' tables get `mats` per run.
DDP: each rank encodes its shard of the passages (global passage ids; a shard may be empty), and
`AverageTermSimilarity.compute()` gathers every rank's occurrences and computes on the whole set (pairs across ranks
count), so the figures equal a single process's. BM25 (no nn.Module) and rankers without term vectors are skipped,
and so are the validations of a frozen ranker (train.py stage=head: its term vectors do not change; the test still
measures them).
"""

from __future__ import annotations

import numpy as np
import torch
from pytorch_lightning import Callback

from datamodules.samplers import shard_range
from metrics.ats import ATSResult, AverageTermSimilarity
from models.rankers.terms import passage_terms


def ats_sample(n_passages: int, n_queries: int, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(passage indices, query indices) of the ATS probe: seeded, sorted, at most `count` passages."""
    rng = np.random.default_rng([seed, 5])
    docs = np.sort(rng.permutation(n_passages)[:count])
    queries = rng.permutation(n_queries)[: max(1, min(count, n_queries))] if n_queries else np.zeros(0, dtype=int)
    return docs, queries


class ATSCallback(Callback):
    """Measure and log ATS/MATS (position-bias paper Eq. 8-9) of the ranker's passage term vectors.

    Runs at the end of every validation (unless the ranker is frozen) and test; see the module docstring for what is
    logged and where.

    Parameters
    ----------
    passages : int
        Size of the seeded passage sample (`eval.ats_passages`); 0 or less turns the measure off.
    max_occurrences : int
        Seeded cap on the occurrences kept per term (`AverageTermSimilarity`).
    seed : int
        Seed of the passage/query sample and of the metric's own subsampling.
    batch_size : int
        Passages (or pairs) encoded per forward pass.
    mats : str
        MATS mode, one of `metrics.ats.MATS_MODES` (`eval.mats`): `paper` (Eq. 9 as printed) or `mean`.
    """

    def __init__(
        self, passages: int = 256, max_occurrences: int = 100, seed: int = 0, batch_size: int = 32, mats: str = "paper"
    ):
        self.passages, self.max_occurrences, self.seed, self.batch_size = passages, max_occurrences, seed, batch_size
        self.mats = mats  # metrics.ats.MATS_MODES (eval.mats)

    def measure(self, trainer, module, split: str) -> ATSResult | None:
        """Compute ATS per delta and MATS of `module.ranker` on the passage sample of `split` ("val" or "test").

        Every DDP rank must call it (the metric gathers across ranks); each encodes its shard of the sample.

        Returns
        -------
        ATSResult or None
            None when the measure does not apply: turned off, a ranker that is neither bi- nor cross-encoder (BM25),
            no data for `split`, or fewer than 2 sampled passages.
        """
        ranker = module.ranker
        data = trainer.datamodule.eval_splits.get(split) if trainer.datamodule is not None else None
        if self.passages <= 0 or ranker.kind not in ("bi", "cross") or data is None:
            return None
        docs, queries = ats_sample(len(data.dtexts), len(data.qtexts), self.passages, self.seed)
        world, rank = trainer.world_size, trainer.global_rank
        if len(docs) < 2:
            return None
        shard = shard_range(len(docs), rank, world)  # empty on some ranks when there are fewer passages than ranks
        metric = AverageTermSimilarity(self.max_occurrences, self.seed, mats=self.mats).to(module.device)
        terms = passage_terms(
            ranker,
            module.pair_tokenizer,
            [data.dtexts[i] for i in docs[shard.start : shard.stop]],
            queries=[data.qtexts[i] for i in queries] if ranker.kind == "cross" else None,
            batch_size=self.batch_size,
            device=module.device,
            first_passage=shard.start,
            autocast=trainer.precision_plugin.forward_context,
        )
        # A rank without passages has [0, 1] vectors (no width), which cannot join the others' gather of [n, d]:
        # the ranks agree on d (max; one all-reduce, a no-op in one process).
        width = trainer.strategy.reduce(
            torch.tensor(terms.vectors.shape[1] if len(terms.vectors) else 0, device=module.device), reduce_op="max"
        )
        metric.update(
            terms.vectors.to(module.device).reshape(-1, int(width)),
            terms.terms.to(module.device),
            terms.positions.to(module.device),
            terms.passages.to(module.device),
        )
        return metric.compute()

    def _log(self, trainer, module, split: str) -> None:
        result = self.measure(trainer, module, split)
        if result is None:
            return
        # NaN (too few passages for any pair) is left out: metrics.json stays plain JSON
        scalars = {
            k: v
            for k, v in (("mats", result.mats), ("mats_std", result.mats_std), ("ats0", float(result.ats[0])))
            if np.isfinite(v)
        }
        module.results.setdefault(split, {})["ats"] = scalars
        for k, v in scalars.items():
            module.log(f"{split}/{k}", v, sync_dist=False)  # every rank computed the same value
        logger = trainer.logger
        if trainer.is_global_zero and logger is not None and hasattr(logger, "log_image"):  # W&B
            import wandb  # lazy: heavy, only W&B logging needs it

            rows = [[int(d), float(a)] for d, a in zip(result.deltas, result.ats) if np.isfinite(a)]
            table = wandb.Table(data=rows, columns=["delta", "ats"])
            logger.experiment.log(
                {
                    f"{split}/ats_curve": wandb.plot.line(
                        table, "delta", "ats", title=f"ATS per positional delta ({split})"
                    ),
                    "trainer/global_step": trainer.global_step,
                }
            )

    @torch.inference_mode()
    def on_validation_epoch_end(self, trainer, module) -> None:
        """Log ATS/MATS of the validation passages, unless sanity checking or the ranker itself is frozen."""
        # a frozen ranker (the head stage trains an isotropy head on top) has the same term vectors at every validation
        trained = any(
            p.requires_grad
            for n, p in module.ranker.named_parameters()
            if not n.startswith(("token_head.", "sequence_head."))
        )
        if not trainer.sanity_checking and trained:
            self._log(trainer, module, "val")

    @torch.inference_mode()
    def on_test_epoch_end(self, trainer, module) -> None:
        """Log ATS/MATS of the test passages (always, frozen ranker or not)."""
        self._log(trainer, module, "test")
