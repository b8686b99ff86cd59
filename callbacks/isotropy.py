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
Cross-encoders have no separate query/passage representations and are skipped.

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
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from pytorch_lightning import Callback
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from core.io import atomic_open, save_figure
from datamodules.tokenization import length_order
from lightning_modules.rankers.base import Encoded, EncodedTexts, masked_mean
from metrics.isotropy import AvgCos, IsotropyIW, avg_cos_from_unit_sum, gram_matrix, isotropy_iw, unit_sum

SIDES = ((1, "query"), (2, "doc"))  # (index in a pair_batches entry, PairTokenizer side)
RANK_STRIDE = 1009  # rank r seeds its figure keys with seed + r * RANK_STRIDE: rank 0 draws what a single process does


class IsotropyCallback(Callback):
    def __init__(self, batch_size: int = 32, max_vectors: int = 20000, figure_vectors: int = 2000, seed: int = 0,
                 batch_pairs: int = 16, dump_dir: str | Path | None = None, max_batches: int | None = None,
                 sample_seed: int = 0):
        self.batch_size = batch_size
        self.max_vectors = max_vectors
        self.figure_vectors, self.seed = figure_vectors, seed
        self.batch_pairs = batch_pairs  # the `paper` protocol's test batch (eval.isotropy_batch_pairs); 0: no `paper`
        self.max_batches, self.sample_seed = max_batches, sample_seed  # eval.isotropy_max_batches / _sample_seed
        # the distinct texts of consecutive test batches are encoded once and kept until those batches are measured;
        # at most this many token vectors at a time (1.5 GB at d=384), so a split that fits is encoded exactly once
        self.group_vectors = 1_000_000
        self.dump_dir = Path(dump_dir) if dump_dir else None  # eval.dump_isotropy: <output_dir>/isotropy_batches
        self.sample: dict[str, dict[str, Tensor]] = {}  # the last measure()'s figure sample, per variant
        self._warned_rank_deficient = False

    @torch.inference_mode()
    def measure(self, trainer, module, split: str = "val") -> dict[str, float]:
        ranker = module.ranker
        self.sample = {}
        if ranker.kind != "bi":
            return {}
        has_head = ranker.token_head is not None or ranker.sequence_head is not None
        variants = ("", "_raw") if has_head else ("",)
        # the figure's sample: the same seeded keys at every validation, shared by both variants (paired tokens);
        # each DDP rank draws its own keys over its shard, and merged() keeps the smallest of all ranks
        rank = dist.get_rank() if _distributed() else 0
        keys = {kind: _KeptSample(self.figure_vectors, torch.Generator().manual_seed(self.seed + i + RANK_STRIDE * rank))
                for i, kind in enumerate(("tokens", "sequence"))} if has_head else {}
        metrics = {}
        for v in variants:
            metrics.update({
                f"iw{v}": IsotropyIW(max_vectors=self.max_vectors), f"avgcos{v}": AvgCos(),
                f"iw_sequence{v}": IsotropyIW(max_vectors=self.max_vectors), f"avgcos_sequence{v}": AvgCos(),
            })
        for m in metrics.values():
            m.to(module.device)
        tok = module.pair_tokenizer
        queries, docs = trainer.datamodule.probe_texts(split)
        was_training = ranker.training
        ranker.eval()
        for texts, tokenize, side in ((queries, tok.queries, "query"), (docs, tok.docs, "doc")):
            for s in range(0, len(texts), self.batch_size):
                batch = tokenize(texts[s : s + self.batch_size])
                ids, mask = (v.to(module.device) for v in batch.values())
                with trainer.precision_plugin.forward_context():
                    raw = ranker.token_representations(ids, mask, side=side)
                    encodings = {v: ranker.finish(raw, heads=(v == "")) for v in variants}
                vectors = {}
                for v, enc in encodings.items():
                    scored = ranker.scoring_vectors(enc.tokens.float())
                    tokens = scored[enc.mask]
                    seq = ranker.scoring_vectors(enc.sequence.float()) if enc.sequence is not None else masked_mean(scored, enc.mask)
                    metrics[f"iw{v}"].update(tokens)
                    metrics[f"avgcos{v}"].update(tokens)
                    metrics[f"iw_sequence{v}"].update(seq)
                    metrics[f"avgcos_sequence{v}"].update(seq)
                    vectors[v] = {"tokens": tokens, "sequence": seq}
                for kind, kept in keys.items():
                    kept.add({v: vectors[v][kind] for v in variants})
        ranker.train(was_training)
        # A DDP rank with no probe text (fewer probe texts than ranks) has seen no vectors, so its states have no
        # width and could not join the others' gathers of [n, d] states: the ranks agree on each metric's width
        # (max; one all-reduce, a no-op in one process) and give it an empty [0, d] update.
        widths = trainer.strategy.reduce(torch.tensor([m.width for m in metrics.values()], device=module.device), reduce_op="max")
        for m, width in zip(metrics.values(), widths.tolist()):
            if width:
                m.update(torch.zeros(0, width, device=module.device))
        for kind, kept in keys.items():
            for v, x in kept.merged().items():
                self.sample.setdefault(v, {})[kind] = x
        self._warn_rank_deficient(metrics["iw_sequence"], split)
        return {k: float(m.compute()) for k, m in metrics.items()}

    def _warn_rank_deficient(self, metric: IsotropyIW, split: str) -> None:
        """The probe's sequence set (one vector per probe text) is smaller than the dimension for most backbones
        (96 texts, 384 dimensions): W^T W is then rank-deficient and I(W) measures mostly its null space. Said
        once per run, loudly; the `paper` protocol is the one to compare with the isotropy paper."""
        local = sum(int(x.shape[0]) for x in metric.vectors) if isinstance(metric.vectors, list) else int(metric.vectors.shape[0])
        dim = int(metric.vectors[0].shape[1]) if isinstance(metric.vectors, list) and metric.vectors else 0
        n = torch.tensor([local], dtype=torch.long)
        if _distributed():
            n = n.to(metric.device)
            dist.all_reduce(n)
        if 0 < int(n) < dim and not self._warned_rank_deficient:
            self._warned_rank_deficient = True
            rank_zero_warn(f"isotropy probe ({split}): iw_sequence is computed from {int(n)} vectors in {dim} dimensions, "
                           f"so W^T W is rank-deficient; it is a training curve, not the isotropy paper's measure "
                           f"(that is iw_paper*, per test batch: docs/isotropy.md)")

    @torch.inference_mode()
    def measure_paper(self, trainer, module, split: str = "test") -> dict[str, float]:
        """The isotropy paper's protocol (Sec. 3.2, "averaging the metric values of the entire test batches"): I(W)
        (Eq. 3) and avgcos (Eq. 4) of each test batch of `batch_pairs` (query, passage) pairs, on the vectors as
        the scorer sees them (`scoring_vectors`, padding removed, uncentred), for the queries' vectors, the
        passages' and both together; then the mean and standard deviation over all batches. Token vectors always;
        pooled vectors (`_sequence`) where the ranker pools. Under DDP each rank measures its share of the batches
        and the per-batch values (not the vectors) are gathered, so the result equals one process's."""
        ranker = module.ranker
        if ranker.kind != "bi" or not hasattr(trainer.datamodule, "pair_batches"):
            return {}
        variants = ("", "_raw") if (ranker.token_head is not None or ranker.sequence_head is not None) else ("",)
        was_training = ranker.training
        ranker.eval()
        per_batch: list[tuple[int, dict[str, float]]] = []
        batches = trainer.datamodule.pair_batches(split, self.batch_pairs, self.max_batches, self.sample_seed)
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
                vectors = {}
                for name, texts in (("query", qtexts), ("passage", ptexts)):
                    rows = [row[name][t] for t in texts]
                    for v, enc in encoded[name].items():
                        vectors[(v, name, "")] = torch.cat([enc.tokens(r) for r in rows])
                        if enc.sequence is not None:
                            vectors[(v, name, "_sequence")] = enc.sequence[rows]
                per_batch.append((k, paper_batch_values(vectors)))
                if self.dump_dir is not None and split == "test":
                    dump_batch(self.dump_dir / f"{k}.npz", {f"{name}{kind}": x for (v, name, kind), x in vectors.items() if v == ""})
        ranker.train(was_training)
        if _distributed() and dist.get_world_size() > 1:
            parts: list = [None] * dist.get_world_size()
            dist.all_gather_object(parts, per_batch)
            per_batch = [b for part in parts for b in part]
        values = aggregate_batches([values for _, values in sorted(per_batch, key=lambda kv: kv[0])])
        values["isotropy_paper_batches"] = float(len(per_batch))  # how many test batches the means are over
        return values

    def _groups(self, batches: list, ids: dict[tuple[str, str], list[int]]) -> list[list]:
        """Consecutive runs of test batches whose distinct texts (`ids`: (side, text) -> token ids) hold at most
        `group_vectors` tokens together (a batch is never split; one larger than the budget is a group of its own)."""
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
        """{variant: the scored vectors of the texts tokenised as `ids` (the ranker's PairTokenizer), as an
        EncodedTexts, padding removed}: one backbone pass, finished with and without the heads, in length-sorted
        batches padded as evaluation pads them."""
        ranker, tok = module.ranker, module.pair_tokenizer
        parts: dict[str, list] = {v: [] for v in variants}
        lengths = np.zeros(len(ids), dtype=np.int64)
        order = length_order([len(x) for x in ids])
        for s in range(0, len(order), self.batch_size):
            chunk = order[s : s + self.batch_size]
            batch = tok.pad([ids[i] for i in chunk], side)
            input_ids, mask = (v.to(module.device) for v in batch.values())
            with trainer.precision_plugin.forward_context():
                raw = ranker.token_representations(input_ids, mask, side=side)
                encodings = {v: ranker.finish(raw, heads=(v == "")) for v in variants}
            for v, enc in encodings.items():
                seq = None if enc.sequence is None else ranker.scoring_vectors(enc.sequence.float()).float().cpu()
                parts[v].append((chunk, Encoded(ranker.scoring_vectors(enc.tokens.float()).float().cpu(), enc.mask.cpu(), seq)))
            lengths[chunk] = enc.mask.sum(1).cpu().numpy()
        return {v: EncodedTexts.collect(lengths, parts[v]) for v in variants}

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
        png = save_figure(cosine_figure(self.sample, values, title, name), Path(trainer.default_root_dir) / f"isotropy_{split}.png")
        logger = trainer.logger
        if logger is not None and hasattr(logger, "log_image"):  # W&B
            logger.log_image(key=f"{split}/isotropy_cosines", images=[str(png)], step=trainer.global_step)

    def on_validation_epoch_end(self, trainer, module) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, module, "val")

    def on_test_epoch_end(self, trainer, module) -> None:
        self._log(trainer, module, "test")


