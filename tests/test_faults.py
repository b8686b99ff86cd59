"""Faults a real run meets, each injected here, with what must be observed (README "Faults and operations").

Signals and kills go to a separate process (tests/fault_driver.py), as a scheduler or the kernel would send them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_script

SMALL = ["data=synthetic", "data.max_train_triples=40", "data.max_eval_queries=12", "data.candidate_depth=20",
         "logger=none", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "eval.probe_queries=8",
         "eval.probe_docs=16"]
GLOW = ["head=glow", "head.hidden_units=32", "head.hidden_layers=1", "head.batch_size=64", "head.lr=1e-3"]


def with_fault(fault: str, script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / "tests" / "fault_driver.py"), fault, script, *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def load(ckpt: Path) -> dict:
    return torch.load(ckpt, map_location="cpu", weights_only=False)


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs by {(a[k].float() - b[k].float()).abs().max()}"


# ---- SIGTERM / SIGINT mid-epoch ---------------------------------------------------------------------------------
# 40 triples in batches of 8: 5 steps per epoch; validation every 4 steps; 12 steps in all.
FT = [*SMALL, "data.batch_size=8", "trainer.val_check_interval=4", "trainer.max_steps=12", "optim.warmup_steps=2",
      "eval.before_training=false"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_bert) -> Path:
    out = tmp_path_factory.mktemp("full")
    run_script("train.py", *FT, f"model.backbone={tiny_bert}", f"output_dir={out}")
    return out


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_mid_epoch_writes_resumable_checkpoint(tmp_path, tiny_bert, uninterrupted, sig):
    """The signal arrives after step 7 (mid-epoch 2, between validations at 4 and 8): last.ckpt of step 7 is written,
    the process exits 128 + signal number with the resume command, and resuming ends bit-identical to the
    uninterrupted run."""
    out = tmp_path / "part"
    args = [*FT, f"model.backbone={tiny_bert}", f"output_dir={out}"]
    proc = with_fault(f"signal:{sig}:7", "train.py", *args)
    assert proc.returncode == 128 + signal.Signals[sig], proc.stderr[-3000:]
    last = out / "checkpoints" / "last.ckpt"
    assert f"stopped: interrupted by {sig} at step 7; resume with ckpt_path={last}" in proc.stderr
    assert load(last)["global_step"] == 7
    assert not (out / "metrics.json").exists()
    run_script("train.py", *args, f"ckpt_path={last}")
    assert_identical(load(uninterrupted / "checkpoints" / "last.ckpt")["state_dict"], load(last)["state_dict"])
    m, mr = metrics(uninterrupted), metrics(out)
    for k in ("ndcg_cut_10", "mrr_10", "iw", "avgcos"):
        assert mr[k] == m[k], k


def test_sigterm_mid_epoch_head_stage(tmp_path, tiny_bert):
    """Glow head, 3 epochs of 4 steps (batch 64 over the cached vectors): SIGTERM after step 6 (mid-epoch 2)
    writes a head-only last.ckpt that resumes to the uninterrupted head, bit for bit."""
    ft = tmp_path / "ft"
    run_script("train.py", *FT, f"model.backbone={tiny_bert}", "trainer.max_steps=2", "trainer.val_check_interval=2",
               f"output_dir={ft}")
    base = [*SMALL, "stage=head", f"ckpt={ft / 'checkpoints' / 'last.ckpt'}", *GLOW, "head.epochs=3",
            f"data.cache_dir={tmp_path / 'cache'}"]
    full, part = tmp_path / "full", tmp_path / "part"
    run_script("train.py", *base, f"output_dir={full}")
    steps_per_epoch = load(full / "checkpoints" / "last.ckpt")["global_step"] // 3
    assert steps_per_epoch >= 3, "the signal must land inside an epoch"
    k = steps_per_epoch + 1
    proc = with_fault(f"signal:SIGTERM:{k}", "train.py", *base, f"output_dir={part}")
    assert proc.returncode == 143, proc.stderr[-3000:]
    last = part / "checkpoints" / "last.ckpt"
    assert load(last)["global_step"] == k
    run_script("train.py", *base, f"output_dir={part}", f"ckpt_path={last}")
    a, b = load(full / "checkpoints" / "last.ckpt")["state_dict"], load(last)["state_dict"]
    assert a and all(key.startswith("ranker.token_head.") for key in a)
    assert_identical(a, b)
    assert metrics(part)["ndcg_cut_10"] == metrics(full)["ndcg_cut_10"]


# ---- a crash while writing a checkpoint or a results file --------------------------------------------------------
def test_kill_during_checkpoint_write_keeps_previous(tmp_path, tiny_bert, uninterrupted):
    """SIGKILL half-way through the second write of last.ckpt (step 8): the step-4 last.ckpt stays whole, the
    half-written bytes sit in a temp file no reader looks at, and resuming ends as the uninterrupted run."""
    out = tmp_path / "part"
    args = [*FT, f"model.backbone={tiny_bert}", f"output_dir={out}"]
    proc = with_fault("kill-in-write:last.ckpt:2", "train.py", *args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckdir = out / "checkpoints"
    (tmp,) = ckdir.glob(".last.ckpt.*.tmp")  # the torn write
    with pytest.raises(Exception):
        torch.load(tmp, map_location="cpu", weights_only=False)
    last = ckdir / "last.ckpt"
    assert load(last)["global_step"] == 4
    run_script("train.py", *args, f"ckpt_path={last}")
    assert_identical(load(uninterrupted / "checkpoints" / "last.ckpt")["state_dict"], load(last)["state_dict"])


def test_kill_during_results_write_leaves_run_unfinished(tmp_path, tiny_bert):
    """SIGKILL half-way through metrics.json: no metrics.json (the grid runner's "finished" mark) exists, so the run
    counts as unfinished; resuming from last.ckpt writes complete results."""
    from pipeline.config import compose
    from pipeline.grid import Cell
    from pipeline.run import train

    out = tmp_path / "run"
    args = [*FT, f"model.backbone={tiny_bert}", "trainer.max_steps=2", "trainer.val_check_interval=2", f"output_dir={out}"]
    proc = with_fault("kill-in-write:metrics.json:1", "train.py", *args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not (out / "metrics.json").exists() and list(out.glob(".metrics.json.*.tmp"))
    cell = Cell(kind="train", row="r", train="t", eval="", replicate="s", seed=None, fold=None, dir=out, argv=())
    assert not cell.done
    train(compose([*args, f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"]))
    assert json.loads((out / "metrics.json").read_text())["ndcg_cut_10"] >= 0


# ---- corrupted, truncated or foreign checkpoints -----------------------------------------------------------------
def _error(capsys, script_main, argv) -> str:
    from pipeline.cli import main

    assert main(argv, script_main) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_bad_checkpoints_one_line_error_nothing_overwritten(tmp_path, capsys, uninterrupted):
    from pipeline.run import evaluate, train

    good = uninterrupted / "checkpoints" / "last.ckpt"
    blob = good.read_bytes()
    (tmp_path / "truncated.ckpt").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "text.ckpt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.ckpt")
    ck = load(good)
    torch.save({**ck, "base_ckpt": str(good), "hyper_parameters": {**ck["hyper_parameters"], "head": {"name": "glow"}}},
               tmp_path / "glow_head.ckpt")
    out = tmp_path / "out"  # a run folder with a checkpoint in it, which no failed command may touch
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(blob)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    common = [*SMALL, f"output_dir={out}"]

    for name in ("truncated", "text"):
        err = _error(capsys, evaluate, [*common, f"ckpt={tmp_path / name}.ckpt"])
        assert err.startswith(f"error: ckpt: cannot read checkpoint '{tmp_path / name}.ckpt'") and "truncated" in err
        err = _error(capsys, lambda c, _: train(c), [*common, f"ckpt_path={tmp_path / name}.ckpt"])
        assert err.startswith("error: ckpt_path: cannot read checkpoint")
    assert "is not a checkpoint of this pipeline" in _error(capsys, evaluate, [*common, f"ckpt={tmp_path / 'foreign.ckpt'}"])
    err = _error(capsys, evaluate, [*common, "model=repbert", f"ckpt={good}"])
    assert err == f"error: ckpt: checkpoint '{good}' holds ranker 'colbert' but model.name is 'repbert'"
    err = _error(capsys, lambda c, _: train(c), [*common, "model=repbert", f"ckpt_path={good}"])
    assert "holds ranker 'colbert' but model.name is 'repbert'" in err
    err = _error(capsys, lambda c, _: train(c), [*common, f"ckpt_path={tmp_path / 'glow_head.ckpt'}"])
    assert "is a head checkpoint (from stage=head)" in err
    head = [*common, "stage=head", f"ckpt={good}", "head=nice"]
    assert "holds head 'glow' but head.name is 'nice'" in _error(capsys, lambda c, _: train(c), [*head, f"ckpt_path={tmp_path / 'glow_head.ckpt'}"])
    assert "is a fine-tuning checkpoint, not a head checkpoint" in _error(capsys, lambda c, _: train(c), [*head, f"ckpt_path={good}"])
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before


# ---- NaN / inf in the loss or in a flow's log-det ----------------------------------------------------------------
def _nan_at(monkeypatch, cls, method: str, step: int) -> None:
    """`cls.method`'s output becomes NaN in the training batch that starts at global step `step`."""
    real = getattr(cls, method)

    def poisoned(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.training and self.global_step == step:
            if isinstance(out, tuple):
                return (out[0] * float("nan"), *out[1:])
            return out * float("nan")
        return out

    monkeypatch.setattr(cls, method, poisoned)


class Snapshots:
    """A callback keeping the trainable weights before and after each training batch, by global step at its start."""

    def __new__(cls):
        from pytorch_lightning import Callback

        class _Snap(Callback):
            def __init__(self):
                self.before, self.after = {}, {}

            def _state(self, module):
                return {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}

            def on_train_batch_start(self, trainer, module, *a):
                self._step = trainer.global_step
                self.before[self._step] = self._state(module)

            def on_train_batch_end(self, trainer, module, *a):
                self.after[self._step] = self._state(module)

        return _Snap()


def _with_callback(monkeypatch, cb) -> None:
    import pipeline.run

    build = pipeline.run.build_trainer

    def building(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.callbacks.append(cb)
        return trainer

    monkeypatch.setattr(pipeline.run, "build_trainer", building)


def test_nonfinite_loss_skip(tmp_path, tiny_bert, monkeypatch):
    """optim.nonfinite=skip: the NaN batch changes no weight (no optimiser step), is warned about and counted; the
    run reaches max_steps on finite weights."""
    from lightning_modules.module import RankingModule
    from pipeline.config import compose
    from pipeline.run import train

    _nan_at(monkeypatch, RankingModule, "training_outputs", 2)
    snap = Snapshots()
    _with_callback(monkeypatch, snap)
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"non-finite training loss \(nan\) at step 2; batch skipped \(1 so far"):
        train(compose([*FT, f"model.backbone={tiny_bert}", "trainer.max_steps=4", "trainer.val_check_interval=4", f"output_dir={out}"]))
    before, after = snap.before[2], snap.after[2]
    assert all(torch.equal(before[k], after[k]) for k in before), "a NaN batch moved weights"
    assert any(not torch.equal(snap.before[1][k], snap.after[1][k]) for k in before), "finite batches do train"
    ck = load(out / "checkpoints" / "last.ckpt")
    assert ck["global_step"] == 4 and ck["nonfinite_batches"] == 1
    assert all(torch.isfinite(v).all() for v in ck["state_dict"].values() if v.is_floating_point())


def test_nonfinite_loss_stop(tmp_path, tiny_bert, monkeypatch, capsys):
    """optim.nonfinite=stop: one line naming the step and the last good checkpoint (the step-4 validation's), exit 3,
    and that checkpoint is not overwritten with anything trained on the NaN batch."""
    from lightning_modules.module import RankingModule
    from pipeline.cli import main
    from pipeline.run import train

    _nan_at(monkeypatch, RankingModule, "training_outputs", 6)
    out = tmp_path / "run"
    rc = main([*FT, f"model.backbone={tiny_bert}", "optim.nonfinite=stop", f"output_dir={out}"], lambda c, _: train(c))
    last = out / "checkpoints" / "last.ckpt"
    assert rc == 3
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"stopped: non-finite training loss (nan) at step 6 (optim.nonfinite=stop); nothing was trained on it; the last good checkpoint is {last}")
    assert load(last)["global_step"] == 4 and not (out / "metrics.json").exists()


def test_nonfinite_flow_logdet_skip(tmp_path, tiny_bert, monkeypatch):
    """Glow head whose log-det turns NaN at step 1: that step is skipped (the head unchanged) and counted."""
    from lightning_modules.heads.flows import FlowHead
    from pipeline.config import compose
    from pipeline.run import train

    ft = tmp_path / "ft"
    train(compose([*FT, f"model.backbone={tiny_bert}", "trainer.max_steps=2", "trainer.val_check_interval=2", f"output_dir={ft}"]))
    real, calls = FlowHead.forward_and_logdet, []

    def nan_logdet(self, x):  # the 2nd training batch (step 1): its log-det is NaN
        z, logdet = real(self, x)
        if torch.is_grad_enabled() and self.training:
            calls.append(1)
            if len(calls) == 2:
                logdet = logdet * float("nan")
        return z, logdet

    monkeypatch.setattr(FlowHead, "forward_and_logdet", nan_logdet)
    snap = Snapshots()
    _with_callback(monkeypatch, snap)
    out = tmp_path / "head"
    with pytest.warns(UserWarning, match=r"non-finite training loss \(nan\) at step 1; batch skipped"):
        train(compose([*SMALL, "stage=head", f"ckpt={ft / 'checkpoints' / 'last.ckpt'}", *GLOW, "head.epochs=1",
                       f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={out}"]))
    assert all(torch.equal(snap.before[1][k], snap.after[1][k]) for k in snap.before[1])
    assert load(out / "checkpoints" / "last.ckpt")["nonfinite_batches"] == 1
