"""The isotropy paper's measurement protocol (`iw_paper*`, `avgcos_paper*`): I(W) and avgcos per test batch of
query-passage pairs, averaged over the batches. Checked against a float64 NumPy formula written from the paper
(Sec. 3.2, Eq. 3-4), recomputed from the vectors evaluate.py dumps with `eval.dump_isotropy=true`."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import job_args, run_script, small_run, synthetic_data

from callbacks.isotropy import IsotropyCallback, aggregate_batches, paper_batch_values

SMALL = job_args("evaluate.py", small_run("eval.ats_passages=0", eval_queries=6, depth=10))  # its evaluations


def iw_reference(W: np.ndarray) -> float:
    """Eq. 3: min_a Z(a) / max_a Z(a), Z(a) = sum_i exp(w_i . a), a over the eigenvectors of W^T W (uncentred),
    each eigenvector's sign fixed so that its largest-magnitude component is positive. Float64, NumPy only."""
    W = np.asarray(W, dtype=np.float64)
    _, E = np.linalg.eigh(W.T @ W)
    E = E * np.sign(E[np.argmax(np.abs(E), axis=0), np.arange(E.shape[1])])
    Z = np.exp(W @ E).sum(axis=0)
    return float(Z.min() / Z.max())


def avgcos_reference(W: np.ndarray) -> float:
    """Eq. 4: the mean cosine over the pairs i != j of non-zero rows, from the float64 Gram matrix of the unit rows
    (the dumps hold thousands of token vectors: a Python double loop over them took ~5 min)."""
    W = np.asarray(W, dtype=np.float64)
    W = W[np.linalg.norm(W, axis=1) > 0]
    n = len(W)
    if n < 2:
        return math.nan
    U = W / np.linalg.norm(W, axis=1, keepdims=True)
    G = U @ U.T
    return float((G.sum() - np.trace(G)) / (n * (n - 1)))


def avgcos_loop(W: np.ndarray) -> float:
    """Eq. 4 written as the paper's double sum, for small inputs: the check of avgcos_reference."""
    W = np.asarray(W, dtype=np.float64)
    W = W[np.linalg.norm(W, axis=1) > 0]
    total, n = 0.0, 0
    for i in range(len(W)):
        for j in range(len(W)):
            if i != j:
                total += W[i] @ W[j] / (np.linalg.norm(W[i]) * np.linalg.norm(W[j]))
                n += 1
    return total / n if n else math.nan


def iw_loop(W: np.ndarray) -> float:
    """Eq. 3 with Z(a) summed row by row, for small inputs: the check of iw_reference."""
    W = np.asarray(W, dtype=np.float64)
    _, E = np.linalg.eigh(W.T @ W)
    for j in range(E.shape[1]):
        if E[np.argmax(np.abs(E[:, j])), j] < 0:
            E[:, j] = -E[:, j]
    Z = [sum(math.exp(float(w @ E[:, j])) for w in W) for j in range(E.shape[1])]
    return min(Z) / max(Z)


def test_vectorised_references_match_the_loops():
    rng = np.random.default_rng(3)
    for shape, shift in (((7, 5), 0.3), ((30, 8), 0.0), ((12, 16), 1.0)):
        W = rng.normal(size=shape) + shift
        W[2] = 0.0  # a zero row (padding) is left out of avgcos
        assert avgcos_reference(W) == pytest.approx(avgcos_loop(W), abs=1e-12)
        assert iw_reference(W) == pytest.approx(iw_loop(W), abs=1e-12)
    assert math.isnan(avgcos_reference(np.ones((1, 3)))) and math.isnan(avgcos_loop(np.ones((1, 3))))


