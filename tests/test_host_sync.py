"""The host is never on the critical path of a training step: nothing in a step reads a tensor's value on the host.

On a GPU such a read (`.item()`, `bool(t)`, `if t:`, boolean-mask indexing...) waits for every kernel queued
before it, so the device idles while the host prepares the next step. CPU tensors cannot show that (and
`torch.cuda.set_sync_debug_mode` needs CUDA), so the tests here record every call that would read a tensor on the host,
made between a training batch's first hook (after its transfer to the device) and Lightning's per-step logging, in real
fits with the pipeline's trainer, callbacks, progress bar and logger. Steps at which Lightning logs
(`trainer.log_every_n_steps`) or a checkpoint is written read tensors by design and are left out; so are the reads of
`DeferredReads` (core/host_reads.py), which reads host copies of an earlier step's flags. Copies of host data to
the device count as reads: from pageable memory CUDA makes the host wait for the queued kernels before each one
(core/transfers.py stages them in page-locked memory).
"""

from __future__ import annotations

import sys
import traceback
import weakref
from collections import defaultdict

import pytest
import torch
from conftest import module_and_data, small_run
from pytorch_lightning import Callback
from pytorch_lightning.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

from core.host_reads import DeferredReads

READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")
DATA_DEPENDENT = ("nonzero", "masked_select", "unique", "repeat_interleave", "argwhere")  # output shape from values
LOG_EVERY = 3
STEPS = 7


class SyncRecorder:
    """Patches the tensor methods that read values on the host and records the calls made while `on`."""

    def __init__(self, monkeypatch):
        self.on = False
        self.step = None
        self.calls: dict[int, list[str]] = defaultdict(list)
        self.excluded: set[int] = set()  # steps that logged or wrote a checkpoint
        # DeferredReads reads host copies of an earlier step; its CPU path stands in for a pinned copy on CUDA
        self._allowed = {DeferredReads.pop.__code__, DeferredReads.push.__code__}
        for name in READS:
            self._wrap(monkeypatch, torch.Tensor, name, name)
        for name in DATA_DEPENDENT:
            self._wrap(monkeypatch, torch.Tensor, name, name)
            self._wrap(monkeypatch, torch, name, f"torch.{name}")
        for name in ("__getitem__", "__setitem__"):
            self._wrap(monkeypatch, torch.Tensor, name, f"{name}[bool mask]", when=_bool_index)
        # copies of host data made in the step (from NumPy or Python values) to a device: on CUDA each copy from
        # pageable memory waits for the kernels queued before it. On a CPU run every tensor is a host tensor and a
        # copy to the CPU returns its source, so a copy is judged by its source: made on the host in the same step
        # (a tensor made once and moved again each step moves only once on a GPU, and then is the moved one). The
        # first step is left out of this check: Lightning moves the states of each newly logged value there, once
        self.host_made: dict[int, tuple[weakref.ref, int | None]] = {}  # id -> (tensor, step made in)
        self._wrap(monkeypatch, torch.Tensor, "to", "to(device) of host data", when=self._host_to_device)
        for name in ("tensor", "as_tensor", "asarray", "from_numpy"):
            self._wrap(monkeypatch, torch, name, f"torch.{name}(host data, device=)", when=_host_data_to_device)
            self._track(monkeypatch, torch, name)

    def _wrap(self, monkeypatch, owner, name, label, when=None):
        real = getattr(owner, name)
        rec = self

        def wrapper(*args, **kwargs):
            if rec.on and (when is None or when(args, kwargs)):
                rec.on = False  # the recording itself reads nothing, but keep it out of its own way
                try:
                    if not rec._inside_allowed():
                        rec.calls[rec.step].append(f"{label}\n" + "".join(traceback.format_stack(limit=10)[:-1]))
                finally:
                    rec.on = True
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    def _track(self, monkeypatch, owner, name):
        """Note the tensors `owner.name` makes on the host while recording (the sources `_host_to_device` judges)."""
        real = getattr(owner, name)
        rec = self

        def tracked(*args, **kwargs):
            out = real(*args, **kwargs)
            if rec.on and isinstance(out, torch.Tensor) and out.device.type == "cpu":
                rec.host_made[id(out)] = (weakref.ref(out), rec.step)
            return out

        monkeypatch.setattr(owner, name, tracked)

    def _host_to_device(self, args, kwargs) -> bool:
        t = args[0]
        ref, step = self.host_made.get(id(t), (None, None))
        made_this_step = ref is not None and ref() is t and step == self.step and step not in (None, 0)
        return made_this_step and not t.is_pinned() and _names_a_device(args, kwargs)

    def _inside_allowed(self) -> bool:
        f = sys._getframe(2)
        while f is not None:
            if f.f_code in self._allowed:
                return True
            f = f.f_back
        return False

    def offending(self) -> dict[int, list[str]]:
        return {s: c for s, c in self.calls.items() if s not in self.excluded and c}


