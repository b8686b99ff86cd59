"""DDP evaluation on splits smaller than the world: validation and test splits of 1-3 queries (one evaluation chunk,
fewer chunks than ranks) give the metrics of one process, each query scored exactly once.

A rank whose evaluation shard is empty runs one empty placeholder batch (datamodules.datamodule.EmptyShard), so it
takes part in every collective (the run gather, the isotropy and ATS callbacks) like the others."""

import json
from pathlib import Path

import pytest
from conftest import run_script
from test_quiet_output import foreign_lines
from test_train_resume import SMALL

RETRIEVAL = ("ndcg_cut_10", "ndcg_cut_20", "P_20", "mrr_10", "recall_100")


def per_query(out: Path) -> dict:
    """per_query.json, failing on a query that appears twice (json.loads would keep the last silently)."""

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicated keys in per_query.json: {keys}"
        return dict(pairs)

    return json.loads((out / "per_query.json").read_text(), object_pairs_hook=no_duplicates)


def ranking(out: Path) -> list[tuple[str, str, int]]:
    """run.trec as (query, document, rank), each (query, document) once."""
    rows = [line.split() for line in (out / "run.trec").read_text().splitlines()]
    triples = [(q, d, int(r)) for q, _, d, r, _, _ in rows]
    assert len({(q, d) for q, d, _ in triples}) == len(triples), "a (query, document) pair appears twice in run.trec"
    return triples


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


# (queries per val/test split, candidates per query, ranks). The last: 1 query with 3 candidates on 4 ranks and a
# probe of 1 passage, so that some ranks also get no ATS passage (3), no isotropy probe text (1 query, 1 passage)
# and no `paper` batch (3 pairs, 1 batch of 16).
CASES = [(1, 20, 2), (2, 20, 2), (3, 20, 2), (1, 3, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("queries,depth,ranks", CASES, ids=[f"{q}q-depth{d}-{r}ranks" for q, d, r in CASES])
def test_ddp_on_splits_smaller_than_the_world_matches_one_process(tmp_path, tiny_bert_nodropout, queries, depth, ranks):
    """Global batch 8 in both runs (as in test_ddp_two_processes_match_one), validation at steps 0, 2 and 4, tests
    before and after training."""
    base = [
        *SMALL,
        f"model.backbone={tiny_bert_nodropout}",
        f"data.max_eval_queries={queries}",
        f"data.candidate_depth={depth}",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        *(["eval.probe_docs=1"] if depth < ranks else []),
    ]
    one, many = tmp_path / "one", tmp_path / "many"
    run_script("train.py", *base, "data.batch_size=8", f"output_dir={one}")
    proc = run_script(
        "train.py",
        *base,
        f"data.batch_size={8 // ranks}",
        "trainer.strategy=ddp",
        f"trainer.devices={ranks}",
        f"output_dir={many}",
    )
    # every rank quiet: no library line (pipeline/quiet.py runs on each rank), each warning once, not once per rank
    assert foreign_lines(proc) == [], "\n".join(foreign_lines(proc))
    said = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(said) == len(set(said)), said
    m1, m2 = metrics(one), metrics(many)
    p1, p2 = per_query(one), per_query(many)
    assert len(p1) == queries and p2.keys() == p1.keys()
    for q in p1:
        assert p2[q] == pytest.approx(p1[q], abs=1e-9, rel=0), q
    # the same ranking of the same candidates (scores agree to float32 noise: Lightning gives each DDP process a
    # share of the CPU threads, which changes the summation order inside the matrix products)
    assert ranking(many) == ranking(one)
    assert {q for q, _, _ in ranking(one)} == p1.keys()
    # the validations chose the same best checkpoint
    assert sorted(p.name for p in (many / "checkpoints").iterdir()) == sorted(
        p.name for p in (one / "checkpoints").iterdir()
    )
    for run1, run2 in ((m1, m2), (m1["before_training"], m2["before_training"])):
        assert run2.keys() == run1.keys()
        for k in RETRIEVAL:
            assert run2[k] == pytest.approx(run1[k], abs=1e-9, rel=0), k
        # isotropy (probe and `paper`) and ATS: every vector is measured once in either run, but each rank encodes
        # its share in its own padded batches (and with its share of the threads), so the vectors, and the values,
        # agree to float32 noise
        for k in run1.keys() - set(RETRIEVAL) - {"before_training"}:
            assert run2[k] == pytest.approx(run1[k], abs=1e-6), k
    for k in ("iw", "iw_sequence", "avgcos", "iw_paper", "avgcos_paper", "mats", "ats0"):
        assert k in m1, k
