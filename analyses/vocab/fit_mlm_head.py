"""Fit the MLM head of Eq. 1 for a backbone shipped without one (the offline all-MiniLM-L6-v2).

    python evaluate.py analysis=fit_mlm_head model.backbone=minilm data=squad analysis.out=outputs/mlm-head-minilm.pt

The encoder stays frozen and the decoder stays tied to its input embeddings v_i; only BERT's transform g (dense,
activation, LayerNorm) and the decoder bias b are fitted, by cross-entropy on masked tokens of the data config's
passages (BERT's masking: 15 % of the non-special tokens, replaced by [MASK] 80 % / a random token 10 % / kept
10 %). Because the encoder is frozen, every passage is encoded once per masking (`analysis.masks` maskings) and the
head trains on the stored vectors at the masked positions.

A seeded `analysis.heldout` share of the passages is never fitted on; its tokens are masked with [MASK] only, and the
report gives the masked-token accuracy (argmax = the original token) of the fitted head, of a randomly initialised
head (BERT's init; the near-chance reference) and of always predicting the most frequent fitted token.
Writes the head (`analysis.out`, default `<output_dir>/mlm_head.pt`, atomically) and the report next to it
(`<out>.json`). Keys: configs/analysis/fit_mlm_head.yaml.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from analyses.vocab.mlm_head import MLMHead, backbone_embeddings, save_head
from core.errors import InputError
from core.io import write_json
from core.precision import warn_emulated_bf16
from datamodules.sources import data_config, load_dataset, used_splits
from models.rankers.backbone import load_backbone

# the splits it reads: the test split's, for the collection alone (`FitMLMHeadConfig.splits_read`)
TEST_ONLY = used_splits("test")


@dataclass
class FitOptions:
    """How the head is fitted (errors name the config keys `analysis.<key>` of `analysis=fit_mlm_head`)."""

    out: str | None = (
        None  # where the head is written (.pt; the report goes to <out>.json); None = <output_dir>/mlm_head.pt
    )
    heldout: float = 0.1  # share of passages held out for the accuracy
    max_passages: int | None = None  # a seeded sample of the collection; None = all
    max_len: int = 128  # WordPiece tokens per passage (truncated)
    mask_rate: float = 0.15
    masks: int = 1  # maskings of every fitted passage
    epochs: int = 6
    lr: float = 3e-3
    batch_size: int = 256  # masked tokens per optimiser step
    encode_batch_size: int = 32
    bf16: bool = True  # bf16 autocast for the head's matmuls while fitting (accuracy is measured in fp32)
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.heldout < 1.0:
            raise InputError("config key 'analysis.heldout'", f"is {self.heldout}; expected a share in (0, 1)")
        if not 0.0 < self.mask_rate < 1.0:
            raise InputError("config key 'analysis.mask_rate'", f"is {self.mask_rate}; expected a share in (0, 1)")
        if self.lr <= 0:
            raise InputError("config key 'analysis.lr'", f"is {self.lr}; expected a positive learning rate")
        for k in ("masks", "epochs", "batch_size", "encode_batch_size", "max_len"):
            if getattr(self, k) < 1:
                raise InputError(f"config key 'analysis.{k}'", f"is {getattr(self, k)}; expected >= 1")
        if self.max_passages is not None and self.max_passages < 2:
            raise InputError(
                "config key 'analysis.max_passages'",
                f"is {self.max_passages}; expected >= 2 (fitted and held-out passages)",
            )


@dataclass
class FitMLMHeadConfig(FitOptions, AnalysisConfig):
    """The `analysis=fit_mlm_head` config: the FitOptions keys (configs/analysis/fit_mlm_head.yaml).

    `python evaluate.py analysis=fit_mlm_head model.backbone=... data=... [analysis.out=PATH]`.
    """

    name: str = "fit_mlm_head"

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the test split: only the collection is read (ir_datasets takes it from the test id or docs_id)."""
        return TEST_ONLY

    def options(self, output_dir: str) -> FitOptions:
        """Return the keys as `FitOptions`, `out` defaulting to `<output_dir>/mlm_head.pt`."""
        keys = {k: v for k, v in asdict(self).items() if k != "name"}
        return FitOptions(**{**keys, "out": self.out or str(Path(output_dir) / "mlm_head.pt")})


@dataclass
class Masked:
    """One masked passage: the encoder's input, and the masked positions with their original tokens."""

    input_ids: list[int]
    positions: list[int]
    targets: list[int]


