"""Checkpointing: the best checkpoint by validation NDCG@10 plus a resumable `last.ckpt`.

`last.ckpt` is written at every validation and after the final training step, so a run killed at any point
resumes from its latest validation (`ckpt_path=.../last.ckpt`). Lightning's ModelCheckpoint alone does neither:
since 2.5 it refreshes `last.ckpt` only at validations that also produced a new best checkpoint, and a run that
stops on `max_steps` between validations is not saved at all. The final save happens in `on_train_batch_end`,
not `on_train_end`: by then Lightning has marked a cut-short epoch as finished, and a resume would skip the rest
of that epoch's batches.

Every validation while fitting (the step-0 candidate included) is kept with its step in `validations`, part of the
checkpoint state so a resumed run keeps the curve; train.py writes it as `validation.json` and the tested
checkpoint's step as `best_step` in metrics.json, which is how a learning-rate x steps sweep is read.

A resumed `last.ckpt` whose best checkpoint is gone (deleted, or a folder copied without it) resumes without it
(`lost_best` names it for the warning train.py prints): the lost best is forgotten, score included, so the best of the
validations after the resume is kept and tested, or the resumed weights when none follows. Lightning alone would
train on and then fail in the test with `Checkpoint file not found`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.rank_zero import rank_zero_only


def lost_best(ckpt: dict) -> dict | None:
    """Return what a checkpoint's RankingCheckpoint state says of its best checkpoint when that file is missing.

    {"path", "score" (float or None), "step" (int or None)} for a best checkpoint recorded in `ckpt` (a loaded
    `last.ckpt`) that does not exist; None when it exists or none is recorded.
    """
    for key, state in (ckpt.get("callbacks") or {}).items():
        if not str(key).startswith("RankingCheckpoint") or not isinstance(state, dict):
            continue
        path = state.get("best_model_path") or ""
        if not path or Path(path).is_file():
            return None
        try:
            score = float(state.get("best_model_score"))
        except (TypeError, ValueError):  # none recorded, or a header read without tensors (core.checkpoints)
            score = None
        return {"path": path, "score": score, "step": state.get("best_step")}
    return None


def lost_best_warning(ckpt: dict, ckpt_path: str, monitor: str) -> str | None:
    """Return the one-line warning for resuming `ckpt_path` (loaded as `ckpt`) whose best checkpoint is gone, else None.

    It names the lost file and its score and says which model the test after training uses instead.
    """
    lost = lost_best(ckpt)
    if lost is None:
        return None
    score = "" if lost["score"] is None else f"{monitor} {lost['score']:.4f}"
    at = "" if lost["step"] is None else f"at step {lost['step']}"
    what = f" ({' '.join(filter(None, [score, at]))})" if score or at else ""
    step = int(ckpt.get("global_step", 0))
    return (
        f"ckpt_path: the best checkpoint that '{ckpt_path}' records, '{lost['path']}'{what}, is missing; resuming "
        f"without it: the best validation after step {step} becomes the best checkpoint and is tested, or the "
        "resumed weights if no validation follows (the lost one cannot be tested)"
    )


class RankingCheckpoint(ModelCheckpoint):
    """Keep the best checkpoint by the monitored validation metric, a resumable `last.ckpt`, and the validation curve.

    The best checkpoint is `best-{step}.ckpt` (top 1, mode max); `last.ckpt` is written at every validation and after
    the final training step (see the module docstring for why Lightning's own `save_last` is not enough).

    Parameters
    ----------
    dirpath : str
        Folder of the checkpoints.
    monitor : str
        Validation metric that picks the best checkpoint, higher is better.
    """

    def __init__(self, dirpath: str, monitor: str = "val/ndcg_cut_10"):
        super().__init__(
            dirpath=dirpath,
            filename="best-{step}",
            monitor=monitor,
            mode="max",
            save_last=True,
            save_top_k=1,
            auto_insert_metric_name=False,
        )
        self._last_step_written = -1
        self._said_other = False  # the warning of a resume from another run's folder, once
        self.start_model_path = ""  # best-0.ckpt while the starting model is the best (add_start_candidate)
        self.before_training: dict | None = (
            None  # the test metrics before fine-tuning, for a resumed run's metrics.json
        )
        self.validations: list[dict] = []  # {"step": global step, "val/...": value} per validation while fitting
        self.best_step: int | None = None  # the step of best_model_path

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Set up as ModelCheckpoint does, without its warning about a non-empty checkpoint folder."""
        with warnings.catch_warnings():
            # best-0.ckpt (add_start_candidate) is ours: train.py refuses an output_dir that already holds checkpoints
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)

    def add_start_candidate(self, trainer, score: float) -> str:
        """Save the model before fine-tuning as the first candidate for "best"; return its path.

        Its validation (`score` of the monitored metric at step 0) enters the ranking like any later validation, so
        the best checkpoint by validation never loses to the starting model. Written as `best-0.ckpt` and replaced, as
        any best, when a validation beats it. Called between trainer.validate and trainer.fit, on every rank (saving
        is a collective).
        """
        path = str(Path(self.dirpath) / f"best-{trainer.global_step}{self.FILE_EXTENSION}")
        trainer.save_checkpoint(path, weights_only=False)  # the whole state, as every checkpoint of a run
        value = torch.tensor(float(score))
        self.best_k_models = {path: value}
        self.kth_best_model_path, self.kth_value = path, value
        self.best_model_path, self.best_model_score = path, value
        self.start_model_path = path
        self.best_step = trainer.global_step
        self._keep_validation(trainer)
        return path

    def curve(self) -> dict | None:
        """Return the content of validation.json: the monitor, the best checkpoint's step and every validation.

        None without a validation. Read it before trainer.test(ckpt_path=best): loading a checkpoint restores this
        callback's state as it was saved.
        """
        if not self.validations:
            return None
        return {
            "monitor": self.monitor,
            "best_step": self.best_step,
            "validations": [dict(v) for v in self.validations],
        }

    def _keep_validation(self, trainer) -> None:
        logged = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("val/") and torch.as_tensor(v).numel() == 1
        }
        self.validations.append({"step": trainer.global_step, **dict(sorted(logged.items()))})

    def state_dict(self) -> dict:
        """Return ModelCheckpoint's state plus the start model's path, the pre-training test metrics and the curve."""
        return {
            **super().state_dict(),
            "start_model_path": self.start_model_path,
            "before_training": self.before_training,
            "validations": self.validations,
            "best_step": self.best_step,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the state of `state_dict`; keys missing from an older checkpoint get their empty defaults.

        A last.ckpt this callback wrote in this process stays the one named: the test after training restores the
        state saved with best-N.ckpt (its last_model_path older or empty), and a signal or a rank's death during that
        test must still name the last.ckpt to resume from (callbacks/preemption.py, callbacks/rank_watch.py).
        """
        written = (self.last_model_path, self._last_step_written)
        other = state_dict.get("dirpath", self.dirpath)
        with warnings.catch_warnings():  # said below in this project's words, with what is carried over
            warnings.filterwarnings("ignore", message="The dirpath has changed")
            super().load_state_dict(state_dict)
        if other != self.dirpath:
            self._carry_best(state_dict, str(other))
        if written[0] and written[1] >= 0 and Path(written[0]).is_file():
            self.last_model_path, self._last_step_written = written
        self.start_model_path = state_dict.get("start_model_path", "")
        self.before_training = state_dict.get("before_training")
        self.validations = list(state_dict.get("validations", []))
        self.best_step = state_dict.get("best_step")
        self._forget_missing()

    def _carry_best(self, state_dict: dict, other: str) -> None:
        """Keep the best so far of a run resumed from another run's folder (`ckpt_path=<other>/last.ckpt`).

        Lightning then reloads only the best checkpoint's path, not its score: the first validation after the resume
        would be taken as the best, however it scored. The score and the best-k record are carried over (their files
        stay in the other folder, where the test reads the best from unless a later validation beats it); last.ckpt
        is this run's own: in a copied run folder, the copy resumed from until this run writes its next.
        """

        def here(path: str) -> str:  # a copied run folder holds its own copy of the file: use that one
            own = Path(self.dirpath) / Path(path).name if path else None
            return str(own) if own is not None and own.is_file() else path

        self.best_model_score = state_dict.get("best_model_score")
        self.best_model_path = here(self.best_model_path)
        self.best_k_models = {here(k): v for k, v in (state_dict.get("best_k_models") or {}).items()}
        self.kth_best_model_path = here(state_dict.get("kth_best_model_path", ""))
        self.kth_value = state_dict.get("kth_value", self.kth_value)
        # a copied folder's own last.ckpt (the one resumed from) is what a stop now keeps; Lightning drops the path
        last = here(state_dict.get("last_model_path", ""))
        copied = bool(last) and Path(last).parent == Path(self.dirpath) and Path(last).is_file()
        if copied:
            self.last_model_path = last
        if self._said_other or rank_zero_only.rank != 0:  # one warning per run, not one per rank
            return
        self._said_other = True
        best, score = self.best_model_path, self.best_model_score
        kept = (
            f"its best so far, {best} ({self.monitor} {float(score):.4f}), stays the one to beat and is tested from "
            "there unless a later validation beats it"
            if best and score is not None
            else "it recorded no best checkpoint"
        )
        where = (
            f"this run folder is a copy of {Path(other).parent}: the run goes on here with the copy's checkpoints"
            if copied
            else f"ckpt_path is a checkpoint of another run's folder ({other}): this run goes on in {self.dirpath}"
        )
        warnings.warn(f"{where}; {kept}", stacklevel=2)

    def _forget_missing(self) -> None:
        """Forget checkpoints of the restored state whose files are gone, the best one included (see `lost_best`).

        The next validation then becomes the best (and is saved), whatever its score against the lost one.
        """
        self.best_k_models = {k: v for k, v in self.best_k_models.items() if Path(k).is_file()}
        if self.best_model_path and not Path(self.best_model_path).is_file():
            self.best_model_path, self.best_model_score, self.best_step = "", None, None
            if self.start_model_path and not Path(self.start_model_path).is_file():
                self.start_model_path = ""
        if self.kth_best_model_path and self.kth_best_model_path not in self.best_k_models:
            self.kth_best_model_path = ""
            self.kth_value = torch.tensor(float("-inf") if self.mode == "max" else float("inf"))

    def write_last(self, trainer) -> str:
        """Write (or keep, if this step's is written) the resumable `last.ckpt`; returns its path."""
        last = Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
        if self._last_step_written != trainer.global_step:
            self._write_last(trainer)
        return str(last)

    def _write_last(self, trainer) -> None:
        if self._last_step_written == trainer.global_step:
            return
        last = Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
        self.last_model_path = str(last)  # part of the saved callback state: set before saving
        trainer.save_checkpoint(str(last), weights_only=False)  # resumable: optimiser, schedule, callbacks
        self._last_step_written = trainer.global_step

    def on_validation_end(self, trainer, pl_module) -> None:
        """Rank the validation as ModelCheckpoint does, then (while fitting) record it and write `last.ckpt`."""
        best_before = self.best_model_path
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._keep_validation(trainer)
            if self.best_model_path != best_before:
                self.best_step = trainer.global_step
            if self._last_global_step_saved == trainer.global_step:  # a new best: Lightning wrote last.ckpt too
                self._last_step_written = trainer.global_step
            self._write_last(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Write `last.ckpt` once the step reaches `max_steps`, before Lightning marks the epoch as finished."""
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if 0 < trainer.max_steps <= trainer.global_step:
            self._write_last(trainer)