def _names_a_device(args, kwargs) -> bool:
    """Whether a `Tensor.to` call moves to a device (not only a dtype): a device, a device string or a tensor."""
    given = [*args[1:], kwargs.get("device"), kwargs.get("other")]
    return any(isinstance(a, (torch.device, str, torch.Tensor)) for a in given if a is not None)


def _host_data_to_device(args, kwargs) -> bool:
    data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
    return kwargs.get("device") is not None and not isinstance(data, torch.Tensor)


def _bool_index(args, kwargs) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _fit_recording(tmp_path, monkeypatch, backbone: str, model: str) -> SyncRecorder:
    """Fine-tune `model` for STEPS steps through the pipeline's trainer, recording host reads in each step."""
    import pytorch_lightning as pl

    from callbacks.loggers import build_logger
    from pipeline.config import compose
    from pipeline.stages import build_trainer

    cfg = compose(
        small_run(
            f"model={model}",
            f"model.backbone={backbone}",
            "data.batch_size=4",
            f"trainer.max_steps={STEPS}",
            f"trainer.val_check_interval={STEPS}",
            f"trainer.log_every_n_steps={LOG_EVERY}",
            "trainer.enable_progress_bar=true",
            "logger=csv",
            "eval.ats_passages=0",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"output_dir={tmp_path / 'run'}",
        )
    )
    module, dm = module_and_data(cfg)
    rec = SyncRecorder(monkeypatch)

    class Start(Callback):  # first of the callbacks: a step's reads start with its first hook
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            rec.step, rec.on = trainer.global_step, True

    update = _LoggerConnector.update_train_step_metrics

    def until_logging(self):  # a step's reads end where Lightning's per-step logging starts
        rec.on = False
        if self.should_update_logs:
            rec.excluded.add(rec.step)
        return update(self)

    monkeypatch.setattr(_LoggerConnector, "update_train_step_metrics", until_logging)
    save = pl.Trainer.save_checkpoint

    def saving(self, *args, **kwargs):
        rec.excluded.add(rec.step)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", saving)
    trainer = build_trainer(cfg, build_logger(cfg, name="run"), checkpoints=True)
    trainer.callbacks.insert(0, Start())
    trainer.fit(module, datamodule=dm)
    rec.on = False
    assert trainer.global_step == STEPS
    assert len(set(range(STEPS)) - rec.excluded) >= 3, "too few steps checked"
    return rec


@pytest.mark.slow
@pytest.mark.parametrize(
    "model",
    [
        "colbert",
        "repbert",
        "bert_cat",
        "tk",
        "dgre",
    ],
)
def test_training_steps_read_nothing_on_the_host(tmp_path, monkeypatch, tiny_bert, model):
    """Between its first hook and Lightning's logging, no training step reads a tensor on the host: not the
    non-finite checks (optim.nonfinite), the progress bar, the callbacks, nor the ranker's length groups and masks."""
    rec = _fit_recording(tmp_path, monkeypatch, tiny_bert, model)
    bad = rec.offending()
    assert not bad, "host reads in training steps " + str(sorted(bad)) + ":\n" + "\n".join(next(iter(bad.values())))


META_QUERIES = ["what is heat transfer", "slab conduction in thin plates of metal", "flow"]
META_DOCS = [
    "heat flows from hot to cold",
    "a plate",
    "conduction in metal slabs studied at length",
    "x",
    "flow",
    "thin",
]


