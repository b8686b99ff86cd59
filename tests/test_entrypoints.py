"""train.py / evaluate.py as a user runs them: real collections from ../shared/data, and every bad input ending
in one line that names the key or file, exit code 2, and no partial output."""

import json

import pytest
from conftest import finetune_steps, quick_eval, run_script, shared_data

FAST = quick_eval()


@pytest.fixture(scope="module")
def colbert_ckpt(tmp_path_factory, tiny_bert):
    out = tmp_path_factory.mktemp("ckpt_run")
    run_script(
        "train.py",
        *FAST,
        f"model.backbone={tiny_bert}",
        "data.max_train_triples=16",
        *finetune_steps(2),
        f"output_dir={out}",
    )
    return out / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "data,extra",
    [
        pytest.param(
            "squad", ["data.max_questions_per_split=200"], marks=pytest.mark.data("squad_v1.1_dev/dev-v1.1.json.gz")
        ),
        pytest.param("cranfield", [], marks=pytest.mark.data("cranfield")),
    ],
)
@pytest.mark.slow
def test_train_then_evaluate_on_real_collections(tmp_path, tiny_bert, data, extra):
    path = shared_data("squad_v1.1_dev", "dev-v1.1.json.gz") if data == "squad" else shared_data("cranfield")
    path_key = f"data.path={path}"
    out, ev = tmp_path / "train", tmp_path / "eval"
    run_script(
        "train.py",
        *FAST,
        f"data={data}",
        path_key,
        *extra,
        f"model.backbone={tiny_bert}",
        "model=repbert",
        "data.batch_size=8",
        "data.max_train_triples=32",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        f"output_dir={out}",
    )
    m = json.loads((out / "metrics.json").read_text())
    assert 0 < m["recall_100"] <= 1 and "before_training" in m
    lines = (out / "run.trec").read_text().splitlines()
    assert len({ln.split()[0] for ln in lines}) == 16  # max_eval_queries judged test queries
    run_script(
        "evaluate.py",
        *FAST,
        f"data={data}",
        path_key,
        *extra,
        f"ckpt={out / 'checkpoints' / 'last.ckpt'}",
        f"output_dir={ev}",
    )
    me = json.loads((ev / "metrics.json").read_text())
    assert set(me) >= {"ndcg_cut_10", "P_20", "mrr_10", "recall_100", "iw", "avgcos"}


def one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(err) == 1, proc.stderr[-3000:]
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


@pytest.mark.slow
def test_checkpoint_of_another_ranker(tmp_path, colbert_ckpt):
    out = tmp_path / "ev"
    proc = run_script("evaluate.py", *FAST, "model=repbert", f"ckpt={colbert_ckpt}", f"output_dir={out}", check=False)
    one_line_error(proc, "ckpt", "colbert", "repbert")
    assert not (out / "metrics.json").exists()


@pytest.mark.slow
def test_resume_from_checkpoint_of_another_ranker(tmp_path, colbert_ckpt, tiny_bert):
    proc = run_script(
        "train.py",
        *FAST,
        "model=bert_dot",
        f"model.backbone={tiny_bert}",
        f"ckpt_path={colbert_ckpt}",
        f"output_dir={tmp_path / 'x'}",
        check=False,
    )
    one_line_error(proc, "ckpt_path", "colbert", "bert_dot")


@pytest.mark.slow
def test_truncated_checkpoint(tmp_path, colbert_ckpt):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(colbert_ckpt.read_bytes()[:5000])
    proc = run_script("evaluate.py", *FAST, f"ckpt={bad}", f"output_dir={tmp_path / 'ev'}", check=False)
    one_line_error(proc, "ckpt", "bad.ckpt", "truncated")
    assert not (tmp_path / "ev" / "metrics.json").exists()


@pytest.mark.slow
def test_missing_checkpoint(tmp_path):
    proc = run_script("evaluate.py", *FAST, f"ckpt={tmp_path / 'nope.ckpt'}", check=False)
    one_line_error(proc, "ckpt", "does not exist")


@pytest.mark.slow
def test_missing_data_path(tmp_path):
    proc = run_script(
        "evaluate.py",
        *FAST,
        "data=squad",
        f"data.path={tmp_path / 'no.json'}",
        f"output_dir={tmp_path / 'ev'}",
        check=False,
    )
    one_line_error(proc, "data.path", "no.json")
    assert not (tmp_path / "ev").exists()  # not even config.yaml or wandb/


@pytest.mark.slow
def test_malformed_data_file_leaves_no_output(tmp_path, tiny_bert):
    """Bad data through the entry point: one line naming file:line, and nothing written (data is read and checked
    before config.yaml, the logger folder or any checkpoint)."""
    (tmp_path / "collection.tsv").write_text("d1\tthe cat sat\nd2\tdogs bark\n")
    (tmp_path / "queries.tsv").write_text("q1\tcat\nq2\tdogs\n")
    (tmp_path / "good_qrels.txt").write_text("q1 0 d1 1\nq2 0 d2 1\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\nq2 0 d2\n")  # line 2 lacks the grade
    files = [
        f"data.collection={tmp_path / 'collection.tsv'}",
        f"data.train_queries={tmp_path / 'queries.tsv'}",
        f"data.train_qrels={tmp_path / 'qrels.txt'}",
        "data.train_triples=null",
    ]
    for split in ("val", "test"):
        files += [
            f"data.{split}_queries={tmp_path / 'queries.tsv'}",
            f"data.{split}_qrels={tmp_path / 'good_qrels.txt'}",
            f"data.{split}_run=null",
        ]
    out = tmp_path / "run"
    proc = run_script(
        "train.py", "data=tsv", *files, f"model.backbone={tiny_bert}", "logger=wandb", f"output_dir={out}", check=False
    )
    one_line_error(proc, f"{tmp_path / 'qrels.txt'}:2")
    assert not out.exists()
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\nq2 0 d9 1\n")  # d9 is not in the collection
    proc = run_script(
        "train.py", "data=tsv", *files, f"model.backbone={tiny_bert}", "logger=wandb", f"output_dir={out}", check=False
    )
    one_line_error(proc, f"{tmp_path / 'qrels.txt'}:2", "unknown doc id 'd9'")
    assert not out.exists()


@pytest.mark.parametrize(
    "args,needles",
    [
        (["model.nope=1"], ["model.nope", "unknown key"]),
        (["data=msmarco_full"], ["config group 'data'", "msmarco_full"]),
        (["trainer.max_steps=ten"], ["trainer.max_steps"]),
        (["data.rotate_train=sometimes"], ["data.rotate_train"]),
    ],
)
@pytest.mark.slow
def test_bad_config_on_the_command_line(tmp_path, args, needles):
    proc = run_script("train.py", *args, f"output_dir={tmp_path / 'o'}", check=False)
    one_line_error(proc, *needles)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_output_dir_with_checkpoints_is_not_overwritten(tmp_path, colbert_ckpt, tiny_bert):
    run_dir = colbert_ckpt.parent.parent
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    proc = run_script("train.py", *FAST, f"model.backbone={tiny_bert}", f"output_dir={run_dir}", check=False)
    one_line_error(proc, "output_dir", "ckpt_path")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
