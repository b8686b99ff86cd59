"""Word representation refinement over the disentangled graph (DGRe paper section 3.3.2, Eq. 11-12).

A gated graph neural network (GGNN, Li et al.) propagates T steps over A~ (masking.py), starting from the
transformer layer's word representations h^0 = E_l:

    h^t = GRU([h^{t-1}, A~ h^{t-1}], h^{t-1})                                                   (Eq. 11)

"GGNN aggregates neighbour word representations for each word in the graph A~ and concatenates word
representations from the last iteration and from neighbourhood aggregation this iteration as the input embedding
of gated recurrent unit (GRU)". `input="concat"` (default) is that reading: the GRU's input is the concatenation
[h^{t-1}; A~ h^{t-1}] (2d wide) and its hidden state h^{t-1}. `input="message"` is Li et al.'s original GGNN, the
GRU's input being the aggregated message A~ h^{t-1} alone. One GRU cell is shared by the T steps (GGNN).

After T steps a self-attention over the refined words gives Z^l (Eq. 12):

    Z^l = softmax((W_a h^T)(W_b h^T)^T) h^T                                                     (Eq. 12)

with padding excluded from the keys. Eq. 12 is printed without a 1/sqrt(d): `scale=False` (default, the ranker's
`attention_scale=false`) is that equation; `scale=True` divides the logits by sqrt(d) as Eq. 5 does, since unscaled
dot products of d = 384 LayerNorm'd vectors saturate the softmax (configs/model/dgre_tuned.yaml).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor, nn

from models.rankers.dgre.masking import masked_softmax

GGNN_INPUTS = ("concat", "message")


class GGNN(nn.Module):
    """The gated graph neural network of Eq. 11: `steps` propagation steps over A~ with one shared GRU cell.

    `input` is "concat" (the paper's reading, GRU input [h; A~ h]) or "message" (Li et al.'s GGNN, GRU input A~ h).
    """

    def __init__(self, dim: int, steps: int, input: str = "concat"):
        super().__init__()
        if input not in GGNN_INPUTS:
            raise ValueError(f"unknown GGNN input {input!r}; expected one of {GGNN_INPUTS}")
        self.steps, self.input = steps, input
        self.gru = nn.GRUCell(2 * dim if input == "concat" else dim, dim)

    def step(self, h: Tensor, graph: Tensor) -> Tensor:
        """One propagation step of Eq. 11: h [B, L, d], graph A~ [B, L, L] -> h^t [B, L, d]."""
        message = torch.bmm(graph.to(h.dtype), h)  # row i: sum_j A~_ij h_j
        x = torch.cat([h, message], dim=-1) if self.input == "concat" else message
        b = h.shape[0]
        out = self.gru(rearrange(x, "b l d -> (b l) d"), rearrange(h, "b l d -> (b l) d"))
        return rearrange(out, "(b l) d -> b l d", b=b)

    def forward(self, h: Tensor, graph: Tensor) -> Tensor:
        """Propagate T steps of Eq. 11: h^0 [B, L, d] over the graph A~ [B, L, L] -> h^T [B, L, d]."""
        for _ in range(self.steps):
            h = self.step(h, graph)
        return h


class RefinementAttention(nn.Module):
    """Eq. 12: single-head self-attention over the GGNN's output, keys restricted to real tokens."""

    def __init__(self, dim: int, scale: bool = False):
        super().__init__()
        self.w_a = nn.Linear(dim, dim, bias=False)
        self.w_b = nn.Linear(dim, dim, bias=False)
        self.scale = 1.0 / math.sqrt(dim) if scale else 1.0

    def forward(self, h: Tensor, attention_mask: Tensor) -> Tensor:
        """Compute Z^l of Eq. 12 from h^T [B, L, d] and the [B, L] attention mask (padding is no key): [B, L, d]."""
        logits = torch.einsum("bid,bjd->bij", self.w_a(h), self.w_b(h)) * self.scale
        keys = attention_mask.bool()[:, None, :].expand_as(logits)
        return torch.bmm(masked_softmax(logits, keys).to(h.dtype), h)


__all__ = ["GGNN", "RefinementAttention", "GGNN_INPUTS"]