def mask_passages(
    ids: list[list[int]],
    special: set[int],
    mask_id: int,
    vocab: int,
    rate: float,
    rng: np.random.Generator,
    mode: str = "bert",
) -> list[Masked]:
    """Mask `rate` of each passage's non-special tokens (at least one); passages without any are dropped.

    `mode` "bert": [MASK] 80 %, a random token 10 %, unchanged 10 %; "mask": always [MASK] (held-out accuracy).
    """
    out = []
    for x in ids:
        cand = [i for i, t in enumerate(x) if t not in special]
        if not cand:
            continue
        n = max(1, int(round(rate * len(cand))))
        pos = sorted(rng.choice(cand, size=n, replace=False).tolist())
        inp = list(x)
        for p in pos:
            r = rng.random() if mode == "bert" else 0.0
            if r < 0.8:
                inp[p] = mask_id
            elif r < 0.9:
                inp[p] = int(rng.integers(vocab))
        out.append(Masked(inp, pos, [x[p] for p in pos]))
    return out


@torch.inference_mode()
def encode_masked(encoder, examples: list[Masked], batch_size: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """(hidden states at the masked positions [N, d], original tokens [N]), in the order of `examples`."""
    hs, ts = [], []
    device = next(encoder.parameters()).device
    for s in range(0, len(examples), batch_size):
        chunk = examples[s : s + batch_size]
        length = max(len(e.input_ids) for e in chunk)
        inp = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), length), dtype=torch.long)
        for r, e in enumerate(chunk):
            inp[r, : len(e.input_ids)] = torch.tensor(e.input_ids)
            att[r, : len(e.input_ids)] = 1
        out = encoder(input_ids=inp.to(device), attention_mask=att.to(device)).last_hidden_state.float().cpu()
        for r, e in enumerate(chunk):
            hs.append(out[r, e.positions])
            ts.extend(e.targets)
    d = encoder.config.hidden_size
    return (torch.cat(hs) if hs else torch.empty(0, d)), torch.tensor(ts, dtype=torch.long)


@torch.inference_mode()
def masked_accuracy(head: MLMHead, hidden: Tensor, targets: Tensor, batch_size: int = 2048) -> tuple[int, int, float]:
    """(correct, total, mean cross-entropy): argmax of Eq. 1 against the original tokens."""
    correct, ce = 0, 0.0
    for s in range(0, len(targets), batch_size):
        logits = head(hidden[s : s + batch_size])
        t = targets[s : s + batch_size]
        correct += int((logits.argmax(-1) == t).sum())
        ce += float(F.cross_entropy(logits, t, reduction="sum"))
    n = len(targets)
    return correct, n, ce / max(n, 1)


