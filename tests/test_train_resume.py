"""End-to-end: train.py -> evaluate.py, exact resume, and DDP equivalence, on a tiny random BERT (CPU)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import job_args, run_script, small_run

# A small synthetic collection; steps chosen so that resume crosses an epoch boundary (5 batches per epoch).
SMALL = small_run()


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def assert_same_weights(a: dict, b: dict, atol: float = 0.0):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=atol, rtol=0), (
            f"{k} differs by {(a[k].float() - b[k].float()).abs().max()}"
        )


@pytest.mark.slow
def test_train_then_evaluate(tmp_path, tiny_bert):
    out = tmp_path / "run"
    args = [
        *SMALL,
        f"model.backbone={tiny_bert}",
        "data.batch_size=8",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        f"output_dir={out}",
    ]
    proc = run_script("train.py", *args)
    m = metrics(out)
    for key in ("ndcg_cut_10", "P_20", "mrr_10", "recall_100", "iw", "avgcos", "before_training"):
        assert key in m, key
    assert 0.0 <= m["ndcg_cut_10"] <= 1.0 and 0.0 < m["iw"] <= 1.0
    assert (out / "run.trec").read_text().splitlines()[0].split()[1] == "Q0"
    assert (out / "config.yaml").exists() and (out / "checkpoints" / "last.ckpt").exists()
    assert "before training" in proc.stdout
    # evaluate.py on the best checkpoint reproduces the test metrics of train.py
    ev = tmp_path / "eval"
    best = next((out / "checkpoints").glob("best-*.ckpt"))
    run_script("evaluate.py", *job_args("evaluate.py", [*SMALL, f"ckpt={best}"]), f"output_dir={ev}")
    me = metrics(ev)
    for k in ("ndcg_cut_10", "P_20", "mrr_10", "recall_100", "iw", "avgcos", "mats"):
        assert me[k] == pytest.approx(m[k], abs=1e-6), k
    assert (ev / "run.trec").read_text() == (out / "run.trec").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_resume_matches_uninterrupted(tmp_path, tiny_bert, precision):
    """A run that dies at step 10 (past warm-up, mid-epoch 2) resumes from the last.ckpt of its step-8 validation,
    with the same max_steps (so the same LR schedule), and ends with the same weights and metrics, bit for bit; its
    metrics.json keeps the first run's `before_training` (carried in the checkpoint). All three runs are processes
    of their own started alike: bit for bit needs the same arithmetic (thread count, matmul precision), which a run
    inside the test process, after other tests changed torch's global settings, need not have (4e-7 apart, seen).
    Under bf16 autocast too: work a process does once at its first training step must not draw from the random
    stream restored there (the autocast cache probe did, and the resumed run trained on other dropout masks)."""
    base = [
        *SMALL,
        f"model.backbone={tiny_bert}",
        "data.batch_size=8",
        "trainer.val_check_interval=4",
        "trainer.max_steps=14",
        "optim.warmup_steps=2",
        f"trainer.precision={precision}",
    ]
    full = tmp_path / "full"
    run_script("train.py", *base, f"output_dir={full}")

    part = tmp_path / "part"
    crashed = run_script(
        "tests/fault_driver.py",
        *base,
        f"output_dir={part}",
        check=False,
        extra_env={"FAULT": "raise:0:10", "SCRIPT": "train.py"},
    )
    assert crashed.returncode == 1 and "injected failure on rank 0 at step 10" in crashed.stderr, crashed.stderr[-3000:]
    last = part / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 8
    assert not (part / "metrics.json").exists()
    run_script("train.py", *base, f"output_dir={part}", f"ckpt_path={last}")
    a, b = weights(full / "checkpoints" / "last.ckpt"), weights(last)
    assert_same_weights(a, b)
    ma, mb = metrics(full), metrics(part)
    for k in ("ndcg_cut_10", "P_20", "mrr_10", "recall_100", "iw", "avgcos"):
        assert mb[k] == pytest.approx(ma[k], abs=1e-9), k
    assert mb.keys() == ma.keys() and mb["before_training"] == ma["before_training"]
    # the validation curve survives the crash: the resumed run's validation.json has every step's, as the full one
    ca, cb = (json.loads((d / "validation.json").read_text()) for d in (full, part))
    assert [v["step"] for v in cb["validations"]] == [v["step"] for v in ca["validations"]] == [0, 4, 8, 12]
    assert cb["best_step"] == ca["best_step"] == mb["best_step"]
    for va, vb in zip(ca["validations"], cb["validations"]):
        assert vb["val/ndcg_cut_10"] == pytest.approx(va["val/ndcg_cut_10"], abs=1e-9)


def csv_column(run, name: str) -> list[str]:
    """The non-empty values of one column of a run's CSVLogger metrics.csv, in step order."""
    import csv

    (path,) = run.glob("csv/*/metrics.csv")
    with open(path, newline="") as f:
        return [row[name] for row in csv.DictReader(f) if row.get(name)]


