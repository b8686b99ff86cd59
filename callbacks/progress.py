"""The progress bar: Lightning's RichProgressBar with a finite epoch count when `trainer.max_steps` ends training.

With `max_epochs` unset and `max_steps` set, Lightning runs with max_epochs=-1 and its bar reads "Epoch 1/-2". Here
the bar shows the last epoch that max_steps reaches, from the training batches per epoch and gradient accumulation
(Lightning steps the optimiser every `accumulate_grad_batches` batches and at the end of each epoch). Display only:
the Trainer's limits, and so when training stops, stay as configured.

Training values (`TRAIN_SHOWN`) are refreshed every `trainer.log_every_n_steps` steps, when Lightning turns logged
tensors into numbers anyway: a value logged with `prog_bar=True` is read on the host after every batch, which on a
GPU waits for the whole step to finish before the next one can be queued.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager

from pytorch_lightning import Callback
from pytorch_lightning.callbacks import RichProgressBar

from core.progress import Phase, phase

# the training values the bar shows, from what the module logs (without prog_bar): fine-tuning's loss, the head's NLL
TRAIN_SHOWN = ("train/loss", "train/nll")


def last_epoch(max_steps: int, batches_per_epoch: float, accumulate: int) -> int | None:
    """Return the 0-based index of the epoch in which step `max_steps` falls.

    None when unknown (no step limit, or a loader without a length).
    """
    if max_steps < 1 or not 0 < batches_per_epoch < math.inf:
        return None
    return math.ceil(max_steps / math.ceil(batches_per_epoch / max(1, accumulate))) - 1


class RankingProgressBar(RichProgressBar):
    """Lightning's RichProgressBar whose epoch label reads "Epoch i/last" when `max_steps` ends training.

    `last` is the epoch that `max_steps` reaches (`last_epoch`); with `max_epochs` set, or no step limit, the label is
    Lightning's own. The values of `TRAIN_SHOWN` are shown as of the latest log step (module docstring).
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """One training batch done."""
        """Advance the bar; refresh its values only at log steps (Lightning's refreshes them after every batch)."""
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()  # as Lightning's: a resumed epoch starts mid-way
        self._update(self.train_progress_bar_id, batch_idx + 1)
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer, pl_module) -> dict:
        """Lightning's values, with the training values of `TRAIN_SHOWN` (latest logged)."""
        items = super().get_metrics(trainer, pl_module)
        for name in TRAIN_SHOWN:
            value = trainer.callback_metrics.get(name)
            if value is not None:
                items[name] = float(value)
        return items

    def _get_train_description(self, current_epoch: int) -> str:
        t = self.trainer
        last = (
            last_epoch(t.max_steps, t.num_training_batches, t.accumulate_grad_batches)
            if t.max_epochs in (None, -1)
            else None
        )
        if last is None:
            return super()._get_train_description(current_epoch)
        # padded as Lightning pads it, so that the bar does not flicker beside the validation bar
        return f"{f'Epoch {current_epoch}/{last}':{len(self.validation_description)}}"


class LoopPhases(Callback):
    """Lightning's loops as phases of core/progress.py, in place of the bar when stdout is not a terminal (a log, CI).

    A Rich bar written to a file prints nothing while it runs and its last frame when it stops: a training epoch of
    hours would be silent in the log. Here each epoch, validation and test is a phase like the pipeline's other long
    work: a line every `ISORANK_PROGRESS_EVERY_S` saying how many batches are done, and `<name> ... done in <s> s`
    (phases under `ISORANK_PROGRESS_QUIET_S` print nothing). Reads no tensor: the loss is in the logger, not here.
    """

    def __init__(self):
        self._open: dict[str, tuple[AbstractContextManager, Phase]] = {}

    def _begin(self, key: str, name: str, total: float | int | None) -> None:
        self._end(key)
        total = int(total) if total is not None and math.isfinite(total) else None
        manager = phase(name, total=total, unit="batches", key=key)
        self._open[key] = (manager, manager.__enter__())

    def _advance(self, key: str) -> None:
        if key in self._open:
            self._open[key][1].advance(1)

    def _end(self, key: str, error: BaseException | None = None) -> None:
        if key in self._open:
            manager, _ = self._open.pop(key)
            if error is None:
                manager.__exit__(None, None, None)
            else:  # no done line for a loop that failed (core/progress.py)
                manager.__exit__(type(error), error, error.__traceback__)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        """Open the epoch's phase, counted in training batches."""
        self._begin("training", f"training epoch {trainer.current_epoch}", trainer.num_training_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Count one training batch."""
        self._advance("training")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """Close the epoch's phase (its done line)."""
        self._end("training")

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        """Open the phase of a validation (or of the sanity check)."""
        name = "sanity check" if trainer.sanity_checking else f"validation at step {trainer.global_step}"
        total = sum(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)
        self._begin("validation", name, total)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """One validation batch done."""
        self._advance("validation")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        """Close the validation's phase."""
        self._end("validation")

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        """Open the test's phase."""
        self._begin("testing", "testing", sum(trainer.num_test_batches))

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """One test batch done."""
        self._advance("testing")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        """Close the test's phase."""
        self._end("testing")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """End the open phases without a done line: the error says what happened."""
        for key in list(self._open):
            self._end(key, exception)
