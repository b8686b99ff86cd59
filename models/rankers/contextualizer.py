"""TK's contextualisation TF (position-bias paper Eq. 4): sinusoidal positions and a shallow Transformer encoder.

Positions are the fixed sinusoids of Vaswani et al. (2017, section 3.5),

    PE(pos, 2i) = sin(pos / 10000^(2i/d)),   PE(pos, 2i+1) = cos(pos / 10000^(2i/d)),

added to the word embeddings at the input of the Transformer only (Eq. 4 mixes the plain embedding back in).
Position ids are given per term, so the caller decides where a sequence starts (TK: passages at 500).

The layers are Vaswani's post-norm encoder layers (self-attention, add & norm, ReLU feed-forward, add & norm) with
the per-head size decoupled from the embedding width: the paper's setting is "2 layers each with 16 attention heads
with size 32 and a feed-forward dimension of 100" on 300-d GloVe vectors, i.e. attention projects 300 -> 16 x 32
and back, which torch's TransformerEncoderLayer (head size = width / heads) cannot express.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sinusoidal_positions(positions: Tensor, dim: int) -> Tensor:
    """[...] integer positions -> [..., dim] float32 encodings (Vaswani et al. Eq. in section 3.5)."""
    two_i = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(-math.log(10000.0) * two_i / dim)  # 1 / 10000^(2i/d)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., ceil(d/2)]
    # interleave: sin at even dimensions 2i, cos at odd dimensions 2i+1
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :dim]


class EncoderLayer(nn.Module):
    """One post-norm Transformer encoder layer with its own head size (`heads` x `head_dim` may differ from `dim`).

    Self-attention, add & norm, ReLU feed-forward of width `ff_dim`, add & norm (module docstring).
    """

    def __init__(self, dim: int, heads: int, head_dim: int, ff_dim: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        self.norm_attention = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_dim, dim))
        self.norm_ff = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, keys: Tensor) -> Tensor:
        """X [B, L, dim]; keys [B, L] bool: the positions every term may attend to."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keys[:, None, None, :], dropout_p=self.dropout.p if self.training else 0.0
        )
        x = self.norm_attention(x + self.dropout(self.out(a.transpose(1, 2).reshape(b, n, -1))))
        return self.norm_ff(x + self.dropout(self.ff(x)))


class Contextualizer(nn.Module):
    """TF(x_1:n) of Eq. 4: positions added, then `layers` encoder layers; padding is never attended to."""

    def __init__(self, dim: int, layers: int, heads: int, head_dim: int, ff_dim: int, dropout: float):
        super().__init__()
        self.dim = dim
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, head_dim, ff_dim, dropout) for _ in range(layers))

    def forward(self, x: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """Contextualise x [B, L, dim], mask [B, L] bool (True on terms), positions [B, L] -> [B, L, dim].

        Rows off the mask are left to the caller to discard.
        """
        # A text with no term at all (empty after dropping [CLS]/[SEP]) would attend to nothing, and softmax over
        # nothing is NaN: let such a row attend everywhere; its outputs are masked out anyway.
        keys = mask | ~mask.any(dim=1, keepdim=True)
        h = x + sinusoidal_positions(positions, self.dim).to(x.dtype)
        for layer in self.layers:
            h = layer(h, keys)
        return h


__all__ = ["sinusoidal_positions", "EncoderLayer", "Contextualizer"]
