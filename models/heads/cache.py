"""On-disk cache of a frozen ranker's representations, for post-hoc head training (isotropy paper Fig. 2b-c).

The paper's code re-encodes the training data with the frozen BERT in every flow epoch; the representations do not
change (the ranker is frozen), so here they are computed once, written to disk, and every epoch reads them back
memory-mapped. Only one window of vectors (`SORT_WINDOW`) is in memory while building, and the file is read lazily
while training.

`granularity` decides what a row is (isotropy paper section 4.1.1):
- `token`: every non-padding token vector of every query and passage (ColBERT; RepBERT before pooling),
- `sequence`: one pooled vector per text (RepBERT's mean-pooled vector).
Vectors are the ranker's own representations with no head (`token_representations`, then `pool`). They are encoded
in windows of `SORT_WINDOW` batches, each window's texts longest first (so a batch pads little: SQuAD paragraphs in
batches of texts' order pad about a quarter of their tokens), in one stream of batches, and each window is written
back in the texts' order while the next window's batches run.

On disk (a folder, written under a temporary name and renamed into place, so a crash never leaves a cache that
looks finished): `vectors.bin` (raw row-major float16 or float32) and `manifest.json` (count, dim, dtype,
granularity, text counts, bytes, the record of vectors.bin (core.digests: bytes, SHA-256, stat when written), `inputs`
and `key`, their digest). `inputs` is everything the vectors depend on (`cache_inputs`): the ranker's weights (a digest
of the checkpoint file, or of the state dict's tensors), the backbone's architecture (the SHA-256 of its config.json,
which every load reads from the backbone's folder: `backbone_digests`), the tokenizer (`tokenizer_digest`: vocabulary,
normaliser, special tokens), the maximum query and passage lengths, the precision of the encoding, the granularity, the
stored dtype and the texts. A cache whose inputs differ is rebuilt with a warning naming them (`built with another
tokenizer`), never reused. A cache with the right key is verified before it is reused (`RepresentationCache.problem`: a
readable manifest, the file's size against count x dim x dtype, its bytes against the record when its stat moved, every
value finite, scanned in chunks); one that fails is rebuilt, with a warning naming what was wrong. Nothing non-finite is
ever written into a cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from core.background import background
from core.digests import file_record, record_problem
from core.errors import InputError, TrainingStopped
from core.io import AtomicDir, write_json
from core.progress import phase
from datamodules.token_cache import texts_digest, tokenizer_digest
from models.encoding import batches, encode_batches
from models.rankers.backbone import backbone_digests

DTYPES = {"float16": np.float16, "float32": np.float32}
# batches of texts sorted by length together: a window's vectors wait in memory until its last batch (8 x 64 passages
# of 180 tokens at d=384: about 140 MB in float32)
SORT_WINDOW = 8


def cache_key(checkpoint: str, granularity: str, queries: list[str], docs: list[str]) -> str:
    """Return the digest that names a cache's folder: the checkpoint's path, the granularity and every text.

    What the vectors depend on beyond these (weights, tokenizer, lengths, precision) is checked from the manifest's
    `inputs` when the folder is read (`cache_inputs`): a folder of other inputs is rebuilt with a warning.
    """
    h = hashlib.sha256(f"{checkpoint}|{granularity}".encode())
    for tag, texts in ((b"Q", queries), (b"D", docs)):
        h.update(tag)
        for t in texts:
            b = t.encode("utf-8")
            h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()[:32]


def weights_digest(module: torch.nn.Module) -> str:
    """Return the SHA-256 of a module's state dict: every tensor's name, dtype, shape and bytes, in order."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# what each input is called in the warning of a cache built from other inputs (`it was built with other inputs (...)`)
_INPUT_NAMES = {
    "weights": "weights",
    "backbone": "backbone files",
    "tokenizer": "tokenizer",
    "query_max_len": "query length",
    "doc_max_len": "passage length",
    "precision": "precision",
    "granularity": "granularity",
    "dtype": "dtype",
    "texts": "texts",
}


def cache_inputs(
    ranker,
    pair_tokenizer,
    queries: list[str],
    docs: list[str],
    *,
    granularity: str,
    dtype: str,
    precision: str,
    weights: str | None = None,
    backbone: dict[str, str] | None = None,
) -> dict:
    """Return everything a cache's vectors depend on (module docstring).

    `weights`: the checkpoint file's digest (core.digests.input_digest); None: the ranker's state dict is hashed.
    `backbone`: the digests of the backbone's architecture files (`backbone_digests`, memoised by the caller); None:
    taken from `ranker.cfg.backbone` here.
    """
    return {
        "weights": weights or weights_digest(ranker),
        "backbone": backbone if backbone is not None else backbone_digests(ranker.cfg.backbone),
        "tokenizer": tokenizer_digest(pair_tokenizer.tokenizer),
        "query_max_len": int(pair_tokenizer.query_max_len),
        "doc_max_len": int(pair_tokenizer.doc_max_len),
        "precision": str(precision),
        "granularity": granularity,
        "dtype": dtype,
        "texts": texts_digest([("Q", q) for q in queries] + [("D", d) for d in docs]),
    }


