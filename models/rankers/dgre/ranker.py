"""DGRe, the disentangled graph recurrent network ranker (DGRe paper, section 3.3-3.4, Eq. 5-25), as a cross-encoder.

    [CLS] q [SEP] d [SEP] -> BERT (Eq. 5-6) -> attention-like scores S of layer l, word representations E_l
      -> disentangled graph A~ (masking.py, Eq. 7-10: none | heuristic | adaptive)
      -> GGNN over A~ for T steps, then self-attention: Z^l (ggnn.py, Eq. 11-12)
      -> decomposition of the document words into query-related Z_dr and unrelated Z_du parts (decomposition.py,
         Eq. 13-15)
      -> g(q, d) = w_2 (W_1 [Z_dr, Z^l, E^L(0)] + b_1) + b_2,  f = sigmoid(g)                   (Eq. 16-17)

Training (section 3.4): the pairwise margin loss on f (Eq. 25; RankingModule with optim.loss=hinge, optim.margin=1,
through `hinge_scores`; the `optim` block of configs/model/dgre.yaml makes them model=dgre's defaults) plus lambda x
(distance loss + L_mi) from `score_triplets`: the triangle distance or its parts (losses.py, Eq. 18-21; `distance`) and
the MINE mutual information terms (mi.py, Eq. 22-24; `mi`). Every ablation of the paper's Tables 3-5 is a setting of
`masking`, `distance` and `mi`.

Defaults are the printed equations. Each addition of ours is a switch, off by default, on in
configs/model/dgre_tuned.yaml (`model=dgre_tuned`, the settings of the Cranfield / CACM grids):
`attention_scale` (1/sqrt(d) in Eq. 12 and Eq. 14-15), `decomposition_norm=mean` (Eq. 14-15 divided by the n
document words), `activation` (relu between W_1 and w_2 of Eq. 16, printed as a linear combination) and `dropout`
(on the input of Eq. 16). docs/dgre.md tabulates them per equation.

Choices where the paper is silent (each also in its file):
- The graph comes from one layer, `graph_layer` (default the last): its attention-like scores S (its own W_Q, W_K
  applied to its input, averaged over heads) and its output E_l as h^0. The paper derives a graph for every layer
  ("for each transformer layer l") but its prediction layer (Eq. 16) reads a single Z^l and never says how layers
  would combine, so one layer is the printed Eq. 16; which one is not printed.
- Pooling for Eq. 16 (whose inputs are matrices): Z_dr is averaged over the query words, Z^l over the real tokens
  (`refined_pool=mean`, "a final graph level representation for each query-document pair"; `cls` takes its [CLS]
  row), E^L(0) is BERT's [CLS] vector. W_1 maps the 3d concatenation to d; `activation` (none: the printed "linear
  combination" | relu | tanh) follows, `dropout` before W_1 (0: none, as printed).
- Evaluation ranks by g, not f = sigmoid(g): the same order, but f rounds to ties near 0 and 1 in float32.
- Learning rates: "the learning rate of BERT fine-tuning and DGRe is 1e-5 and 5e-5": BERT trains at optim.lr and
  DGRe's own layers (GGNN, attention, decomposition, prediction, MINE networks) at `layers_lr`, or when null at
  `layers_lr_scale` x optim.lr (default 5, the paper's ratio).
- The paper's T (GGNN steps) is not given; 2 by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from core.errors import InputError, check_choice
from core.ranges import COUNT, FRACTION, NON_NEGATIVE, POSITIVE, check_ranges
from models.rankers.backbone import backbone_mask
from models.rankers.base import (
    CrossEncoder,
    ParamGroup,
    RankerConfig,
    TripletOutput,
    host_padded,
    masked_mean,
)
from models.rankers.capabilities import RankerCapabilities
from models.rankers.dgre.decomposition import (
    DECOMPOSITION_NORMS,
    Decomposition,
)
from models.rankers.dgre.ggnn import GGNN, GGNN_INPUTS, RefinementAttention
from models.rankers.dgre.losses import DISTANCES, distance_loss
from models.rankers.dgre.masking import (
    INF_NORMS,
    MASKINGS,
    disentangled_graph,
    segments,
)
from models.rankers.dgre.mi import MutualInformation

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "none": nn.Identity}


@dataclass
class DGReConfig(RankerConfig):
    """`model: dgre`: the graph, GGNN, decomposition, prediction and auxiliary-loss settings (module docstring).

    The defaults are the printed equations; configs/model/dgre_tuned.yaml switches on our additions.
    """

    cross: ClassVar[bool] = True
    name: str = "dgre"
    masking: str = "adaptive"  # none | heuristic | adaptive (Table 3)
    inf_norm: str = "entry"  # Eq. 10: entry | row | induced (masking.py)
    graph_layer: int = (
        -1
    )  # the l of Eq. 8-16: the transformer layer whose scores form the graph and whose output is h^0
    ggnn_steps: int = 2  # T of Eq. 11 (the paper gives none)
    ggnn_input: str = "concat"  # concat: GRU([h, A~h], h) as Eq. 11 reads | message: GRU(A~h, h) (Li et al.)
    # Defaults below are the printed equations; configs/model/dgre_tuned.yaml holds the settings of our grids.
    attention_scale: bool = False  # Eq. 12 and Eq. 14-15 as printed (no scale) | true: logits / sqrt(d)
    decomposition_norm: str = "sum"  # Eq. 14-15: sum: Z_dr = P Z_d as printed | mean: P Z_d / n
    refined_pool: str = "mean"  # Z^l in Eq. 16: mean over real tokens | cls
    activation: str = "none"  # between W_1 and w_2 of Eq. 16: none (printed: a linear combination) | relu | tanh
    dropout: float = 0.0  # on the input of Eq. 16 (printed: none)
    distance: str = "triangle"  # none | point | pair | triangle (Table 4; losses.py)
    mi: bool = True  # mutual information regularisation L_mi (Table 5; mi.py)
    mi_hidden: int = 128  # width of the MINE statistics networks
    aux_lambda: float = 0.01  # lambda of lambda (L_triangle + L_mi) + L_rank ("lambda is 1e-2")
    hinge_on: str = "probability"  # what Eq. 25's margin loss compares: probability f = sigmoid(g) | logit g
    layers_lr: float | None = None  # DGRe's own layers; null: layers_lr_scale x optim.lr
    layers_lr_scale: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        check_choice("model.masking", self.masking, MASKINGS)
        check_choice("model.inf_norm", self.inf_norm, INF_NORMS)
        check_choice("model.ggnn_input", self.ggnn_input, GGNN_INPUTS)
        check_choice("model.decomposition_norm", self.decomposition_norm, DECOMPOSITION_NORMS)
        check_choice("model.refined_pool", self.refined_pool, ("mean", "cls"))
        check_choice("model.activation", self.activation, tuple(ACTIVATIONS))
        check_choice("model.distance", self.distance, DISTANCES)
        check_choice("model.hinge_on", self.hinge_on, ("probability", "logit"))
        # graph_layer is checked against the backbone's depth when the ranker is built
        check_ranges(
            "model",
            self,
            ggnn_steps=NON_NEGATIVE,
            dropout=FRACTION,
            aux_lambda=NON_NEGATIVE,
            mi_hidden=COUNT,
            layers_lr_scale=POSITIVE,
            layers_lr=POSITIVE,
        )


@dataclass
class DGReOutput:
    """Everything one forward computes, for the losses and for analyses (e.g. the paper's Fig. 6 attention maps)."""

    logits: Tensor  # g(q, d) [B] (Eq. 16)
    scores: Tensor  # attention-like scores S of the graph layer [B, L, L] (float32)
    graph: Tensor  # disentangled graph A~ [B, L, L] (Eq. 10, or the none / heuristic variants)
    query_mask: Tensor  # [B, L] bool
    doc_mask: Tensor  # [B, L] bool
    cls: Tensor  # E^L(0) [B, d]
    query_words: Tensor  # mean of E^L over the query words [B, d] (pointwise distance, Eq. 19)
    doc_words: Tensor  # mean of E^L over the document words [B, d]
    refined: Tensor  # Z^l [B, L, d] (Eq. 12)
    related: Tensor  # mean of Z_dr over the query words [B, d] (Eq. 14, 16)
    mi_rows: tuple[Tensor, Tensor, Tensor]  # (Z_q, Z_dr, Z_du) rows of the positions query words can hold [N, d]
    mi_valid: Tensor  # [N] bool: which of those rows are query words (Eq. 22-24 take only these)


def bert_self_attention(encoder: nn.Module, layer: int):
    """Return the self-attention block of a BERT-family encoder's layer `layer`, or raise InputError.

    The block has `query`, `key`, `num_attention_heads`, `attention_head_size`: DGRe reads the graph layer's
    attention-like scores from it.
    """
    try:
        att = encoder.encoder.layer[layer].attention.self
        att.query, att.key, att.num_attention_heads, att.attention_head_size  # noqa: B018 - attribute check
    except (AttributeError, IndexError) as e:
        raise InputError(
            "model.backbone",
            "DGRe needs a BERT-family encoder (encoder.layer[i].attention.self.query/key); "
            f"{type(encoder).__name__} has none at layer {layer}",
        ) from e
    return att


class DGRe(CrossEncoder):
    """DGRe as a cross-encoder: BERT, the disentangled graph, GGNN, decomposition and the prediction g (Eq. 16).

    Training adds the triangle distance and MINE terms through `score_triplets`; see the module docstring.
    """

    capabilities = RankerCapabilities(vectors="none")

    def __init__(self, cfg: DGReConfig):
        super().__init__(cfg)
        n_layers = self.encoder.config.num_hidden_layers
        if not -n_layers <= cfg.graph_layer < n_layers:
            raise InputError(
                "config key 'model.graph_layer'",
                f"is {cfg.graph_layer}; the backbone has {n_layers} layers (expected -{n_layers}..{n_layers - 1})",
            )
        self.graph_layer = cfg.graph_layer % n_layers
        bert_self_attention(self.encoder, self.graph_layer)  # fails early on a non-BERT backbone
        if self.tokenizer.sep_token_id is None:
            raise InputError(
                "model.backbone", "DGRe needs a tokenizer with a [SEP] token (query and document segments)"
            )
        d = self.hidden_size
        self.ggnn = GGNN(d, cfg.ggnn_steps, cfg.ggnn_input)
        self.refine = RefinementAttention(d, scale=cfg.attention_scale)
        self.decomposition = Decomposition(d, norm=cfg.decomposition_norm, scale=cfg.attention_scale)
        self.predict = nn.Sequential(
            nn.Dropout(cfg.dropout), nn.Linear(3 * d, d), ACTIVATIONS[cfg.activation](), nn.Linear(d, 1)
        )
        self.mutual_information = MutualInformation(d, cfg.mi_hidden) if cfg.mi else None

    # ---- forward -------------------------------------------------------------------------------------------
    def attention_scores(self, hidden: Tensor) -> Tensor:
        """Compute S = mean over heads of (W_Q^h E)(W_K^h E)^T / sqrt(d_k) of the graph layer.

        It is computed from the layer's input `hidden` [B, L, d] and returned as [B, L, L] float32. The mean over H
        heads of per-head scaled dot products is one dot product of the concatenated projections divided by H sqrt(d_k).
        """
        att = bert_self_attention(self.encoder, self.graph_layer)  # looked up, not kept: a second reference
        # would register the layer's weights twice in the state dict
        q, k = att.query(hidden).float(), att.key(hidden).float()
        return torch.einsum("bid,bjd->bij", q, k) / (att.num_attention_heads * att.attention_head_size**0.5)

    def forward(self, batch: dict[str, Tensor]) -> DGReOutput:
        """Run Eq. 5-16 on a batch of B tokenised `[CLS] q [SEP] d [SEP]` inputs [B, L].

        Returns the logits g(q, d) [B] with every intermediate the losses and analyses read (`DGReOutput`).
        """
        cfg = self.cfg
        ids, am = batch["input_ids"], batch["attention_mask"]
        out = self.encoder(
            input_ids=ids,
            attention_mask=backbone_mask(self.encoder, am, host_padded(batch, "attention_mask", ids.shape[1])),
            token_type_ids=batch.get("token_type_ids"),
            output_hidden_states=True,
        )
        hidden = out.hidden_states  # [embeddings, layer 1, ..., layer L]
        last = out.last_hidden_state
        query, doc = segments(ids, am, self.tokenizer.sep_token_id)
        scores = self.attention_scores(hidden[self.graph_layer])
        graph = disentangled_graph(scores, query, doc, am, cfg.masking, cfg.inf_norm)
        h = self.ggnn(hidden[self.graph_layer + 1], graph)  # h^0 = E_l, the graph layer's output
        z = self.refine(h, am)
        dec = self.decomposition(z, query, doc)
        related = masked_mean(dec.related, query)
        refined = masked_mean(z, am.bool()) if cfg.refined_pool == "mean" else z[:, 0]
        cls = last[:, 0]
        logits = self.predict(torch.cat([related, refined, cls], dim=-1)).squeeze(-1)
        # the MINE rows: positions 1..query_max_len, where the pair tokenizer puts every query word (a fixed block, so
        # no step waits for the host to count them; checked on the device, without a sync)
        span = min(ids.shape[1], cfg.query_max_len + 1)
        torch._assert_async(~query[:, span:].any(), "DGRe: a query word lies past model.query_max_len")
        return DGReOutput(
            logits=logits,
            scores=scores,
            graph=graph,
            query_mask=query,
            doc_mask=doc,
            cls=cls,
            query_words=masked_mean(last, query),
            doc_words=masked_mean(last, doc),
            refined=z,
            related=related,
            mi_rows=tuple(t[:, :span].flatten(0, 1) for t in (dec.query, dec.related, dec.unrelated)),
            mi_valid=query[:, :span].flatten(),
        )

    def score(self, batch: dict[str, Tensor]) -> Tensor:
        """Score each (query, document) pair by its logit g(q, d) of Eq. 16: [B] (evaluation ranks by g, not f)."""
        return self.forward(batch).logits

    def hinge_scores(self, scores: Tensor) -> Tensor:
        """Map logits g to what Eq. 25's margin loss compares: f = sigmoid(g) (Eq. 17), or g with `hinge_on: logit`."""
        return torch.sigmoid(scores) if self.cfg.hinge_on == "probability" else scores

    # ---- training ------------------------------------------------------------------------------------------
    def auxiliary_losses(self, out: DGReOutput) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Return (weighted losses, logged values) of a triplet batch's forward.

        The losses are lambda x C_distance (Eq. 18-21) and lambda x the MINE surrogate of L_mi (Eq. 22-24); rows 0..B-1
        are the positive pairs, B..2B-1 the negatives.
        """
        cfg = self.cfg
        b = out.logits.shape[0] // 2
        pos, neg = slice(0, b), slice(b, 2 * b)
        losses, logs = {}, {}
        point = (out.query_words[pos], out.doc_words[pos], out.query_words[neg], out.doc_words[neg])
        dist = distance_loss(cfg.distance, point, [out.cls[pos], out.related[pos]], [out.cls[neg], out.related[neg]])
        if dist is not None:
            losses["distance"] = cfg.aux_lambda * dist
            logs[cfg.distance] = dist.detach()
        if self.mutual_information is not None:
            surrogate, estimates = self.mutual_information(*out.mi_rows, valid=out.mi_valid)
            losses["mi"] = cfg.aux_lambda * surrogate
            logs.update(estimates)
        return losses, logs

    def score_triplets(self, batch: dict[str, Tensor]) -> TripletOutput:
        """Score a triplet batch (B positive pairs, then B negatives) in one forward, with the auxiliary losses."""
        out = self.forward(batch)
        b = out.logits.shape[0] // 2
        losses, logs = self.auxiliary_losses(out)
        return TripletOutput(pos=out.logits[:b], neg=out.logits[b:], aux_losses=losses, logs=logs)

    def param_groups(self) -> dict[str, ParamGroup]:
        """Return DGRe's own layers (everything but the BERT encoder) as one group at `layers_lr` or its scale."""
        cfg = self.cfg
        layers = [p for name, p in self.named_parameters() if not name.startswith("encoder.")]
        return {"dgre_layers": ParamGroup(layers, lr=cfg.layers_lr, lr_scale=cfg.layers_lr_scale)}


__all__ = ["DGRe", "DGReConfig", "DGReOutput", "bert_self_attention"]