def _meta_step(backbone: str, model: str, change=None):
    """A training step (loss and backward) of `model` on PyTorch's shape-only "meta" device, in train mode.

    A meta tensor has no values: any read of one on the host (`.item()`, `bool()`, boolean-mask indexing, `nonzero`,
    `repeat_interleave` without a size...) fails, wherever it is made: in the ranker, in transformers or inside a
    PyTorch operator, which the recorder above cannot see. The batch carries its token counts (HOST_LENGTHS) as the
    collate makes them. `change(module)` may alter the module first.
    """
    from datamodules.tokenization import HOST_LENGTHS, host_lengths
    from lightning_modules.module import RankingModule

    torch.manual_seed(0)
    m = RankingModule({"name": model, "backbone": backbone, "query_max_len": 8, "doc_max_len": 16}, {}).train()
    batch = m.pair_tokenizer.triplets(META_QUERIES, META_DOCS[:3], META_DOCS[3:])
    batch[HOST_LENGTHS] = host_lengths(batch)
    if change is not None:
        change(m)
    m.to("meta")
    loss = m.training_step({k: v.to("meta") if torch.is_tensor(v) else v for k, v in batch.items()}, 0)
    loss.backward()
    return loss


@pytest.mark.parametrize("model", ["colbert", "repbert", "bert_cat", "bert_dot", "tk", "dgre"])
def test_training_step_runs_on_a_device_without_values(tiny_bert, model):
    """Every ranker's training step runs on the meta device: nothing in it, down to the operators, reads a value on
    the host (the length groups: 3 here; on an accelerator `auto` makes one, tested in test_speed.py)."""
    loss = _meta_step(tiny_bert, model, lambda m: setattr(m.ranker.cfg, "length_buckets", 3))
    assert loss.device.type == "meta" and loss.shape == ()


def test_meta_step_sees_a_read_inside_an_operator(tiny_bert, monkeypatch):
    """The meta check itself: a value read that no Python method shows (an operator whose output size depends on
    values) fails the step."""
    from lightning_modules.module import RankingModule

    real = RankingModule.training_step

    def reading(self, batch, batch_idx):
        loss = real(self, batch, batch_idx)
        return loss + torch.repeat_interleave(torch.ones_like(loss).long().reshape(1)).float().sum() * 0

    monkeypatch.setattr(RankingModule, "training_step", reading)
    with pytest.raises((RuntimeError, NotImplementedError)):
        _meta_step(tiny_bert, "colbert")


def test_recorder_sees_a_host_read_in_a_training_step(tmp_path, monkeypatch, tiny_bert):
    """The recorder itself: a `.item()` in the loss reaches it (so an empty record means no read, not no recording)."""
    from lightning_modules.module import RankingModule

    real = RankingModule.training_step

    def reading(self, batch, batch_idx):
        loss = real(self, batch, batch_idx)
        if loss.item() > 1e9:  # a Python decision on a tensor value, as a GPU would have to wait for
            pass
        return loss

    monkeypatch.setattr(RankingModule, "training_step", reading)
    rec = _fit_recording(tmp_path, monkeypatch, tiny_bert, "colbert")
    bad = rec.offending()
    assert bad and all(any(c.startswith("item\n") for c in calls) for calls in bad.values())


def test_deferred_reads_hand_out_all_but_the_newest():
    reads = DeferredReads()
    for step in range(3):
        reads.push(step, torch.tensor([float(step), 2.0 * step]))
    assert reads.pop(keep_last=1) == [(0, [0.0, 0.0]), (1, [1.0, 2.0])]
    assert len(reads) == 1
    assert reads.pop() == [(2, [2.0, 4.0])] and reads.pop() == []


def test_deferred_reads_keep_the_value_at_push():
    """A value changed in place after its push is read as it was: the copy is taken when pushed (on a GPU, the copy
    is queued behind the work that computed it, and read once its event has passed)."""
    reads = DeferredReads()
    t = torch.tensor([1.0])
    reads.push("a", t)
    t.fill_(5.0)
    assert reads.pop() == [("a", [1.0])]
