"""BERT_DOT: dot product of the [CLS] vectors (position-bias paper section 4, Eq. 3).

The [CLS] vectors are optionally compressed by a linear layer as in that paper's setup (off by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from core.ranges import COUNT, check_ranges
from models.rankers import RANKERS
from models.rankers.base import Encoded, RankerConfig, SingleVectorEncoder
from models.rankers.capabilities import RankerCapabilities


@dataclass
class BertDotConfig(RankerConfig):
    """`model: bert_dot`: `compress_dim` is the width of the optional linear compression (None: off)."""

    name: str = "bert_dot"
    compress_dim: int | None = None

    def __post_init__(self):
        super().__post_init__()
        check_ranges("model", self, compress_dim=COUNT)


class BertDot(SingleVectorEncoder):
    """BERT_DOT, position-bias paper Eq. 3: TF([CLS; q])_1 . TF([CLS; p])_1, a plain dot product (no cosine)."""

    cosine = False
    capabilities = RankerCapabilities(vectors="single", index="dense", token_vectors=True, sequence_vectors=True)

    def __init__(self, cfg: BertDotConfig):
        super().__init__(cfg)
        self.compress = nn.Linear(self.hidden_size, cfg.compress_dim) if cfg.compress_dim else None

    def pool(self, enc: Encoded) -> Encoded:
        """Set `enc.sequence` [B, D] to the [CLS] token vector, compressed when `compress_dim` is set."""
        cls = enc.tokens[:, 0]
        enc.sequence = self.compress(cls) if self.compress is not None else cls
        return enc


@RANKERS.register("bert_dot", schema=BertDotConfig, capabilities=BertDot.capabilities)
def build(cfg: BertDotConfig) -> BertDot:
    """Build BERT_DOT for `model.name: bert_dot`."""
    return BertDot(cfg)