def paper_batch_values(vectors: dict[tuple[str, str, str], Tensor]) -> dict[str, float]:
    """I(W) and avgcos of one test batch: `vectors` {(variant, "query" | "passage", "" | "_sequence"): [n, d]} ->
    {iw_paper<side><kind><variant>: value, avgcos_paper...}, side "" (queries and passages concatenated), "_query"
    or "_passage"."""
    values = {}
    for v, kind in sorted({(v, kind) for v, _, kind in vectors}):
        q, p = (vectors[(v, name, kind)].to(torch.float64) for name in ("query", "passage"))
        # the queries-and-passages set's W^T W and unit-vector sum are the sums of the two sides' (the cost of a
        # batch is its three eigendecompositions and projections, not three Gram matrices)
        gram = {"_query": gram_matrix(q), "_passage": gram_matrix(p)}
        units = {"_query": unit_sum(q), "_passage": unit_sum(p)}
        gram[""] = gram["_query"] + gram["_passage"]
        units[""] = (units["_query"][0] + units["_passage"][0], units["_query"][1] + units["_passage"][1])
        for side, W in (("", torch.cat([q, p])), ("_query", q), ("_passage", p)):
            values[f"iw_paper{side}{kind}{v}"] = isotropy_iw(W, gram=gram[side])
            values[f"avgcos_paper{side}{kind}{v}"] = avg_cos_from_unit_sum(*units[side])
    return values


