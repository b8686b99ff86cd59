"""Logs I(W) (isotropy paper Eq. 3) and avgcos (Eq. 4) of a ranker's representations at every validation and test.

Measured on a fixed, seeded probe set (queries and candidate passages of the validation split at every validation,
of the test split at test: `RankingDataModule.probe_texts`) so the curves over training compare like with like:
- `iw`, `avgcos`: token vectors of queries and passages (padding excluded), the vectors ColBERT scores with;
- `iw_sequence`, `avgcos_sequence`: one vector per text (the ranker's pooled vector; the mean of its unit
  token vectors for ColBERT).
Vectors are whatever the ranker scores with, as its score function compares them (`scoring_vectors`): unit length
for the cosine rankers (ColBERT, RepBERT), as the paper's ColBERT normalises its output embeddings; I(W) of
unnormalised vectors is dominated by a few long held-out vectors (exp of their projections) and drops towards 0
for reasons that the cosine score never sees. With an isotropy head attached these are the head's outputs, and
the same four are logged for the raw representations under `*_raw` (the "Ft" column of the isotropy paper's
tables next to "Ft -> head"), from the same backbone pass.
The metric states are torchmetrics states: under DDP each rank encodes its shard and `compute()` syncs.
A ranker that declares no vectors of its own (`RankerCapabilities.encodes_texts` false: the cross-encoders) has no
separate query/passage representations and is skipped; its jobs refuse these protocols' keys (pipeline/jobs.py).

With a head, every validation and test also draws the isotropy "before/after" figure (`cosine_figure`): histograms
of the pairwise cosine similarities (the quantity Eq. 4 averages) of the raw ("Ft") and head ("Ft -> head")
vectors, token vectors and sequence vectors side by side, with the I(W) and avgcos of the whole probe set in the
legend. The histograms are of a seeded uniform sample of at most `figure_vectors` vectors, the same tokens before
and after the head (one random key per token, the smallest keys kept), so the figure costs a few million dot
products. Written to `<output_dir>/isotropy_<split>.png` (atomically; a validation overwrites the previous
epoch's) and logged to W&B as the image `<split>/isotropy_cosines`. Under DDP the figure's sample is drawn over all
ranks' shards of the probe set (each rank samples its shard with its own seeded keys; the smallest keys of all
ranks are kept), like the numbers in its legend.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from pytorch_lightning import Callback
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from core.io import atomic_open, save_figure
from core.progress import phase
from metrics.isotropy import (
    AvgCos,
    IsotropyIW,
    avg_cos_from_unit_sum,
    gram_matrix,
    isotropy_iw_batched,
    one_thread,
    unit_sum,
)
from models.encoding import RAW, WITH_HEAD, encode_collection, encode_stream, variants_forward
from models.rankers.base import EncodedTexts, masked_mean
from models.rankers.capabilities import capabilities_of

SIDES = ((1, "query"), (2, "doc"))  # (index in a pair_batches entry, PairTokenizer side)
RANK_STRIDE = 1009  # rank r seeds its figure keys with seed + r * RANK_STRIDE: rank 0 draws what a single process does


class IsotropyCallback(Callback):
    """Measure and log I(W) (isotropy paper Eq. 3) and avgcos (Eq. 4) of a bi-encoder's vectors.

    At every validation and test on the probe texts (`measure`), at test also by the isotropy paper's per-batch
    protocol (`measure_paper`), and with a head the before/after cosine figure; see the module docstring.

    Parameters
    ----------
    batch_size : int
        Texts encoded per forward pass.
    max_vectors : int
        Cap on the vectors each probe-set `IsotropyIW` keeps (the first ones, in probe order).
    figure_vectors : int
        Size of the figure's seeded sample of vectors, per kind (token, sequence).
    seed : int
        Seed of the figure's sample.
    batch_pairs : int
        (query, passage) pairs per test batch of the `paper` protocol (`eval.isotropy_batch_pairs`); 0 turns the
        protocol off.
    dump_dir : str or Path, optional
        Folder for each test batch's vectors as `<k>.npz` (`eval.dump_isotropy`); None writes nothing.
    max_batches : int, optional
        At most this many test batches for the `paper` protocol (`eval.isotropy_max_batches`); None: all.
    sample_seed : int
        Seed of the sample of test batches when `max_batches` limits them (`eval.isotropy_sample_seed`).
    figure_dir : str or Path, optional
        Folder of the before/after figures (the job's attempt folder, published with its results); None: the
        trainer's `default_root_dir`.
    """

    def __init__(
        self,
        batch_size: int = 32,
        max_vectors: int = 20000,
        figure_vectors: int = 2000,
        seed: int = 0,
        batch_pairs: int = 16,
        dump_dir: str | Path | None = None,
        figure_dir: str | Path | None = None,
        max_batches: int | None = None,
        sample_seed: int = 0,
    ):
        self.batch_size = batch_size
        self.max_vectors = max_vectors
        self.figure_vectors, self.seed = figure_vectors, seed
        self.batch_pairs = batch_pairs  # the `paper` protocol's test batch (eval.isotropy_batch_pairs); 0: no `paper`
        self.max_batches, self.sample_seed = max_batches, sample_seed  # eval.isotropy_max_batches / _sample_seed
        # the distinct texts of consecutive test batches are encoded once and kept until those batches are measured;
        # at most this many token vectors at a time (1.5 GB at d=384), so a split that fits is encoded exactly once
        self.group_vectors = 1_000_000
        # the `paper` protocol measures the test batches holding this many bytes (their vectors and Gram matrices,
        # ~6.5 MB for a ColBERT batch at d=384: ~20 batches) at once, by one batched eigendecomposition (PaperMeasure);
        # about 3x this is held while they are measured (float64 copies, stacked Gram matrices, eigenvectors)
        self.paper_bytes = 2**27
        # the test's scored vectors are kept for the `paper` protocol up to this many bytes (spilled to disk beyond
        # 1 GiB); a larger split (MS MARCO dev x top 1,000: ~180 GB) falls back to encoding its batches in groups
        self.keep_bytes = 2**33
        self.dump_dir = Path(dump_dir) if dump_dir else None  # eval.dump_isotropy: <output_dir>/isotropy_batches
        self.figure_dir = Path(figure_dir) if figure_dir else None  # None: the trainer's default_root_dir
        self.sample: dict[str, dict[str, Tensor]] = {}  # the last measure()'s figure sample, per variant
        self._warned_rank_deficient = False

    @torch.inference_mode()
    def measure(self, trainer, module, split: str = "val") -> dict[str, float]:
        """Return I(W) and avgcos of the probe texts of `split`, token and sequence vectors, with and without the head.

        Keys: `iw`, `avgcos`, `iw_sequence`, `avgcos_sequence`, and the same with `_raw` when a head is attached (the
        raw representations, from the same backbone pass); empty for a ranker that is not a bi-encoder. Also keeps the
        figure's sample in `self.sample`. A collective under DDP: every rank must call it.
        """
        ranker = module.ranker
        self.sample = {}
        if not capabilities_of(ranker).encodes_texts:
            return {}
        has_head = ranker.token_head is not None or ranker.sequence_head is not None
        variants = (WITH_HEAD, RAW) if has_head else (WITH_HEAD,)
        # the figure's sample: the same seeded keys at every validation, shared by both variants (paired tokens);
        # each DDP rank draws its own keys over its shard, and merged() keeps the smallest of all ranks
        rank = dist.get_rank() if _distributed() else 0
        keys = (
            {
                kind: _KeptSample(
                    self.figure_vectors, torch.Generator().manual_seed(self.seed + i + RANK_STRIDE * rank)
                )
                for i, kind in enumerate(("tokens", "sequence"))
            }
            if has_head
            else {}
        )
        metrics = {}
        for v in variants:
            metrics.update(
                {
                    f"iw{v}": IsotropyIW(max_vectors=self.max_vectors),
                    f"avgcos{v}": AvgCos(),
                    f"iw_sequence{v}": IsotropyIW(max_vectors=self.max_vectors),
                    f"avgcos_sequence{v}": AvgCos(),
                }
            )
        for m in metrics.values():
            m.to(module.device)
        tok = module.pair_tokenizer
        queries, docs = trainer.datamodule.probe_texts(split)
        for texts, side in ((queries, "query"), (docs, "doc")):
            # in the probe's own order (sort=False): IsotropyIW keeps the first max_vectors vectors and the figure's
            # keys follow the tokens, so the order is part of what is measured
            for _, encodings in encode_stream(
                ranker,
                tok.ids(texts, side),
                side,
                batch_size=self.batch_size,
                pad_id=tok.tokenizer.pad_token_id,
                forward=variants_forward(ranker, side, variants),
                autocast=trainer.precision_plugin.forward_context,
                sort=False,
            ):
                vectors = {}
                for v, enc in encodings.items():
                    scored = ranker.scoring_vectors(enc.tokens.float())
                    tokens = scored[enc.mask]
                    seq = (
                        ranker.scoring_vectors(enc.sequence.float())
                        if enc.sequence is not None
                        else masked_mean(scored, enc.mask)
                    )
                    metrics[f"iw{v}"].update(tokens)
                    metrics[f"avgcos{v}"].update(tokens)
                    metrics[f"iw_sequence{v}"].update(seq)
                    metrics[f"avgcos_sequence{v}"].update(seq)
                    vectors[v] = {"tokens": tokens, "sequence": seq}
                for kind, kept in keys.items():
                    kept.add({v: vectors[v][kind] for v in variants})
        # A DDP rank with no probe text (fewer probe texts than ranks) has seen no vectors, so its states have no
        # width and could not join the others' gathers of [n, d] states: the ranks agree on each metric's width
        # (max; one all-reduce, a no-op in one process) and give it an empty [0, d] update.
        widths = trainer.strategy.reduce(
            torch.tensor([m.width for m in metrics.values()], device=module.device), reduce_op="max"
        )
        for m, width in zip(metrics.values(), widths.tolist()):
            if width:
                m.update(torch.zeros(0, width, device=module.device))
        for kind, kept in keys.items():
            for v, x in kept.merged().items():
                self.sample.setdefault(v, {})[kind] = x
        self._warn_rank_deficient(metrics["iw_sequence"], split)
        return {k: float(m.compute()) for k, m in metrics.items()}

    def _warn_rank_deficient(self, metric: IsotropyIW, split: str) -> None:
        """Warn, once per run, when the probe's sequence set has fewer vectors than dimensions.

        The probe's sequence set (one vector per probe text) is smaller than the dimension for most backbones
        (96 texts, 384 dimensions): W^T W is then rank-deficient and I(W) measures mostly its null space. Said
        once per run, naming the keys that make it full rank, and only when the run measures isotropy by the
        isotropy paper's protocol (`eval.isotropy_paper`, `batch_pairs` > 0), the one to compare with the paper:
        without it the run is not about isotropy and the note is nothing to act on.
        """
        if self.batch_pairs <= 0 or self._warned_rank_deficient:  # the same on every rank: no rank skips a collective
            return
        local = (
            sum(int(x.shape[0]) for x in metric.vectors)
            if isinstance(metric.vectors, list)
            else int(metric.vectors.shape[0])
        )
        dim = int(metric.vectors[0].shape[1]) if isinstance(metric.vectors, list) and metric.vectors else 0
        n = torch.tensor([local], dtype=torch.long)
        if _distributed():
            n = n.to(metric.device)
            dist.all_reduce(n)
        if 0 < int(n) < dim:
            self._warned_rank_deficient = True
            rank_zero_warn(
                f"isotropy probe ({split}): iw_sequence is computed from {int(n)} vectors in {dim} dimensions, "
                f"so W^T W is rank-deficient; it is a training curve, not the isotropy paper's measure "
                f"(that is iw_paper*, per test batch: docs/isotropy.md); eval.probe_queries + eval.probe_docs "
                f">= {dim} (at most the split's texts) makes it full rank"
            )

    @torch.inference_mode()
    def measure_paper(self, trainer, module, split: str = "test") -> dict[str, float]:
        """Return I(W) and avgcos by the isotropy paper's per-test-batch protocol: mean and std over the batches.

        The isotropy paper's protocol (Sec. 3.2, "averaging the metric values of the entire test batches"): I(W)
        (Eq. 3) and avgcos (Eq. 4) of each test batch of `batch_pairs` (query, passage) pairs, on the vectors as
        the scorer sees them (`scoring_vectors`, padding removed, uncentred), for the queries' vectors, the
        passages' and both together; then the mean and standard deviation over all batches. Token vectors always;
        pooled vectors (`_sequence`) where the ranker pools. Under DDP each rank measures its share of the batches
        and the per-batch values (not the vectors) are gathered, so the result equals one process's. The batches
        stream into `PaperMeasure`, which measures many at a time (one batched eigendecomposition) with each
        distinct text's vectors once (`batch_sets`: a query repeated in a batch is weighted by its count). In one
        process the vectors are those the test scored (kept by `RankingModule.keep_vectors`, asked for in
        `on_test_epoch_start`), so the split is encoded once; a DDP rank, which scored only its chunks, encodes its
        batches' texts (`_measure_encoding`).
        """
        ranker = module.ranker
        if not capabilities_of(ranker).encodes_texts or not hasattr(trainer.datamodule, "pair_batches"):
            return {}
        variants = self._variants(ranker)
        kept = module.kept_vectors(split) if hasattr(module, "kept_vectors") else None
        # minutes on a large split after the test's own bar has ended: a phase with its progress (core/progress.py)
        with phase(f"isotropy paper protocol ({split})", unit="batches", key="isotropy paper protocol") as ph:
            measure = PaperMeasure(self.paper_bytes, on_measured=ph.advance)
            if kept is not None and all(v in kept["query"] for v in variants):
                # the vectors the evaluation just scored (keep_vectors, asked for at the epoch's start): nothing is
                # encoded again, and the protocol measures exactly what was ranked
                batches = trainer.datamodule.pair_batches(
                    split, self.batch_pairs, self.max_batches, self.sample_seed, texts=False
                )
                ph.stage("measuring the test batches' vectors", total=len(batches))
                for k, qrows, prows in batches:
                    rows = {"query": qrows, "passage": prows}
                    measure.add(k, batch_sets(kept, rows, module.device))
                    if self.dump_dir is not None and split == "test":
                        dump_batch(self.dump_dir / f"{k}.npz", batch_vectors(kept, rows))
            else:
                self._measure_encoding(trainer, module, split, variants, measure, ph)
            measure.flush()
        per_batch = measure.values
        if _distributed() and dist.get_world_size() > 1:
            parts: list = [None] * dist.get_world_size()
            dist.all_gather_object(parts, per_batch)
            per_batch = [b for part in parts for b in part]
        values = aggregate_batches([values for _, values in sorted(per_batch, key=lambda kv: kv[0])])
        values["isotropy_paper_batches"] = float(len(per_batch))  # how many test batches the means are over
        return values

    @staticmethod
    def _variants(ranker) -> tuple[str, ...]:
        return (WITH_HEAD, RAW) if (ranker.token_head is not None or ranker.sequence_head is not None) else (WITH_HEAD,)

    def _measure_encoding(self, trainer, module, split: str, variants, measure: PaperMeasure, ph) -> None:
        """Add this rank's protocol batches to `measure`, their texts encoded here (`ph`: the protocol's phase).

        Used where the evaluation's own vectors are not at hand (a DDP rank scored only its share of the passages; a
        direct call outside a test).
        """
        batches = trainer.datamodule.pair_batches(split, self.batch_pairs, self.max_batches, self.sample_seed)
        ph.stage("encoding and measuring the test batches", total=len(batches))
        tok = module.pair_tokenizer
        ids = {}  # (side, text) -> token ids: each distinct text tokenised once, for the budget and the encoding
        for i, side in SIDES:
            texts = sorted({t for b in batches for t in b[i]})
            ids.update({(side, t): x for t, x in zip(texts, tok.ids(texts, side))})
        for group in self._groups(batches, ids):
            # each distinct text of the group encoded once, in length-sorted batches as the evaluation encodes them
            # (a batch of 16 pairs mostly repeats one query, and candidates recur across queries)
            encoded, row = {}, {}
            for (i, side), name in zip(SIDES, ("query", "passage")):
                texts = sorted({t for b in group for t in b[i]})
                encoded[name] = self._encode_distinct(trainer, module, [ids[(side, t)] for t in texts], side, variants)
                row[name] = {t: k for k, t in enumerate(texts)}
            for k, qtexts, ptexts in group:
                rows = {name: [row[name][t] for t in texts] for name, texts in (("query", qtexts), ("passage", ptexts))}
                measure.add(k, batch_sets(encoded, rows, module.device))
                if self.dump_dir is not None and split == "test":
                    dump_batch(self.dump_dir / f"{k}.npz", batch_vectors(encoded, rows))

    def _groups(self, batches: list, ids: dict[tuple[str, str], list[int]]) -> list[list]:
        """Split `batches` into consecutive runs whose distinct texts hold at most `group_vectors` tokens together.

        `ids`: (side, text) -> token ids. A batch is never split; one larger than the budget is a group of its own.
        """
        groups, group, seen, size = [], [], set(), 0
        for b in batches:
            texts = {(side, t) for i, side in SIDES for t in b[i]}
            if group and size + sum(len(ids[x]) for x in texts - seen) > self.group_vectors:
                groups.append(group)
                group, seen, size = [], set(), 0
            size += sum(len(ids[x]) for x in texts - seen)
            seen |= texts
            group.append(b)
        return groups + [group] if group else groups

    def _encode_distinct(self, trainer, module, ids: list[list[int]], side: str, variants) -> dict[str, EncodedTexts]:
        """Encode the texts tokenised as `ids` once per variant: {variant: their scored vectors as EncodedTexts}.

        `ids` are token ids from the ranker's PairTokenizer; padding is removed. One backbone pass, finished with and
        without the heads (`encode_collection`).
        """
        return encode_collection(
            module.ranker,
            ids,
            side,
            batch_size=self.batch_size,
            pad_id=module.pair_tokenizer.tokenizer.pad_token_id,
            variants=variants,
            autocast=trainer.precision_plugin.forward_context,
        )

    def _log(self, trainer, module, split: str) -> None:
        values = self.measure(trainer, module, split)
        if split == "test" and self.batch_pairs > 0:
            values.update(self.measure_paper(trainer, module, split))
        module.results.setdefault(split, {})["isotropy"] = values
        for k, v in values.items():
            module.log(f"{split}/{k}", v, sync_dist=False)
        if self.sample and trainer.is_global_zero:
            self._figure(trainer, module, split, values)

    def _figure(self, trainer, module, split: str, values: dict[str, float]) -> None:
        head = getattr(module, "head_cfg", None)
        name = head.name if head is not None else "head"
        title = f"Isotropy before/after the {name} head ({split} probe texts, step {trainer.global_step})"
        png = save_figure(
            cosine_figure(self.sample, values, title, name),
            (self.figure_dir or Path(trainer.default_root_dir)) / f"isotropy_{split}.png",
        )
        logger = trainer.logger
        if logger is not None and hasattr(logger, "log_image"):  # W&B
            logger.log_image(key=f"{split}/isotropy_cosines", images=[str(png)], step=trainer.global_step)

    def on_validation_epoch_end(self, trainer, module) -> None:
        """Measure and log the validation probe (and draw the figure with a head), except while sanity checking."""
        if not trainer.sanity_checking:
            self._log(trainer, module, "val")

    def on_test_epoch_start(self, trainer, module) -> None:
        """Ask the module to keep the test's scored vectors for the `paper` protocol (one process only)."""
        # one process scores every passage of the split: the protocol can take the evaluation's vectors instead of
        # encoding the texts again (under DDP each rank scores only its chunks, so the ranks encode their batches)
        if (
            self.batch_pairs > 0
            and capabilities_of(module.ranker).encodes_texts
            and hasattr(module, "keep_vectors")
            and not (_distributed() and dist.get_world_size() > 1)
        ):
            module.keep_vectors("test", self._variants(module.ranker), self.keep_bytes)

    def on_test_epoch_end(self, trainer, module) -> None:
        """Measure and log the test probe and the `paper` protocol (and draw the figure with a head)."""
        self._log(trainer, module, "test")


