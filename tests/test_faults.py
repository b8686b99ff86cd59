"""Faults a real run meets, each injected here, with what must be observed (docs/reliability.md).

Signals and kills go to a separate process (tests/fault_driver.py), as a scheduler or the kernel would send them."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import glow_head, run_script, small_run

SMALL = small_run()
GLOW = glow_head(batch_size=64)


def with_fault(fault: str, script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`script` with one injected fault (tests/fault_driver.py), as a process of its own."""
    extra = {"FAULT": fault, "SCRIPT": script}
    return run_script("tests/fault_driver.py", *args, timeout=timeout, check=False, extra_env=extra)


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
FT = [
    *SMALL,
    "data.batch_size=8",
    "trainer.val_check_interval=4",
    "trainer.max_steps=12",
    "optim.warmup_steps=2",
    "eval.before_training=false",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_bert) -> Path:
    """The reference run of the resume tests, a process started as theirs are (run_script): compared bit for bit,
    it must do the same arithmetic, which a run inside the test process need not (1.9e-8 apart, seen)."""
    out = tmp_path_factory.mktemp("full")
    run_script("train.py", *FT, f"model.backbone={tiny_bert}", "logger=csv", f"output_dir={out}")  # csv: val history
    return out


def train_here(args: list[str]) -> None:
    """train.py in this process, for the tests that patch it here (no run of theirs is compared bit for bit with a
    run in another process)."""
    from pipeline.config import compose
    from pipeline.run import train

    train(compose(args))


def val_history(out: Path, version: int = 0) -> dict[int, float]:
    """{global step: val/ndcg_cut_10} from a run's CSV log (Lightning writes the step as global step - 1)."""
    import csv

    rows = csv.DictReader((out / "csv" / f"version_{version}" / "metrics.csv").open())
    return {int(r["step"]) + 1: float(r["val/ndcg_cut_10"]) for r in rows if r.get("val/ndcg_cut_10")}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.slow
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


@pytest.mark.slow
def test_sigterm_during_validation_lets_it_finish(tmp_path, tiny_bert, uninterrupted):
    """SIGTERM during the step-8 validation: the validation completes (logged with the uninterrupted run's value; the
    same best checkpoint is chosen), then the run stops with last.ckpt of step 8 and resumes to identical weights."""
    out = tmp_path / "part"
    args = [*FT, f"model.backbone={tiny_bert}", "logger=csv", f"output_dir={out}"]
    proc = with_fault("signal-in-validation:SIGTERM:8", "train.py", *args)
    assert proc.returncode == 143, proc.stderr[-3000:]
    last = out / "checkpoints" / "last.ckpt"
    assert load(last)["global_step"] == 8
    full = val_history(uninterrupted)
    # 1: the validation at step 0 (eval.start_candidate), which trainer.validate logs as step 0
    assert sorted(full) == [1, 4, 8, 12] and val_history(out) == {1: full[1], 4: full[4], 8: full[8]}
    best = lambda d: sorted(p.name for p in (d / "checkpoints").glob("best-*.ckpt"))  # noqa: E731
    full_best = best(uninterrupted)
    run_script("train.py", *args, f"ckpt_path={last}")
    assert best(out) == full_best
    assert_identical(load(uninterrupted / "checkpoints" / "last.ckpt")["state_dict"], load(last)["state_dict"])
    assert metrics(out)["ndcg_cut_10"] == metrics(uninterrupted)["ndcg_cut_10"]


@pytest.mark.slow
def test_preemption_handles_sanity_validation(tmp_path, tiny_bert):
    """The callback sees validation hooks before training starts (Lightning's sanity check): no signal, no effect."""
    out = tmp_path / "run"
    train_here(
        [
            *FT,
            f"model.backbone={tiny_bert}",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "trainer.num_sanity_val_steps=1",
            f"output_dir={out}",
        ]
    )
    assert load(out / "checkpoints" / "last.ckpt")["global_step"] == 2 and (out / "metrics.json").exists()


