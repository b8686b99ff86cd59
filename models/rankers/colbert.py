"""ColBERT: late interaction over token vectors (isotropy paper Eq. 1).

    score(q, d) = sum_{j in q} max_{k in d} cos(x_j^q, x_k^d)

Padding tokens take part in neither the max nor the sum. The linear compression of the original ColBERT
is optional and off by default, as in the isotropy paper, so heads act on the backbone's own vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from core.ranges import COUNT, check_ranges
from models.rankers import RANKERS
from models.rankers.base import (
    BiEncoder,
    Encoded,
    RankerConfig,
    cosine_normalize,
)
from models.rankers.capabilities import RankerCapabilities
from models.rankers.maxsim import maxsim_all, maxsim_pairs


@dataclass
class ColBERTConfig(RankerConfig):
    """`model: colbert`: `compress_dim` is the width of the optional linear compression (None: off)."""

    name: str = "colbert"
    compress_dim: int | None = None  # e.g. 128 as in the original ColBERT; None keeps the backbone width

    def __post_init__(self):
        super().__post_init__()
        check_ranges("model", self, compress_dim=COUNT)


class ColBERT(BiEncoder):
    """ColBERT, isotropy paper Eq. 1: the sum over query tokens of their best cosine with a passage token."""

    capabilities = RankerCapabilities(vectors="multi", index="colbert", token_vectors=True)

    def __init__(self, cfg: ColBERTConfig):
        super().__init__(cfg)
        self.compress = nn.Linear(self.hidden_size, cfg.compress_dim, bias=False) if cfg.compress_dim else None

    def token_representations(self, input_ids: Tensor, attention_mask: Tensor, side: str | None = None) -> Encoded:
        """Return the backbone's token vectors [B, L, D], compressed by the linear layer when `compress_dim` is set."""
        enc = super().token_representations(input_ids, attention_mask, side=side)
        if self.compress is not None:
            enc.tokens = self.compress(enc.tokens)
        return enc

    def scoring_vectors(self, x: Tensor) -> Tensor:
        """Return the token vectors as compared: unit length, so dot products are the cosines of Eq. 1."""
        return cosine_normalize(x)

    def score_pairs(self, q: Encoded, d: Encoded) -> Tensor:
        """Score query i against passage i by Eq. 1 (MaxSim over cosines, padding masked): [B]."""
        return maxsim_pairs(cosine_normalize(q.tokens), q.mask, cosine_normalize(d.tokens), d.mask)

    def score_all(self, q: Encoded, d: Encoded) -> Tensor:
        """Score every query against every passage by Eq. 1: [Bq, Bd]."""
        return maxsim_all(cosine_normalize(q.tokens), q.mask, cosine_normalize(d.tokens), d.mask)


@RANKERS.register("colbert", schema=ColBERTConfig, capabilities=ColBERT.capabilities)
def build(cfg: ColBERTConfig) -> ColBERT:
    """Build ColBERT for `model.name: colbert`."""
    return ColBERT(cfg)
