"""k-fold cross-validation over query sets (datamodules/folds.py, data.num_folds / data.fold / data.fold_seed)."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, shared_data

from core.errors import InputError
from datamodules.corpus import IRDataset, Split
from datamodules.folds import apply_folds, assign_folds, fold_roles
from datamodules.sources import load_dataset
from datamodules.sources.classic import CranfieldConfig
from datamodules.sources.squad import SquadConfig
from datamodules.sources.synthetic import SyntheticConfig
from datamodules.sources.tsv import TsvConfig

SMALL_SYN = dict(num_docs=120, num_train_queries=30, num_val_queries=7, num_test_queries=13, num_topics=6, data_seed=5)


def qsets(ds):
    return {name: set(s.queries) for name, s in ds.splits.items()}


def check_cover(cfg_of, k):
    """Over f = 0..k-1: splits disjoint, their union the pooled judged set, every query in exactly one test fold."""
    tests, pooled = [], None
    for f in range(k):
        ds = load_dataset(cfg_of(f), 0)
        s = qsets(ds)
        assert not (s["train"] & s["val"]) and not (s["train"] & s["test"]) and not (s["val"] & s["test"])
        union = s["train"] | s["val"] | s["test"]
        pooled = union if pooled is None else pooled
        assert union == pooled
        assert all(s[n] for n in ("train", "val", "test"))
        for name, split in ds.splits.items():
            assert set(split.qrels) == s[name] and all(any(g > 0 for g in d.values()) for d in split.qrels.values())
        tests.append(s["test"])
    assert sum(len(t) for t in tests) == len(pooled)
    assert set().union(*tests) == pooled
    return tests, pooled


def test_roles():
    assert fold_roles(0, 5) == {"train": [2, 3, 4], "val": [1], "test": [0]}
    assert fold_roles(4, 5) == {"train": [1, 2, 3], "val": [0], "test": [4]}
    assert fold_roles(2, 3) == {"train": [1], "val": [0], "test": [2]}


def test_assignment_balanced_deterministic_and_order_free():
    qids = [f"q{i}" for i in range(103)]
    a = assign_folds(qids, 5, 13)
    assert a == assign_folds(list(reversed(qids)), 5, 13)  # input order plays no part
    sizes = [sum(1 for f in a.values() if f == i) for i in range(5)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103
    assert a != assign_folds(qids, 5, 14)  # fold_seed matters
    # groups stay together
    groups = {q: f"g{int(q[1:]) // 4}" for q in qids}
    g = assign_folds(qids, 5, 13, groups)
    for q in qids:
        assert all(g[o] == g[q] for o in qids if groups[o] == groups[q])


def test_synthetic_folds_cover_every_query_once():
    tests, pooled = check_cover(lambda f: SyntheticConfig(**SMALL_SYN, num_folds=5, fold=f), 5)
    assert len(pooled) == 50  # 30 + 7 + 13 synthetic queries, all judged
    assert sorted(len(t) for t in tests) == [10] * 5
    ds = load_dataset(SyntheticConfig(**SMALL_SYN, num_folds=5, fold=0), 0)
    assert [len(ds.splits[n].queries) for n in ("train", "val", "test")] == [30, 10, 10]


@pytest.mark.slow
def test_fold_assignment_independent_of_run_seed_and_stable_across_processes():
    cfg = SyntheticConfig(**SMALL_SYN, num_folds=5, fold=2)
    a, b = load_dataset(cfg, 0), load_dataset(cfg, 123)  # data_seed fixed: same collection, same folds
    assert qsets(a) == qsets(b)
    code = (
        "from datamodules.sources import load_dataset; from datamodules.sources.synthetic import SyntheticConfig;"
        f"ds = load_dataset(SyntheticConfig(**{SMALL_SYN!r}, num_folds=5, fold=2), 0);"
        "print(sorted(ds.splits['test'].queries))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        # another hash seed; the tests' cache folder (conftest.py), as every process a test starts has it
        env={"PYTHONHASHSEED": "777", "PATH": "", "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]},
    ).stdout
    assert out.strip() == str(sorted(a.splits["test"].queries))
    c = load_dataset(SyntheticConfig(**SMALL_SYN, num_folds=5, fold=2, fold_seed=99), 0)
    assert qsets(c) != qsets(a)


@pytest.mark.data("cranfield")
def test_cranfield_folds():
    path = str(shared_data("cranfield"))
    plain = load_dataset(CranfieldConfig(path=path), 0)
    judged = set().union(*qsets(plain).values())
    tests, pooled = check_cover(lambda f: CranfieldConfig(path=path, num_folds=5, fold=f), 5)
    assert pooled == judged
    ds = load_dataset(CranfieldConfig(path=path, num_folds=5, fold=1), 0)
    assert ds.docs == plain.docs


@pytest.mark.data("squad_v1.1_dev/dev-v1.1.json.gz")
def test_squad_folds_keep_articles_apart():
    path = str(shared_data("squad_v1.1_dev", "dev-v1.1.json.gz"))
    tests, pooled = check_cover(lambda f: SquadConfig(path=path, num_folds=5, fold=f), 5)
    ds = load_dataset(SquadConfig(path=path, num_folds=5, fold=0), 0)
    arts = {n: {d.split("-")[0] for q in s.qrels for d in s.qrels[q]} for n, s in ds.splits.items()}
    assert not (arts["train"] & arts["test"]) and not (arts["val"] & arts["test"]) and not (arts["train"] & arts["val"])
    assert all(len(t) > 1000 for t in tests)  # 10,570 questions in 5 about-even folds


def test_bad_fold_keys():
    with pytest.raises(InputError, match="data.num_folds"):
        load_dataset(SyntheticConfig(**SMALL_SYN, num_folds=2), 0)
    with pytest.raises(InputError, match="data.fold"):
        load_dataset(SyntheticConfig(**SMALL_SYN, num_folds=5, fold=5), 0)
    with pytest.raises(InputError, match="data.fold.*num_folds is null"):
        load_dataset(SyntheticConfig(**SMALL_SYN, fold=1), 0)
    with pytest.raises(InputError, match="data.fold_seed.*num_folds is null"):  # it would assign nothing
        load_dataset(SyntheticConfig(**SMALL_SYN, fold_seed=14), 0)
    with pytest.raises(InputError, match="data.num_folds.*only 50"):
        load_dataset(SyntheticConfig(**SMALL_SYN, num_folds=51), 0)


def test_triples_or_candidates_refuse_folds():
    docs = {"d1": "alpha", "d2": "beta", "d3": "gamma"}
    for kw in ({"triples": [("q1", "d1", "d2")]}, {"candidates": {"q1": ["d1", "d2"]}}):
        splits = {
            n: Split(queries={f"q{i}": "x"}, qrels={f"q{i}": {"d1": 1}})
            for i, n in enumerate(("train", "val", "test"), 1)
        }
        for k, v in kw.items():
            setattr(splits["train"], k, v)
        with pytest.raises(InputError, match=r"^data.num_folds: .*source 'tsv' gives"):
            apply_folds(IRDataset("x", docs, splits), 3, 0, 13, source="tsv")


def test_tsv_with_triples_and_folds_is_one_line_error(tmp_path):
    (tmp_path / "collection.tsv").write_text("d1\talpha beta\nd2\tgamma delta\nd3\tepsilon\n")
    (tmp_path / "q.tsv").write_text("q1\talpha\nq2\tgamma\nq3\tepsilon\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\nq2 0 d2 1\nq3 0 d3 1\n")
    (tmp_path / "triples.tsv").write_text("q1\td1\td2\n")
    kw = dict(
        collection=str(tmp_path / "collection.tsv"),
        train_queries=str(tmp_path / "q.tsv"),
        train_qrels=str(tmp_path / "qrels.txt"),
        train_triples=str(tmp_path / "triples.tsv"),
    )
    with pytest.raises(InputError, match="data.num_folds"):
        load_dataset(TsvConfig(**kw, num_folds=3), 0)