class BatchSets(NamedTuple):
    """Hold one test batch's vectors of one (variant, kind) for the `paper` protocol.

    W of the queries-and-passages set as its distinct rows, the queries' first, with each row's count in the batch (a
    query repeated in the batch counts each time: Z(a) and W^T W weigh its rows by that count instead of repeating
    them).
    """

    vectors: Tensor  # [m, d] distinct query rows, then distinct passage rows
    n_query: int  # the first n_query rows are the queries'
    counts: Tensor | None  # [m] float64 row counts; None: each row once

    def side(self, side: str) -> tuple[Tensor, Tensor | None]:
        """Return (rows, counts) of the set `side`: "" (queries and passages), "_query" or "_passage".

        Counts are None where every row is there once (no weighting pass).
        """
        rows = {"": slice(None), "_query": slice(0, self.n_query), "_passage": slice(self.n_query, None)}[side]
        counts = None if self.counts is None else self.counts[rows]
        return self.vectors[rows], None if counts is None or bool((counts == 1).all()) else counts


class PaperMeasure:
    """Measure I(W) (Eq. 3) and avgcos (Eq. 4) of a stream of test batches, the `paper` protocol.

    `add` keeps a batch; the pending batches are measured together when they hold `max_bytes` (their vectors and the
    Gram matrices they will need) or at `flush()`, so memory stays bounded however many batches there are: per batch the
    two sides' Gram matrices and unit-vector sums (the queries-and-passages set's are their sums: the cost of a batch is
    its three eigendecompositions and projections, not three Gram matrices), then one batched eigendecomposition of the
    stacked Gram matrices (`isotropy_iw_batched`). On a GPU all pending batches are one such call; on the CPU they are
    split over `torch.get_num_threads()` threads with one BLAS / LAPACK thread each (`_map_threads`).
    `values`: [(k, {key: value})], in the order added; the keys are `paper_batch_values`'.
    """

    def __init__(self, max_bytes: int | None = None, on_measured=None):
        self.max_bytes = max_bytes
        self.on_measured = on_measured  # called with the number of batches each flush measured (progress)
        self.values: list[tuple[int, dict[str, float]]] = []
        self._pending: list[tuple[int, dict[tuple[str, str], BatchSets]]] = []
        self._bytes = 0

    def add(self, k: int, sets: dict[tuple[str, str], BatchSets]) -> None:
        """Test batch `k`: {(variant, "" | "_sequence"): its BatchSets}."""
        self._pending.append((k, sets))
        self._bytes += sum(b.vectors.nbytes + 3 * 8 * b.vectors.shape[1] ** 2 for b in sets.values())
        if self.max_bytes is not None and self._bytes >= self.max_bytes:
            self.flush()

    def flush(self) -> None:
        """Measure the pending batches and move them to `values`."""
        if not self._pending:
            return
        device = next(iter(self._pending[0][1].values())).vectors.device
        workers = torch.get_num_threads() if device.type == "cpu" else 1
        bounds = np.linspace(0, len(self._pending), workers + 1).round().astype(int)
        parts = [self._pending[a:b] for a, b in zip(bounds, bounds[1:])]
        self.values += [kv for part in _map_threads(_measure_batches, parts) for kv in part]
        if self.on_measured is not None:
            self.on_measured(len(self._pending))
        self._pending, self._bytes = [], 0


