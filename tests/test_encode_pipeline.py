"""The pipelined encoder (models/encoding.py `encode_batches`, retrieval/encode.py `encode_windows`,
core/background.py): the same batches and vectors as the serial loop it replaced (bench/bench_encode.py
`serial_windows`, exactly, on the CPU in fp32) and as each text encoded alone (to float rounding); `pad_batch` against
the row-by-row loop; errors on the background thread raised as themselves, after the batches before them; a consumer
that stops early leaves no thread behind."""

import random
import threading

import numpy as np
import pytest
import torch
from conftest import cpu_windows

from bench.bench_encode import loop_pad, serial_windows
from core.background import background
from core.errors import InputError
from datamodules.tokenization import PairTokenizer
from models.encoding import encode_stream, pad_batch
from models.loading import pair_tokenizer_for
from models.rankers.base import Encoded
from retrieval.encode import encode_docs, encode_windows, iter_items, window_size, windows
from retrieval.split import share_windows

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)]


DOCS = {f"d{i}": t for i, t in enumerate(_texts(61, 3))}  # in windows of 12: the last holds one text


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def rankers(tiny_encoders):
    return tiny_encoders


def _encoder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("encode-")]


def _windows(ranker, numbered, encoder=None, **kw):
    return list(cpu_windows(ranker, numbered, encoder, **kw))


def _assert_same_batches(got, want):
    assert [(w, ids) for w, ids, _ in got] == [(w, ids) for w, ids, _ in want]
    for (_, _, a), (_, _, b) in zip(got, want):
        if isinstance(b, Encoded):
            assert isinstance(a, Encoded) and a.sequence is None
            assert a.tokens.dtype == torch.float32 and torch.equal(a.mask, b.mask) and torch.equal(a.tokens, b.tokens)
        else:
            assert a.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("rows", ["lists", "arrays"])
@pytest.mark.parametrize("pad_id", [0, 7])
def test_pad_batch_equals_the_row_loop(rows, pad_id):
    """Random lengths (an empty row and a single row among them): ids, mask and dtype as the row-by-row loop gives."""
    rng = np.random.default_rng(pad_id)
    ids = [rng.integers(100, 30000, size=n).tolist() for n in [5, 0, 17, 1, 17, 3]]
    if rows == "arrays":
        ids = [np.asarray(x, dtype=np.int64) for x in ids]
    for batch in (ids, ids[1:2], ids[3:4], []):
        got, want = pad_batch(batch, pad_id), loop_pad(batch, pad_id)
        for g, w in zip(got, want):
            assert g.dtype == torch.long and g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("name,output", [("repbert", "sequence"), ("repbert", "tokens"), ("colbert", "auto")])
@pytest.mark.parametrize("sort", [True, False])
def test_pipeline_equals_the_serial_loop(rankers, name, output, sort):
    """Every window of DOCS: the same (window, ids) in the same order and the same float32 vectors, exactly."""
    ranker = rankers[name]
    numbered = lambda: enumerate(windows(iter_items(DOCS), 12))  # noqa: E731
    got = _windows(ranker, numbered(), output=output, sort=sort)
    _assert_same_batches(got, _windows(ranker, numbered(), serial_windows, output=output, sort=sort))
    assert len(got) == 16 and not _encoder_threads()  # five windows of 3 batches, the last window of one text


@pytest.mark.parametrize("world", [2, 3])
def test_a_ranks_share_is_its_windows_alone(rankers, world):
    """retrieval/split.py relies on it: each rank's windows come out in their order, batch for batch what the serial
    loop makes of those windows, and together the ranks' batches are one process's."""
    ranker = rankers["colbert"]
    window = window_size(4, 12)
    every = _windows(ranker, enumerate(windows(iter_items(DOCS), window)))
    shares = []
    for rank in range(world):
        got = _windows(ranker, share_windows(DOCS, window, rank, world))
        _assert_same_batches(got, _windows(ranker, share_windows(DOCS, window, rank, world), serial_windows))
        assert [w for w, _, _ in got] == sorted(w for w, _, _ in got)
        shares += got
    _assert_same_batches(sorted(shares, key=lambda b: b[0]), every)


@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_vectors_equal_each_text_encoded_alone(rankers, name):
    """An independent reference: `ranker.encode` of each text alone, unpadded (float rounding: the batch pads)."""
    ranker = rankers[name]
    pt = pair_tokenizer_for(ranker)
    seen = set()
    for ids, out in encode_docs(ranker, None, DOCS, batch_size=5, sort_window=15):
        for r, k in enumerate(ids):
            x = torch.tensor([pt.ids([DOCS[k]], "doc")[0]])
            with torch.inference_mode():
                alone = ranker.encode(x, torch.ones_like(x), side="doc")
            if name == "repbert":
                torch.testing.assert_close(out[r], alone.sequence[0], atol=1e-5, rtol=1e-5)
            else:
                n = int(out.mask[r].sum())
                assert n == x.shape[1] and not out.mask[r, n:].any()
                torch.testing.assert_close(out.tokens[r, :n], alone.tokens[0], atol=1e-5, rtol=1e-5)
            seen.add(k)
    assert seen == set(DOCS)


