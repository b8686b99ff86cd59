"""What a researcher sees on the dashboard: NDCG@10, I(W) and avgcos at every validation, through W&B (offline,
no login) and CSV."""

import csv
import os

import pytest
from conftest import run_script

RUN = [
    "data.max_train_triples=16",
    "data.max_eval_queries=8",
    "data.candidate_depth=10",
    "data.batch_size=8",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "eval.probe_queries=8",
    "eval.probe_docs=16",
    "eval.before_training=false",
    "trainer.log_every_n_steps=1",
]


@pytest.mark.slow
def test_csv_logger_records_validation_metrics(tmp_path, tiny_bert):
    out = tmp_path / "run"
    run_script("train.py", *RUN, f"model.backbone={tiny_bert}", "logger=csv", f"output_dir={out}")
    (metrics_csv,) = out.glob("csv/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics_csv.open()))
    val_rows = [r for r in rows if r.get("val/ndcg_cut_10")]
    # the validation at step 0 (eval.start_candidate, trainer.validate logs it as step 0), then after steps 2 and 4
    # (within fit Lightning logs step - 1)
    assert [int(r["step"]) for r in val_rows] == [0, 1, 3]
    for r in val_rows:
        assert 0 < float(r["val/iw"]) <= 1 and -1 <= float(r["val/avgcos"]) <= 1
        assert float(r["val/iw_sequence"]) > 0
    assert any(r.get("train/loss") for r in rows) and any(r.get("lr-AdamW/pg1") for r in rows)


@pytest.mark.slow
def test_wandb_offline_without_login(tmp_path, tiny_bert):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_DIR=str(tmp_path), HOME=str(tmp_path), PYTHONUNBUFFERED="1")  # no API key anywhere
    out = tmp_path / "run"
    proc = run_script(
        "train.py",
        *RUN,
        f"model.backbone={tiny_bert}",
        "logger=wandb",
        "logger.run_name=t1",
        f"output_dir={out}",
        env=env,
    )
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, proc.stderr[-2000:]
    assert list(runs[0].glob("run-*.wandb")), "the offline run holds the logged history"
    assert (out / "metrics.json").exists()


def _csv_fit(tmp_path, backbone: str, model: str, name: str) -> list[dict]:
    """The train/ rows of metrics.csv after a 7-step fit logging every 3 steps (validation off), in process."""
    from conftest import module_and_data, small_run

    from callbacks.loggers import build_logger
    from pipeline.config import compose
    from pipeline.stages import build_trainer

    cfg = compose(
        small_run(
            f"model={model}",
            f"model.backbone={backbone}",
            "data.batch_size=4",
            "trainer.max_steps=7",
            "trainer.limit_val_batches=0",
            "trainer.log_every_n_steps=3",
            "eval.before_training=false",
            "eval.ats_passages=0",
            "logger=csv",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"output_dir={tmp_path / name}",
        )
    )
    module, dm = module_and_data(cfg)
    trainer = build_trainer(cfg, build_logger(cfg, name="run"), checkpoints=False)
    trainer.fit(module, datamodule=dm)
    (metrics_csv,) = (tmp_path / name).glob("csv/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics_csv.open()))
    return [{k: v for k, v in r.items() if k == "step" or k.startswith("train/")} for r in rows if r.get("train/loss")]


@pytest.mark.parametrize("model", ["dgre"])  # its auxiliary losses and further values: every branch that logs
def test_training_values_are_logged_only_at_log_steps_with_the_same_values(tmp_path, monkeypatch, tiny_bert, model):
    """`self.log` in a training step runs only where Lightning hands values to the logger: the logger gets the same
    rows (steps and values) as when every step logs, as Lightning kept only each step's newest value anyway."""
    from lightning_modules.module import RankingModule

    real = RankingModule.logs_this_step
    asked = []
    monkeypatch.setattr(RankingModule, "logs_this_step", lambda self: asked.append(real(self)) or asked[-1])
    gated = _csv_fit(tmp_path, tiny_bert, model, "gated")
    # asked in each training step and before each optimiser step: True at steps 3 and 6 of 7 (1-based)
    assert asked == [False, False, False, False, True, True] + [False] * 4 + [True, True] + [False] * 2
    monkeypatch.setattr(RankingModule, "logs_this_step", lambda self: True)  # every step logs, as before
    every = _csv_fit(tmp_path, tiny_bert, model, "every")
    assert [r["step"] for r in gated] == ["2", "5"]
    assert gated == every