def aggregate_batches(batches: list[dict[str, float]]) -> dict[str, float]:
    """Mean over the test batches (the paper's number) and the standard deviation over them (`<key>_std`,
    population, ddof 0). A value a batch cannot define (avgcos of fewer than two non-zero vectors, e.g. the pooled
    query of a last batch of one pair) is left out of that key's mean and std."""
    out = {}
    for key in sorted({k for b in batches for k in b}):
        vals = np.array([b[key] for b in batches if key in b], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        out[key] = float(vals.mean()) if len(vals) else math.nan
        out[f"{key}_std"] = float(vals.std()) if len(vals) else math.nan
    return out


def dump_batch(path: Path, arrays: dict[str, Tensor]) -> None:
    """One test batch's vectors as scored (float32, padding removed) for recomputation: `eval.dump_isotropy`."""
    with atomic_open(path, "wb") as f:
        np.savez(f, **{k: x.numpy().astype(np.float32) for k, x in arrays.items()})


class _KeptSample:
    """A seeded uniform sample of at most `size` rows of a stream of batches: each row gets a random key and the
    rows with the smallest keys are kept, so the sample does not depend on the batch sizes and memory stays O(size).
    Several parallel streams (raw and head vectors of the same rows) share the keys and keep the same rows."""

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
        """The rows with the `size` smallest keys over every DDP rank's sample (in rank, then stream order): under
        DDP each rank sees only its shard of the probe texts, so the figure is drawn from all ranks' rows, like the
        numbers in its legend. Without DDP, this rank's rows. A collective: every rank must call it."""
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
    """cos(w_i, w_j) for the unordered pairs i < j of the rows of x (zero rows left out, as avgcos does)."""
    x = x.double()
    x = x[x.norm(dim=1) > 0]
    u = x / x.norm(dim=1, keepdim=True)
    i, j = torch.triu_indices(len(u), len(u), offset=1)
    return (u @ u.T)[i, j]


def cosine_figure(sample: dict[str, dict[str, Tensor]], values: dict[str, float], title: str, head: str = "head"):
    """Histograms of pairwise cosine similarities, raw ("Ft", `sample["_raw"]`) vs with the head (`sample[""]`), of
    token vectors and sequence vectors; `values` the callback's I(W) and avgcos (legend)."""
    import matplotlib  # lazy: heavy, only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only figures need it

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, kind, suffix, label in ((axes[0], "tokens", "", "token vectors"), (axes[1], "sequence", "_sequence", "sequence vectors")):
        bins = np.linspace(-1, 1, 81)
        for v, name, colour in (("_raw", "Ft", "tab:blue"), ("", f"Ft -> {head}", "tab:orange")):
            x = sample[v][kind]
            cos = pairwise_cosines(x).numpy()
            iw, avg = values.get(f"iw{suffix}{v}", float("nan")), values.get(f"avgcos{suffix}{v}", float("nan"))
            ax.hist(cos, bins=bins, density=True, alpha=0.5, color=colour, label=f"{name}: I(W) {iw:.3f}, avgcos {avg:.3f}")
        ax.set_xlabel("cosine similarity of a pair")
        ax.set_ylabel("density")
        ax.set_title(f"{label} ({len(x)} sampled)", fontsize=9)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return fig