def _measure_batches(batches: list[tuple[int, dict[tuple[str, str], BatchSets]]]) -> list[tuple[int, dict[str, float]]]:
    """PaperMeasure's values of `batches`: their I(W) from one `isotropy_iw_batched` call."""
    out, sets, grams, keys = [], [], [], []
    for k, batch in batches:
        values = {}
        for (v, kind), b in sorted(batch.items()):
            b = b._replace(vectors=b.vectors.to(torch.float64))  # once, not in every function below
            part = {side: b.side(side) for side in ("", "_query", "_passage")}
            gram = {side: gram_matrix(*part[side]) for side in ("_query", "_passage")}
            units = {side: unit_sum(*part[side]) for side in ("_query", "_passage")}
            gram[""] = gram["_query"] + gram["_passage"]
            units[""] = (units["_query"][0] + units["_passage"][0], units["_query"][1] + units["_passage"][1])
            for side in ("", "_query", "_passage"):
                values[f"avgcos_paper{side}{kind}{v}"] = avg_cos_from_unit_sum(*units[side])
                keys.append((len(out), f"iw_paper{side}{kind}{v}"))
                sets.append(part[side])
                grams.append(gram.pop(side))
        out.append((k, values))
    if sets:
        iw = isotropy_iw_batched([W for W, _ in sets], torch.stack(grams), counts=[c for _, c in sets]).tolist()
        for (i, key), value in zip(keys, iw):
            out[i][1][key] = value
    return out