def test_batch_values_and_aggregate_match_the_formulas():
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(3):
        q, p = rng.normal(size=(7, 5)) + 0.3, rng.normal(size=(11, 5))
        vecs = {
            ("", "query", ""): torch.tensor(q, dtype=torch.float32),
            ("", "passage", ""): torch.tensor(p, dtype=torch.float32),
        }
        values = paper_batch_values(vecs)
        q32, p32 = q.astype(np.float32), p.astype(np.float32)
        assert values["iw_paper"] == pytest.approx(iw_reference(np.concatenate([q32, p32])), abs=1e-9)
        assert values["iw_paper_query"] == pytest.approx(iw_reference(q32), abs=1e-9)
        assert values["avgcos_paper_passage"] == pytest.approx(avgcos_reference(p32), abs=1e-9)
        batches.append(values)
    agg = aggregate_batches(batches)
    iws = [b["iw_paper"] for b in batches]
    assert agg["iw_paper"] == pytest.approx(np.mean(iws), abs=1e-12)
    assert agg["iw_paper_std"] == pytest.approx(np.std(iws), abs=1e-12)
    # a batch that cannot define a value (NaN) is left out of that key only
    agg = aggregate_batches([{"avgcos_paper": 0.5, "iw_paper": 0.1}, {"avgcos_paper": math.nan, "iw_paper": 0.3}])
    assert agg["avgcos_paper"] == 0.5 and agg["iw_paper"] == pytest.approx(0.2)


def _reference(dumps: list, model: str) -> dict[str, list[float]]:
    """The paper's formulas on each dumped test batch: {key: [value per batch]}."""
    ref = {
        k: []
        for k in (
            "iw_paper",
            "iw_paper_query",
            "iw_paper_passage",
            "avgcos_paper",
            "avgcos_paper_query",
            "avgcos_paper_passage",
        )
    }
    if model == "repbert":
        ref.update({"iw_paper_sequence": [], "avgcos_paper_passage_sequence": []})
    for path in dumps:
        z = np.load(path)
        q, p = z["query"], z["passage"]
        assert q.dtype == np.float32 and q.ndim == 2 and len(p) > 0
        assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)  # as scored: unit vectors, no padding rows
        ref["iw_paper"].append(iw_reference(np.concatenate([q, p])))
        ref["iw_paper_query"].append(iw_reference(q))
        ref["iw_paper_passage"].append(iw_reference(p))
        ref["avgcos_paper"].append(avgcos_reference(np.concatenate([q, p])))
        ref["avgcos_paper_query"].append(avgcos_reference(q))
        ref["avgcos_paper_passage"].append(avgcos_reference(p))
        if model == "repbert":
            qs, ps = z["query_sequence"], z["passage_sequence"]
            assert len(qs) == len(ps) <= 16
            ref["iw_paper_sequence"].append(iw_reference(np.concatenate([qs, ps])))
            ref["avgcos_paper_passage_sequence"].append(avgcos_reference(ps))
    return ref


def _assert_means(m: dict, ref: dict[str, list[float]]) -> None:
    for key, values in ref.items():
        values = np.array(values)
        values = values[np.isfinite(values)]
        assert m[key] == pytest.approx(values.mean(), abs=1e-6), key
        assert m[f"{key}_std"] == pytest.approx(values.std(), abs=1e-6), key


def _dumps(out) -> list:
    return sorted((out / "isotropy_batches").glob("*.npz"), key=lambda p: int(p.stem))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["colbert", "repbert"])
def test_paper_protocol_recomputed_from_the_dump(tmp_path, tiny_bert, model):
    """evaluate.py writes iw_paper* into metrics.json and, with eval.dump_isotropy=true, each test batch's scored
    vectors; the paper's formula on the dump gives the same numbers (1e-6)."""
    out = tmp_path / "eval"
    run_script(
        "evaluate.py",
        *SMALL,
        f"model={model}",
        f"model.backbone={tiny_bert}",
        "eval.isotropy_batch_pairs=16",
        "eval.dump_isotropy=true",
        f"output_dir={out}",
    )
    m = json.loads((out / "metrics.json").read_text())
    dumps = _dumps(out)
    assert [int(p.stem) for p in dumps] == list(range(len(dumps))) and len(dumps) >= 2
    assert m["isotropy_paper_batches"] == len(dumps)
    _assert_means(m, _reference(dumps, model))
    assert ("iw_paper_sequence" in m) == (model == "repbert")  # ColBERT does not pool
    assert "iw" in m and "iw_sequence" in m  # the probe protocol's keys keep their names