@pytest.mark.parametrize("to_host", [False, True])
def test_encode_stream_keeps_its_batches(rankers, to_host):
    """The shared encoder on tokenised texts: the batches of the length order, each as `ranker.encode` gives it for
    the row-loop's padded batch, exactly; stopped after one batch, it leaves no thread."""
    ranker = rankers["colbert"]
    pt = pair_tokenizer_for(ranker)
    ids = pt.ids(list(DOCS.values()), "doc")
    lengths = [len(x) for x in ids]
    got = list(encode_stream(ranker, ids, "doc", batch_size=8, pad_id=pt.tokenizer.pad_token_id, to_host=to_host))
    order = np.concatenate([chunk for chunk, _ in got])
    assert sorted(order.tolist()) == list(range(len(ids))) and np.all(np.diff([lengths[i] for i in order]) <= 0)
    for chunk, enc in got:
        inp, att = loop_pad([ids[i] for i in chunk], pt.tokenizer.pad_token_id)
        with torch.inference_mode():
            want = ranker.encode(inp, att, side="doc")
        assert torch.equal(enc.tokens, want.tokens) and torch.equal(enc.mask, want.mask)
    stopped = encode_stream(ranker, ids, "doc", batch_size=2, pad_id=pt.tokenizer.pad_token_id)
    next(stopped)
    _close_within(stopped)
    assert not _encoder_threads()


def test_pre_tokenised_texts_are_used_as_they_are(rankers):
    """A window may carry token ids instead of text (a token cache): the same batches as the texts give."""
    ranker = rankers["colbert"]
    pt = pair_tokenizer_for(ranker)
    items = list(DOCS.items())
    cached = [(k, pt.ids([t], "doc")[0] if i % 2 else t) for i, (k, t) in enumerate(items)]
    _assert_same_batches(
        _windows(ranker, enumerate(windows(cached, 12))), _windows(ranker, enumerate(windows(items, 12)))
    )


def _close_within(gen, seconds: float = 30.0) -> None:
    """Close `gen` on another thread; fail rather than hang if closing does not return."""
    closer = threading.Thread(target=gen.close)
    closer.start()
    closer.join(seconds)
    assert not closer.is_alive(), "closing the encoder hung"


def test_a_consumer_that_stops_early_stops_the_thread(rankers):
    """After one batch of many windows (the background thread a window ahead, waiting), closing the generator
    returns and leaves no encoder thread; breaking out of a loop (the generator collected) does the same."""
    ranker = rankers["repbert"]
    many = {f"x{i}": t for i, t in enumerate(_texts(400, 5))}
    gen = encode_docs(ranker, None, many, batch_size=2, sort_window=4)
    first = next(gen)
    assert len(first[0]) == 2 and _encoder_threads()
    _close_within(gen)
    assert not _encoder_threads()
    for _ in encode_docs(ranker, None, many, batch_size=2, sort_window=4):
        break
    assert not _encoder_threads()


def test_an_error_while_reading_surfaces_after_the_batches_before_it(rankers):
    """A bad item in the third window (read on the background thread): the first two windows' batches come out,
    then the same one-line InputError the serial loop raises, and no thread is left."""
    ranker = rankers["repbert"]
    items = list(DOCS.items())[:30] + [("bad", 42)] + list(DOCS.items())[30:]

    def run(encoder):
        got = []
        with pytest.raises(InputError) as err:
            numbered = enumerate(windows(iter_items(items), 12))
            for batch in cpu_windows(ranker, numbered, encoder, output="sequence"):
                got.append(batch)
        return got, str(err.value)

    (got, message), (want, want_message) = run(encode_windows), run(serial_windows)
    assert message == want_message and "\n" not in message and "'bad'" in message
    _assert_same_batches(got, want)
    assert {w for w, _, _ in got} == {0, 1} and not _encoder_threads()


def test_an_error_in_the_tokenizer_surfaces_as_itself(rankers, monkeypatch):
    """The tokenizer fails on the second window (on the background thread): the first window's batches, then that
    very exception."""
    ranker = rankers["colbert"]
    real, calls = PairTokenizer.ids, []

    def failing(self, texts, side):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise RuntimeError("tokenizer broke")
        return real(self, texts, side)

    monkeypatch.setattr(PairTokenizer, "ids", failing)
    got = []
    with pytest.raises(RuntimeError, match="^tokenizer broke$"):
        for batch in cpu_windows(ranker, enumerate(windows(iter_items(DOCS), 12))):
            got.append(batch)
    assert [w for w, _, _ in got] == [0, 0, 0] and not _encoder_threads()
    assert calls == ["encode-doc", "encode-doc"]  # tokenised on the background thread


def test_an_error_in_a_forward_comes_after_the_batch_before_it(rankers, monkeypatch):
    """The forward of the third batch fails: the first two batches are yielded, then its error (the pipeline runs
    batch k + 1's forward before handing out batch k, but not the error before batch k)."""
    ranker = rankers["repbert"]
    real, calls = type(ranker).encode, []

    def failing(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("forward broke")
        return real(self, *a, **k)

    monkeypatch.setattr(type(ranker), "encode", failing)
    gen = encode_docs(ranker, None, DOCS, batch_size=4, sort_window=12, output="sequence")
    assert len(next(gen)[0]) == 4 and len(next(gen)[0]) == 4
    with pytest.raises(ValueError, match="forward broke"):
        next(gen)
    assert not _encoder_threads()


def test_background_keeps_order_errors_and_stops():
    """core/background.py on its own: the items in order; an error after the items before it; closing while the
    producer waits `depth` items ahead returns at once and ends the thread, which made no more than that."""
    assert list(background(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield from range(5)
        raise KeyError("x")

    got = []
    with pytest.raises(KeyError):
        for item in background(failing(), depth=2, name="encode-test"):
            got.append(item)
    assert got == list(range(5))
    made = []

    def endless():
        while True:
            made.append(1)
            yield len(made)

    gen = background(endless(), depth=2, name="encode-test")
    assert next(gen) == 1
    _close_within(gen)
    assert not _encoder_threads() and len(made) <= 4
    with pytest.raises(ValueError, match="depth"):
        next(background([], depth=0))
