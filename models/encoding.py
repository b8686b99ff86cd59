"""One encoder for every job: tokenised texts in, a bi-encoder's vectors out, batch by batch.

`encode_stream` is the loop that evaluation (`RankingModule.encode_texts`), the index builders
(retrieval/encode.py), the head representation cache (heads/cache.py), the isotropy callback and the analyses
(`encode_collection`) share:
- length-sorted batches (`length_order`: longest first, so a batch pads little), or the texts' own order
  (`sort=False`, for consumers whose result depends on it, e.g. a capped sample);
- on the ranker's device, under `torch.inference_mode()` and in eval mode (the ranker's mode is restored);
- under the caller's autocast (`autocast`: a factory of a context, e.g. the Lightning precision plugin's
  `forward_context`, or retrieval's bf16 / fp16);
- a batch that runs out of accelerator memory is retried in halves (models/oom.py); rows are
  independent at inference, so the result is the unsplit call's;
- pipelined (`encode_batches`, the loop itself): the next batches are prepared (padded; retrieval's windows also read
  and tokenised) on a background thread while the forward runs, and a batch is handed over once the next one's forward
  has started, so on CUDA the caller's copy to the host and its writes overlap the accelerator's work. The batches,
  their order and their vectors are those of a plain loop; only the timing differs.

`forward(input_ids, attention_mask)` says what a batch becomes: by default `ranker.encode` (heads applied);
`variants_forward` gives several readings of one backbone pass ("" with the isotropy heads, "_raw" without).

`EncodedTextsWriter` gathers such batches, arriving in any order, into an `EncodedTexts` without padding. It holds them
in memory up to `budget_bytes` and spills beyond that to a file (in `spill_dir`, unlinked as soon as it is created, so
nothing is left behind even if the process is killed), whose texts are read back by `pread`; so a collection larger than
memory needs disk, not RAM.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.background import background
from core.npy import NpyRowWriter
from core.progress import phase
from datamodules.tokenization import length_order
from models.oom import halving
from models.rankers.base import Encoded, EncodedTexts

__all__ = [
    "WITH_HEAD",
    "RAW",
    "encode_stream",
    "encode_batches",
    "batches",
    "variants_forward",
    "EncodedTextsWriter",
    "encode_collection",
    "eval_mode",
    "pad_batch",
]

WITH_HEAD, RAW = "", "_raw"  # the variants: with the isotropy heads ("Ft -> head"), without them ("Ft")
DEFAULT_BUDGET = 2**30  # bytes of vectors an EncodedTextsWriter keeps in memory before it spills to disk


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module):
    """Put `module` in eval mode (no dropout) inside the block, and restore its train / eval mode on leaving it."""
    was = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was)


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int, pin: bool = False) -> tuple[Tensor, Tensor]:
    """Return right-padded input ids and attention mask of `ids`, to the longest of them (int64 both).

    This is what `PairTokenizer.pad` gives for a right-padding tokenizer. One NumPy fill, not a copy per row (9 ms
    -> 1 ms for 256 passages); rows that are arrays (a token cache) are joined without a walk over their tokens. `pin`:
    in page-locked memory, for a non-blocking copy to CUDA. NumPy does the work, not torch, so a background thread
    padding the next batch starts no second OpenMP team beside the forward's.
    """
    n = len(ids)
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=n)
    width = int(lens.max(initial=0))
    real = np.arange(width) < lens[:, None]
    inp = torch.empty((n, width), dtype=torch.long, pin_memory=pin)
    att = torch.empty((n, width), dtype=torch.long, pin_memory=pin)
    flat = inp.numpy()
    flat.fill(pad_id)
    if n and isinstance(ids[0], np.ndarray):
        flat[real] = np.concatenate(ids)
    else:
        flat[real] = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lens.sum()))
    att.numpy()[...] = real
    return inp, att


def variants_forward(
    ranker, side: str, variants: Sequence[str] = (WITH_HEAD,)
) -> Callable[[Tensor, Tensor], dict[str, Encoded]]:
    """Build a `forward` for `encode_stream` that returns several readings of one backbone pass.

    One backbone pass (`token_representations`), finished once per variant (`WITH_HEAD`: token head, pooling,
    sequence head; `RAW`: pooling only), gives {variant: Encoded}.
    """

    def forward(input_ids: Tensor, attention_mask: Tensor) -> dict[str, Encoded]:
        raw = ranker.token_representations(input_ids, attention_mask, side=side)
        return {v: ranker.finish(raw, heads=(v == WITH_HEAD)) for v in variants}

    return forward


def batches(
    ids: Sequence[Sequence[int]], *, batch_size: int, pad_id: int, sort: bool = True, pin: bool = False
) -> Iterator[tuple[np.ndarray, Tensor, Tensor]]:
    """Yield (text indices into `ids`, padded input ids, attention mask) per batch of `batch_size` texts.

    Longest first (`length_order`) or in the texts' order (`sort=False`); `pin`: see `pad_batch`.
    """
    order = length_order([len(x) for x in ids]) if sort else np.arange(len(ids))
    for s in range(0, len(order), batch_size):
        chunk = order[s : s + batch_size]
        yield (chunk, *pad_batch([ids[i] for i in chunk], pad_id, pin))


def encode_stream(
    ranker,
    ids: Sequence[Sequence[int]],
    side: str,
    *,
    batch_size: int = 64,
    pad_id: int = 0,
    forward: Callable | None = None,
    autocast: Callable | None = None,
    sort: bool = True,
    on_retry: Callable[[int], None] | None = None,
    to_host: bool = False,
) -> Iterator[tuple[np.ndarray, object]]:
    """Encode texts batch by batch, yielding (the batch's text indices into `ids`, `forward`'s output for them).

    One pair per batch of `batch_size` texts; see the module docstring. `side`: "query" or "doc"; `ids`: token ids with
    special tokens, unpadded (lists, or arrays). The output stays on the ranker's device, as `forward` returns it, or
    comes to the CPU in float32 (`to_host`; see `encode_batches`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    pin = next(ranker.parameters()).device.type == "cuda"
    prepared = batches(ids, batch_size=batch_size, pad_id=pad_id, sort=sort, pin=pin)
    # padded on a thread, two batches ahead of the forward; one batch (a query being re-ranked) has nothing to overlap
    # and is spared the thread's start
    ahead = background(prepared, 2, name=f"encode-{side}") if len(ids) > batch_size else prepared
    with contextlib.closing(ahead) as ready:
        yield from encode_batches(
            ranker, ready, side, forward=forward, autocast=autocast, on_retry=on_retry, to_host=to_host
        )


def encode_batches(
    ranker,
    prepared: Iterable[tuple[object, Tensor, Tensor]],
    side: str,
    *,
    forward: Callable | None = None,
    autocast: Callable | None = None,
    on_retry: Callable[[int], None] | None = None,
    to_host: bool = False,
) -> Iterator[tuple[object, object]]:
    """Yield (key, `forward`'s output) for each (key, input ids, attention mask) of `prepared`: the one encoding loop.

    Batch k is handed to the caller only once batch k + 1's forward has been started, so on CUDA, where that call
    returns as soon as its kernels are queued, the accelerator computes batch k + 1 while the caller stores batch k.
    An exception from `prepared` or from batch k + 1's forward is raised after batch k has been yielded: where it was
    raised before the overlap. The callers make `prepared` on a background thread (core/background.py), so that
    reading, tokenising and padding the next batches overlap the forward too.

    `to_host`: every tensor of the output comes to the CPU, floating ones as float32. On CUDA the copy is
    non-blocking into page-locked memory, and the caller's thread waits for it (an event) only when it takes the
    batch. Default: the output stays on the ranker's device.
    """
    device = next(ranker.parameters()).device
    if forward is None:

        def forward(input_ids, attention_mask):
            return ranker.encode(input_ids, attention_mask, side=side)

    # the host knows whether a batch is padded (its mask is still on the host): told so, the backbone does not read
    # the mask back from the device to find out, a sync per batch (a ranker that can be told declares padding_known)
    told = getattr(ranker, "padding_known", None)

    def run(inp: Tensor, att: Tensor):
        padded = not bool(att.all()) if att.device.type == "cpu" else None
        batch = {"input_ids": inp.to(device, non_blocking=True), "attention_mask": att.to(device, non_blocking=True)}
        # entered per batch, not around the loop: a suspended generator must not leave inference mode, eval mode or
        # autocast switched on in its consumer's code
        with (
            torch.inference_mode(),
            eval_mode(ranker),
            autocast() if autocast is not None else contextlib.nullcontext(),
            told(padded) if told is not None else contextlib.nullcontext(),
        ):
            out = halving(
                lambda b: forward(b["input_ids"], b["attention_mask"]), batch, f"encoding {side} texts", on_retry
            )
        if not to_host:
            return out, None
        with torch.inference_mode():
            return _host_copy(out)

    pending, error = None, None
    source = iter(prepared)
    while True:
        try:
            key, inp, att = next(source)
            out, copied = run(inp, att)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001 - raised below, once the batch before it is out
            error = e
            break
        if pending is not None:
            yield _ready(*pending)
        pending = (key, out, copied)
    if pending is not None:
        yield _ready(*pending)
    if error is not None:
        raise error


def _map_tensors(fn: Callable[[Tensor], Tensor], out):
    """`out` (a tensor, an `Encoded` or a dict of them) with `fn` applied to each of its tensors."""
    if isinstance(out, dict):
        return {k: _map_tensors(fn, v) for k, v in out.items()}
    if isinstance(out, Encoded):
        seq = None if out.sequence is None else fn(out.sequence)
        return Encoded(tokens=fn(out.tokens), mask=fn(out.mask), sequence=seq)
    return fn(out)


def _host_copy(out) -> tuple[object, torch.cuda.Event | None]:
    """`out` on the CPU (floating tensors as float32), and the CUDA event that marks its copy done (None: no copy)."""
    copies = []

    def copy(t: Tensor) -> Tensor:
        t = t.detach()
        t = t.float() if t.is_floating_point() else t
        if t.device.type != "cuda":
            return t.cpu()
        copies.append(t.shape)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return host.copy_(t, non_blocking=True)

    host = _map_tensors(copy, out)
    if not copies:
        return host, None
    done = torch.cuda.Event()
    done.record()
    return host, done


def _ready(key, out, copied: torch.cuda.Event | None):
    if copied is not None:
        copied.synchronize()
    return key, out


class EncodedTextsWriter:
    """Gather `count` texts' vectors, added batch by batch in any order, into one `EncodedTexts` (float32, on the CPU).

    It holds each text's real tokens (its mask) flat, in the order they arrived (`starts` / `lengths` say where), and
    its pooled vector where there is one. `keep_tokens=False` keeps the pooled vectors only. Token rows stay in memory
    until they exceed `budget_bytes`; then they (and every later row) go to a .npy file in `spill_dir` (default: the
    system's temporary folder), unlinked at once and read back through the open file by `finish` (texts by pread, the
    whole also memory-mapped). The pooled vectors likewise: a memory-mapped file when `count` x width exceeds the
    budget. A text added twice keeps its last vectors.
    """

    def __init__(
        self,
        count: int,
        keep_tokens: bool = True,
        keep_ids: bool = False,
        budget_bytes: int = DEFAULT_BUDGET,
        spill_dir: str | os.PathLike | None = None,
    ):
        self.count, self.keep_tokens, self.keep_ids = int(count), keep_tokens, keep_ids
        self.budget, self.spill_dir = int(budget_bytes), spill_dir
        self.starts = np.zeros(self.count, dtype=np.int64)
        self.lengths = np.zeros(self.count, dtype=np.int64)
        self.rows = 0  # token rows written so far
        self._parts: list[Tensor] = []
        self._ids: list[Tensor] = []
        self._file: NpyRowWriter | None = None
        self._sequence: Tensor | None = None

    def _temp_path(self, suffix: str) -> Path:
        fd, name = tempfile.mkstemp(prefix="encoded-", suffix=suffix, dir=self.spill_dir)
        os.close(fd)
        return Path(name)

    def _spill(self, width: int) -> None:
        path = self._temp_path(".npy")
        self._file = NpyRowWriter(path, np.float32, width, readable=True)
        _unlink(path)  # written and read through the open file: nothing is left behind, however the process ends
        for part in self._parts:
            self._file.write(part.numpy())
        self._parts = []

    def add(self, rows, enc: Encoded, token_ids: Sequence[int] | None = None) -> None:
        """Add the vectors of texts `rows` (indices < count), given as one padded batch `enc` (any device and dtype).

        `token_ids`: the real tokens' vocabulary ids, flat in row order (the texts' unpadded ids, concatenated), kept
        when `keep_ids`.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if self.keep_tokens:
            mask = enc.mask.cpu()
            tokens = enc.tokens.detach().float().cpu()[mask]
            lengths = mask.sum(1).numpy()
            self.starts[rows] = self.rows + np.cumsum(lengths) - lengths
            self.lengths[rows] = lengths
            self.rows += len(tokens)
            if self._file is None and self.rows * tokens.shape[-1] * 4 > self.budget:
                self._spill(tokens.shape[-1])
            if self._file is not None:
                self._file.write(tokens.numpy())
            else:
                self._parts.append(tokens)
            if self.keep_ids:
                self._ids.append(torch.as_tensor(token_ids, dtype=torch.long))
        if enc.sequence is not None:
            seq = enc.sequence.detach().float().cpu()
            if self._sequence is None:
                self._sequence = self._zeros((self.count, seq.shape[-1]))
            self._sequence[torch.from_numpy(rows)] = seq

    def _zeros(self, shape: tuple[int, int]) -> Tensor:
        if shape[0] * shape[1] * 4 <= self.budget:
            return torch.zeros(shape)
        path = self._temp_path(".f32")
        mapped = np.memmap(path, dtype=np.float32, mode="w+", shape=shape)  # zero-filled, sparse on disk
        _unlink(path)
        return torch.from_numpy(mapped)  # the tensor keeps the mapping alive

    @property
    def nbytes(self) -> int:
        """Bytes of token vectors held so far (in memory or spilled)."""
        return self.rows * 4 * (self._parts[0].shape[-1] if self._parts else self._file.width if self._file else 0)

    def discard(self) -> None:
        """Drop everything held, the spill file included."""
        if self._file is not None:
            self._file.abort()
            _unlink(self._file.path)  # where the platform kept it (Windows)
            self._file = None
        self._parts, self._ids, self._sequence = [], [], None

    def finish(self) -> EncodedTexts:
        """Return everything added as one `EncodedTexts`; spilled token rows are read back through the open file."""
        reader = None
        if self._file is not None:
            # texts' rows are read back by pread (EncodedTexts.text_vectors / tokens); the copy-on-write map (writable
            # for torch, never written back) serves consumers of `vecs` as a whole
            reader = self._file.reader()
            vecs = torch.from_numpy(reader.memmap())
        elif self._parts:
            vecs = torch.cat(self._parts)
        else:
            vecs = torch.zeros((0, 0))
        ids = torch.cat(self._ids) if self.keep_ids and self._ids else None
        return EncodedTexts(vecs, self.starts, self.lengths, ids, self._sequence, rows_file=reader)


def _unlink(path: Path) -> None:
    # the mapping keeps the data; a platform that cannot unlink an open file (Windows) keeps it in the temp folder
    with contextlib.suppress(OSError):
        path.unlink()


def encode_collection(
    ranker,
    ids: Sequence[Sequence[int]],
    side: str,
    *,
    batch_size: int = 64,
    pad_id: int = 0,
    scoring: bool = True,
    keep_ids: bool = False,
    keep_tokens: bool = True,
    variants: Sequence[str] | None = None,
    autocast: Callable | None = None,
    budget_bytes: int = DEFAULT_BUDGET,
    spill_dir=None,
) -> EncodedTexts | dict[str, EncodedTexts]:
    """Encode tokenised texts (with [CLS]/[SEP]) by `encode_stream` into an `EncodedTexts` on the CPU.

    The vectors are kept as the score compares them (`scoring_vectors`), or as `encode` returns them (`scoring=False`:
    what the MLM head projects, vocabulary paper Eq. 3). `keep_tokens=False`: the pooled vectors only (single-vector
    rankers). `variants` (e.g. (WITH_HEAD, RAW)): {variant: EncodedTexts}, all from one backbone pass per batch.
    """
    prep = ranker.scoring_vectors if scoring else (lambda x: x)
    names = tuple(variants) if variants is not None else (WITH_HEAD,)
    forward = variants_forward(ranker, side, names) if variants is not None else None
    writers = {v: EncodedTextsWriter(len(ids), keep_tokens, keep_ids, budget_bytes, spill_dir) for v in names}
    unit = "queries" if side == "query" else "passages"
    with phase(f"encoding {len(ids):,} {unit}", total=len(ids), unit=unit, key=f"encoding {unit}") as ph:
        for chunk, out in encode_stream(
            ranker, ids, side, batch_size=batch_size, pad_id=pad_id, forward=forward, autocast=autocast
        ):
            encodings = out if variants is not None else {WITH_HEAD: out}
            token_ids = (
                [t for i in chunk for t in ids[i]] if keep_ids else None
            )  # the real tokens, as the writer keeps them
            for v, enc in encodings.items():
                seq = None if enc.sequence is None else prep(enc.sequence.float())
                writers[v].add(chunk, Encoded(prep(enc.tokens.float()), enc.mask, seq), token_ids)
            ph.advance(len(chunk))
    done = {v: w.finish() for v, w in writers.items()}
    return done if variants is not None else done[WITH_HEAD]
