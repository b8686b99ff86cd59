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

from pytorch_lightning.callbacks import RichProgressBar

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
