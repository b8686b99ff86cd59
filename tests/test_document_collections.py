"""Robust04 / ClueWeb09 through ir_datasets (configs/data/robust04.yaml, clueweb09.yaml), tested on a locally
registered stand-in with the same layout: a collection id with the documents and topic ids holding queries and qrels
(one per fold for Robust04, one per year for the Web Track). The licensed documents are never needed here."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest

from core.errors import InputError
from datamodules.folds import assign_folds
from datamodules.sources import data_config, load_dataset
from pipeline.config import compose

N_QUERIES = 20
WORDS = ["crime", "international", "organized", "trade", "policy", "river", "storm", "market", "vaccine", "election"]


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def register_standin(tmp_path: Path, parts: int) -> tuple[str, list[str]]:
    """A stand-in collection (40 documents of 30-70 words) with N_QUERIES topics split over `parts` topic ids."""
    import ir_datasets
    from ir_datasets.formats import TrecQrels, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    docs = "".join(
        f"D{i}\t" + " ".join(WORDS[(i * 7 + k * (1 + i % 3)) % 10] for k in range(30 + i)) + "\n" for i in range(40)
    )
    name = f"isorank-test/{uuid.uuid4().hex}"
    ir_datasets.registry.register(
        name, ir_datasets.Dataset(TsvDocs(LocalDownload(_write(tmp_path / "docs.tsv", docs))))
    )
    ids = []
    for p in range(parts):
        qs = [q for q in range(1, N_QUERIES + 1) if q % parts == p]
        queries = "".join(f"{q}\t{WORDS[q % 10]} {WORDS[(q + 3) % 10]}\n" for q in qs)
        qrels = "".join(f"{q} 0 D{(q * 3 + j) % 40} {2 - j}\n" for q in qs for j in range(3))
        sub = f"{name}/part{p + 1}"
        ir_datasets.registry.register(
            sub,
            ir_datasets.Dataset(
                TsvQueries(LocalDownload(_write(tmp_path / f"q{p}.tsv", queries))),
                TrecQrels(LocalDownload(_write(tmp_path / f"qrels{p}.txt", qrels)), {0: "not", 1: "rel", 2: "high"}),
            ),
        )
        ids.append(sub)
    return name, ids


def _ids(ids: list[str]) -> str:
    return "[" + ",".join(ids) + "]"


def test_robust04_yaml_uses_the_predefined_folds(tmp_path):
    name, folds = register_standin(tmp_path, 5)
    for f in range(5):
        cfg = compose(
            [
                "data=robust04",
                f"data.docs_id={name}",
                f"data.fold_ids={_ids(folds)}",
                f"data.fold={f}",
                f"data.cache_dir={tmp_path}",
            ]
        )
        ds = load_dataset(data_config(cfg), 0)
        part = lambda i: {str(q) for q in range(1, N_QUERIES + 1) if q % 5 == i % 5}  # noqa: E731 - queries of fold id i
        assert set(ds.split("test").queries) == part(f)
        assert set(ds.split("val").queries) == part(f + 1)
        assert set(ds.split("train").queries) == set().union(*(part(i) for i in range(5) if i not in (f, (f + 1) % 5)))
        assert len(ds.docs) == 40 and ds.split("test").qrels[sorted(part(f))[0]]  # graded qrels kept
        q = sorted(part(f))[0]
        assert ds.split("test").qrels[q] == {f"D{(int(q) * 3 + j) % 40}": 2 - j for j in range(3)}


def test_clueweb09_yaml_pools_the_years_and_deals_folds(tmp_path):
    name, years = register_standin(tmp_path, 4)
    qids = [str(q) for q in range(1, N_QUERIES + 1)]
    assignment = assign_folds(qids, 5, 13)
    for f in (0, 3):
        cfg = compose(
            [
                "data=clueweb09",
                f"data.docs_id={name}",
                f"data.pool_ids={_ids(years)}",
                f"data.fold={f}",
                f"data.cache_dir={tmp_path}",
            ]
        )
        ds = load_dataset(data_config(cfg), 0)
        assert set(ds.split("test").queries) == {q for q in qids if assignment[q] == f}
        assert set(ds.split("val").queries) == {q for q in qids if assignment[q] == (f + 1) % 5}
        assert len(ds.split("train").queries) == N_QUERIES - len(ds.split("test").queries) - len(
            ds.split("val").queries
        )


@pytest.mark.parametrize(
    "extra,key",
    [
        (["data.num_folds=4"], "data.num_folds"),
        (["data.train_id=x/y"], "data.train_id"),
    ],
)
def test_fold_ids_misuse_is_input_error(tmp_path, extra, key):
    name, folds = register_standin(tmp_path, 5)
    cfg = compose(["data=robust04", f"data.docs_id={name}", f"data.fold_ids={_ids(folds)}", *extra])
    with pytest.raises(InputError, match=key):
        load_dataset(data_config(cfg), 0)


def test_pool_ids_need_num_folds(tmp_path):
    name, years = register_standin(tmp_path, 4)
    cfg = compose(
        ["data=clueweb09", f"data.docs_id={name}", f"data.pool_ids={_ids(years)}", "data.num_folds=null", "data.fold=0"]
    )
    with pytest.raises(InputError, match="data.num_folds"):
        load_dataset(data_config(cfg), 0)


@pytest.mark.slow
def test_dgre_maxp_on_the_robust04_standin_end_to_end(tmp_path, tiny_bert):
    """train.py's code path in-process (the stand-in is registered in this process): DGRe, MaxP passages of 12 words,
    BM25 candidates, fold 1, the paper's measures."""
    from pipeline.run import train

    name, folds = register_standin(tmp_path, 5)
    out = tmp_path / "run"
    cfg = compose(
        [
            "data=robust04",
            "model=dgre",
            f"model.backbone={tiny_bert}",
            "model.query_max_len=8",
            "model.doc_max_len=24",
            f"data.docs_id={name}",
            f"data.fold_ids={_ids(folds)}",
            "data.fold=1",
            "data.candidate_depth=6",
            "data.passage_words=12",
            "data.passage_stride=6",
            "data.batch_size=4",
            f"data.cache_dir={tmp_path}",
            "optim.loss=hinge",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false",
            "logger=none",
            "eval.before_training=false",
            "eval.measures=[P_20,ndcg_cut_20,ndcg_cut_10]",
            f"output_dir={out}",
        ]
    )
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"P_20", "ndcg_cut_20", "ndcg_cut_10"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    per_query = json.loads((out / "per_query.json").read_text())
    assert set(per_query) == {str(q) for q in range(1, N_QUERIES + 1) if q % 5 == 1}  # the test fold's topics
