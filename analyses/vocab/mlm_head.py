"""The MLM head of Eq. 1 (Ram et al., section 2.1).

    MLM-Head(h)[i] = exp(v_i^T g(h) + b_i) / sum_j exp(v_j^T g(h) + b_j),   g(h) = LayerNorm(act(W h + c))

v_i = the backbone's static input embedding of vocabulary item i (the decoder is tied to them, as in BERT), b the
decoder bias, g BERT's "transform" (dense, the backbone's activation, LayerNorm). The paper's Eq. 1 has no bias;
BERT's head does, and the projections use the head as pre-trained.

Two sources (`load_mlm_head`):
- the backbone checkpoint's own head (BERT's `cls.predictions`, RoBERTa/MPNet's `lm_head`) when it has one;
- a file written by `python evaluate.py analysis=fit_mlm_head` (g and b fitted with the encoder frozen; for
  backbones shipped without a head, such as the offline all-MiniLM-L6-v2).

v always comes from the pre-trained backbone, never from a fine-tuned ranker's encoder: the projections read a
fine-tuned ranker through the head of the model it was initialised from (section 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from core.errors import InputError
from core.inputs import check_input_file
from core.io import atomic_open
from models.rankers.backbone import load_backbone, resolve

FORMAT = "isorank-mlm-head-v1"


class MLMHead(nn.Module):
    """g and b trainable, the tied decoder weight (the input embeddings) frozen and not part of `state_dict`."""

    def __init__(self, embeddings: Tensor, act: str = "gelu", eps: float = 1e-12):
        from transformers.activations import (
            ACT2FN,  # lazy: heavy, only model building needs it
        )

        super().__init__()
        vocab, hidden = embeddings.shape
        self.dense = nn.Linear(hidden, hidden)
        self.act_name = act
        self.act = ACT2FN[act]
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab))
        # a buffer, not a Parameter: the decoder stays tied to the backbone's vectors and never trains
        self.register_buffer("embeddings", embeddings.detach(), persistent=False)

    @property
    def vocab_size(self) -> int:
        """The number of vocabulary items V the head scores (rows of the tied input embeddings)."""
        return self.embeddings.shape[0]

    def transform(self, h: Tensor) -> Tensor:
        """g(h) of Eq. 1."""
        return self.norm(self.act(self.dense(h)))

    def forward(self, h: Tensor) -> Tensor:
        """Logits v_i^T g(h) + b_i over the vocabulary: [..., V]; the softmax of Eq. 1 is left to the caller."""
        return self.transform(h) @ self.embeddings.T + self.bias

    def init_identity(self) -> None:
        """W = I, c = 0: g starts as LayerNorm(act(h)), so fitting starts near decoding h by its nearest v_i."""
        with torch.no_grad():
            self.dense.weight.copy_(torch.eye(self.dense.in_features))
            self.dense.bias.zero_()


def backbone_embeddings(backbone: str) -> tuple[Tensor, object]:
    """Return (the pre-trained input embeddings [V, d], the HF config) of a backbone (`minilm`, an HF id, a path)."""
    encoder, _ = load_backbone(backbone)
    return encoder.get_input_embeddings().weight.detach().clone(), encoder.config


def has_mlm_weights(backbone: str) -> bool | None:
    """Tell whether a local checkpoint's weight files hold MLM-head tensors, without loading the model.

    Read from the file index; None when that cannot be told (a hub id, an unknown file layout).
    """
    d = Path(resolve(backbone))
    if not d.is_dir():
        return None
    names: list[str] = []
    for index in d.glob("*.safetensors.index.json"):
        names += list(json.loads(index.read_text())["weight_map"])
    if not names and (d / "model.safetensors").is_file():
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            names = list(f.keys())
    if not names:
        return None
    return any("predictions" in k or "lm_head" in k for k in names)


def _from_hf(backbone: str) -> MLMHead | None:
    """Return the checkpoint's own MLM head, or None when the checkpoint has no MLM weights."""
    from transformers import (
        AutoModelForMaskedLM,  # lazy: heavy, only model building needs it
    )

    if has_mlm_weights(backbone) is False:
        return None
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(resolve(backbone), output_loading_info=True)
    except (OSError, ValueError):
        return None
    missing = [k for k in info.get("missing_keys", []) if "predictions" in k or "lm_head" in k]
    if missing:
        return None  # the head would be random: transformers initialised it
    cfg = model.config
    emb = model.get_input_embeddings().weight.detach().clone()
    if hasattr(model, "cls"):  # BERT family: cls.predictions.{transform.dense, transform.LayerNorm, bias}
        p = model.cls.predictions
        dense, norm, bias = (
            p.transform.dense,
            p.transform.LayerNorm,
            p.decoder.bias if p.decoder.bias is not None else p.bias,
        )
        act = cfg.hidden_act if isinstance(cfg.hidden_act, str) else "gelu"
    elif hasattr(model, "lm_head"):  # RoBERTa / MPNet: lm_head.{dense, layer_norm, bias}, GELU
        p = model.lm_head
        dense, norm, bias, act = p.dense, p.layer_norm, p.bias, "gelu"
    else:
        return None
    head = MLMHead(emb, act=act, eps=norm.eps)
    with torch.no_grad():
        head.dense.load_state_dict(dense.state_dict())
        head.norm.load_state_dict(norm.state_dict())
        head.bias.copy_(bias)
    return head.eval()