def train_head(
    head: MLMHead,
    hidden: Tensor,
    targets: Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    log=print,
    bf16: bool = False,
) -> list[float]:
    """Adam on g and b (the tied embeddings are a buffer, so they cannot move); mean training loss per epoch."""
    if bf16:
        warn_emulated_bf16("analysis.bf16", "true", "cpu", "false")
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    head.train()
    for ep in range(epochs):
        order = torch.randperm(len(targets), generator=gen)
        total = 0.0
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                logits = head(hidden[idx])
            loss = F.cross_entropy(logits.float(), targets[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / max(len(targets), 1))
        log(f"epoch {ep + 1}/{epochs}: training cross-entropy {losses[-1]:.4f}")
    head.eval()
    return losses


def random_head(embeddings: Tensor, act: str, eps: float, seed: int, std: float = 0.02) -> MLMHead:
    """BERT's initialisation (normal(0, 0.02) weights, zero biases, unit LayerNorm), seeded."""
    head = MLMHead(embeddings, act=act, eps=eps)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.dense.weight.copy_(torch.randn(head.dense.weight.shape, generator=gen) * std)
        head.dense.bias.zero_()
    return head.eval()


def split_passages(
    doc_ids: list[str], heldout: float, max_passages: int | None, seed: int
) -> tuple[list[str], list[str]]:
    """Split the passages, seeded, into (fitted, held-out) doc ids; the held-out share is never fitted on.

    At most `max_passages` of them (a seeded sample), at least one held out and one fitted.
    """
    rng = np.random.default_rng([seed, 11])
    ids = sorted(doc_ids)
    order = rng.permutation(len(ids))
    if max_passages is not None:
        order = order[:max_passages]
    n_held = max(1, int(round(heldout * len(order))))
    if len(order) - n_held < 1:
        raise InputError("data", f"has {len(ids)} passages; expected at least 2 (fitted and held-out)")
    return [ids[i] for i in order[n_held:]], [ids[i] for i in order[:n_held]]


def fit(backbone: str, docs: dict[str, str], opts: FitOptions, log=print) -> tuple[MLMHead, dict, dict]:
    """(fitted head, report, held-out data {"hidden", "targets", "examples"}) for `backbone` on the passages `docs`."""
    t0 = time.perf_counter()
    torch.manual_seed(opts.seed)
    encoder, tok = load_backbone(backbone)
    encoder.eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    emb, hf_cfg = backbone_embeddings(backbone)
    act = hf_cfg.hidden_act if isinstance(getattr(hf_cfg, "hidden_act", None), str) else "gelu"
    eps = float(getattr(hf_cfg, "layer_norm_eps", 1e-12))
    fit_ids, held_ids = split_passages(list(docs), opts.heldout, opts.max_passages, opts.seed)
    enc = lambda ids: tok([docs[d] for d in ids], truncation=True, max_length=opts.max_len)["input_ids"]  # noqa: E731
    special = set(tok.all_special_ids)
    rng = np.random.default_rng([opts.seed, 13])
    fit_tok = enc(fit_ids)
    fit_ex = [
        e
        for _ in range(opts.masks)
        for e in mask_passages(fit_tok, special, tok.mask_token_id, len(tok), opts.mask_rate, rng, "bert")
    ]
    held_ex = mask_passages(enc(held_ids), special, tok.mask_token_id, len(tok), opts.mask_rate, rng, "mask")
    log(
        f"encoding {len(fit_ex):,} masked passages ({opts.masks} maskings of {len(fit_ids):,}) "
        f"and {len(held_ex):,} held-out"
    )
    h_fit, t_fit = encode_masked(encoder, fit_ex, opts.encode_batch_size, tok.pad_token_id)
    h_held, t_held = encode_masked(encoder, held_ex, opts.encode_batch_size, tok.pad_token_id)
    t_enc = time.perf_counter() - t0

    counts = torch.bincount(t_fit, minlength=len(tok))
    top = int(counts.argmax())
    head = MLMHead(emb, act=act, eps=eps)
    head.init_identity()
    with torch.no_grad():  # b starts at the fitted tokens' log unigram frequencies (add-one): the prior of Eq. 1
        head.bias.copy_(torch.log((counts + 1.0) / (counts.sum() + len(counts))))
    untrained = masked_accuracy(head, h_held, t_held)
    t1 = time.perf_counter()
    losses = train_head(head, h_fit, t_fit, opts.epochs, opts.lr, opts.batch_size, opts.seed, log, opts.bf16)
    t_train = time.perf_counter() - t1
    fitted = masked_accuracy(head, h_held, t_held)
    rand = masked_accuracy(random_head(emb, act, eps, opts.seed), h_held, t_held)
    unigram = int((t_held == top).sum())

    def acc(c):
        return {"correct": c[0], "total": c[1], "accuracy": c[0] / max(c[1], 1), "cross_entropy": c[2]}

    report = {
        "backbone": backbone,
        "settings": asdict(opts),
        "passages": {"fitted": len(fit_ids), "heldout": len(held_ids)},
        "masked_tokens": {"fitted": int(len(t_fit)), "heldout": int(len(t_held))},
        "heldout": {
            "fitted_head": acc(fitted),
            "random_head": acc(rand),
            "initial_head": acc(untrained),
            "most_frequent_token": {
                "token": tok.convert_ids_to_tokens(top),
                "correct": unigram,
                "total": int(len(t_held)),
                "accuracy": unigram / max(len(t_held), 1),
            },
            "chance": 1.0 / len(tok),
        },
        "training_cross_entropy": losses,
        "timings_s": {"encode": round(t_enc, 2), "train": round(t_train, 2)},
    }
    return head, report, {"hidden": h_held, "targets": t_held, "examples": held_ex}


def run(cfg, opts: FitOptions) -> dict:
    """Fit the MLM head of `cfg.model.backbone` on the configured collection, write it and its report, print.

    The head goes to `opts.out` (atomically) and the report to `<out>.json`, last; returns the report.
    """
    backbone = str(cfg.model.backbone)
    # only the collection is read here; ir_datasets takes it from the test id (or data.docs_id)
    ds = load_dataset(data_config(cfg), int(cfg.seed), TEST_ONLY)
    head, report, _ = fit(backbone, ds.docs, opts, log=lambda m: print(f"[fit_mlm_head] {m}", flush=True))
    report["dataset"] = ds.name
    target = opts.out or str(Path(cfg.output_dir) / "mlm_head.pt")
    # The new head is written beside the earlier set first: a write that fails (a full disk) leaves that set whole.
    # Then the report marks a finished head: the earlier one goes before the new head replaces the old, so an
    # interrupt in between leaves a head without a report (unfinished), never a report beside a head it does not
    # describe.
    staged = save_head(head, Path(target).with_name(f".{Path(target).name}.new"), backbone, report)
    Path(target + ".json").unlink(missing_ok=True)
    out = Path(target)
    os.replace(staged, out)
    write_json(Path(str(out) + ".json"), report)
    h = report["heldout"]
    print(
        f"held-out masked-token accuracy on {ds.name} ({h['fitted_head']['total']:,} tokens): fitted head "
        f"{h['fitted_head']['accuracy']:.4f} (CE {h['fitted_head']['cross_entropy']:.3f}), random head "
        f"{h['random_head']['accuracy']:.4f}, most frequent token '{h['most_frequent_token']['token']}' "
        f"{h['most_frequent_token']['accuracy']:.4f}, chance {h['chance']:.2e}"
    )
    print(f"wrote {out} and {out}.json")
    return report


@ANALYSES.register("fit_mlm_head", schema=FitMLMHeadConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg).options(cfg.output_dir))