def _map_threads(fn, parts: list) -> list:
    """Return [fn(part) for part in parts], each part in its own thread with one torch (BLAS / LAPACK) thread.

    In this thread when there is one part. Why: a batched eigh on the CPU is one LAPACK call per matrix in a loop, and a
    LAPACK or BLAS call with several threads spins on its threads' barriers when the cores are shared (DDP ranks,
    other jobs): on this project's 2-core CPU under a load of ~8 other processes, the old per-batch path with 2 BLAS
    threads used 6x the CPU time of one thread (0.84 s against 0.13 s of CPU a batch, d = 384); a 2-threaded eigh took
    0.7-29 s against 0.1-0.8 s. Independent single-threaded parts have no barrier: on the idle machine two such
    threads took 24 ms a set against 47 ms for one thread and 26-29 ms for one 2-threaded call (Gram matrix, eigh,
    projection, d = 384, ~2,200 rows), with the same CPU time as one thread, and equal results.
    """
    parts = [p for p in parts if p]
    if len(parts) <= 1:
        return [fn(p) for p in parts]

    def one(part):
        torch.set_num_threads(1)
        return fn(part)

    with one_thread(), ThreadPoolExecutor(len(parts)) as pool:
        return list(pool.map(one, parts))


def paper_batch_values(vectors: dict[tuple[str, str, str], Tensor]) -> dict[str, float]:
    """Return I(W) and avgcos of one test batch, the one-batch form of `PaperMeasure`.

    `vectors` {(variant, "query" | "passage", "" | "_sequence"): [n, d]} ->
    {iw_paper<side><kind><variant>: value, avgcos_paper...}, side "" (queries and passages concatenated), "_query"
    or "_passage". Every row is given as it is.
    """
    measure = PaperMeasure()
    measure.add(
        0,
        {
            (v, kind): BatchSets(
                torch.cat([vectors[(v, "query", kind)], vectors[(v, "passage", kind)]]),
                len(vectors[(v, "query", kind)]),
                None,
            )
            for v, kind in {(v, kind) for v, _, kind in vectors}
        },
    )
    measure.flush()
    return measure.values[0][1]


