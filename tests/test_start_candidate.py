"""The validation at step 0 is a candidate for the best checkpoint (`eval.start_candidate`): "best by validation"
never loses to the model before fine-tuning, and the run says so when the start wins."""

import json

import pytest
import torch
from conftest import run_script, small_run

SMALL = small_run(
    "eval.ats_passages=0",
    "data.batch_size=8",
    "trainer.max_steps=2",
    "trainer.val_check_interval=1",
    triples=24,
    eval_queries=6,
    depth=10,
    probe_queries=4,
    probe_docs=8,
)


@pytest.mark.slow
def test_start_wins_when_training_cannot_improve(tmp_path, tiny_bert_nodropout):
    """With a learning rate too small to move the weights, no validation beats step 0 (a tie is not a win): the
    best checkpoint stays best-0.ckpt, the run warns, and the test after training scores the starting weights, so
    it equals the test before training."""
    out = tmp_path / "run"
    proc = run_script(
        "train.py",
        *SMALL,
        f"model.backbone={tiny_bert_nodropout}",
        "optim.lr=1e-20",
        "optim.warmup_steps=0",
        f"output_dir={out}",
    )
    names = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    assert names == ["best-0.ckpt", "last.ckpt"]
    assert "\nwarning: no validation beat the model before fine-tuning" in proc.stderr  # one line, as errors
    assert "UserWarning: no validation beat" not in proc.stderr
    assert "exists and is not empty" not in proc.stderr  # best-0.ckpt is ours, not another run's
    m = json.loads((out / "metrics.json").read_text())
    for k in ("ndcg_cut_10", "mrr_10", "P_20"):
        assert m[k] == m["before_training"][k], k
    start = torch.load(out / "checkpoints" / "best-0.ckpt", map_location="cpu", weights_only=False)
    assert start["global_step"] == 0
    # the validation curve: step 0 and each validation while fitting, and the tested checkpoint's step
    curve = json.loads((out / "validation.json").read_text())
    assert [v["step"] for v in curve["validations"]] == [0, 1, 2]
    assert curve["best_step"] == m["best_step"] == 0
    assert len({v["val/ndcg_cut_10"] for v in curve["validations"]}) == 1  # lr 1e-20: the same model at every step


@pytest.mark.slow
def test_start_candidate_off_keeps_the_old_selection(tmp_path, tiny_bert_nodropout):
    out = tmp_path / "run"
    run_script(
        "train.py",
        *SMALL,
        f"model.backbone={tiny_bert_nodropout}",
        "optim.lr=1e-20",
        "optim.warmup_steps=0",
        "eval.start_candidate=false",
        f"output_dir={out}",
    )
    names = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    assert "best-0.ckpt" not in names and len([n for n in names if n.startswith("best-")]) == 1
    best = next(n for n in names if n.startswith("best-"))
    curve = json.loads((out / "validation.json").read_text())
    assert [v["step"] for v in curve["validations"]] == [1, 2]
    assert f"best-{curve['best_step']}.ckpt" == best
    scores = {v["step"]: v["val/ndcg_cut_10"] for v in curve["validations"]}
    assert scores[curve["best_step"]] == max(scores.values())


@pytest.mark.slow
def test_no_validation_means_no_start_candidate(tmp_path, tiny_bert_nodropout):
    """trainer.limit_val_batches=0 (the DGRe grids: no validation, the last weights tested) trains and tests without
    a step-0 candidate; it used to fail on the empty validation result."""
    out = tmp_path / "run"
    run_script(
        "train.py", *SMALL, f"model.backbone={tiny_bert_nodropout}", "trainer.limit_val_batches=0", f"output_dir={out}"
    )
    assert "ndcg_cut_10" in json.loads((out / "metrics.json").read_text())
    assert not (out / "checkpoints" / "best-0.ckpt").exists()
