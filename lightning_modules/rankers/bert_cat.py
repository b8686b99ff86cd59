"""BERT_CAT: the cross-encoder `[CLS] q [SEP] p [SEP]` -> linear([CLS]) (position-bias paper section 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from lightning_modules.rankers import RANKERS
from lightning_modules.rankers.base import CrossEncoder, RankerConfig


@dataclass
class BertCatConfig(RankerConfig):
    name: str = "bert_cat"
    cross: ClassVar[bool] = True


class BertCat(CrossEncoder):
    def __init__(self, cfg: BertCatConfig):
        super().__init__(cfg)
        self.classifier = nn.Linear(self.hidden_size, 1)

    def cls_representation(self, batch: dict[str, Tensor]) -> Tensor:
        out = self.encoder(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch.get("token_type_ids"),
        ).last_hidden_state
        return out[:, 0]

    def score(self, batch: dict[str, Tensor]) -> Tensor:
        return self.classifier(self.cls_representation(batch)).squeeze(-1)


@RANKERS.register("bert_cat", schema=BertCatConfig)
def build(cfg: BertCatConfig) -> BertCat:
    return BertCat(cfg)