# token-vector and pooled-vector gathers; 17 triples: the ranks' shares of the one global batch are 9 and 8, each
# rank's block padded to 18 passages of model.doc_max_len tokens
@pytest.mark.parametrize("model,triples", [("colbert", 17), ("repbert", 17)])
@pytest.mark.slow
def test_ddp_two_processes_match_one(tmp_path, tiny_bert_nodropout, model, triples):
    """One global batch of all 17 triples: one process with batch 17 vs two gloo ranks with batch 8 each (the last
    global batch is merged: shares of 9 and 8). Each rank pads its in-batch negatives to 18 passages of doc_max_len
    tokens (no host sync for the others' sizes) and weighs its mean loss by its share of the global batch, so the
    loss, the weights and the test metrics match the single-process run up to float summation order. In that batch
    one query's judged document is another triple's positive: masked (optim.in_batch_mask_relevant) in both runs
    alike, which the equal weights show (a mask that differed would change the gradients), and counted alike per
    query: the padding is no column."""
    base = [
        *SMALL,
        f"model={model}",
        f"model.backbone={tiny_bert_nodropout}",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "eval.before_training=false",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    base += [f"data.max_train_triples={triples}", "logger=csv", "trainer.log_every_n_steps=1"]
    run_script("train.py", *base, f"data.batch_size={triples}", f"output_dir={one}")
    run_script("train.py", *base, "data.batch_size=8", "trainer.devices=2", "trainer.strategy=ddp", f"output_dir={two}")
    assert_same_weights(
        weights(one / "checkpoints" / "last.ckpt"), weights(two / "checkpoints" / "last.ckpt"), atol=1e-5
    )
    # masked per query, each step (all 16 triples are the batch), against a brute-force count over the triples
    from pipeline.config import compose
    from pipeline.stages import load_data

    dm = load_data(compose([*base, f"data.batch_size={triples}", f"output_dir={tmp_path / 'x'}"]), fit=True)
    qrels = dm.dataset.split("train").qrels
    columns = [t[1] for t in dm.triples] + [t[2] for t in dm.triples]

    def judged(rows) -> float:  # mean over the queries `rows` of the judged columns other than their own two
        return sum(
            qrels[dm.triples[i][0]].get(columns[c], 0) > 0
            for i in rows
            for c in range(2 * triples)
            if c not in (i, triples + i)
        ) / len(rows)

    assert judged(range(triples)) > 0
    assert [float(v) for v in csv_column(one, "train/masked_in_batch")] == pytest.approx([judged(range(triples))] * 6)
    # rank 0 logs its own queries' mean: the first share of each step's global batch (one epoch a step)
    from datamodules.samplers import epoch_permutation

    rank0 = [np.array_split(epoch_permutation(triples, dm.seed, epoch), 2)[0] for epoch in range(6)]
    assert [float(v) for v in csv_column(two, "train/masked_in_batch")] == pytest.approx([judged(r) for r in rank0])
    m1, m2 = metrics(one), metrics(two)
    # ATS: occurrences gathered; iw_paper*: per-batch values gathered (each rank measures its share of the batches)
    paper = ["iw_paper", "iw_paper_std", "avgcos_paper", "iw_paper_query", "avgcos_paper_passage"]
    paper += ["iw_paper_sequence", "avgcos_paper_sequence"] if model == "repbert" else []
    for k in ("ndcg_cut_10", "P_20", "mrr_10", "recall_100", "iw", "avgcos", "mats", "ats0", *paper):
        assert m2[k] == pytest.approx(m1[k], abs=1e-4), k
