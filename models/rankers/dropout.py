"""Dropout for CPU training at a fraction of PyTorch's cost (`model.fast_dropout`, on by default).

Profiling a ColBERT training step on MiniLM (bf16, 2 CPU threads) put ~20 % of the time in `aten::bernoulli_`:
PyTorch's CPU Bernoulli draws one 32-bit Mersenne-Twister number per element, one thread, and attention dropout
masks [B, heads, L, L] probabilities (12.4 M per layer at 32 x 180 tokens). And because SDPA's fused CPU kernels
have no dropout, training fell back to the unfused math path (with a safe-softmax pass on top).

Here a mask comes from 16-bit uniforms, four per 64-bit draw of the same global generator (seeded, saved and
restored with the RNG state like any dropout): an element is kept when its uniform is >= round(p * 2^16), so
P(keep) = 1 - round(p * 2^16) / 2^16 (p = 0.1: 0.899994 instead of 0.9) and kept values are scaled by the inverse of
that exact probability, which keeps the layer unbiased (E[dropout(x)] = x), as in Srivastava et al. (2014). The
mask is stored as bool for the backward. Attention: softmax(Q K^T / sqrt(d_k) + mask) V (Vaswani et al. 2017,
Eq. 1) with the same dropout on the probabilities; without dropout (evaluation, p = 0, or CUDA tensors, whose SDPA
kernels drop out themselves) it is PyTorch's SDPA unchanged, so evaluation scores are identical to the plain path.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

ATTENTION_NAME = "isorank_sdpa"
_LEVELS = 1 << 16


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, device=None) -> tuple[Tensor, float]:
    """(bool mask of the dropped elements, the exact keep probability)."""
    n = 1
    for s in shape:
        n *= s
    threshold = round(p * _LEVELS)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    uniform = words.view(torch.int16)[:n].view(shape)  # int16 over [-2^15, 2^15): shift the threshold alike
    return uniform < threshold - _LEVELS // 2, 1.0 - threshold / _LEVELS


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, drop: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return (x * scale).masked_fill_(drop, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (drop,) = ctx.saved_tensors
        return (grad * ctx.scale).masked_fill_(drop, 0.0), None, None


def fast_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Drop elements of `x` with probability `p` and scale the kept ones by 1 / P(keep), as `F.dropout` does.

    On the CPU the mask comes from 16-bit uniforms (module docstring); in eval mode, for p = 0 or for CUDA tensors
    it is PyTorch's own dropout.
    """
    if not training or p == 0.0 or x.is_cuda:
        return nn.functional.dropout(x, p, training)
    if p >= 1.0:
        return x * 0.0
    drop, q = drop_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, drop, 1.0 / q)


class FastDropout(nn.Dropout):
    """nn.Dropout with the mask of `drop_mask` (same p, same train/eval behaviour)."""

    def forward(self, x: Tensor) -> Tensor:
        """Apply `fast_dropout` to x (any shape) while training; the identity in eval mode."""
        return fast_dropout(x, self.p, self.training)


def attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """Compute attention for the transformers attention interface: SDPA, or the math path with fast dropout.

    The math path (with the `drop_mask` dropout on the probabilities) runs only with dropout on the CPU; everything
    else goes to PyTorch's SDPA unchanged.
    """
    from transformers.integrations.sdpa_attention import (
        sdpa_attention_forward,  # lazy: heavy, only model building needs it
    )

    if (
        dropout == 0.0
        or query.is_cuda
        or kwargs.get("position_bias") is not None
        or getattr(module, "is_causal", False)
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # every pass over the [B, heads, L, L] tensor counts: the scale goes on Q, the mask is filled in place, the
    # softmax runs in the input dtype (PyTorch's CPU kernel accumulates bf16 in float), dropped probabilities are
    # zeroed in place of a multiply, and 1 / P(keep) goes on the [B, heads, L, d_k] output.
    w = torch.matmul(query * scale, key.transpose(-1, -2))
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # True = attend (SDPA's convention)
            w = w.masked_fill_(~attention_mask, torch.finfo(w.dtype).min)
        else:
            w = w + attention_mask
    probs = torch.softmax(w, dim=-1)
    drop, q = drop_mask(probs.shape, dropout, probs.device)
    out = torch.matmul(probs.masked_fill(drop, 0.0), value) * (1.0 / q)
    return out.transpose(1, 2).contiguous(), None


def use_fast_dropout(encoder: nn.Module) -> nn.Module:
    """Swap the encoder's nn.Dropout modules for FastDropout and its SDPA attention for `attention` (in place)."""
    for _name, child in list(encoder.named_modules()):
        for attr, sub in list(child.named_children()):
            if type(sub) is nn.Dropout:
                setattr(child, attr, FastDropout(sub.p, sub.inplace))
    config = getattr(encoder, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        from transformers import (
            AttentionInterface,  # lazy: heavy, only model building needs it
        )
        from transformers.masking_utils import (  # lazy: heavy, only model building needs it
            AttentionMaskInterface,
            sdpa_mask,
        )

        AttentionInterface.register(ATTENTION_NAME, attention)
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # the mask SDPA gets, for both paths
        encoder.set_attn_implementation(ATTENTION_NAME)
    return encoder
