"""`batch_size: auto` for encoding (models/batch_fit.py, retrieval/encode.py): the rows that fit against a brute-force
search, the probe's line fitted back from a linear memory model, and the wiring: on the CPU `auto` makes exactly the
batches and vectors of 64; on a device with memory statistics (a stand-in here) the probes encode texts of the side's
maximum length and the collection is encoded in the batches the fit chose, with the vectors of that explicit size."""

import random

import numpy as np
import pytest
import torch

import retrieval.encode as encode_mod
from core.errors import InputError
from models import batch_fit
from models.batch_fit import ACCELERATOR_CAP, CPU_BATCH, MEMORY_SHARE, MULTIPLE, PROBE_ROWS, fit_batch, rows_that_fit
from models.loading import pair_tokenizer_for
from models.rankers.base import Encoded
from retrieval.encode import encode_docs, window_size

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def rankers(tiny_encoders):
    return tiny_encoders


def _docs(n: int, seed: int = 5) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"d{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for i in range(n)}


def _brute_rows(free, row, fixed, cap):
    """The largest n in [1, cap] (a multiple of 8 once >= 8) whose n texts fit in MEMORY_SHARE of free."""
    best = 1
    for n in range(1, cap + 1):
        if n >= MULTIPLE and n % MULTIPLE:
            continue
        if n * row + fixed <= MEMORY_SHARE * free:
            best = n
    return best


def test_rows_that_fit_equal_a_brute_force_search():
    rng = np.random.default_rng(0)
    for _ in range(300):
        row = float(rng.integers(1, 5000))
        fixed = float(rng.integers(0, 20000))
        free = int(rng.integers(1, 3_000_000))
        cap = int(rng.choice([1, 7, 64, 1024]))
        assert rows_that_fit(free, row, fixed, cap) == _brute_rows(free, row, fixed, cap), (free, row, fixed, cap)


class LinearMemory(batch_fit.DeviceMemory):
    """A device whose work allocates `fixed + rows * per_row` at its peak; `rows` read from what the work encoded."""

    def __init__(self, free: int, fixed: int, per_row: int, seen: list):
        self.free, self.fixed, self.per_row, self.seen = free, fixed, per_row, seen

    def free_bytes(self) -> int:
        return self.free

    def peak_bytes(self, work) -> int:
        before = len(self.seen)
        work()
        rows = sum(shape[0] for shape in self.seen[before:])
        return self.fixed + rows * self.per_row


def test_fit_recovers_the_per_text_and_fixed_cost_from_two_probes():
    seen = []

    def probe(rows):
        seen.append((rows,))

    mem = LinearMemory(free=10**9, fixed=30_000_000, per_row=2_000_000, seen=seen)
    fit = fit_batch(mem, probe)
    assert [s[0] for s in seen] == list(PROBE_ROWS)
    assert fit.row_bytes == pytest.approx(2e6) and fit.fixed_bytes == pytest.approx(3e7)
    assert fit.rows == _brute_rows(10**9, 2e6, 3e7, ACCELERATOR_CAP) == 232  # (5e8 - 3e7) / 2e6 = 235 -> 232
    assert "232 passages per batch (1.91 MiB a text" in fit.describe("passages")


def test_without_memory_statistics_auto_is_the_cpu_batch_and_nothing_is_probed():
    def probe(rows):
        raise AssertionError("probed")

    assert fit_batch(None, probe).rows == CPU_BATCH == 64
    assert batch_fit.memory_of(torch.device("cpu")) is None
    assert window_size("auto", None, torch.device("cpu")) == window_size(64, None) == 512


def _batches(ranker, docs, **kw):
    return list(encode_docs(ranker, pair_tokenizer_for(ranker), docs, device="cpu", **kw))


def _assert_same(got, want, exact=True):
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, a), (_, b) in zip(got, want):
        if isinstance(b, Encoded):
            assert torch.equal(a.mask, b.mask)
            a, b = a.tokens, b.tokens
        assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_auto_on_the_cpu_is_batches_of_64_exactly(rankers, name):
    docs = _docs(150)
    got = _batches(rankers[name], docs, batch_size="auto")
    assert [len(ids) for ids, _ in got][:2] == [64, 64]
    _assert_same(got, _batches(rankers[name], docs, batch_size=64))


@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_auto_with_memory_statistics_encodes_in_the_fitted_batches(rankers, name, monkeypatch, capsys):
    ranker = rankers[name]
    seen = []
    encode = ranker.encode

    def recording(input_ids, attention_mask, side):
        seen.append(tuple(input_ids.shape))
        return encode(input_ids, attention_mask, side=side)

    monkeypatch.setattr(ranker, "encode", recording)
    # 24 texts fit: (0.5 * 100,000 - 2,000) / 1,950 = 24.6 -> 24
    mem = LinearMemory(free=100_000, fixed=2_000, per_row=1_950, seen=seen)
    monkeypatch.setattr(encode_mod, "memory_of", lambda device: mem)
    docs = _docs(150)
    got = _batches(ranker, docs, batch_size="auto")
    longest = pair_tokenizer_for(ranker).doc_max_len
    assert seen[: len(PROBE_ROWS)] == [(n, longest) for n in PROBE_ROWS]  # the probes: the side's longest texts
    assert [len(ids) for ids, _ in got] == [24] * 6 + [6]  # one window (8 x the cap holds all 150), cut by 24
    assert "batch_size=auto on cpu: 24 passages per batch" in capsys.readouterr().err
    monkeypatch.setattr(ranker, "encode", encode)
    _assert_same(got, _batches(ranker, docs, batch_size=24, sort_window=8 * ACCELERATOR_CAP))


def test_encode_rejects_a_batch_size_that_is_neither_a_count_nor_auto(rankers):
    for bad in (0, "big", 2.5):
        with pytest.raises(InputError, match="batch_size"):
            _batches(rankers["repbert"], _docs(3), batch_size=bad)