@pytest.mark.slow
def test_paper_protocol_on_a_sample_of_the_test_batches(tmp_path, tiny_bert):
    """eval.isotropy_max_batches=2: the means are over 2 of the test batches (the dump holds exactly those, and
    metrics.json says how many), recomputed from the dump with the paper's formula (1e-6)."""
    out = tmp_path / "eval"
    run_script(
        "evaluate.py",
        *SMALL,
        "model=colbert",
        f"model.backbone={tiny_bert}",
        "eval.isotropy_batch_pairs=8",
        "eval.isotropy_max_batches=2",
        "eval.dump_isotropy=true",
        f"output_dir={out}",
    )
    m = json.loads((out / "metrics.json").read_text())
    dumps = _dumps(out)
    assert len(dumps) == 2 and m["isotropy_paper_batches"] == 2
    assert max(int(p.stem) for p in dumps) < -(-6 * 10 // 8)  # k names a batch of the full list (6 queries x 10)
    _assert_means(m, _reference(dumps, "colbert"))


def test_groups_encode_each_distinct_text_once_within_the_budget():
    rng = np.random.default_rng(1)
    docs = [" ".join(["w"] * int(n)) + f" d{i}" for i, n in enumerate(rng.integers(1, 30, size=40))]
    batches = [(k, [f"q{k // 3}"] * 4, [docs[j] for j in rng.integers(0, 40, size=4)]) for k in range(30)]
    cb = IsotropyCallback()
    ids = {("doc", d): d.split() for d in docs} | {("query", b[1][0]): [b[1][0]] for b in batches}  # a token per word
    length = {x: len(v) for x, v in ids.items()}

    def distinct_tokens(group):
        return sum(
            length[x] for x in {(s, t) for b in group for s, texts in (("query", b[1]), ("doc", b[2])) for t in texts}
        )

    cb.group_vectors = 10**9  # the whole split fits: one group, every distinct text encoded once
    assert cb._groups(batches, ids) == [batches]
    for budget in (1, 60, 200):
        cb.group_vectors = budget
        groups = cb._groups(batches, ids)
        assert [b for g in groups for b in g] == batches  # consecutive, in order, each batch once
        for g in groups:  # within the budget, unless one batch alone exceeds it
            assert distinct_tokens(g) <= budget or len(g) == 1
        for g, nxt in zip(groups, groups[1:]):  # greedy: the next batch would not have fit
            assert distinct_tokens(g + nxt[:1]) > budget


def _pair_batches(dm, world: int, **kw) -> list:
    """pair_batches as the ranks of a world of `world` processes see them, concatenated in rank order."""
    out = []
    for rank in range(world):
        dm._rank_world = lambda r=rank: (r, world)
        out += dm.pair_batches("test", 4, **kw)
    del dm._rank_world
    return out


def test_a_batch_sample_is_the_same_for_every_run_seed_and_world_size(tmp_path):
    """eval.isotropy_max_batches: a uniform sample of K of the test batches, fixed by its own seed (every model and
    run seed measures the same batches), split by DDP ranks without overlap; each batch as the full list has it."""

    def module(seed):
        sizes = dict(num_docs=80, num_train_queries=10, num_val_queries=4, num_test_queries=12)
        return synthetic_data(tmp_path, seed, **sizes, num_topics=4, data_seed=3)

    dm = module(1)
    every = dm.pair_batches("test", 4)
    n = -(-len(dm.eval_splits["test"].pairs) // 4)
    assert [k for k, _, _ in every] == list(range(n)) and n > 20
    by_k = {k: (q, p) for k, q, p in every}
    sample = dm.pair_batches("test", 4, max_batches=7, sample_seed=0)
    ks = [k for k, _, _ in sample]
    assert len(ks) == 7 == len(set(ks)) and ks == sorted(ks)
    assert all(by_k[k] == (q, p) for k, q, p in sample)
    for world in (2, 3):  # the ranks' shares are the one-process sample, no batch twice
        assert sorted(_pair_batches(dm, world, max_batches=7, sample_seed=0)) == sorted(sample)
    assert _pair_batches(dm, 2) == sorted(_pair_batches(dm, 2), key=lambda b: b[0] % 2)  # no sample: k mod world
    assert module(2).pair_batches("test", 4, max_batches=7, sample_seed=0) == sample  # the run seed plays no part
    assert [k for k, _, _ in dm.pair_batches("test", 4, max_batches=7, sample_seed=1)] != ks
    assert dm.pair_batches("test", 4, max_batches=n + 5) == every