def _differing(was: dict, inputs: dict) -> list[str]:
    """Name the inputs of `inputs` that differ from `was` (a manifest's), a backbone file by its name."""
    out = []
    for k, now in inputs.items():
        before = was.get(k)
        if before == now:
            continue
        if k == "backbone" and isinstance(before, dict):
            out += [f"backbone {n}" for n in sorted({*before, *now}) if before.get(n) != now.get(n)]
        else:
            out.append(_INPUT_NAMES[k])
    return out


def inputs_key(inputs: dict) -> str:
    """Return the digest of a cache's inputs (`cache_inputs`): the manifest's `key`."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


@torch.inference_mode()
def _vectors(ranker, ids: torch.Tensor, mask: torch.Tensor, side: str, granularity: str) -> dict[str, torch.Tensor]:
    """Return the batch's rows (`rows`: each text's non-padding token vectors, or its pooled vector), texts' counts."""
    enc = ranker.token_representations(ids, mask, side=side)
    if granularity == "token":
        return {"rows": enc.tokens[enc.mask], "counts": enc.mask.sum(1)}
    pooled = ranker.pool(enc).sequence
    if pooled is None:
        raise InputError(
            "head.granularity",
            f"'sequence' needs a single-vector ranker; '{ranker.cfg.name}' scores token vectors (use 'token')",
        )
    return {"rows": pooled, "counts": torch.ones(pooled.shape[0], dtype=torch.long)}


def _window_batches(ids: list, batch_size: int, pad_id: int, pin: bool):
    """Yield ((window start, text indices in the window), input ids, mask) per batch, each window longest first."""
    window = batch_size * SORT_WINDOW
    for start in range(0, len(ids), window):
        for chunk, inp, att in batches(ids[start : start + window], batch_size=batch_size, pad_id=pad_id, pin=pin):
            yield (start, chunk), inp, att


def _windows(stream, total: int, window: int, advance):
    """Yield (window start, its rows in its texts' order, each text's row count) per window of `_window_batches`.

    A window is yielded when the first batch of the next one comes: `encode_batches` has then queued the forward of
    the batch after it, so writing a window overlaps the accelerator's work. `advance(n)` after each batch of n.
    """
    current, rows, counts = None, [], np.zeros(0, dtype=np.int64)
    for (start, chunk), out in stream:
        if start != current:
            if current is not None:
                yield current, np.concatenate(rows), counts
            size = min(window, total - start)
            current, rows, counts = start, [np.empty((0, 0), np.float32)] * size, np.zeros(size, dtype=np.int64)
        n = out["counts"].numpy()
        counts[chunk] = n
        for i, piece in zip(chunk, np.split(out["rows"].numpy(), np.cumsum(n)[:-1])):
            rows[i] = piece
        advance(len(chunk))
    if current is not None:
        yield current, np.concatenate(rows), counts


