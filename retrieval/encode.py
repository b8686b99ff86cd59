"""Streaming encoders for full ranking: texts in, vectors out, one batch at a time.

`encode_docs` / `encode_queries` take any iterable of texts (a dict {id: text}, an iterable of (id, text) pairs,
or plain strings, whose ids are then their positions) and yield `(ids, output)` per batch. Only one window of raw
texts and their token ids (`sort_window` texts, default 8 batches) is held at a time, so a collection of any size
streams through in bounded memory.

Each window goes through the one encoder (models/encoding.py `encode_stream`): batches of similar token
length (longest first), which cuts padding; each batch carries its own ids, so order never matters to the caller.
`sort_window <= batch_size` keeps input order. The forward runs under `torch.inference_mode()`, in eval mode (the
ranker's mode is restored after each batch), optionally under bf16 autocast (`precision="bf16"`; weights stay
fp32), and a batch out of accelerator memory is retried in halves. The next windows are read and tokenised on a
background thread while the forward runs, and on CUDA each batch's copy to the host and the caller's work on it
overlap the next batch's forward (`encode_windows`); the batches are the same, in the same order.

Outputs, on the CPU in float32:
- single-vector rankers (RepBERT, BERT_DOT): the pooled vectors `[B, D]` exactly as `ranker.encode` returns them
  (not normalised: scoring-specific preparation is the index's job);
- multi-vector rankers (ColBERT): an `Encoded` with the token vectors `[B, L, D]` and the padding mask `[B, L]`.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Hashable, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch import Tensor

from core.background import background
from core.errors import InputError
from core.precision import warn_emulated_bf16
from datamodules.tokenization import PairTokenizer
from models.batch_fit import AUTO, BATCH, ceiling, fit_batch, memory_of
from models.encoding import batches, encode_batches
from models.loading import pair_tokenizer_for
from models.rankers import rankers_with
from models.rankers.base import BiEncoder, Encoded
from models.rankers.capabilities import capabilities_of

__all__ = [
    "PRECISIONS",
    "iter_items",
    "windows",
    "window_size",
    "largest_batch",
    "encode_windows",
    "encode_docs",
    "encode_queries",
    "encode_texts",
    "autocast",
    "resolve_device",
    "check_encode_args",
]

PRECISIONS = ("fp32", "bf16", "fp16")


def iter_items(texts: Mapping | Iterable, what: str = "docs") -> Iterator[tuple[Hashable, str]]:
    """(id, text) pairs from a dict, an iterable of pairs, or an iterable of strings (id = position).

    A text may also be given as its token ids, special tokens included (a NumPy array): a collection tokenised once.
    """
    it = texts.items() if isinstance(texts, Mapping) else texts
    for pos, item in enumerate(it):
        if isinstance(item, str):
            ident, text = pos, item
        else:
            try:
                ident, text = item
            except (TypeError, ValueError):
                raise InputError(
                    what, f"item {pos} is {type(item).__name__}; expected a text or an (id, text) pair"
                ) from None
        # a text, or its token ids with the special tokens (datamodules/tokenized.py's TokenizedCollection)
        if not isinstance(text, (str, np.ndarray)):
            raise InputError(what, f"text of '{ident}' is {type(text).__name__}; expected a string")
        yield ident, text


def windows(items: Iterable[tuple[Hashable, str]], size: int) -> Iterator[list[tuple[Hashable, str]]]:
    """Consecutive lists of `size` (id, text) items (the last may be shorter)."""
    window: list[tuple[Hashable, str]] = []
    for item in items:
        window.append(item)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


def autocast(device: torch.device, precision: str):
    """Return the autocast context for `precision` on `device` (fp32: a no-op context).

    fp16 needs a CUDA device; it and an unknown precision are InputErrors otherwise.
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        warn_emulated_bf16("precision", precision, device.type, "fp32")
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "fp16":
        if device.type != "cuda":
            raise InputError("precision", "fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
        return torch.autocast("cuda", dtype=torch.float16)
    raise InputError("precision", f"unknown precision '{precision}'; expected one of {list(PRECISIONS)}")


def resolve_device(ranker: torch.nn.Module, device: str | torch.device | None) -> torch.device:
    """`device`, or the ranker's own device when None. The ranker is moved there when it is elsewhere."""
    current = next(ranker.parameters()).device
    if device is None:
        return current
    dev = torch.device(device)
    if dev != current and not (dev.type == current.type and dev.index is None):
        ranker.to(dev)
    return next(ranker.parameters()).device


def _check_ranker(ranker) -> None:
    if capabilities_of(ranker).vectors == "none":
        name = getattr(getattr(ranker, "cfg", None), "name", type(ranker).__name__)
        indexed = ", ".join(rankers_with(lambda c: c.index is not None))
        raise InputError(
            "model.name",
            f"'{name}' is not a bi-encoder; full ranking needs separately encoded passages ({indexed})",
        )


def check_encode_args(ranker, side: str, output: str, precision: str, batch_size: int) -> None:
    """Check the arguments of `encode_texts` (and of a split encoding) before any text is read."""
    _check_ranker(ranker)
    if side not in ("docs", "queries"):
        raise ValueError(f"side must be 'docs' or 'queries', got {side!r}")
    if output not in ("auto", "sequence", "tokens"):
        raise ValueError(f"output must be 'auto', 'sequence' or 'tokens', got {output!r}")
    if precision not in PRECISIONS:
        raise InputError("precision", f"unknown precision '{precision}'; expected one of {list(PRECISIONS)}")
    if batch_size not in BATCH:
        raise InputError("batch_size", f"is {batch_size!r}; expected a positive integer or '{AUTO}'")


def encode_texts(
    ranker: BiEncoder,
    pair_tokenizer: PairTokenizer | None,
    texts: Mapping | Iterable,
    *,
    side: str = "docs",
    batch_size: int | str = 64,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    sort_window: int | None = None,
    output: str = "auto",
) -> Iterator[tuple[list, Tensor | Encoded]]:
    """Yield (ids, vectors [B, D] | Encoded) per batch; see the module docstring.

    `side`: "docs" or "queries". `output`: "auto" (pooled vectors when the ranker pools, else token vectors),
    "sequence" or "tokens". `batch_size`: texts per batch, or "auto" (models/batch_fit.py: as many as the device's
    memory allows; 64 on the CPU).
    """
    check_encode_args(ranker, side, output, precision, batch_size)
    pt = pair_tokenizer or pair_tokenizer_for(ranker)
    dev = resolve_device(ranker, device)
    window = window_size(batch_size, sort_window, dev)
    for _, ids, out in encode_windows(
        ranker,
        pt,
        enumerate(windows(iter_items(texts, side), window)),
        side=side,
        batch_size=batch_size,
        device=dev,
        precision=precision,
        sort=window > largest_batch(batch_size, dev),
        output=output,
    ):
        yield ids, out


def largest_batch(batch_size: int | str, device: torch.device | None = None) -> int:
    """Return the most texts a batch of `batch_size` holds on `device`: the number, or auto's ceiling there."""
    if batch_size == AUTO:
        return ceiling(memory_of(device if device is not None else torch.device("cpu")))
    return int(batch_size)


def window_size(batch_size: int | str, sort_window: int | None, device: torch.device | None = None) -> int:
    """Texts per length-sorting window: `sort_window`, at least one batch; default 8 batches.

    With `batch_size="auto"` a batch is auto's ceiling on `device` (set by the device's kind, not its free memory), so
    every process of a split encoding cuts the same windows.
    """
    largest = largest_batch(batch_size, device)
    return 8 * largest if sort_window is None else max(int(sort_window), largest)


def encode_windows(
    ranker: BiEncoder,
    pt: PairTokenizer,
    numbered: Iterable[tuple[int, list[tuple[Hashable, object]]]],
    *,
    side: str,
    batch_size: int | str,
    device: torch.device,
    precision: str,
    sort: bool,
    output: str,
) -> Iterator[tuple[int, list, Tensor | Encoded]]:
    """Yield (window number, ids, vectors | Encoded) per batch of the numbered windows of (id, text) items.

    Each window goes through the one encoder (models/encoding.py): length-sorted batches (`sort`), eval and
    inference mode, autocast, out-of-memory halving. A window's batches depend on that window alone, so a rank that
    encodes every other window (retrieval/split.py) makes exactly the batches one process makes of them.

    The windows are read, tokenised and padded on a background thread, one window ahead of the forward; an item's text
    may also be its token ids already (special tokens included; a token cache), which are used as they are. Only the
    wanted output comes to the host (`encode_batches`' `to_host`: on CUDA, overlapped with the next forward).
    `batch_size="auto"`: chosen here, before the first window is read (models/batch_fit.py).
    """
    ranker_side = "doc" if side == "docs" else "query"
    pin = device.type == "cuda"

    def prepared():  # on a background thread, a window ahead of the forward: read, tokenise, pad
        for w, items in numbered:
            ids = _token_ids(pt, [t for _, t in items], ranker_side)
            padded = batches(ids, batch_size=batch_size, pad_id=pt.tokenizer.pad_token_id, sort=sort, pin=pin)
            yield [((w, [items[i][0] for i in chunk]), inp, att) for chunk, inp, att in padded]

    def forward(input_ids: Tensor, attention_mask: Tensor) -> Tensor | Encoded:
        enc = ranker.encode(input_ids, attention_mask, side=ranker_side)
        want = output if output != "auto" else ("sequence" if enc.sequence is not None else "tokens")
        if want == "sequence":
            if enc.sequence is None:
                raise InputError("output", f"ranker '{ranker.cfg.name}' has no pooled vector; use output='tokens'")
            return enc.sequence
        # the pooled vector stays behind: only what the caller takes is copied to the host
        return Encoded(tokens=enc.tokens, mask=enc.mask)

    if batch_size == AUTO:
        batch_size = _fit(ranker, pt, side, device, forward, lambda: autocast(device, precision))

    with (
        contextlib.closing(background(prepared(), 1, name=f"encode-{ranker_side}")) as ready,
        contextlib.closing(
            encode_batches(
                ranker,
                itertools.chain.from_iterable(ready),
                ranker_side,
                forward=forward,
                autocast=lambda: autocast(device, precision),
                to_host=True,
            )
        ) as stream,
    ):
        for (w, ids), out in stream:
            yield w, ids, out


def _fit(ranker, pt: PairTokenizer, side: str, device: torch.device, forward, amp) -> int:
    """Return auto's batch size for `side` on `device` (models/batch_fit.py), said on stderr when it was measured.

    Each process of a split encoding says its own: the device's free memory sets it.
    """
    ranker_side = "doc" if side == "docs" else "query"
    length = pt.query_max_len if ranker_side == "query" else pt.doc_max_len
    pin = device.type == "cuda"

    def probe(rows: int) -> None:  # `rows` texts of the side's longest, encoded as the real batches are
        inp = torch.full((rows, length), pt.tokenizer.pad_token_id or 0, dtype=torch.long, pin_memory=pin)
        att = torch.ones((rows, length), dtype=torch.long, pin_memory=pin)
        for _ in encode_batches(ranker, [(None, inp, att)], ranker_side, forward=forward, autocast=amp, to_host=True):
            pass

    fit = fit_batch(memory_of(device), probe)
    if fit.row_bytes is not None:
        print(
            f"batch_size=auto on {device}: {fit.describe('passages' if side == 'docs' else 'queries')}",
            file=sys.stderr,
            flush=True,
        )
    return fit.rows


def _token_ids(pt: PairTokenizer, texts: list, side: str) -> list:
    """Return the token ids of a window's texts: strings tokenised (in one call), token ids kept as they are."""
    raw = [k for k, t in enumerate(texts) if isinstance(t, str)]
    if len(raw) == len(texts):
        return pt.ids(texts, side)
    ids = list(texts)
    for k, x in zip(raw, pt.ids([texts[k] for k in raw], side)):
        ids[k] = x
    return ids


def encode_docs(
    ranker, pair_tokenizer, texts_iterable, batch_size: int | str = 64, device=None, precision: str = "fp32", **kw
):
    """Encode passages, streamed: iterator of (ids, vectors [B, D] or Encoded). See `encode_texts`."""
    return encode_texts(
        ranker,
        pair_tokenizer,
        texts_iterable,
        side="docs",
        batch_size=batch_size,
        device=device,
        precision=precision,
        **kw,
    )


def encode_queries(
    ranker, pair_tokenizer, texts_iterable, batch_size: int | str = 64, device=None, precision: str = "fp32", **kw
):
    """Encode queries, streamed: iterator of (ids, vectors [B, D] or Encoded). See `encode_texts`."""
    return encode_texts(
        ranker,
        pair_tokenizer,
        texts_iterable,
        side="queries",
        batch_size=batch_size,
        device=device,
        precision=precision,
        **kw,
    )
