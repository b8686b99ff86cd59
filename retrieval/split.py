"""The collection's encoding split across processes: each rank encodes a share, rank 0 merges.

An index build spends nearly all its time in the encoder, and the encoder's batches are independent, so N devices
encode a collection N times as fast. `split_encode` runs in every rank of the default process group (retrieval/
retrieve.py starts them with Lightning Fabric: `retrieval.devices=N`, or under `torchrun`):

1. The collection is cut into the windows that `encode_texts` length-sorts (`window_size`); rank r encodes windows
   r, r + N, r + 2N, ... (a collection with row access, the document store, reads only those rows; any other
   iterable is walked and the other ranks' windows skipped). Strided windows balance the ranks' work.
2. Each rank streams its batches to its own folder under `parts_dir`: the vectors as float32 rows (token vectors
   without padding, with each text's length), the ids, and a table (window, texts, rows) per batch.
3. All ranks agree that every share is complete (one all-reduce: a rank that failed says so instead of leaving the
   others waiting), then rank 0 reads the shares back, window by window, as the batches one process would have
   yielded (same ids, same order, same vectors), and the index is built from them exactly as from `encode_docs`.
   The other ranks return None. Rank 0 removes `parts_dir` when the merge ends, or fails.

The shares are on disk, not gathered through the process group: at MS MARCO size they are tens of GB, and a
file read back in order needs no memory beyond one batch.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
from collections.abc import Iterable, Iterator, Mapping, Sized
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from core.errors import InputError
from core.npy import NpyRowWriter
from core.progress import phase
from core.ranks import RankDied, RankStopped, as_rank_death
from models.loading import pair_tokenizer_for
from models.rankers.base import Encoded
from retrieval.encode import (
    check_encode_args,
    encode_windows,
    iter_items,
    largest_batch,
    resolve_device,
    window_size,
    windows,
)

__all__ = ["ranks", "split_encode", "ShareWriter", "read_shares", "share_windows", "drop_shares"]


def ranks() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share_windows(docs: Mapping | Iterable, window: int, rank: int, world: int) -> Iterator[tuple[int, list]]:
    """Yield (window number, [(id, text)]) of the windows of `window` items that rank `rank` of `world` encodes.

    Those are the windows numbered rank, rank + world, ... A collection with row access (`id_at` / `text_at` and a
    length: the document store) reads only its rows; any other collection is walked and the other windows skipped.
    """
    if hasattr(docs, "id_at") and hasattr(docs, "text_at") and hasattr(docs, "__len__"):
        n = len(docs)
        for w in range(rank, -(-n // window), world):
            yield w, [(docs.id_at(r), docs.text_at(r)) for r in range(w * window, min(n, (w + 1) * window))]
        return
    for w, items in enumerate(windows(iter_items(docs, "docs"), window)):
        if w % world == rank:
            yield w, items


def _share_phase(docs, window: int, rank: int, world: int):
    """Return the phase (core/progress.py) of this rank's encoding, counting its passages (shown on rank 0 only)."""
    if not isinstance(docs, Sized):
        return phase(f"encoding rank {rank}'s share of the collection", unit="passages", key="encoding a share")
    n = len(docs)
    share = sum(min(n, (w + 1) * window) - w * window for w in range(rank, -(-n // window), world))
    return phase(
        f"encoding {share:,} of {n:,} passages (rank {rank}'s share of {world})",
        total=share,
        unit="passages",
        key="encoding a share",
    )


class ShareWriter:
    """One rank's encoded batches, written to `folder`.

    The files: `vectors.npy` (float32 rows: pooled vectors, or the token vectors of each text without padding),
    `lengths.npy` (tokens: the texts' lengths), `ids.jsonl` (a batch's ids per line), `batches.npy` (int64
    [batches, 3]: window, texts, rows) and `done.json`, written last.
    """

    def __init__(self, folder: Path):
        shutil.rmtree(folder, ignore_errors=True)  # a failed earlier attempt's share
        folder.mkdir(parents=True)
        self.folder = folder
        self._vectors: NpyRowWriter | None = None
        self._ids = open(folder / "ids.jsonl", "w", encoding="utf-8")
        self._batches: list[tuple[int, int, int]] = []
        self._lengths: list[np.ndarray] = []
        self.kind: str | None = None

    def add(self, w: int, ids: list, out: Tensor | Encoded) -> None:
        """Append one batch of window `w`: its `ids` and their pooled vectors [B, D] or token vectors (Encoded)."""
        if isinstance(out, Encoded):
            kind, rows, lengths = "tokens", out.tokens[out.mask], out.mask.sum(1).numpy().astype(np.int64)
            self._lengths.append(lengths)
        else:
            kind, rows = "sequence", out
        if self._vectors is None:
            self.kind = kind
            self._vectors = NpyRowWriter(self.folder / "vectors.npy", np.float32, rows.shape[-1])
        self._vectors.write(rows.numpy())
        self._ids.write(json.dumps(list(ids)) + "\n")
        self._batches.append((w, len(ids), len(rows)))

    def finish(self) -> None:
        """Close the share: write `batches.npy` and `lengths.npy`, then `done.json`, which marks it complete."""
        self._ids.close()
        if self._vectors is not None:
            self._vectors.close()
        np.save(self.folder / "batches.npy", np.asarray(self._batches, dtype=np.int64).reshape(-1, 3))
        np.save(self.folder / "lengths.npy", np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64))
        (self.folder / "done.json").write_text(json.dumps({"kind": self.kind, "batches": len(self._batches)}))

    def abort(self) -> None:
        """Close the share's files after a failure; without `done.json` it never reads as complete."""
        self._ids.close()
        if self._vectors is not None:
            self._vectors.abort()


def _share_folder(parts_dir: Path, rank: int) -> Path:
    return parts_dir / f"rank-{rank}"


def read_shares(parts_dir: str | Path, world: int) -> Iterator[tuple[list, Tensor | Encoded]]:
    """Yield the batches of `world` ranks' shares in `parts_dir`, window by window, as `encode_docs` yields them.

    Each batch is (ids, vectors | Encoded); window w comes from rank w mod world. Reads each share front to back, one
    batch at a time. A missing or incomplete share, or a missing window, is an InputError.
    """
    parts_dir = Path(parts_dir)
    shares = []
    for r in range(world):
        folder = _share_folder(parts_dir, r)
        if not (folder / "done.json").is_file():
            raise InputError(str(folder), "is not a complete share of the split encoding (no done.json)")
        done = json.loads((folder / "done.json").read_text())
        shares.append((done["kind"], np.load(folder / "batches.npy"), np.load(folder / "lengths.npy"), folder))
    files = [
        (open(f / "vectors.npy", "rb") if b.size else None, open(f / "ids.jsonl", encoding="utf-8"))
        for _, b, _, f in shares
    ]
    try:
        for fv, _ in files:
            if fv is not None:
                np.lib.format.read_magic(fv)
                shape, _, _ = np.lib.format.read_array_header_1_0(fv)  # leaves the file at the first row
                width = shape[1]
        nxt, lpos = [0] * world, [0] * world
        w = 0
        while True:
            r = w % world
            kind, batches, lengths, _ = shares[r]
            if nxt[r] >= len(batches):
                if all(nxt[q] >= len(shares[q][1]) for q in range(world)):
                    return
                raise InputError(str(parts_dir), f"window {w} is missing from rank {r}'s share")
            while nxt[r] < len(batches) and batches[nxt[r], 0] == w:
                _, n_texts, n_rows = (int(x) for x in batches[nxt[r]])
                fv, fi = files[r]
                rows = torch.from_numpy(np.fromfile(fv, dtype=np.float32, count=n_rows * width).reshape(n_rows, width))
                ids = json.loads(fi.readline())
                if kind == "tokens":
                    lens = torch.from_numpy(lengths[lpos[r] : lpos[r] + n_texts])
                    lpos[r] += n_texts
                    mask = torch.arange(int(lens.max()) if n_texts else 0)[None, :] < lens[:, None]
                    tokens = torch.zeros((n_texts, mask.shape[1], width))
                    tokens[mask] = rows
                    yield ids, Encoded(tokens=tokens, mask=mask)
                else:
                    yield ids, rows
                nxt[r] += 1
            w += 1
    finally:
        for fv, fi in files:
            fi.close()
            if fv is not None:
                fv.close()


def _statuses(status: int) -> list[int]:
    """Every rank's status (an all-gather: a failed rank joins it too, so none waits forever).

    0: its share is in; 1: it failed and said why; 128 + signum: SIGINT / SIGTERM stopped it (only global rank 0
    speaks of signals, so rank 0 names it).
    """
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor([status], device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]


def _status_of(e: BaseException) -> int:
    signum = getattr(e, "signum", signal.SIGINT if isinstance(e, KeyboardInterrupt) else None)
    return 128 + int(signum) if signum is not None else 1


def split_encode(
    ranker,
    pair_tokenizer,
    docs: Mapping | Iterable,
    parts_dir: str | Path,
    *,
    batch_size: int | str = 64,
    device=None,
    precision: str = "fp32",
    sort_window: int | None = None,
    output: str = "auto",
) -> Iterator[tuple[list, Tensor | Encoded]] | None:
    """Encode this rank's share of `docs` into `parts_dir`; on rank 0, return an iterator over every rank's batches.

    The iterator yields them in one process's order (see the module docstring); the other ranks get None. Without a
    process group (or with one rank) the share is the whole collection. Call it on every rank.
    """
    check_encode_args(ranker, "docs", output, precision, batch_size)
    rank, world = ranks()
    pt = pair_tokenizer or pair_tokenizer_for(ranker)
    dev = resolve_device(ranker, device)
    window = window_size(batch_size, sort_window, dev)  # auto: the same on every rank (its ceiling, not its fit)
    parts_dir = Path(parts_dir)
    writer = None
    try:
        writer = ShareWriter(_share_folder(parts_dir, rank))
        with _share_phase(docs, window, rank, world) as ph:
            for w, ids, out in encode_windows(
                ranker,
                pt,
                share_windows(docs, window, rank, world),
                side="docs",
                batch_size=batch_size,
                device=dev,
                precision=precision,
                sort=window > largest_batch(batch_size, dev),
                output=output,
            ):
                writer.add(w, ids, out)
                ph.advance(len(ids))
        writer.finish()
    except BaseException as e:
        if writer is not None:
            writer.abort()
        dead = as_rank_death(e) if world > 1 else None
        if world > 1 and dead is None:  # a dead rank joins no all-gather
            with contextlib.suppress(RankDied, RuntimeError):  # the others stopped as well: this rank's own error
                _statuses(_status_of(e))
        drop_shares(parts_dir, rank, dead)
        raise
    try:
        statuses = [0] if world == 1 else _statuses(0)
    except BaseException as e:  # waiting for the others when one died
        drop_shares(parts_dir, rank, as_rank_death(e))
        raise
    failed = [(r, code) for r, code in enumerate(statuses) if code]
    if failed:
        drop_shares(parts_dir, rank, None)
        if rank == 0:
            other, code = failed[0]
            if code > 128:  # a signal to that rank alone: it says nothing itself (rank 0 speaks of signals)
                raise RankStopped(other, code - 128)
            raise InputError(
                "retrieval.devices",
                f"rank {other} failed while encoding its share of the collection; see its message above",
            )
        return None
    if rank != 0:
        return None
    return _merged(parts_dir, world)


def drop_shares(parts_dir: Path, rank: int, dead: RankDied | None) -> None:
    """Remove the shares after a failure: rank 0 does (they are its to merge), or, when rank 0 died, its survivors.

    Also for a failure before this rank began its share (retrieval/retrieve.py): another rank's may be there.
    """
    if rank == 0 or (dead is not None and dead.rank == 0):
        shutil.rmtree(parts_dir, ignore_errors=True)


def _merged(parts_dir: Path, world: int) -> Iterator[tuple[list, Tensor | Encoded]]:
    try:
        yield from read_shares(parts_dir, world)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
