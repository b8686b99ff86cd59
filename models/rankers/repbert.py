"""RepBERT: cosine of mean-pooled token vectors (isotropy paper Eq. 2).

    score(q, d) = cos( 1/|q| sum_j x_j^q , 1/|d| sum_j x_j^d )

The mean runs over non-padding tokens only. A token-wise isotropy head acts before the mean, a
sequence-wise head after it (isotropy paper section 4.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from models.rankers import RANKERS
from models.rankers.base import (
    Encoded,
    RankerConfig,
    SingleVectorEncoder,
    masked_mean,
)
from models.rankers.capabilities import RankerCapabilities


@dataclass
class RepBERTConfig(RankerConfig):
    """`model: repbert`: only the keys every ranker shares."""

    name: str = "repbert"


class RepBERT(SingleVectorEncoder):
    """RepBERT, isotropy paper Eq. 2: the cosine of the mean-pooled query and passage token vectors."""

    cosine = True
    capabilities = RankerCapabilities(vectors="single", index="dense", token_vectors=True, sequence_vectors=True)
    ce_temperature = 0.05  # cosines in [-1, 1]: see OptimConfig.temperature

    def pool(self, enc: Encoded) -> Encoded:
        """Set `enc.sequence` [B, D] to the mean of the real (non-padding) token vectors."""
        enc.sequence = masked_mean(enc.tokens, enc.mask)
        return enc


@RANKERS.register("repbert", schema=RepBERTConfig, capabilities=RepBERT.capabilities)
def build(cfg: RepBERTConfig) -> RepBERT:
    """Build RepBERT for `model.name: repbert`."""
    return RepBERT(cfg)