@pytest.mark.slow
def test_sigterm_mid_epoch_head_stage(tmp_path, tiny_bert):
    """Glow head, 3 epochs over the cached vectors (batch 64): SIGTERM one step into epoch 2 writes a head-only
    last.ckpt that resumes to the uninterrupted head, bit for bit."""
    ft = tmp_path / "ft"
    train_here(steps_of_ft(tiny_bert, 2, ft))
    base = [
        *SMALL,
        "stage=head",
        f"ckpt={ft / 'checkpoints' / 'last.ckpt'}",
        *GLOW,
        "head.epochs=3",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    run_script("train.py", *base, f"output_dir={full}")  # started as the resumed run is: the same arithmetic
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
@pytest.mark.slow
def test_kill_during_checkpoint_write_keeps_previous(tmp_path, tiny_bert, uninterrupted):
    """SIGKILL half-way through the second write of last.ckpt (step 8): the step-4 last.ckpt stays whole, the
    half-written bytes sit in a temp file no reader looks at, and resuming ends as the uninterrupted run."""
    out = tmp_path / "part"
    args = [*FT, f"model.backbone={tiny_bert}", f"output_dir={out}"]
    proc = with_fault("kill-in-write:last.ckpt:2", "train.py", *args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckdir = out / "checkpoints"
    (tmp,) = ckdir.glob(".last.ckpt.*.tmp")  # the torn write
    with pytest.raises(RuntimeError):  # PytorchStreamReader: the zip archive has no central directory
        torch.load(tmp, map_location="cpu", weights_only=False)
    last = ckdir / "last.ckpt"
    assert load(last)["global_step"] == 4
    run_script("train.py", *args, f"ckpt_path={last}")
    assert_identical(load(uninterrupted / "checkpoints" / "last.ckpt")["state_dict"], load(last)["state_dict"])


@pytest.mark.slow
def test_kill_during_results_write_leaves_run_unfinished(tmp_path, tiny_bert):
    """SIGKILL half-way through metrics.json: the result set was still staged in a hidden folder, so the run folder
    holds none of its files (no metrics.json, the grid runner's "finished" mark, and no per_query.json or run.trec
    that would read like a finished run missing a file) and counts as unfinished; resuming from last.ckpt writes
    complete results and removes the dead run's staged set."""
    from grid.engine import Cell
    from pipeline.config import compose
    from pipeline.run import train

    out = tmp_path / "run"
    args = [
        *FT,
        f"model.backbone={tiny_bert}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        f"output_dir={out}",
    ]
    proc = with_fault("kill-in-write:metrics.json:1", "train.py", *args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not any((out / name).exists() for name in ("metrics.json", "per_query.json", "run.trec", "validation.json"))
    (staged,) = out.glob(".results.tmp-*")  # what the killed run had computed, with its torn metrics.json
    assert list(staged.glob(".metrics.json.*.tmp"))
    cell = Cell(kind="train", row="r", train="t", eval="", replicate="s", seed=None, fold=None, dir=out, argv=())
    assert not cell.done
    killed_per_query = json.loads((staged / "per_query.json").read_text())
    killed_run = (staged / "run.trec").read_text()
    train(compose([*args, f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"]))
    assert cell.done and not list(out.glob(".results.tmp-*"))
    # the resumed run (already at max_steps: only its test repeats) writes the killed run's results, and metrics.json
    # holds their mean over the judged test queries
    assert json.loads((out / "per_query.json").read_text()) == killed_per_query
    assert (out / "run.trec").read_text() == killed_run
    per_query = [q["ndcg_cut_10"] for q in killed_per_query.values()]
    assert len(per_query) > 0
    assert metrics(out)["ndcg_cut_10"] == pytest.approx(math.fsum(per_query) / len(per_query), abs=1e-12)


# ---- corrupted, truncated or foreign checkpoints -----------------------------------------------------------------
def _error(capsys, script_main, argv) -> str:
    from pipeline.cli import main

    assert main(argv, script_main) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


@pytest.mark.slow
def test_bad_checkpoints_one_line_error_nothing_overwritten(tmp_path, capsys, uninterrupted):
    from pipeline.run import evaluate, train

    good = uninterrupted / "checkpoints" / "last.ckpt"
    blob = good.read_bytes()
    (tmp_path / "truncated.ckpt").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "text.ckpt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.ckpt")
    ck = load(good)
    torch.save(
        {**ck, "base_ckpt": str(good), "hyper_parameters": {**ck["hyper_parameters"], "head": {"name": "glow"}}},
        tmp_path / "glow_head.ckpt",
    )
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
    assert "is not a checkpoint of this pipeline" in _error(
        capsys, evaluate, [*common, f"ckpt={tmp_path / 'foreign.ckpt'}"]
    )
    err = _error(capsys, evaluate, [*common, "model=repbert", f"ckpt={good}"])
    assert err == f"error: ckpt: checkpoint '{good}' holds ranker 'colbert' but model.name is 'repbert'"
    err = _error(capsys, lambda c, _: train(c), [*common, "model=repbert", f"ckpt_path={good}"])
    assert "holds ranker 'colbert' but model.name is 'repbert'" in err
    err = _error(capsys, lambda c, _: train(c), [*common, f"ckpt_path={tmp_path / 'glow_head.ckpt'}"])
    assert "is a head checkpoint (from stage=head)" in err
    head = [*common, "stage=head", f"ckpt={good}", "head=nice"]
    assert "holds head 'glow' but head.name is 'nice'" in _error(
        capsys, lambda c, _: train(c), [*head, f"ckpt_path={tmp_path / 'glow_head.ckpt'}"]
    )
    assert "is a fine-tuning checkpoint, not a head checkpoint" in _error(
        capsys, lambda c, _: train(c), [*head, f"ckpt_path={good}"]
    )
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
    """A callback keeping the trainable weights and the optimiser's state (moments, step counts) before and after each
    training batch, by global step at its start."""

    def __new__(cls):
        from pytorch_lightning import Callback

        class _Snap(Callback):
            def __init__(self):
                self.before, self.after = {}, {}
                self.opt_before, self.opt_after = {}, {}

            def _state(self, module):
                return {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}

            def _opt(self, trainer):
                state = trainer.optimizers[0].state
                return {(i, k): v.clone() for i, st in enumerate(state.values()) for k, v in st.items()}

            def on_train_batch_start(self, trainer, module, *a):
                self._step = trainer.global_step
                self.before[self._step] = self._state(module)
                self.opt_before[self._step] = self._opt(trainer)

            def on_train_batch_end(self, trainer, module, *a):
                self.after[self._step] = self._state(module)
                self.opt_after[self._step] = self._opt(trainer)

        return _Snap()


def assert_step_had_no_effect(snap, step: int) -> None:
    """Weights and optimiser state (AdamW's moments and step counts) after `step` exactly as before it."""
    before, after = snap.before[step], snap.after[step]
    assert all(torch.equal(before[k], after[k]) for k in before), "a non-finite step moved weights"
    ob, oa = snap.opt_before[step], snap.opt_after[step]
    assert ob and ob.keys() == oa.keys(), "the optimiser's state changed shape"
    assert all(torch.equal(ob[k], oa[k]) for k in ob), "a non-finite step changed the optimiser's state"


def steps_of_ft(backbone: str, steps: int, out: Path) -> list[str]:
    """FT on `backbone` for `steps` steps with one validation at the end, into `out`: the non-finite tests' runs."""
    return [
        *FT,
        f"model.backbone={backbone}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        f"output_dir={out}",
    ]


def _with_callback(monkeypatch, cb) -> None:
    from fault_driver import with_callback

    with_callback(cb, monkeypatch.setattr)


@pytest.mark.slow
def test_nonfinite_loss_skip(tmp_path, tiny_bert, monkeypatch):
    """optim.nonfinite=skip: the NaN batch changes no weight (no optimiser step), is warned about and counted; the
    run reaches max_steps on finite weights."""
    from lightning_modules.module import RankingModule

    _nan_at(monkeypatch, RankingModule, "training_outputs", 2)
    snap = Snapshots()
    _with_callback(monkeypatch, snap)
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"non-finite training loss \(nan\) at step 2; batch skipped \(1 so far"):
        train_here(steps_of_ft(tiny_bert, 4, out))
    assert_step_had_no_effect(snap, 2)
    before = snap.before[1]
    assert any(not torch.equal(before[k], snap.after[1][k]) for k in before), "finite batches do train"
    ck = load(out / "checkpoints" / "last.ckpt")
    assert ck["global_step"] == 4 and ck["nonfinite_batches"] == 1
    assert all(torch.isfinite(v).all() for v in ck["state_dict"].values() if v.is_floating_point())


@pytest.mark.slow
def test_nonfinite_gradients_skip(tmp_path, tiny_bert, monkeypatch):
    """A finite loss whose gradients overflow (one gradient set to inf after backward at step 2): no weight moves on
    that step, it is warned about and counted, training goes on to finite weights."""
    from pytorch_lightning import Callback

    class InfGrad(Callback):
        def on_after_backward(self, trainer, module):
            if trainer.global_step == 2:
                next(p for p in module.parameters() if p.grad is not None).grad.fill_(float("inf"))

    snap = Snapshots()
    _with_callback(monkeypatch, snap)
    _with_callback(monkeypatch, InfGrad())
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"non-finite gradients at step 2; optimiser step skipped \(1 so far"):
        train_here(steps_of_ft(tiny_bert, 4, out))
    assert_step_had_no_effect(snap, 2)
    ck = load(out / "checkpoints" / "last.ckpt")
    assert ck["nonfinite_batches"] == 1
    assert all(torch.isfinite(v).all() for v in ck["state_dict"].values() if v.is_floating_point())


@pytest.mark.slow
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
        "stopped: non-finite training loss (nan) at step 6 (optim.nonfinite=stop); nothing was trained on it; "
        f"the last good checkpoint is {last}"
    )
    assert load(last)["global_step"] == 4 and not (out / "metrics.json").exists()


@pytest.mark.slow
def test_nonfinite_flow_logdet_skip(tmp_path, tiny_bert, monkeypatch):
    """Glow head whose log-det turns NaN at step 1: that step is skipped (the head unchanged) and counted."""
    from models.heads.flows import FlowHead
    from pipeline.config import compose
    from pipeline.run import train

    ft = tmp_path / "ft"
    train_here(steps_of_ft(tiny_bert, 2, ft))
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
        train(
            compose(
                [
                    *SMALL,
                    "stage=head",
                    f"ckpt={ft / 'checkpoints' / 'last.ckpt'}",
                    *GLOW,
                    "head.epochs=1",
                    f"data.cache_dir={tmp_path / 'cache'}",
                    f"output_dir={out}",
                ]
            )
        )
    assert_step_had_no_effect(snap, 1)
    assert load(out / "checkpoints" / "last.ckpt")["nonfinite_batches"] == 1


def _fit_tiny(tmp_path, backbone: str, steps: int, *callbacks, **optim):
    """ColBERT on tiny data for `steps` steps in a bare Lightning trainer (no validation, logger or checkpoints)."""
    import pytorch_lightning as pl
    from conftest import tiny_ranker_and_data

    module, dm = tiny_ranker_and_data(tmp_path, backbone, "colbert", batch_size=2)
    module.optim_cfg.nonfinite = optim.get("nonfinite", "skip")
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(module, datamodule=dm)
    return module, trainer


@pytest.mark.parametrize("fused", [True, False])
def test_nonfinite_skip_leaves_weights_and_adamw_state(tmp_path, tiny_bert, monkeypatch, fused):
    """optim.nonfinite=skip, NaN loss at step 1 of 3: weights, AdamW moments and step counts after step 1 exactly as
    before it, whether the optimiser is fused (skipped on the device, read one step later) or not (fp16's GradScaler
    path: read at once, gradients dropped); the warning names step 1."""
    from lightning_modules.module import RankingModule

    if not fused:
        monkeypatch.setattr(RankingModule, "fused_optimizer", lambda self, params: None)
    _nan_at(monkeypatch, RankingModule, "training_outputs", 1)
    snap = Snapshots()
    with pytest.warns(UserWarning, match=r"non-finite training loss \(nan\) at step 1; batch skipped \(1 so far"):
        module, trainer = _fit_tiny(tmp_path, tiny_bert, 3, snap)
    assert all(g["fused"] is (True if fused else None) for g in trainer.optimizers[0].param_groups)
    assert_step_had_no_effect(snap, 1)
    for step in (0, 2):
        assert any(not torch.equal(snap.before[step][k], snap.after[step][k]) for k in snap.before[step])
    assert {float(v) for (_, k), v in snap.opt_after[2].items() if k == "step"} == {2.0}  # steps 0 and 2 counted
    assert module.nonfinite_batches == 1 and trainer.global_step == 3


def test_nonfinite_stop_at_the_last_step_names_it(tmp_path, tiny_bert, monkeypatch):
    """optim.nonfinite=stop with the NaN in the last step (its flag read when training ends, one step late
    everywhere else): TrainingStopped names that step, and nothing was trained on it."""
    from core.errors import TrainingStopped
    from lightning_modules.module import RankingModule

    _nan_at(monkeypatch, RankingModule, "training_outputs", 2)
    snap = Snapshots()
    with pytest.raises(TrainingStopped, match=r"non-finite training loss \(nan\) at step 2 \(optim.nonfinite=stop\)"):
        _fit_tiny(tmp_path, tiny_bert, 3, snap, nonfinite="stop")
    assert_step_had_no_effect(snap, 2)


# ---- out of memory during evaluation -----------------------------------------------------------------------------
def _run_scores(out: Path) -> dict[tuple[str, str], float]:
    rows = [line.split() for line in (out / "run.trec").read_text().splitlines()]
    return {(r[0], r[2]): float(r[4]) for r in rows}


@pytest.mark.parametrize(
    "model,cls,methods",
    [
        ("colbert", "models.rankers.colbert:ColBERT", ("encode_queries", "encode_docs")),
        ("bert_cat", "models.rankers.bert_cat:BertCat", ("score",)),
    ],
)
@pytest.mark.slow
def test_oom_during_evaluation_retried_in_halves(tmp_path, tiny_bert, monkeypatch, model, cls, methods):
    """Every call on more than 3 rows raises torch.OutOfMemoryError (as CUDA would): each batch is retried in halves
    down to 3 rows, with a warning per split, and the scores equal an evaluation that never ran out of memory."""
    import importlib

    from pipeline.config import compose
    from pipeline.run import evaluate

    args = [*SMALL, f"model={model}", f"model.backbone={tiny_bert}", "data.eval_batch_size=16"]
    ref = tmp_path / "ref"
    evaluate(compose([*args, f"output_dir={ref}"]), True)

    mod, name = cls.split(":")
    klass = getattr(importlib.import_module(mod), name)
    calls = []
    for method in methods:
        real = getattr(klass, method)

        def limited(self, batch, _real=real):
            rows = next(v for k, v in batch.items() if k.endswith("input_ids")).shape[0]
            calls.append(rows)
            if rows > 3:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return _real(self, batch)

        monkeypatch.setattr(klass, method, limited)
    out = tmp_path / "oom"
    with pytest.warns(
        UserWarning, match=r"out of memory (encoding passages|scoring pairs) on 16 rows; retrying in halves of 8 and 8"
    ):
        evaluate(compose([*args, f"output_dir={out}"]), True)
    assert max(calls) == 16 and {c for c in calls if c <= 3}, calls
    a, b = _run_scores(ref), _run_scores(out)
    assert a.keys() == b.keys()
    assert max(abs(a[k] - b[k]) for k in a) < 1e-5
    assert metrics(out)["ndcg_cut_10"] == pytest.approx(metrics(ref)["ndcg_cut_10"], abs=1e-9)


# ---- a DataLoader worker dying or failing ----------------------------------------------------------------------
class _Examples(torch.utils.data.Dataset):
    """40 examples; `kill` makes the worker loading that example die (SIGKILL), `fail` raises inside it."""

    def __init__(self, kill: int = -1, fail: int = -1):
        self.kill, self.fail = kill, fail

    def __len__(self) -> int:
        return 40

    def __getitem__(self, item):
        _, i = item
        if i == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.fail:
            raise ValueError(f"unparseable passage in example {i}")
        return torch.tensor([i])


def _training_loader(ds, workers: int):
    from datamodules.samplers import DistributedTrainBatchSampler, ResumableLoader

    return ResumableLoader(
        ds,
        batch_sampler=DistributedTrainBatchSampler(len(ds), 4, seed=0, shuffle=False),
        num_workers=workers,
        consumed=lambda: 0,
        what="training example",
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_example_exception_names_the_example(workers):
    from datamodules.guarded import ExampleError

    with pytest.raises(ExampleError) as e:
        list(_training_loader(_Examples(fail=13), workers))
    where = " in DataLoader worker " if workers else ""
    assert e.value.example == 13 and str(e.value).startswith(f"training example 13{where}")
    assert str(e.value).endswith("ValueError: unparseable passage in example 13") and "\n" not in str(e.value)


@pytest.mark.slow
def test_dataloader_worker_killed_names_the_example_without_hanging():
    """The worker loading example 13 is SIGKILLed: within PyTorch's worker check (seconds), not a hang, the run
    stops with the example index."""
    import time

    from datamodules.guarded import ExampleError

    start = time.monotonic()
    with pytest.raises(ExampleError) as e:
        list(_training_loader(_Examples(kill=13), 2))
    assert time.monotonic() - start < 60
    assert e.value.example == 13
    assert "training example 13 in DataLoader worker" in str(e.value) and "died while loading it" in str(e.value)


@pytest.mark.parametrize(
    "message",
    [
        "DataLoader worker (pid 4242) is killed by signal: Killed. ",
        "DataLoader worker (pid 4242) exited unexpectedly with exit code 1. Details are lost due to multiprocessing.",
        "DataLoader worker (pid(s) 4241, 4242) exited unexpectedly",
    ],
)
def test_dead_worker_message_forms_name_the_example(message):
    """PyTorch reports a dead worker from its SIGCHLD handler or from its queue poll, whichever notices first (the
    test above hits either, by timing): every form is mapped to the example the dead worker was loading."""
    from datamodules.guarded import ExampleError, GuardedLoader, _GuardedIter

    loader = GuardedLoader(_Examples(), num_workers=2, what="training example")
    loader._pids[0], loader._slots[0] = 4240, 7  # a live worker, busy with another example
    loader._pids[1], loader._slots[1] = 4242, 13

    def dying():
        raise RuntimeError(message)
        yield

    with pytest.raises(ExampleError) as e:
        next(_GuardedIter(dying(), loader))
    assert e.value.example == 13 and str(e.value).startswith(
        "training example 13 in DataLoader worker 1: the worker process died"
    )


# ---- DDP: one rank raising ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.slow
def test_ddp_one_rank_raising_stops_all_ranks(tmp_path, tiny_bert, rank):
    """Two gloo ranks; one raises after step 2. The other rank's next collective fails ("Connection closed by
    peer"), or its watchdog sees the rank end, instead of waiting, so the job exits non-zero well inside the limit and
    no rank process is left over."""
    import time

    out = tmp_path / f"ddp-rank{rank}"
    args = [
        *SMALL,
        f"model.backbone={tiny_bert}",
        "data.batch_size=4",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "eval.before_training=false",
        f"output_dir={out}",
    ]
    start = time.monotonic()
    proc = with_fault(f"raise:{rank}:2", "train.py", *args, timeout=240)  # TimeoutExpired would mean a hang
    assert proc.returncode != 0 and time.monotonic() - start < 240
    log = proc.stdout + proc.stderr
    assert f"injected failure on rank {rank} at step 2" in log
    # the surviving rank noticed, rather than hanging: its collective failed, or its watchdog saw the rank end first
    # (core/ranks.py; with rank 0 raising, the parent process is gone before rank 1's next collective)
    assert "Connection closed by peer" in log or f"stopped: rank {rank} died" in log, log[-3000:]
    deadline = time.monotonic() + 60  # a rank still exiting on a loaded machine is not one that outlived the job
    while str(out) in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "a rank process outlived the job"
        time.sleep(0.5)
    assert not (out / "metrics.json").exists()


# ---- W&B unreachable or its folder unwritable -------------------------------------------------------------------
def _wandb_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), PYTHONUNBUFFERED="1", **extra)
    return env


WB = [
    *SMALL,
    "data.batch_size=8",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "eval.before_training=false",
    "logger=wandb",
    "trainer.log_every_n_steps=1",
]


@pytest.mark.slow
def test_wandb_unreachable_falls_back_to_offline(tmp_path, tiny_bert):
    """logger.mode=online with a server that refuses connections: a warning, an offline run in <output_dir>/wandb that
    `wandb sync` can upload later, and the training finishes."""
    out = tmp_path / "run"
    env = _wandb_env(
        tmp_path, WANDB_API_KEY="local-" + "0" * 40, WANDB_BASE_URL="http://127.0.0.1:9", WANDB_INIT_TIMEOUT="3"
    )
    proc = run_script(
        "train.py", *WB, f"model.backbone={tiny_bert}", "logger.mode=online", f"output_dir={out}", env=env
    )
    assert "W&B online run failed (CommError" in proc.stderr
    assert (
        f"logging offline to {out / 'wandb'} instead: sync it later with `wandb sync {out / 'wandb'}/offline-run-*`"
        in proc.stderr
    )
    (run,) = (out / "wandb").glob("offline-run-*")
    assert list(run.glob("run-*.wandb")) and (out / "metrics.json").exists()


@pytest.mark.slow
def test_wandb_folder_unwritable_falls_back_to_a_temporary_folder(tmp_path, tiny_bert):
    """<output_dir>/wandb cannot be created (a file is in the way; permissions do not stop root): the run logs offline
    into a fresh temporary folder, says where, and finishes."""
    out, tmp = tmp_path / "run", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    (out / "wandb").write_text("not a folder\n")
    proc = run_script(
        "train.py", *WB, f"model.backbone={tiny_bert}", f"output_dir={out}", env=_wandb_env(tmp_path, TMPDIR=str(tmp))
    )
    (fallback,) = tmp.glob("isorank-wandb-*")
    assert f"logging offline to {fallback / 'wandb'} instead" in proc.stderr
    assert list((fallback / "wandb").glob("offline-run-*/run-*.wandb")) and (out / "metrics.json").exists()


def test_wandb_names_groups_and_tags():
    from callbacks.loggers import wandb_init_args
    from pipeline.config import compose

    a = wandb_init_args(compose(["model=repbert", "data=synthetic", "output_dir=outputs/x"]), "x")
    assert (a["name"], a["group"], a["job_type"], a["tags"]) == (
        "x",
        "repbert-synthetic",
        "train",
        ["repbert", "synthetic"],
    )
    b = wandb_init_args(
        compose(["stage=head", "head=glow", "logger.group=g", "logger.run_name=r", "logger.tags=[t]"]), "y"
    )
    assert (b["name"], b["group"], b["job_type"], b["tags"]) == (
        "r",
        "g",
        "head",
        ["colbert", "synthetic", "glow", "t"],
    )
    assert wandb_init_args(compose([]), "eval-z")["job_type"] == "eval"
