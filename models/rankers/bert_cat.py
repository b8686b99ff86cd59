"""BERT_CAT: the cross-encoder `[CLS] q [SEP] p [SEP]` -> linear([CLS]) (position-bias paper section 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from models.rankers import RANKERS
from models.rankers.backbone import backbone_mask
from models.rankers.base import CrossEncoder, RankerConfig, host_padded
from models.rankers.capabilities import RankerCapabilities


@dataclass
class BertCatConfig(RankerConfig):
    """`model: bert_cat`: only the keys every ranker shares; the query and passage share one input."""

    name: str = "bert_cat"
    cross: ClassVar[bool] = True


class BertCat(CrossEncoder):
    """BERT_CAT, position-bias paper Eq. 2: TF([CLS; q; SEP; p; SEP])_1 * W_s, a linear layer on the [CLS] vector."""

    capabilities = RankerCapabilities(vectors="none")

    def __init__(self, cfg: BertCatConfig):
        super().__init__(cfg)
        self.classifier = nn.Linear(self.hidden_size, 1)

    def cls_representation(self, batch: dict[str, Tensor]) -> Tensor:
        """Return the backbone's last-layer [CLS] vector of each `[CLS] q [SEP] p [SEP]` input: [B, hidden]."""
        ids = batch["input_ids"]
        out = self.encoder(
            input_ids=ids,
            attention_mask=backbone_mask(
                self.encoder, batch["attention_mask"], host_padded(batch, "attention_mask", ids.shape[1])
            ),
            token_type_ids=batch.get("token_type_ids"),
        ).last_hidden_state
        return out[:, 0]

    def score(self, batch: dict[str, Tensor]) -> Tensor:
        """Score each tokenised (query, passage) pair, W_s applied to its [CLS] vector: [B]."""
        return self.classifier(self.cls_representation(batch)).squeeze(-1)


@RANKERS.register("bert_cat", schema=BertCatConfig, capabilities=BertCat.capabilities)
def build(cfg: BertCatConfig) -> BertCat:
    """Build BERT_CAT for `model.name: bert_cat`."""
    return BertCat(cfg)