def _distinct(rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Return (the distinct text rows of a batch's side, how many times each is in it)."""
    return np.unique(np.asarray(rows, dtype=np.int64), return_counts=True)


def batch_sets(
    encoded: dict[str, dict[str, EncodedTexts]], rows: dict[str, list[int]], device
) -> dict[tuple[str, str], BatchSets]:
    """Build a test batch's `PaperMeasure` input: {(variant, kind): BatchSets} on `device`.

    `encoded` {"query" | "passage": {variant: EncodedTexts}}, `rows` {"query" | "passage": the batch's texts as rows
    of those, repeats included} -> {(variant, kind): BatchSets} on `device`, each distinct text's vectors once (one
    gather), weighted by its count.
    """
    distinct = {name: _distinct(r) for name, r in rows.items()}
    repeats = any(bool((c > 1).any()) for _, c in distinct.values())
    out = {}
    for v in encoded["query"]:
        tokens, counts, sequence = [], [], []
        for name in ("query", "passage"):
            enc, (texts, count) = encoded[name][v], distinct[name]
            vecs, lengths = enc.text_vectors(texts)
            tokens.append(vecs)
            counts.append(np.repeat(count, lengths))
            if enc.sequence is not None:
                sequence.append(enc.sequence[torch.from_numpy(texts)])
        out[(v, "")] = BatchSets(
            torch.cat(tokens).to(device),
            len(tokens[0]),
            torch.from_numpy(np.concatenate(counts)).to(device, torch.float64) if repeats else None,
        )
        if sequence:
            out[(v, "_sequence")] = BatchSets(
                torch.cat(sequence).to(device),
                len(sequence[0]),
                torch.from_numpy(np.concatenate([distinct[n][1] for n in ("query", "passage")])).to(
                    device, torch.float64
                )
                if repeats
                else None,
            )
    return out


def batch_vectors(encoded: dict[str, dict[str, EncodedTexts]], rows: dict[str, list[int]]) -> dict[str, Tensor]:
    """Return a test batch's vectors as scored, every row as the batch holds it, for `dump_batch`.

    Without a head's `_raw` variant: {"query" | "passage" [+ "_sequence"]: [n, d]}.
    """
    out = {}
    for name, r in rows.items():
        enc = encoded[name][""]
        out[name] = torch.cat([enc.tokens(i) for i in r])
        if enc.sequence is not None:
            out[f"{name}_sequence"] = enc.sequence[r]
    return out


def aggregate_batches(batches: list[dict[str, float]]) -> dict[str, float]:
    """Return the mean over the test batches (the paper's number) and the standard deviation over them.

    The standard deviation is `<key>_std` (population, ddof 0). A value a batch cannot define (avgcos of fewer than two
    non-zero vectors, e.g. the pooled query of a last batch of one pair) is left out of that key's mean and std.
    """
    out = {}
    for key in sorted({k for b in batches for k in b}):
        vals = np.array([b[key] for b in batches if key in b], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        out[key] = float(vals.mean()) if len(vals) else math.nan
        out[f"{key}_std"] = float(vals.std()) if len(vals) else math.nan
    return out


def dump_batch(path: Path, arrays: dict[str, Tensor]) -> None:
    """Write one test batch's vectors as scored (float32, padding removed) for recomputation: `eval.dump_isotropy`."""
    with atomic_open(path, "wb") as f:
        np.savez(f, **{k: x.numpy().astype(np.float32) for k, x in arrays.items()})


class _KeptSample:
    """Keep a seeded uniform sample of at most `size` rows of a stream of batches.

    Each row gets a random key and the rows with the smallest keys are kept, so the sample does not depend on the batch
    sizes and memory stays O(size). Several parallel streams (raw and head vectors of the same rows) share the keys and
    keep the same rows.
    """

    def __init__(self, size: int, generator: torch.Generator):
        self.size, self.generator = size, generator
        self.keys = torch.empty(0)
        self.rows: dict[str, Tensor] = {}

    def add(self, batch: dict[str, Tensor]) -> None:
        n = next(iter(batch.values())).shape[0]
        keys = torch.cat([self.keys, torch.rand(n, generator=self.generator)])
        keep = torch.argsort(keys)[: self.size].sort().values  # stream order, so the sample reads like the probe
        self.keys = keys[keep]
        for v, x in batch.items():
            old = self.rows.get(v)
            rows = x.detach().float().cpu()
            self.rows[v] = (rows if old is None else torch.cat([old, rows]))[keep]

    def merged(self) -> dict[str, Tensor]:
        """Return the rows with the `size` smallest keys over every DDP rank's sample (in rank, then stream order).

        Under DDP each rank sees only its shard of the probe texts, so the figure is drawn from all ranks' rows, like
        the numbers in its legend. Without DDP, this rank's rows. A collective: every rank must call it.
        """
        if not _distributed() or dist.get_world_size() == 1:
            return self.rows
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (self.keys, self.rows))
        keys = torch.cat([k for k, _ in parts])
        keep = torch.argsort(keys)[: self.size].sort().values
        # a rank with no probe text added nothing: no rows, not even empty ones
        names = sorted({v for _, rows in parts for v in rows})
        return {v: torch.cat([rows[v] for _, rows in parts if v in rows])[keep] for v in names}


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def pairwise_cosines(x: Tensor) -> Tensor:
    """Return cos(w_i, w_j) for the unordered pairs i < j of the rows of x (zero rows left out, as avgcos does)."""
    x = x.double()
    x = x[x.norm(dim=1) > 0]
    u = x / x.norm(dim=1, keepdim=True)
    i, j = torch.triu_indices(len(u), len(u), offset=1)
    return (u @ u.T)[i, j]


def cosine_figure(sample: dict[str, dict[str, Tensor]], values: dict[str, float], title: str, head: str = "head"):
    """Draw histograms of pairwise cosine similarities, raw vs with the head, of token and sequence vectors.

    Raw is "Ft", `sample["_raw"]`; with the head is `sample[""]`. `values`: the callback's I(W) and avgcos (legend).
    Returns the matplotlib figure.
    """
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, kind, suffix, label in (
        (axes[0], "tokens", "", "token vectors"),
        (axes[1], "sequence", "_sequence", "sequence vectors"),
    ):
        bins = np.linspace(-1, 1, 81)
        for v, name, colour in (("_raw", "Ft", "tab:blue"), ("", f"Ft -> {head}", "tab:orange")):
            x = sample[v][kind]
            cos = pairwise_cosines(x).numpy()
            iw, avg = values.get(f"iw{suffix}{v}", float("nan")), values.get(f"avgcos{suffix}{v}", float("nan"))
            ax.hist(
                cos, bins=bins, density=True, alpha=0.5, color=colour, label=f"{name}: I(W) {iw:.3f}, avgcos {avg:.3f}"
            )
        ax.set_xlabel("cosine similarity of a pair")
        ax.set_ylabel("density")
        ax.set_title(f"{label} ({len(x)} sampled)", fontsize=9)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return fig