def save_head(head: MLMHead, path: str | Path, backbone: str, report: dict) -> Path:
    """Write g and b with what they were fitted for to `path`, atomically (a crash leaves no half-written file)."""
    path = Path(path)
    payload = {
        "format": FORMAT,
        "backbone": backbone,
        "vocab_size": head.vocab_size,
        "hidden_size": head.dense.in_features,
        "act": head.act_name,
        "eps": head.norm.eps,
        "state": {k: v.detach().cpu() for k, v in head.state_dict().items()},
        "report": report,
    }
    with atomic_open(path, "wb") as f:
        torch.save(payload, f)
    return path


def load_fitted(path: str | Path, backbone: str, where: str = "analysis.mlm_head") -> MLMHead:
    """Load a head written by `analysis=fit_mlm_head` (`save_head`), tied to `backbone`'s input embeddings.

    A missing or unreadable file, or one fitted for embeddings of another shape, is a one-line error naming `where`
    or the file.
    """
    p = Path(path)
    check_head_source(backbone, path, where)
    try:
        payload = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise InputError(str(p), f"cannot be read as an MLM head ({type(e).__name__}: {e})") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise InputError(str(p), f"is not an MLM head file (expected format {FORMAT})")
    emb, _ = backbone_embeddings(backbone)
    if tuple(emb.shape) != (payload["vocab_size"], payload["hidden_size"]):
        raise InputError(
            str(p),
            f"was fitted for backbone '{payload['backbone']}' ({payload['vocab_size']} x {payload['hidden_size']}); "
            f"model.backbone '{backbone}' has embeddings {tuple(emb.shape)}",
        )
    head = MLMHead(emb, act=payload["act"], eps=payload["eps"])
    head.load_state_dict(payload["state"])
    return head.eval()


def load_mlm_head(backbone: str, path: str | None = None, where: str = "analysis.mlm_head") -> tuple[MLMHead, str]:
    """Return (head, where it came from): the fitted file when `path` is given, else the backbone's own head.

    The backbone checkpoint's own head; a backbone without one is a one-line error naming the fitting command.
    """
    if path:
        return load_fitted(path, backbone, where), str(path)
    head = _from_hf(backbone)
    if head is None:
        raise _no_head(backbone, where)
    return head, f"{backbone} (pre-trained MLM head)"


def check_head_source(backbone: str, path: str | None = None, where: str = "analysis.mlm_head") -> None:
    """Check, from the files alone and before any data is read, that `load_mlm_head` has a head to load.

    The fitted file exists, or (without one) the backbone's weights hold MLM weights (their names, no tensor read).
    """
    if path:
        check_input_file(path, f"config key '{where}'", "a head written by python evaluate.py analysis=fit_mlm_head")
    elif has_mlm_weights(backbone) is False:
        raise _no_head(backbone, where)


def _no_head(backbone: str, where: str) -> InputError:
    return InputError(
        f"config key '{where}'",
        f"is null and backbone '{backbone}' has no MLM head; fit one with "
        f"python evaluate.py analysis=fit_mlm_head model.backbone={backbone} data=squad analysis.out=PATH "
        f"and set {where}=PATH",
    )