class RepresentationCache:
    """A finished cache folder on disk (`vectors.bin` and `manifest.json`, see the module docstring).

    Opening one reads its manifest; `build` writes one (or reuses a valid one), `vectors` maps the rows for training.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.manifest = json.loads((self.path / "manifest.json").read_text())

    @property
    def count(self) -> int:
        """Number of cached vectors (rows of vectors.bin), from the manifest."""
        return int(self.manifest["count"])

    @property
    def dim(self) -> int:
        """Width of the cached vectors, from the manifest."""
        return int(self.manifest["dim"])

    def problem(self, key: str | None = None, chunk_bytes: int = 1 << 26) -> str | None:
        """Return what is wrong with the cache on disk ("" / None: nothing).

        Checked: its key (when given), the manifest's fields, the size of vectors.bin (count x dim x dtype), non-finite
        values (a chunked scan of the file), its bytes against the manifest's record when its stat moved.
        """
        m = self.manifest
        if key is not None and m.get("key") != key:
            return "its key differs"
        if not isinstance(m.get("vectors"), dict):
            return "its manifest has no record of vectors.bin (written by an earlier version)"
        try:
            count, dim, dtype = int(m["count"]), int(m["dim"]), DTYPES[m["dtype"]]
        except (KeyError, TypeError, ValueError):
            return "its manifest lacks count, dim or dtype"
        f = self.path / "vectors.bin"
        if not f.is_file():
            return "vectors.bin is missing"
        size, want = f.stat().st_size, count * dim * np.dtype(dtype).itemsize
        if size != want:
            return f"vectors.bin has {size} bytes; the manifest's {count} x {dim} {m['dtype']} vectors need {want}"
        if count == 0:
            return record_problem(f, m["vectors"])
        vecs = self.vectors()
        step = max(1, chunk_bytes // max(1, dim * np.dtype(dtype).itemsize))
        for s in range(0, count, step):
            block = np.asarray(vecs[s : s + step])
            bad = ~np.isfinite(block)
            if bad.any():
                return f"row {s + int(np.argmax(bad.any(axis=1)))} of vectors.bin holds non-finite values"
        try:  # its bytes against the record, when its (size, mtime, inode) moved since it was written
            return record_problem(f, m["vectors"])
        except (KeyError, TypeError):
            return "its manifest's record of vectors.bin lacks bytes or sha256"

    def vectors(self) -> np.memmap:
        """Return the cached vectors [count, dim], read-only and memory-mapped."""
        return np.memmap(
            self.path / "vectors.bin", dtype=DTYPES[self.manifest["dtype"]], mode="r", shape=(self.count, self.dim)
        )

    @classmethod
    def build(
        cls,
        path: str | os.PathLike,
        ranker,
        pair_tokenizer,
        queries: list[str],
        docs: list[str],
        *,
        granularity: str = "token",
        dtype: str = "float16",
        checkpoint: str = "",
        batch_size: int = 64,
        autocast=None,
        precision: str = "32-true",
        weights: str | None = None,
        backbone: dict[str, str] | None = None,
    ) -> RepresentationCache:
        """Encode `queries` and `docs` once and write their vectors; reuse an existing cache of the same inputs.

        `precision`: how `autocast` encodes (part of the key); `weights`: the checkpoint file's digest (else the
        ranker's state dict is hashed); `backbone`: its architecture files' digests (else taken here, unmemoised).
        """
        if dtype not in DTYPES:
            raise InputError("head.cache_dtype", f"is '{dtype}'; expected one of {sorted(DTYPES)}")
        path = Path(path)
        inputs = cache_inputs(
            ranker,
            pair_tokenizer,
            queries,
            docs,
            granularity=granularity,
            dtype=dtype,
            precision=precision,
            weights=weights,
            backbone=backbone,
        )
        key = inputs_key(inputs)
        if (path / "manifest.json").is_file():
            try:
                cached = cls(path)
            except (OSError, ValueError) as e:  # a truncated or garbled manifest.json
                cached, problem = None, f"its manifest.json is unreadable ({type(e).__name__})"
            else:
                if cached.manifest.get("key") == key:
                    problem = cached.problem()
                    if not problem:
                        return cached
                else:
                    was = cached.manifest.get("inputs")
                    was = was if isinstance(was, dict) else {}
                    differ = _differing(was, inputs) if was else []
                    problem = f"it was built with other inputs ({', '.join(differ) or 'written by an earlier version'})"
            warnings.warn(f"representation cache '{path}': {problem}; rebuilding it", stacklevel=2)
        # written into a temporary sibling and renamed into place: a crash leaves the old cache or none
        with AtomicDir(path, kind="a representation cache") as tmp:
            count, dim = 0, None
            device = next(ranker.parameters()).device
            pad_id = pair_tokenizer.tokenizer.pad_token_id
            with (
                phase(
                    f"encoding the representation cache ({len(queries):,} queries, {len(docs):,} passages)",
                    total=len(queries) + len(docs),
                    unit="texts",
                    key="encoding the representation cache",
                ) as ph,
                open(tmp / "vectors.bin", "wb") as f,
            ):
                for texts, side in ((queries, "query"), (docs, "doc")):
                    ids = pair_tokenizer.ids(texts, side)
                    window = batch_size * SORT_WINDOW
                    # padded on a thread, two batches ahead of the forward
                    ahead = background(
                        _window_batches(ids, batch_size, pad_id, device.type == "cuda"), 2, name=f"cache-{side}"
                    )
                    with contextlib.closing(ahead) as ready:
                        stream = encode_batches(
                            ranker,
                            ready,
                            side,
                            forward=lambda i, m, side=side: _vectors(ranker, i, m, side, granularity),
                            autocast=autocast or (lambda: torch.autocast(device.type, enabled=False)),
                            to_host=True,
                        )
                        for start, v, counts in _windows(stream, len(ids), window, ph.advance):
                            v = v.astype(DTYPES[dtype])
                            finite = np.isfinite(v).all(axis=1)
                            if not finite.all():
                                bad = int(np.argmin(finite))
                                first = start + int(np.searchsorted(np.cumsum(counts), bad, side="right"))
                                hint = (
                                    ""
                                    if dtype == "float32"
                                    else ", or beyond the range of " + dtype + ": try head.cache_dtype=float32"
                                )
                                raise TrainingStopped(
                                    f"the frozen ranker gives non-finite representations ({side} text {first}{hint}); "
                                    f"no representation cache written at '{path}'"
                                )
                            f.write(np.ascontiguousarray(v).tobytes())
                            count, dim = count + len(v), v.shape[1]
                f.flush()
                os.fsync(f.fileno())
            write_json(
                tmp / "manifest.json",
                {
                    "key": key,
                    "inputs": inputs,
                    "vectors": file_record(tmp / "vectors.bin"),
                    "count": count,
                    "dim": dim,
                    "dtype": dtype,
                    "granularity": granularity,
                    "checkpoint": checkpoint,
                    "queries": len(queries),
                    "docs": len(docs),
                    "bytes": count * (dim or 0) * np.dtype(DTYPES[dtype]).itemsize,
                },
            )
        return cls(path)
