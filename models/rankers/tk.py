"""TK (Hofstätter et al. 2020), as described in the position-bias paper (section 2.4, Eq. 4-6, and section 3).

"TK independently contextualizes query (q_1:m) and passage (p_1:n) sequences based on pre-trained word
embeddings, where the intensity of the contextualization (with TF) is regulated by a gate (alpha)":

    q^_i = q_i * alpha + TF(q_1:m)_i * (1 - alpha),   p^_i likewise                              (Eq. 4)
    K^k_ij = exp( -(cos(q^_i, p^_j) - mu_k)^2 / (2 sigma^2) )                                     (Eq. 5)
    s = ( sum_i log( sum_j K^k_ij ) )_k W_s                                                       (Eq. 6)

Query and passage are contextualised independently, so TK is a bi-encoder here: `token_representations` returns
q^ / p^ (the "contextualized passage vectors" whose position bias the paper's ATS / MATS measure, and where the
isotropy heads attach), and `score_pairs` / `score_all` / `score_indexed` compute the cosine match matrix, the
kernels and the pooling (`kernel_pooling.py`), then the linear layer W_s (no bias, as in Eq. 6).

Choices, each with the paper's wording where it has one:
- Terms. Text is WordPiece-tokenised by the backbone's tokenizer through the ordinary PairTokenizer ("bi": query
  and passage separately), which adds [CLS] and [SEP]. TK has no such tokens, so every special token of the
  tokenizer except [UNK] is dropped through the mask (`term_mask`): it is neither attended to, nor counted as a
  position, nor scored. `query_max_len` / `doc_max_len` still count them, so a query keeps at most
  query_max_len - 2 terms.
- Positions. "We use the same sinusoidal positional encodings as Vaswani et al. [48], for the document encodings we
  shift the start position by 500 to distinguish them from the query encodings": the first query term has position
  0, the first passage term position 500 (`passage_position_offset`), then one more per term. They are added to
  the Transformer's input only, not to the q_i of Eq. 4's first summand.
- Transformer. "2 layers each with 16 attention heads with size 32 and a feed-forward dimension of 100"
  (`contextualizer.py`). Dropout 0 by default, as in the authors' TK code (the paper names none).
- Gate. alpha is one learned scalar shared by queries and passages, initialised at 0.5 and not squashed into
  [0, 1], as in the authors' code (the paper says only that a gate regulates the intensity).
- Word embeddings. The paper uses 300-d GloVe; offline, the default copies the backbone's input word embeddings
  (after which the backbone's Transformer is dropped: TK keeps no BERT layer), or a GloVe-format file is read
  (`word_vectors.py`). Trained unless `train_embeddings=false`.
- Learning rates. "Adam with a learning rate of 10^-4 for word embeddings and contextualization layers, 10^-3 for
  the kernel-pooling weights": `param_groups` gives the two groups their own rates (RankingModule's AdamW keeps its
  warm-up, schedule and weight-decay split for both).
- Scale. The sinusoids have norm sqrt(d/2) and TF's LayerNorm'd output about sqrt(d), while BERT input word
  vectors are short (MiniLM's WordPiece vectors ~1.07, against 13.9 and ~20 at d = 384). Taken as they are, q^ of
  Eq. 4 is mostly position and TF, exactly matching terms start at cosine ~0.2 instead of 1, and TK did not learn
  in a short run (docs/position-bias.md). GloVe 300-d vectors are several times longer than BERT's, closer to the
  sinusoids. So `embedding_scale=auto` multiplies backbone vectors by one factor that gives them a mean norm of
  sqrt(d) (the sqrt(d_model) factor of Vaswani et al.'s embedding layer, whose positional encodings the paper
  takes), keeping their relative norms; a GloVe file is used as it is. A number sets the factor (1.0: the raw
  backbone vectors).
- Precision. The match matrix and kernels are computed in float32 even under bf16 autocast: with sigma = 0.1 a
  bf16 cosine (3 significant digits) would move the kernel activations visibly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from core.errors import InputError
from core.inputs import input_path
from core.precision import full_precision
from core.ranges import (
    COUNT,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    Range,
    check_ranges,
)
from models.rankers import RANKERS
from models.rankers.base import (
    BiEncoder,
    Encoded,
    ParamGroup,
    RankerConfig,
    cosine_normalize,
    take,
)
from models.rankers.capabilities import RankerCapabilities
from models.rankers.contextualizer import Contextualizer
from models.rankers.kernel_pooling import kernel_means, kernel_pooling
from models.rankers.word_vectors import (
    WordVectors,
    from_backbone,
    from_glove,
)

SIDES = ("query", "doc")


@dataclass
class TKConfig(RankerConfig):
    """`model: tk`: word embeddings, the contextualiser TF, the kernels and the two learning rates (module docstring).

    Its length keys are checked against `passage_position_offset` here, not against a backbone's positions.
    """

    name: str = "tk"
    # "backbone": copy the backbone's input word embeddings; otherwise a GloVe-format text file (token v1 ... vd)
    # whose vectors replace them (the paper's GloVe). The backbone always supplies the WordPiece tokenizer.
    embeddings: str = input_path(
        "file", "a GloVe-format file (token v1 ... vd) or backbone", "backbone", keywords=("backbone",)
    )
    train_embeddings: bool = True  # the paper trains them (lr 1e-4); false freezes them
    # "auto": backbone vectors scaled to a mean norm of sqrt(d), GloVe as it is; a number: that factor (see Scale)
    embedding_scale: str | int | float = "auto"
    layers: int = 2  # Transformer layers of TF
    heads: int = 16  # attention heads per layer
    head_dim: int = 32  # size of each head (heads x head_dim need not equal the embedding width)
    ff_dim: int = 100  # feed-forward width
    dropout: float = 0.0  # attention, residual and feed-forward dropout in TF
    kernels: int = 11  # RBF kernels, means evenly from -1 to +1
    sigma: float = 0.1  # standard deviation of every kernel
    passage_position_offset: int = 500  # position of the first passage term (queries start at 0)
    gate_init: float = 0.5  # initial alpha of Eq. 4
    contextualization_lr: float | None = 1.0e-4  # embeddings, TF and alpha; null: optim.lr
    kernel_lr: float | None = 1.0e-3  # W_s; null: kernel_lr_scale x optim.lr
    kernel_lr_scale: float = 10.0  # only when kernel_lr is null

    def __post_init__(self):
        super().__post_init__()
        check_ranges(
            "model",
            self,
            layers=COUNT,
            heads=COUNT,
            head_dim=COUNT,
            ff_dim=COUNT,
            sigma=POSITIVE,
            kernel_lr_scale=POSITIVE,
            contextualization_lr=POSITIVE,
            kernel_lr=POSITIVE,
            embedding_scale=Range(0, lo_open=True, also=("auto",)),
            kernels=Range(2, note="means from -1 to +1"),
            dropout=FRACTION,
            passage_position_offset=NON_NEGATIVE,
            gate_init=PROBABILITY,
        )
        if self.query_max_len > self.passage_position_offset:  # query positions 0.. would run into the passage's
            raise InputError(
                "config key 'model.query_max_len'",
                f"is {self.query_max_len}, above model.passage_position_offset={self.passage_position_offset}: "
                "query positions would overlap the passage's; expected at most the offset",
            )

    def token_budgets(self) -> dict[str, tuple[str, int]]:
        """Return no budget: TK has sinusoidal positions of its own, which no backbone position embedding bounds."""
        return {}  # sinusoidal positions of its own: no backbone position embedding bounds them


def embedding_scale(setting: str | int | float, vectors: WordVectors) -> float:
    """Return the factor on the word vectors (module docstring, Scale).

    "auto" gives backbone vectors a mean row norm of sqrt(d) and leaves GloVe as the paper used it.
    """
    if setting != "auto":
        return float(setting)
    if vectors.source != "backbone":
        return 1.0
    weight = vectors.weight.double()
    return float(weight.shape[1] ** 0.5 / weight.norm(dim=1).mean())


class TK(BiEncoder):
    """TK, position-bias paper Eq. 4-6: gated contextualised word embeddings, kernel pooling of cosines, then W_s.

    A bi-encoder with no BERT layer: only the word embeddings (and the tokenizer) come from the backbone.
    """

    # token vectors, but scored by kernel pooling, which no index family reproduces
    capabilities = RankerCapabilities(vectors="multi", token_vectors=True)

    # Bound on the elements of one [pairs, Lq, Ld, kernels] activation tensor; scoring runs in chunks under it.
    max_kernel_elements: int = 2**24

    def __init__(self, cfg: TKConfig):
        super().__init__(cfg)  # loads the backbone for its tokenizer (and, by default, its word embeddings)
        tok = self.tokenizer
        if cfg.embeddings == "backbone":
            vectors = from_backbone(self.encoder)
        else:
            vectors = from_glove(cfg.embeddings, tok.get_vocab(), len(tok))
        del self.encoder  # TK keeps no BERT layer: only the word embeddings came from it
        scale = embedding_scale(cfg.embedding_scale, vectors)
        self.embedding_source = {
            "source": vectors.source,
            "found": vectors.found,
            "missing": vectors.missing,
            "scale": scale,
        }
        self.embeddings = nn.Embedding.from_pretrained(vectors.weight * scale, freeze=not cfg.train_embeddings)
        self.hidden_size = vectors.weight.shape[1]
        self.contextualizer = Contextualizer(
            self.hidden_size, cfg.layers, cfg.heads, cfg.head_dim, cfg.ff_dim, cfg.dropout
        )
        self.gate = nn.Parameter(torch.tensor(float(cfg.gate_init)))
        self.scoring = nn.Linear(cfg.kernels, 1, bias=False)  # W_s of Eq. 6
        # small initial weights: the pooled features are sums of logs, tens in magnitude (authors' code: +-0.014)
        nn.init.uniform_(self.scoring.weight, -0.014, 0.014)
        self.register_buffer("mu", kernel_means(cfg.kernels), persistent=False)
        dropped = sorted(set(tok.all_special_ids) - {tok.unk_token_id})
        self.register_buffer("dropped_ids", torch.tensor(dropped, dtype=torch.long), persistent=False)

    # ---- contextualisation (Eq. 4) -------------------------------------------------------------------------
    def term_mask(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Return True on TK's terms: real tokens that are not [CLS], [SEP] or another special token (but [UNK])."""
        return attention_mask.bool() & ~torch.isin(input_ids, self.dropped_ids)

    def position_ids(self, mask: Tensor, side: str | None) -> Tensor:
        """Return the position of every term, counted over terms only.

        0, 1, ... for queries, 500, 501, ... (`passage_position_offset`) for passages. (Slots off the mask repeat a
        neighbour's position; they are never attended to nor scored.)
        """
        if side not in SIDES:
            raise ValueError(f"TK encodes queries and passages differently: side must be one of {SIDES}, got {side!r}")
        offset = 0 if side == "query" else self.cfg.passage_position_offset
        return (mask.long().cumsum(dim=1) - 1).clamp_min(0) + offset

    def token_representations(self, input_ids: Tensor, attention_mask: Tensor, side: str | None = None) -> Encoded:
        """q^ (side="query") or p^ (side="doc") of Eq. 4, zero off the term mask."""
        mask = self.term_mask(input_ids, attention_mask)
        keep = mask.unsqueeze(-1)
        x = self.embeddings(input_ids) * keep
        tf = self.contextualizer(x, mask, self.position_ids(mask, side))
        mixed = self.gate * x + (1 - self.gate) * tf
        return Encoded(tokens=mixed * keep, mask=mask)

    def scoring_vectors(self, x: Tensor) -> Tensor:
        """Return the term vectors at unit length, as the cosine match matrix of Eq. 5 compares them."""
        return cosine_normalize(x)  # the match matrix is cosine

    # ---- kernel pooling and scoring (Eq. 5-6) --------------------------------------------------------------
    def _step(self, per_item: int) -> int:
        return max(1, self.max_kernel_elements // max(1, per_item))

    def _pair_features(self, qn: Tensor, qm: Tensor, dn: Tensor, dm: Tensor) -> Tensor:
        cos = torch.einsum("bid,bjd->bij", qn, dn)  # [B, Lq, Ld]
        return kernel_pooling(cos, qm, dm, self.mu, self.cfg.sigma)

    def _cross_features(self, qn: Tensor, qm: Tensor, dn: Tensor, dm: Tensor) -> Tensor:
        cos = torch.einsum("qid,pjd->qpij", qn, dn)  # [Bq, Bd, Lq, Ld]
        return kernel_pooling(cos, qm[:, None], dm[None], self.mu, self.cfg.sigma)

    def kernel_features(self, q: Encoded, d: Encoded, cross: bool = False) -> Tensor:
        """Return the pooled kernel features of Eq. 6 (before W_s): [B, K] for aligned pairs, [Bq, Bd, K] with `cross`.

        Passages are taken in chunks so that no [.., Lq, Ld, K] tensor exceeds `max_kernel_elements`; when that
        takes more than one chunk under autograd, each chunk is checkpointed (recomputed in backward), so training
        memory stays bounded too and in-batch negatives scale with the batch.
        """
        with full_precision(q.tokens.device.type):
            qn, dn = cosine_normalize(q.tokens.float()), cosine_normalize(d.tokens.float())
            if not cross and qn.shape[0] != dn.shape[0]:
                raise ValueError(f"score_pairs needs as many queries as passages, got {qn.shape[0]} and {dn.shape[0]}")
            per_passage = qn.shape[1] * dn.shape[1] * len(self.mu) * (qn.shape[0] if cross else 1)
            step, n = self._step(per_passage), dn.shape[0]
            spans = [(a, min(n, a + step)) for a in range(0, n, step)] or [(0, 0)]
            run = self._cross_features if cross else self._pair_features
            recompute = torch.is_grad_enabled() and len(spans) > 1
            out = []
            for a, b in spans:
                args = (qn, q.mask, dn[a:b], d.mask[a:b]) if cross else (qn[a:b], q.mask[a:b], dn[a:b], d.mask[a:b])
                out.append(checkpoint(run, *args, use_reentrant=False) if recompute else run(*args))
            return torch.cat(out, dim=1 if cross else 0)

    def _score(self, q: Encoded, d: Encoded, cross: bool) -> Tensor:
        with full_precision(q.tokens.device.type):
            return self.scoring(self.kernel_features(q, d, cross)).squeeze(-1)

    def score_pairs(self, q: Encoded, d: Encoded) -> Tensor:
        """Score query i against passage i by Eq. 5-6 (in float32): [B]."""
        return self._score(q, d, cross=False)

    def score_all(self, q: Encoded, d: Encoded) -> Tensor:
        """Score every query against every passage by Eq. 5-6 (in float32): [Bq, Bd]."""
        return self._score(q, d, cross=True)

    def score_indexed(self, q: Encoded, d: Encoded, iq: Tensor, id_: Tensor) -> Tensor:
        """Score (q[iq[k]], d[id_[k]]) by Eq. 5-6, gathering a memory-bounded chunk of pairs at a time: [K]."""
        # gather the token tensors of a chunk of pairs at a time: [P, L, D] copies for all pairs would dominate memory
        step = self._step(q.tokens.shape[1] * d.tokens.shape[1] * len(self.mu))
        parts = [
            self.score_pairs(take(q, iq[a : a + step]), take(d, id_[a : a + step])) for a in range(0, len(iq), step)
        ]
        return torch.cat(parts) if parts else q.tokens.new_zeros(0, dtype=torch.float32)

    # ---- optimisation --------------------------------------------------------------------------------------
    def param_groups(self) -> dict[str, ParamGroup]:
        """Return the paper's two learning-rate groups: embeddings + contextualisation (TF and alpha), and W_s."""
        c = self.cfg
        context = [self.embeddings.weight, self.gate, *self.contextualizer.parameters()]
        return {
            "contextualization": ParamGroup(context, lr=c.contextualization_lr),
            "kernel_scoring": ParamGroup(list(self.scoring.parameters()), lr=c.kernel_lr, lr_scale=c.kernel_lr_scale),
        }


@RANKERS.register("tk", schema=TKConfig, capabilities=TK.capabilities)
def build(cfg: TKConfig) -> TK:
    """Build TK for `model.name: tk`."""
    return TK(cfg)
