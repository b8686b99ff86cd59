"""BERT_DOT: dot product of the [CLS] vectors (position-bias paper section 4), optionally compressed
by a linear layer as in that paper's setup (off by default)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from lightning_modules.rankers import RANKERS
from lightning_modules.rankers.base import BiEncoder, Encoded, RankerConfig


@dataclass
class BertDotConfig(RankerConfig):
    name: str = "bert_dot"
    compress_dim: int | None = None


class BertDot(BiEncoder):
    def __init__(self, cfg: BertDotConfig):
        super().__init__(cfg)
        self.compress = nn.Linear(self.hidden_size, cfg.compress_dim) if cfg.compress_dim else None

    def pool(self, enc: Encoded) -> Encoded:
        cls = enc.tokens[:, 0]
        enc.sequence = self.compress(cls) if self.compress is not None else cls
        return enc

    def score_pairs(self, q: Encoded, d: Encoded) -> Tensor:
        return (q.sequence * d.sequence).sum(-1)

    def score_all(self, q: Encoded, d: Encoded) -> Tensor:
        return q.sequence @ d.sequence.T


@RANKERS.register("bert_dot", schema=BertDotConfig)
def build(cfg: BertDotConfig) -> BertDot:
    return BertDot(cfg)
