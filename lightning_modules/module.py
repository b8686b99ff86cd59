"""The one LightningModule family: trains any registered ranker and evaluates it with trec_eval semantics.

Losses over (query, positive, negative) triplets:
- `ce`: softmax cross-entropy over the positive and the negatives, on scores / `optim.temperature`. For
  bi-encoders with `in_batch_negatives` the negatives are every other passage of the global batch, gathered across
  DDP ranks with gradients, except those judged relevant to the query (`in_batch_mask_relevant`: another query's
  positive may be this query's too).
- `hinge`: pairwise margin loss max(0, margin - s(q, p+) + s(q, p-)) on each triplet's own negative, on the scores
  as `Ranker.hinge_scores` maps them (identity; DGRe: sigmoid probabilities, its Eq. 25).

A cross-encoder may return auxiliary losses from its training forward (`CrossEncoder.score_triplets`): they are
added to the ranking loss and logged as `train/<name>`, with any further values the ranker reports.

Evaluation scores each (query, candidate) pair of this rank's shard; the (qidx, didx, score) triples are
gathered across ranks by a torchmetrics state before pytrec_eval runs once on the whole run.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from pytorch_lightning.utilities.seed import _collect_rng_states, _set_rng_states
from torch import Tensor

from core.errors import TrainingStopped, check_choice, check_unused
from core.host_reads import DeferredReads
from core.precision import cast_once
from core.ranges import NON_NEGATIVE, POSITIVE, check_ranges
from core.transfers import to_device
from datamodules.tokenization import HOST_RANK_ROWS, PairTokenizer
from metrics.ir import DEFAULT_MEASURES, RetrievalRun, evaluate_run
from metrics.rerank_depth import SELECT_BY, candidate_ranks, choose_depth, truncate
from models.encoding import WITH_HEAD, EncodedTextsWriter, encode_stream
from models.gradients import contiguous_gradient
from models.loading import pair_tokenizer_for
from models.oom import halving
from models.rankers import build_ranker, ranker_config
from models.rankers.base import Encoded, EncodedTexts, Ranker, TripletOutput, take


@dataclass
class OptimConfig:
    """The `optim` section of the config: learning rate and schedule, the training loss, and non-finite handling.

    Validated on construction (choices and ranges), so a typo in a YAML file or an override fails before training.
    The comments on the fields say what each one does.
    """

    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_steps: int = 10
    schedule: str = "linear"  # linear decay to 0 after warm-up | constant
    loss: str = "ce"  # ce | hinge
    margin: float = 1.0  # hinge only
    in_batch_negatives: bool = True  # bi-encoders under ce only: hinge scores each triplet's own negative
    # in-batch negatives judged relevant to the query are left out of its softmax: on SQuAD several questions share a
    # paragraph, so another query's positive is often this query's positive too (18% of batches of 16)
    in_batch_mask_relevant: bool = True
    # ce only: logits = score / temperature. null = the ranker's own (Ranker.ce_temperature): 0.05 for RepBERT,
    # whose scores are single cosines in [-1, 1] (a softmax over them is near uniform, and the loss then pulls
    # every positive to cosine 1 and every negative to -1, wrecking the pre-trained geometry; 0.05 is the scale 20
    # of sentence-transformers' MultipleNegativesRankingLoss, with which all-MiniLM-L6-v2 was trained), 1 for the
    # rest (ColBERT's sums of |q| cosines and unbounded dot products / logits already spread out).
    temperature: float | None = None
    # a NaN/inf training loss or gradient: skip (no update from that batch, a warning, train/nonfinite_batches
    # logged) or stop (TrainingStopped naming the last good checkpoint). Either way nothing is trained on it.
    nonfinite: str = "skip"

    def __post_init__(self):
        check_choice("optim.loss", self.loss, ("ce", "hinge"))
        check_choice("optim.nonfinite", self.nonfinite, ("skip", "stop"))
        check_choice("optim.schedule", self.schedule, ("linear", "constant"))
        check_ranges(
            "optim",
            self,
            lr=POSITIVE,
            weight_decay=NON_NEGATIVE,
            warmup_steps=NON_NEGATIVE,
            margin=NON_NEGATIVE,
            temperature=POSITIVE,
        )


def check_loss_keys(optim: OptimConfig) -> None:
    """Refuse a key of the loss not chosen set away from its default: it would be silently unused.

    At composition (pipeline/config.py `compose`), not in `OptimConfig`, so that a checkpoint written before this
    check still loads with the settings it records.
    """
    if optim.loss == "ce":
        why = "optim.loss is 'ce' and the margin is the hinge loss's"
        check_unused("optim", optim, ("margin",), why, "set optim.loss=hinge")
        if not optim.in_batch_negatives:
            why = "optim.in_batch_negatives is false: there are no in-batch negatives to mask"
            check_unused("optim", optim, ("in_batch_mask_relevant",), why, "set optim.in_batch_negatives=true")
    else:
        why = "optim.loss is 'hinge' and the temperature is the ce loss's"
        check_unused("optim", optim, ("temperature",), why, "set optim.loss=ce")
        why = "optim.loss is 'hinge', which scores each triplet's own negative alone: no in-batch negatives to mask"
        check_unused("optim", optim, ("in_batch_mask_relevant",), why, "set optim.loss=ce")


class RankingModule(pl.LightningModule):
    """Train any registered ranker (`model.name`) on triplets and evaluate it by re-ranking with trec_eval semantics.

    `model` is the ranker's config (`ranker_config`), `optim` the `OptimConfig`, `measures` the trec_eval measures
    of every evaluation (default `DEFAULT_MEASURES`); `ranker`: an already built (loaded) ranker of that config,
    which the module wraps instead of building a fresh one (`models.loading.load_ranker`). The losses and the
    evaluation are described in the module docstring; the results of the latest evaluation of each split are in
    `results[split]`.
    """

    def __init__(self, model: dict, optim: dict, measures: list[str] | None = None, ranker: Ranker | None = None):
        super().__init__()
        self.save_hyperparameters("model", "optim", "measures")  # not `ranker`, nor a subclass's modules
        self.model_cfg = ranker_config(model)
        self.optim_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OptimConfig), optim))
        self.measures = list(measures or DEFAULT_MEASURES)
        self.ranker = ranker if ranker is not None else build_ranker(self.model_cfg)
        # from_pretrained returns modules in eval mode, and Lightning keeps the modes it finds: without this,
        # dropout would be off during fine-tuning.
        self.ranker.train()
        self.runs = torch.nn.ModuleDict({"val": RetrievalRun(), "test": RetrievalRun()})
        self.results: dict[str, dict] = {}
        self.nonfinite_batches = 0
        self.oom_retries = 0  # evaluation batches retried in halves since the split's evaluation started
        # keep_vectors(split, variants): a consumer (the isotropy callback's `paper` protocol) asks for the vectors this
        # evaluation scores, so that nothing encodes the split twice
        self._keep_request: dict[str, tuple[str, ...]] = {}
        self._kept: dict[str, dict[str, EncodedTextsWriter]] = {}
        self._keep_limit: int | None = None

    @property
    def temperature(self) -> float:
        """The ce loss's softmax temperature: `optim.temperature`, or the ranker's own when that is null."""
        t = self.optim_cfg.temperature
        return float(t) if t is not None else float(self.ranker.ce_temperature)

    @property
    def pair_tokenizer(self) -> PairTokenizer:
        """A tokenizer for the ranker's texts, with its query / passage maximum lengths and its layout (bi or cross)."""
        return pair_tokenizer_for(self.ranker)

    # ---- training ------------------------------------------------------------------------------------------
    def _gather_docs(
        self, d: Encoded, keys: Tensor | None, rank_rows: int | None
    ) -> tuple[Encoded, Tensor | None, int, Tensor | None]:
        """Gather all ranks' passages for in-batch negatives, in shapes every rank knows without asking (no host sync).

        Each rank pads its block to 2 x `rank_rows` passages (HOST_RANK_ROWS: the most triplets a rank's batch holds)
        of the tokenizer's most passage tokens, so the gathered tensors have one shape on every rank. Returns all ranks'
        blocks (with gradients), their doc keys (`keys`: this rank's, one per passage, -1 for padding; None stays
        None), where this rank's block starts, and which gathered passages are real ([C] bool; None in one process).
        """
        world = self.trainer.world_size if self._trainer is not None else 1
        if world == 1:
            return d, keys, 0, None
        n, length = d.tokens.shape[:2]
        n_max, l_max = 2 * (rank_rows or 0), self.pair_tokenizer.doc_max_len
        if n > n_max or length > l_max:  # shapes, known on the host
            raise RuntimeError(
                f"in-batch negatives under DDP: {n} passages of {length} tokens on rank {self.global_rank}, above the "
                f"{n_max} x {l_max} every rank pads to (HOST_RANK_ROWS missing from the batch?)"
            )
        dev = d.tokens.device
        real = self.all_gather(torch.arange(n_max, device=dev) < n).reshape(world * n_max)
        if keys is not None:
            keys = self.all_gather(F.pad(keys, (0, n_max - n), value=-1)).reshape(world * n_max)
        start = self.global_rank * n_max
        if d.sequence is not None:  # single-vector rankers score with the pooled vector only
            seq = F.pad(d.sequence, (0, 0, 0, n_max - n))
            seq = self._gather_with_grads(seq).reshape(world * n_max, -1)
            return Encoded(tokens=seq[:, None], mask=real[:, None], sequence=seq), keys, start, real
        tok = F.pad(d.tokens, (0, 0, 0, l_max - length, 0, n_max - n))
        mask = F.pad(d.mask, (0, l_max - length, 0, n_max - n))
        mask[n:, 0] = True  # a padding passage holds one zero vector: finite scores (masked out) for every ranker
        tok = self._gather_with_grads(tok).reshape(world * n_max, l_max, -1)
        mask = self.all_gather(mask).reshape(world * n_max, l_max)
        return Encoded(tokens=tok, mask=mask), keys, start, real

    def _gather_with_grads(self, x: Tensor) -> Tensor:
        """Return all ranks' `x` stacked [world, ...]; gradients flow back to each rank's own, contiguous.

        (A strided gradient reaches gloo's all-to-all as wrong values: models/gradients.py.)
        """
        return contiguous_gradient(self.all_gather(x, sync_grads=True))

    @staticmethod
    def _judged_columns(keys: Tensor, relevant: Tensor, start: int) -> Tensor:
        """Mark the in-batch passages judged relevant to each query, to leave out of its softmax.

        Returns [B, C] bool: column c of the global batch (doc key `keys[c]`) is judged relevant to query i
        (`relevant`: [B, R] doc keys, -1 pads), other than the query's own positive and negative (those stay: a bad
        triple is the data's to fix, not the loss's).
        """
        judged = (keys[None, :, None] == relevant[:, None, :]).any(-1)
        b = relevant.shape[0]
        ar = torch.arange(b, device=keys.device)
        judged[ar, start + ar] = False
        judged[ar, start + b + ar] = False
        return judged

    def training_outputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, TripletOutput]:
        """Score a training batch of triplets.

        Returns (score matrix [B, C], target column [B], TripletOutput: s(q, p+) [B], s(q, own p-) [B] and the
        ranker's auxiliary losses and logs).
        """
        r = self.ranker
        if r.kind == "cross":
            out = r.score_triplets(batch)
            b = out.pos.shape[0]
            return torch.stack([out.pos, out.neg], 1), torch.zeros(b, dtype=torch.long, device=out.pos.device), out
        q, d = r.encode_queries(batch), r.encode_docs(batch)
        b = q.tokens.shape[0]
        ar = torch.arange(b, device=q.tokens.device)
        # the hinge loss reads each triplet's own negative alone: no in-batch score matrix (nor its DDP gather) for it
        if self.optim_cfg.in_batch_negatives and self.optim_cfg.loss == "ce":
            mask = self.optim_cfg.in_batch_mask_relevant and "relevant_docs" in batch
            keys = torch.cat([batch["pos_doc"], batch["neg_doc"]]) if mask else None
            d_all, keys_all, start, real = self._gather_docs(d, keys, batch.get(HOST_RANK_ROWS))
            scores = r.score_all(q, d_all)  # positives of this rank sit at start + i, own negatives at start + b + i
            out = TripletOutput(scores[ar, start + ar], scores[ar, start + b + ar])
            if real is not None:  # other ranks' padding is no negative
                scores = scores.masked_fill(~real, float("-inf"))
            if mask:
                judged = self._judged_columns(keys_all, batch["relevant_docs"], start)
                if real is not None:
                    judged &= real  # padding's key -1 would match the -1 that pads `relevant_docs`
                out.logs["masked_in_batch"] = judged.sum(1).float().mean()  # per query
                scores = scores.masked_fill(judged, float("-inf"))
            return scores, start + ar, out
        pos, neg = r.score_pairs(q, take(d, slice(0, b))), r.score_pairs(q, take(d, slice(b, None)))
        return torch.stack([pos, neg], 1), torch.zeros(b, dtype=torch.long, device=pos.device), TripletOutput(pos, neg)

    def triplet_scores(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(score matrix [B, C], target column [B], s(q, p+) [B], s(q, own p-) [B])."""
        scores, target, out = self.training_outputs(batch)
        return scores, target, out.pos, out.neg

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Return the batch's training loss (`optim.loss` plus the ranker's auxiliary losses) and log its parts.

        A non-finite loss is returned too: `watch_loss` notes it on the device, and `on_before_optimizer_step` has the
        optimiser skip the step there (`optim.nonfinite`), with no host sync.
        """
        with cast_once(self.device.type):  # each weight cast to the autocast dtype once a step, not once a pass
            scores, target, out = self.training_outputs(batch)
        pos, neg = out.pos, out.neg
        if self.optim_cfg.loss == "ce":
            loss = F.cross_entropy(scores.float() / self.temperature, target)
        else:
            hp, hn = self.ranker.hinge_scores(pos.float()), self.ranker.hinge_scores(neg.float())
            loss = F.relu(self.optim_cfg.margin - hp + hn).mean()
        logs = self.logs_this_step()
        # not prog_bar: Lightning turns progress-bar values into Python numbers after every batch (a host sync); the
        # bar (callbacks/progress.py) shows train/loss at log steps instead
        if logs:
            self.log("train/ranking_loss" if out.aux_losses else "train/loss", loss)
        for name, value in out.aux_losses.items():
            if logs:
                self.log(f"train/{name}_loss", value)
            loss = loss + value
        if logs:
            for name, value in out.logs.items():
                self.log(f"train/{name}", value)
            if out.aux_losses:
                self.log("train/loss", loss)
            self.log("train/margin", (pos - neg).float().mean())
        return self.watch_loss(loss * self._rank_weight(pos.shape[0]))

    def logs_this_step(self) -> bool:
        """Return whether Lightning hands this training step's values to the logger (`trainer.log_every_n_steps`).

        Lightning passes on only the newest on-step value of a key, at its log steps; each `self.log` costs host time
        (a median 0.5 ms on this project's CPU: Lightning moves its record of the key to the value's device and reads
        the hook's signature, each call) and a copy on the device, so the steps between log steps log nothing. The
        logger receives the same values either way (tests/test_logging.py). Outside a trainer: always.
        """
        connector = getattr(self._trainer, "_logger_connector", None)
        return bool(getattr(connector, "should_update_logs", True))

    def _rank_weight(self, rows: int) -> Tensor | float:
        """Return the factor that makes DDP's mean of the ranks' gradients that of the global batch's mean loss.

        Each rank's loss is a mean over its `rows` queries and DDP averages the ranks' gradients, which weighs every
        rank alike; the last global batch of an epoch can give ranks one query more or less (datamodules/samplers.py),
        so each rank weighs its mean by rows x world / global rows (1 exactly when the shares are equal). The global
        count is all-reduced on the device: no host sync.
        """
        world = self.trainer.world_size if self._trainer is not None else 1
        if world == 1:
            return 1.0
        total = torch.full((1,), float(rows), device=self.device)
        torch.distributed.all_reduce(total)
        return (rows * world / total).reshape(())

    # ---- non-finite losses and gradients (optim.nonfinite), decided on the device -------------------------------
    # A step's flags (loss NaN/inf on any rank, gradients NaN/inf) reach the optimiser as a tensor: the fused AdamW /
    # Adam kernels leave weights, moments and step count untouched when `found_inf` is 1, as under a GradScaler. The
    # host reads the flags one step later (core/host_reads.py), to warn, count or stop, naming the step they belong to.
    _loss_flag: Tensor | None = None  # this step's loss is non-finite on some rank (float 0/1, on the device)
    _loss_value: Tensor | None = None  # this rank's loss, for the message
    _nonfinite_count: Tensor | None = None  # nonfinite_batches as the device knows it (logged without a host sync)
    _flags: DeferredReads | None = None
    _grad_norm: Tensor | None = None  # this step's total gradient norm, from the non-finite check, for clipping

    def watch_loss(self, loss: Tensor) -> Tensor:
        """Return `loss`, noting on the device whether it is NaN/inf on any rank, for `on_before_optimizer_step`.

        Ranks agree (one all-reduce, queued on the device like any collective), since a rank that steps while another
        skips would desynchronise DDP. Under gradient accumulation, one non-finite micro-batch spoils the step.
        """
        value = loss.detach().float().reshape(())
        bad = (~torch.isfinite(value)).float()
        if self._trainer is not None and self.trainer.world_size > 1:
            # torch's own all-reduce: Lightning's strategy.reduce adds a barrier, which waits on the host
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        if self._loss_flag is not None:
            value = torch.where(bad > 0, value, self._loss_value)
            bad = torch.maximum(bad, self._loss_flag)
        self._loss_flag, self._loss_value = bad, value
        return loss

    compiles_backbone = True  # `model.compile` applies (the head stage's backbone is frozen and encodes once)

    def on_fit_start(self) -> None:
        """Compile the backbone's forward when `model.compile` is set; weights and state-dict keys stay as they are."""
        if getattr(self.model_cfg, "compile", False) and self.compiles_backbone:
            self.ranker.encoder.compile()  # in place (nn.Module.compile): no `_orig_mod.` wrapper in checkpoints

    def on_train_start(self) -> None:
        """Start the device's count of skipped batches from the host's (a resumed checkpoint's)."""
        self._nonfinite_count = torch.tensor(float(self.nonfinite_batches), device=self.device)
        self._flags = DeferredReads()

    def on_before_optimizer_step(self, optimizer) -> None:
        """Apply `optim.nonfinite` to a NaN/inf loss (`watch_loss`) or NaN/inf gradients before the optimiser step.

        A finite loss can still give inf/NaN gradients (overflow in the backward pass): `optim.nonfinite` applies to
        them too. Gradients are already all-reduced here, so DDP ranks decide alike. With a fused optimiser (the
        default on CPU and CUDA, `fused_optimizer`) the step is skipped on the device and the previous step's flags
        are read; otherwise (fp16's GradScaler) this step's flags are read now and its gradients dropped when bad.
        """
        # the optimiser's parameters, not self.parameters(): that walks every submodule, ~1.4 ms a step of host time
        # for a 6-layer BERT; the total norm is the one clipping then reuses (`configure_gradient_clipping`)
        grads = [p.grad for g in getattr(optimizer, "optimizer", optimizer).param_groups for p in g["params"]]
        grads = [g for g in grads if g is not None]
        zero = torch.zeros((), device=self.device)
        self._grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
        grad_bad = (~torch.isfinite(self._grad_norm)).float() if grads else zero
        loss_bad = self._loss_flag if self._loss_flag is not None else zero
        loss_value = self._loss_value if self._loss_value is not None else zero
        self._loss_flag = self._loss_value = None
        bad = torch.maximum(loss_bad, grad_bad)
        if self._flags is None:  # stepped outside fit (a test driving the hooks itself)
            self.on_train_start()
        self._nonfinite_count = self._nonfinite_count + bad
        if self.logs_this_step():
            self.log("train/nonfinite_batches", self._nonfinite_count)
        self._flags.push(self.global_step, torch.stack([loss_bad, grad_bad, loss_value]))
        opt = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's torch optimizer
        if all(g.get("fused") for g in opt.param_groups):
            opt.found_inf = bad  # read by the fused kernels: no update, the step count stays
            self.apply_nonfinite(keep_last=1)
        elif self.apply_nonfinite():  # this step's flags read now (a host sync)
            for p in self.parameters():
                p.grad = None  # the optimiser skips parameters without gradients

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        """Step as Lightning does; the skip flag set by `on_before_optimizer_step` applies to this step only."""
        try:
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        finally:
            getattr(optimizer, "optimizer", optimizer).__dict__.pop("found_inf", None)

    def apply_nonfinite(self, keep_last: int = 0) -> bool:
        """Read the flags of the steps taken so far but the newest `keep_last`, and apply `optim.nonfinite` to them.

        `skip`: warn and count each bad step (its update was skipped on the device); `stop`: raise TrainingStopped
        naming the step and the last good checkpoint. Returns whether the newest step read was bad.
        """
        bad = False
        for step, (loss_bad, grad_bad, loss) in self._flags.pop(keep_last) if self._flags is not None else []:
            bad = loss_bad > 0 or grad_bad > 0
            if not bad:
                continue
            what, whose = (f"training loss ({loss})", "it") if loss_bad > 0 else ("gradients", "them")
            if self.optim_cfg.nonfinite == "stop":
                ckpt = self.trainer.checkpoint_callback if self._trainer is not None else None
                last = getattr(ckpt, "last_model_path", "")
                raise TrainingStopped(
                    f"non-finite {what} at step {step} (optim.nonfinite=stop); nothing was trained on {whose}; "
                    + (f"the last good checkpoint is {last}" if last else "no checkpoint was written yet")
                )
            self.nonfinite_batches += 1
            skipped = "batch skipped" if loss_bad > 0 else "optimiser step skipped"
            warnings.warn(
                f"non-finite {what} at step {step}; {skipped} ({self.nonfinite_batches} so far, optim.nonfinite=skip)",
                stacklevel=2,
            )
        return bad

    def on_validation_start(self) -> None:
        """Apply `optim.nonfinite` to the steps not yet read before validating (`stop`: no validation of them)."""
        self.apply_nonfinite()

    def on_train_end(self) -> None:
        """Apply `optim.nonfinite` to the last steps' flags."""
        self.apply_nonfinite()

    def optimizer_groups(self) -> list[dict]:
        """Return the AdamW parameter groups.

        They are the ranker's named groups (`Ranker.param_groups`, each at its own learning rate) and the rest at
        optim.lr, each split into decayed weights and undecayed biases / norms / scalars. Rankers
        without groups get exactly two unnamed groups, as before, so their checkpoints resume unchanged.
        """
        o = self.optim_cfg
        named = self.ranker.param_groups()
        owner: dict[int, str] = {}
        for gname, g in named.items():
            for p in g.params:
                if owner.setdefault(id(p), gname) != gname:
                    raise ValueError(f"parameter in two ranker param groups: '{owner[id(p)]}' and '{gname}'")
        buckets: dict[tuple[str | None, bool], list] = {}
        for _, p in self.named_parameters():
            if p.requires_grad:  # biases and LayerNorm weights are not decayed
                buckets.setdefault((owner.get(id(p)), p.ndim >= 2), []).append(p)
        groups = []
        for gname in (None, *named):
            lr = o.lr if gname is None else named[gname].resolve(o.lr)
            for decay in (True, False):
                params = buckets.get((gname, decay), [])
                if not params and (gname is not None or named):
                    continue
                group = {"params": params, "weight_decay": o.weight_decay if decay else 0.0, "lr": lr}
                if gname is not None:  # LearningRateMonitor logs lr-AdamW/<name>
                    group["name"] = f"{gname}/{'decay' if decay else 'no_decay'}"
                groups.append(group)
        return groups

    def _grad_scaler(self):
        """Return the precision plugin's GradScaler (fp16 mixed precision), None otherwise (fp32, bf16)."""
        return getattr(getattr(self._trainer, "precision_plugin", None), "scaler", None)

    def fused_optimizer(self, params) -> bool | None:
        """Return whether to use one fused optimizer kernel over all tensors (True, or None for torch's default).

        Fused by default on CUDA and on the CPU (there ~3x faster than foreach for MiniLM's 22M weights); its kernel
        also skips a non-finite step on the device (`on_before_optimizer_step`). Not under fp16's GradScaler, where
        gradients must be unscaled before clipping and a fused optimizer would unscale them only inside its step.
        """
        eligible = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        return (eligible and self._grad_scaler() is None) or None

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip gradients by `trainer.gradient_clip_val` as Lightning does, but allowing fused optimizers.

        Without a GradScaler (fp32, bf16-mixed) the gradients are clipped as they are, because Lightning's
        mixed-precision plugin refuses any fused optimizer ("performs unscaling of gradients internally"), even under
        bf16 where nothing is scaled.
        """
        if not gradient_clip_val or self._grad_scaler() is not None:
            return self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        norm, self._grad_norm = self._grad_norm, None
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        elif norm is not None:  # the norm `on_before_optimizer_step` took of these gradients: not taken twice
            torch.nn.utils.clip_grads_with_norm_(params, gradient_clip_val, norm)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def configure_optimizers(self):
        """Return AdamW over `optimizer_groups` with a per-step schedule: linear warm-up over `optim.warmup_steps`.

        After the warm-up the learning rate decays linearly to 0 at the last step (`optim.schedule: linear`) or
        stays constant.
        """
        o = self.optim_cfg
        groups = self.optimizer_groups()
        fused = self.fused_optimizer([p for g in groups for p in g["params"]])
        opt = torch.optim.AdamW(groups, lr=o.lr, fused=fused)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm = max(0, o.warmup_steps)

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / (warm + 1)
            if o.schedule == "constant":
                return 1.0
            return max(0.0, (total - step) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- evaluation ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_query_texts(self, texts: list[str], batch_size: int = 128, encode=None) -> Encoded:
        """Encode all queries of an evaluation split once (bi-encoders), padded to one length.

        `encode(batch) -> Encoded` replaces the ranker's `encode_queries` (e.g. raw token representations).
        """
        return self.encode_texts(texts, side="query", batch_size=batch_size, encode=encode)

    @torch.inference_mode()
    def encode_texts(self, texts: list[str], side: str = "doc", batch_size: int = 32, encode=None) -> Encoded:
        """Encode texts of one side, returned in the given order, padded to one length.

        The one encoder runs them (`encoding.encode_stream`: batches of similar token length, the precision plugin's
        autocast, out-of-memory halving). `encode(batch) -> Encoded` replaces the ranker's `encode_queries` /
        `encode_docs`.
        """
        tok = self.pair_tokenizer
        encode = encode or (self.ranker.encode_queries if side == "query" else self.ranker.encode_docs)
        prefix = "q_" if side == "query" else "d_"

        def forward(input_ids, attention_mask):
            return encode({f"{prefix}input_ids": input_ids, f"{prefix}attention_mask": attention_mask})

        def count(_rows: int) -> None:
            self.oom_retries += 1

        chunks, parts = [], []
        for chunk, enc in encode_stream(
            self.ranker,
            tok.ids(texts, side),
            side,
            batch_size=batch_size,
            pad_id=tok.tokenizer.pad_token_id,
            forward=forward,
            autocast=self._forward_context,
            on_retry=count,
        ):
            chunks.append(chunk)
            parts.append(enc)
        if not parts:
            raise ValueError(f"no {side} texts to encode")
        length = max(p.tokens.shape[1] for p in parts)
        inverse = torch.empty(len(texts), dtype=torch.long)
        inverse[torch.from_numpy(np.concatenate(chunks))] = torch.arange(len(texts))
        inverse = to_device(inverse, self.device)
        return Encoded(
            tokens=torch.cat([F.pad(p.tokens, (0, 0, 0, length - p.tokens.shape[1])) for p in parts])[inverse],
            mask=torch.cat([F.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts])[inverse],
            sequence=None if parts[0].sequence is None else torch.cat([p.sequence for p in parts])[inverse],
        )

    @torch.inference_mode()
    def rerank_texts(self, query: str, candidates: list[str], batch_size: int = 32) -> Tensor:
        """Return bi-encoder scores of one query's candidate passages [n].

        The query is encoded once, the passages in length-sorted batches.
        """
        if self.ranker.kind != "bi":
            raise ValueError("rerank_texts needs a bi-encoder; cross-encoders score pairs with ranker.score")
        q = self.encode_texts([query], side="query")
        d = self.encode_texts(candidates, side="doc", batch_size=batch_size)
        n = len(candidates)
        return self.ranker.score_indexed(
            q, d, torch.zeros(n, dtype=torch.long, device=self.device), torch.arange(n, device=self.device)
        )

    def _forward_context(self):
        # the precision plugin's autocast (bf16-mixed) outside the *_step hooks, where Lightning applies it itself
        return self.trainer.precision_plugin.forward_context() if self._trainer is not None else nullcontext()

    def score_chunk(
        self, queries: Encoded, batch: dict[str, Tensor], pairs_per_pass: int = 512, docs: Encoded | None = None
    ) -> Tensor:
        """Score a chunk of evaluation pairs with a bi-encoder.

        Encode a chunk of passages once (or take them as `docs`) and score its pairs against the split's pre-encoded
        queries (`batch["qidx"]` indexes `queries`).
        """
        r = self.ranker
        if docs is None:
            docs = self.with_oom_retry(
                r.encode_docs, {k: v for k, v in batch.items() if k.startswith("d_")}, "encoding passages"
            )
        out = []
        for s in range(0, len(batch["pair_d"]), pairs_per_pass):  # bounds the [P, Lq, Ld] similarity tensor
            pairs = {
                "iq": batch["qidx"][s : s + pairs_per_pass].to(docs.tokens.device),
                "id": batch["pair_d"][s : s + pairs_per_pass],
            }
            out.append(
                self.with_oom_retry(lambda p: r.score_indexed(queries, docs, p["iq"], p["id"]), pairs, "scoring pairs")
            )
        return torch.cat(out)

    def with_oom_retry(self, fn, batch: dict[str, Tensor], what: str):
        """Return `fn(batch)`, retried in halves on out-of-memory (models/oom.py).

        Retries are counted per split and logged as `<split>/oom_retries`.
        """

        def count(_rows: int) -> None:
            self.oom_retries += 1

        return halving(fn, batch, what, count)

    # ---- the scored vectors, kept for a consumer ----------------------------------------------------------------
    kept_variants: tuple[str, ...] = (WITH_HEAD,)  # the readings _eval_epoch_start / _eval_step hand to _keep

    def keep_vectors(self, split: str, variants: tuple[str, ...] = (WITH_HEAD,), max_bytes: int | None = None) -> None:
        """Ask for the vectors of `split`'s next evaluation to be kept as it scores them.

        They are kept as scored (`scoring_vectors`, padding removed), per variant (WITH_HEAD; RAW where a head is
        attached, `HeadModule`), for `kept_vectors(split)` to hand out at the epoch's end (bi-encoders). Beyond
        `DEFAULT_BUDGET` bytes they go to memory-mapped files in the run's folder; beyond `max_bytes` in all (a test
        split of MS MARCO's size) nothing is kept, and `kept_vectors` says None.
        """
        self._keep_request[split] = (tuple(variants), max_bytes)

    def kept_vectors(self, split: str) -> dict[str, dict[str, EncodedTexts]] | None:
        """Hand out the vectors kept by `keep_vectors` for the evaluation of `split` that just ran, once.

        Returns {"query" | "passage": {variant: EncodedTexts}}, rows as the split's `qtexts` / `dtexts` (a passage
        this rank did not score has no token rows); None if not kept.
        """
        writers = self._kept.pop(split, None)
        return (
            None if writers is None else {side: {v: w.finish() for v, w in ws.items()} for side, ws in writers.items()}
        )

    def _drop_kept(self, split: str) -> None:
        for ws in self._kept.pop(split, {}).values():
            for w in ws.values():
                w.discard()

    def _start_keeping(self, split: str) -> None:
        self._drop_kept(split)
        request = self._keep_request.pop(split, None)
        if request is None or self.ranker.kind != "bi":
            return
        variants, self._keep_limit = request
        # only the readings this module's evaluation computes; a consumer missing one encodes the texts itself
        variants = [v for v in variants if v in self.kept_variants]
        es = self.trainer.datamodule.eval_splits[split]
        folder = Path(self.trainer.default_root_dir)
        self._kept[split] = {
            side: {v: EncodedTextsWriter(n, spill_dir=folder if folder.is_dir() else None) for v in variants}
            for side, n in (("query", len(es.qtexts)), ("passage", len(es.dtexts)))
        }

    def _keep(self, split: str, side: str, rows, encodings: dict[str, Encoded]) -> None:
        writers = self._kept.get(split)
        if writers is None:
            return
        prep = self.ranker.scoring_vectors
        for v, w in writers[side].items():
            enc = encodings[v]
            seq = None if enc.sequence is None else prep(enc.sequence.float())
            w.add(rows.cpu() if isinstance(rows, Tensor) else rows, Encoded(prep(enc.tokens.float()), enc.mask, seq))
        held = sum(w.nbytes for ws in writers.values() for w in ws.values())
        if self._keep_limit is not None and held > self._keep_limit:
            self._drop_kept(split)
            warnings.warn(
                f"{split}: the scored vectors exceed {self._keep_limit / 2**30:.1f} GiB; they are not kept, and "
                f"their consumer (the isotropy protocol) encodes the texts it needs itself",
                stacklevel=2,
            )

    def _eval_epoch_start(self, split: str) -> None:
        self._start_keeping(split)
        if self.ranker.kind == "bi":
            self._eval_queries = self.encode_query_texts(self.trainer.datamodule.eval_splits[split].qtexts)
            self._keep(split, "query", np.arange(len(self._eval_queries.mask)), {WITH_HEAD: self._eval_queries})

    def on_validation_epoch_start(self) -> None:
        """Start keeping requested vectors and, for a bi-encoder, encode the validation split's queries once."""
        self._eval_epoch_start("val")

    def on_test_epoch_start(self) -> None:
        """Start keeping requested vectors and, for a bi-encoder, encode the test split's queries once."""
        self._eval_epoch_start("test")

    def _eval_step(self, batch: dict[str, Tensor], batch_idx: int, split: str) -> None:
        """Score one evaluation batch into `runs[split]` (subclasses score differently)."""
        if "pair_d" in batch:
            docs = self.with_oom_retry(
                self.ranker.encode_docs, {k: v for k, v in batch.items() if k.startswith("d_")}, "encoding passages"
            )
            self._keep(split, "passage", batch["dpos"], {WITH_HEAD: docs})
            scores = self.score_chunk(self._eval_queries, batch, docs=docs)
        else:
            scores = self.with_oom_retry(self.ranker.score, batch, "scoring pairs")
        self.runs[split].update(batch["qidx"], batch["didx"], scores.float())

    def _eval_batch(self, batch: dict[str, Tensor], batch_idx: int, split: str) -> None:
        if len(batch["qidx"]):
            self._eval_step(batch, batch_idx, split)
            return
        # The placeholder of a DDP rank with an empty shard (datamodule.EmptyShard): nothing to score. An empty
        # update of every run changes none of them but counts as one, so this rank's states are int64 / float32 like
        # the others' in the gather (untouched, torchmetrics would gather float32 placeholders) and torchmetrics does
        # not warn that they were computed before any update.
        for run in self.runs.values():
            run.update(batch["qidx"], batch["didx"], torch.zeros(0, device=batch["qidx"].device))

    def validation_step(self, batch, batch_idx):
        """Score one validation batch of (query, candidate) pairs into the `val` run."""
        self._eval_batch(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        """Score one test batch of (query, candidate) pairs into the `test` run."""
        self._eval_batch(batch, batch_idx, "test")

    def _eval_epoch_end(self, split: str, key: str | None = None) -> None:
        """Evaluate the run gathered under `runs[key]` (default: the split's own) against the split's qrels."""
        key = key or split
        self._eval_queries = None
        self._drop_kept(split)  # kept vectors nobody took (their consumer runs before this hook)
        es = self.trainer.datamodule.eval_splits[split]
        run = self.runs[key].to_run(es.qids, es.doc_ids)  # gathered from every rank
        self.runs[key].reset()
        run, depth = self._at_rerank_depth(run, es, split)
        measures = self.measures
        if split == "val" and SELECT_BY not in measures:
            # validation selects the checkpoint (and the re-ranking depth) by it, whatever the test reports
            measures = [*measures, SELECT_BY]
        means, per_query = evaluate_run(run, es.qrels, measures)
        if depth is not None:
            means["rerank_depth"] = float(depth)
        # update, not replace: the isotropy callback stores its values here just before this hook
        self.results.setdefault(key, {}).update(metrics=means, per_query=per_query, run=run)
        # Identical on every rank (computed from the gathered run), so no further reduction is needed.
        for k, v in means.items():
            self.log(f"{key}/{k}", v, sync_dist=False, prog_bar=(k == "ndcg_cut_10" and key == split))
        if self.oom_retries and key == split:
            self.log(f"{split}/oom_retries", float(self.oom_retries), sync_dist=False)
            self.results[key]["oom_retries"] = self.oom_retries
            self.oom_retries = 0

    # ---- re-ranking depth chosen on validation (eval.rerank_depths, metrics/rerank_depth.py) ---------------------
    rerank_depths: tuple[int, ...] | None = None  # set by the pipeline from eval.rerank_depths; None: every candidate
    rerank_depth: int | None = None  # the depth chosen at the latest validation (saved in checkpoints)

    def _at_rerank_depth(self, run: dict, es, split: str) -> tuple[dict, int | None]:
        """Return (`run` cut to the re-ranking depth, that depth; None when eval.rerank_depths is unset).

        Validation chooses the depth with the best nDCG@10 and keeps it; a test applies the kept one (the tested
        checkpoint's).
        """
        if not self.rerank_depths:
            return run, None
        ranks = candidate_ranks(es.qids, es.doc_ids, es.pairs, es.unit_doc)
        if split == "val":
            self.rerank_depth, _ = choose_depth(run, es.qrels, ranks, self.rerank_depths)
        elif self.rerank_depth is None:
            warnings.warn(
                f"eval.rerank_depths is set but no validation chose a depth for this model (none ran, or its "
                f"checkpoint predates the setting): testing at the largest, {max(self.rerank_depths)}",
                stacklevel=2,
            )
        depth = self.rerank_depth if self.rerank_depth is not None else max(self.rerank_depths)
        return truncate(run, ranks, depth), depth

    def on_validation_epoch_end(self) -> None:
        """Evaluate the gathered validation run (choosing the re-ranking depth) and log `val/<measure>`."""
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        """Evaluate the gathered test run at the chosen re-ranking depth and log `test/<measure>`."""
        self._eval_epoch_end("test")

    # ---- exact resume --------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Save what exact resume needs beyond Lightning's own state: RNG states, skip count, re-ranking depth."""
        self.apply_nonfinite()  # the count of the steps taken so far (`stop`: no checkpoint after a bad step)
        # Lightning restores weights, optimiser, schedule, loop and loader state; the RNG (dropout masks) is ours.
        checkpoint["rng_states"] = _collect_rng_states()
        checkpoint["nonfinite_batches"] = self.nonfinite_batches
        checkpoint["rerank_depth"] = self.rerank_depth  # the depth its validation chose (eval.rerank_depths)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the skipped-batch count and re-ranking depth; the RNG states wait for the first training batch."""
        # Applied at the first training batch, not now: setting up the resumed run (loaders, sanity checks)
        # draws random numbers that the uninterrupted run drew long before the checkpoint.
        self._pending_rng = checkpoint.get("rng_states")
        self.nonfinite_batches = checkpoint.get("nonfinite_batches", 0)
        self.rerank_depth = checkpoint.get("rerank_depth")

    def on_train_batch_start(self, batch, batch_idx) -> None:
        """Restore a resumed checkpoint's RNG states at the first training batch, so dropout masks match."""
        if getattr(self, "_pending_rng", None) is not None:
            _set_rng_states(self._pending_rng)
            self._pending_rng = None
