"""On-disk cache of a frozen ranker's representations, for post-hoc head training (isotropy paper Fig. 2b-c).

The paper's code re-encodes the training data with the frozen BERT in every flow epoch; the representations do not
change (the ranker is frozen), so here they are computed once, written to disk, and every epoch reads them back
memory-mapped. Only one tokenised batch is in memory while building, and the file is read lazily while training.

`granularity` decides what a row is (isotropy paper section 4.1.1):
- `token`: every non-padding token vector of every query and passage (ColBERT; RepBERT before pooling),
- `sequence`: one pooled vector per text (RepBERT's mean-pooled vector).
Vectors are the ranker's own representations with no head (`token_representations`, then `pool`).

On disk (a folder, written under a temporary name and renamed into place, so a crash never leaves a cache that
looks finished): `vectors.bin` (raw row-major float16 or float32) and `manifest.json` (count, dim, dtype,
granularity, text counts, and `key`: a digest of the checkpoint, granularity and texts; a cache with another key is
rebuilt, not reused).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from core.errors import InputError
from core.io import AtomicDir, write_json
from lightning_modules.encoding import encode_stream

DTYPES = {"float16": np.float16, "float32": np.float32}


def cache_key(checkpoint: str, granularity: str, queries: list[str], docs: list[str]) -> str:
    h = hashlib.sha256(f"{checkpoint}|{granularity}".encode())
    for tag, texts in ((b"Q", queries), (b"D", docs)):
        h.update(tag)
        for t in texts:
            b = t.encode("utf-8")
            h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()[:32]


@torch.inference_mode()
def _vectors(ranker, ids: torch.Tensor, mask: torch.Tensor, side: str, granularity: str) -> torch.Tensor:
    enc = ranker.token_representations(ids, mask, side=side)
    if granularity == "token":
        return enc.tokens[enc.mask]
    pooled = ranker.pool(enc).sequence
    if pooled is None:
        raise InputError("head.granularity", f"'sequence' needs a single-vector ranker; '{ranker.cfg.name}' scores token vectors (use 'token')")
    return pooled


class RepresentationCache:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.manifest = json.loads((self.path / "manifest.json").read_text())

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def vectors(self) -> np.memmap:
        """[count, dim], read-only and memory-mapped."""
        return np.memmap(self.path / "vectors.bin", dtype=DTYPES[self.manifest["dtype"]], mode="r", shape=(self.count, self.dim))

    @classmethod
    def build(cls, path: str | os.PathLike, ranker, pair_tokenizer, queries: list[str], docs: list[str], *,
              granularity: str = "token", dtype: str = "float16", checkpoint: str = "", batch_size: int = 64,
              autocast=None) -> "RepresentationCache":
        """Encode `queries` and `docs` once and write their vectors; reuse an existing cache with the same key."""
        if dtype not in DTYPES:
            raise InputError("head.cache_dtype", f"is '{dtype}'; expected one of {sorted(DTYPES)}")
        path = Path(path)
        key = cache_key(checkpoint, granularity, queries, docs)
        if (path / "manifest.json").is_file():
            cached = cls(path)
            if cached.manifest.get("key") == key:
                return cached
        # written into a temporary sibling and renamed into place: a crash leaves the old cache or none
        with AtomicDir(path, kind="a representation cache") as tmp:
            count, dim = 0, None
            device = next(ranker.parameters()).device
            pad_id = pair_tokenizer.tokenizer.pad_token_id
            with open(tmp / "vectors.bin", "wb") as f:
                for texts, side in ((queries, "query"), (docs, "doc")):
                    # in the texts' order (sort=False): the file's rows are the texts' vectors, text after text
                    stream = encode_stream(ranker, pair_tokenizer.ids(texts, side), side, batch_size=batch_size, pad_id=pad_id,
                                           forward=lambda i, m, side=side: _vectors(ranker, i, m, side, granularity),
                                           autocast=autocast or (lambda: torch.autocast(device.type, enabled=False)), sort=False)
                    for chunk, v in stream:
                        v = v.float().cpu().numpy().astype(DTYPES[dtype])
                        if not np.isfinite(v).all():
                            raise FloatingPointError(f"non-finite representation while caching (texts {chunk[0]}..{chunk[-1] + 1})")
                        f.write(np.ascontiguousarray(v).tobytes())
                        count, dim = count + len(v), v.shape[1]
                f.flush()
                os.fsync(f.fileno())
            write_json(tmp / "manifest.json", {"key": key, "count": count, "dim": dim, "dtype": dtype, "granularity": granularity,
                                               "checkpoint": checkpoint, "queries": len(queries), "docs": len(docs)})
        return cls(path)
