"""BERT_DOT: dot product of the [CLS] vectors (position-bias paper section 4), optionally compressed
by a linear layer as in that paper's setup (off by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from core.ranges import COUNT, check_ranges
from lightning_modules.rankers import RANKERS
from lightning_modules.rankers.base import Encoded, RankerConfig, SingleVectorEncoder


@dataclass
class BertDotConfig(RankerConfig):
    name: str = "bert_dot"
    compress_dim: int | None = None

    def __post_init__(self):
        super().__post_init__()
        check_ranges("model", self, compress_dim=COUNT)


class BertDot(SingleVectorEncoder):
    cosine = False

    def __init__(self, cfg: BertDotConfig):
        super().__init__(cfg)
        self.compress = nn.Linear(self.hidden_size, cfg.compress_dim) if cfg.compress_dim else None

    def pool(self, enc: Encoded) -> Encoded:
        cls = enc.tokens[:, 0]
        enc.sequence = self.compress(cls) if self.compress is not None else cls
        return enc


@RANKERS.register("bert_dot", schema=BertDotConfig)
def build(cfg: BertDotConfig) -> BertDot:
    return BertDot(cfg)
