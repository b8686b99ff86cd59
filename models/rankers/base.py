"""The ranker contract shared by every model family.

Rankers are plain `nn.Module`s with no Lightning inside, so the analyses (isotropy, vocabulary projections,
white-box ColBERT) reuse them directly. Two kinds:

- `BiEncoder`: queries and passages are encoded separately. `token_representations` is the hook where the
  isotropy heads and analyses attach (per-token vectors, padding masked); `score_all` scores every query
  against every passage, which in-batch negatives use. Its `side` argument ("query" or "doc") says which of the
  two is encoded: the BERT rankers ignore it, TK needs it (passage positions start at an offset).
- `CrossEncoder`: `[CLS] q [SEP] p [SEP]` through the backbone, one score per pair. `score_triplets` is the
  training hook: the scores of a triplet batch's positives and negatives, plus any auxiliary losses the ranker
  defines on its own internals (DGRe's triangle distance and mutual information terms), which RankingModule adds
  to the ranking loss and logs, so no ranker needs a special case in the module.

Both expose `score(batch) -> [B]` over tokenised (query, passage) pairs, the only call evaluation needs. Every
ranker declares what it can do as its class attribute `capabilities` (capabilities.py: multi- or single-vector, its
index family, token and sequence vectors for the heads, trainable), which callers ask instead of its name or class.
`hinge_scores` maps scores to what the pairwise margin loss compares (identity; DGRe: its sigmoid probability).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.npy import NpyRowReader
from core.ranges import COUNT, Range, check_ranges
from core.transfers import to_device
from datamodules.tokenization import HOST_LENGTHS
from models.rankers.backbone import backbone_mask, check_attention, load_backbone
from models.rankers.capabilities import RankerCapabilities
from models.rankers.dropout import use_fast_dropout

# model keys that change how a ranker runs, not what it computes: a resume may set them otherwise, and a job that
# loads a checkpoint runs it with the run's values of them (models/loading.load_ranker's `runtime`)
RUNTIME_KEYS = ("attn_implementation", "compile", "fast_dropout", "length_buckets")


BUCKETS = Range(1, also=("auto",), integer=True)  # model.length_buckets
CPU_LENGTH_GROUPS = 4  # model.length_buckets=auto on the CPU


def length_groups(setting: int | str, device: torch.device) -> int:
    """Return how many length groups `model.length_buckets` (`setting`) makes of a batch of passages on `device`.

    `auto`: `CPU_LENGTH_GROUPS` on the CPU, where the padding a group saves is compute paid per token; one on an
    accelerator, where each group adds a forward and backward pass of kernel launches (a ColBERT step of batch 32
    launches about twice the operators of one padded block) while the device's work barely shrinks (on an H200 the
    bare loop's one padded block took 65 ms of GPU work per MiniLM step of 256 triples, our four groups 69;
    docs/performance.md).

    >>> cpu, cuda = torch.device("cpu"), torch.device("cuda")
    >>> length_groups("auto", cpu), length_groups("auto", cuda), length_groups(3, cuda)
    (4, 1, 3)
    """
    if setting == "auto":
        return CPU_LENGTH_GROUPS if device.type == "cpu" else 1
    return int(setting)


@dataclass
class RankerConfig:
    """Keys shared by every ranker (`configs/model/*.yaml`)."""

    name: str = "colbert"
    backbone: str = "minilm"
    query_max_len: int = 32
    doc_max_len: int = 180
    # dropout masks from 16-bit uniforms and attention dropout outside SDPA's math path on CPU (dropout.py); same p,
    # unbiased, evaluation unchanged. false: PyTorch's nn.Dropout and SDPA as they are.
    fast_dropout: bool = True
    # bi-encoders: a batch of passages is encoded in groups of similar length, each padded only to its own longest
    # (the batch and the scores stay the same). auto: 4 groups on the CPU, which pays per token (training batches of
    # 32 SQuAD passages at 180 tokens are ~24 % padding as one block), one block on an accelerator, where each group
    # is another forward and backward pass of kernel launches that costs the host more than the padding costs the
    # device (`length_groups`). A number: that many groups on any device; 1: one block.
    length_buckets: int | str = "auto"
    # the backbone's attention: sdpa (PyTorch's scaled-dot-product attention) | eager (transformers' reference) |
    # flash_attention_2 (needs the flash_attn package, a CUDA GPU and bf16/fp16)
    attn_implementation: str = "sdpa"
    # torch.compile the backbone's forward for fine-tuning (RankingModule.on_fit_start); weights and checkpoints as
    # without. The first steps compile (minutes for BERT-base); batches of new shapes recompile a few times.
    compile: bool = False

    # a cross-encoder reads `[CLS] q [SEP] p [SEP]` as one input (bert_cat, dgre set it)
    cross: ClassVar[bool] = False

    def __post_init__(self):
        check_ranges("model", self, query_max_len=COUNT, doc_max_len=COUNT, length_buckets=BUCKETS)
        check_attention(self.attn_implementation)

    def token_budgets(self) -> dict[str, tuple[str, int]]:
        """Return {key: (what the key bounds, its token count)} for the length keys of the config.

        They are checked against the backbone's position embeddings at config time
        (models/rankers/limits.py): a bi-encoder's query and passage each (special tokens included), a
        cross-encoder's query + passage + 3 special tokens together.
        """
        q, d = int(self.query_max_len), int(self.doc_max_len)
        if self.cross:
            what = f"the cross-encoder's input [CLS] query [SEP] passage [SEP] ({q} + {d} + 3)"
            return {"query_max_len": (what, q + d + 3), "doc_max_len": (what, q + d + 3)}
        return {"query_max_len": ("a query", q), "doc_max_len": ("a passage", d)}


def padded_rows(lengths: np.ndarray | None, width: int) -> bool | None:
    """Return whether any of the rows of token counts `lengths` is shorter than `width`; None when `lengths` is."""
    return None if lengths is None else bool(len(lengths) and lengths.min() < width)


def host_padded(batch: dict, mask_key: str, width: int) -> bool | None:
    """Return whether any row of `batch[mask_key]` ([B, width]) is padded, from `HOST_LENGTHS`; None when not there."""
    return padded_rows(batch.get(HOST_LENGTHS, {}).get(mask_key), width)


@dataclass
class Encoded:
    """Output of a bi-encoder side: token vectors with their padding mask, and the pooled sequence vector."""

    tokens: Tensor  # [B, L, D]
    mask: Tensor  # [B, L] bool, True on real tokens
    sequence: Tensor | None = None  # [B, D]


@dataclass
class EncodedTexts:
    """A collection of encoded texts, the one container the analyses and the isotropy protocol keep (on the CPU).

    It holds the real tokens' vectors flat (no padding stored), text k at rows starts[k] : starts[k] + lengths[k] (texts
    may lie in any order: models/encoding.EncodedTextsWriter writes them as they arrive), with the tokens'
    vocabulary ids when kept and one pooled vector per text where the ranker pools. `padded(index)` gives texts back as
    an `Encoded` batch for the scoring functions.
    """

    vecs: Tensor  # [T, D]
    starts: np.ndarray  # [K] int64
    lengths: np.ndarray  # [K] int64 (0: no token vectors kept for the text)
    ids: Tensor | None = None  # [T] vocabulary ids of the tokens
    sequence: Tensor | None = None  # [K, D]
    rows_file: NpyRowReader | None = None  # where vecs is a mapped file: texts' rows read from it by pread instead

    @classmethod
    def from_offsets(
        cls, vecs: Tensor, offsets, ids: Tensor | None = None, sequence: Tensor | None = None
    ) -> EncodedTexts:
        """Build from texts stored one after another: text k at rows offsets[k] : offsets[k + 1]."""
        offsets = np.asarray(offsets, dtype=np.int64)
        return cls(vecs, offsets[:-1].copy(), np.diff(offsets), ids, sequence)

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def n_tokens(self) -> int:
        """Total number of token vectors kept, over all texts."""
        return int(self.lengths.sum())

    def tokens(self, k: int) -> Tensor:
        """Return text k's token vectors [lengths[k], D] (read by `pread` where they were spilled to a file)."""
        if self.rows_file is not None:
            return torch.from_numpy(self.rows_file.read_spans(self.starts[k : k + 1], self.lengths[k : k + 1]))
        return self.vecs[int(self.starts[k]) : int(self.starts[k] + self.lengths[k])]

    def text_vectors(self, texts) -> tuple[Tensor, np.ndarray]:
        """Return (the token vectors of `texts`, text after text, [sum of lengths, D]; each text's token count).

        From a spilled file they are read by `pread` (`rows_file`), so reading them leaves no pages mapped in this
        process.
        """
        texts = np.asarray(texts, dtype=np.int64)
        if self.rows_file is not None:
            lengths = self.lengths[texts]
            return torch.from_numpy(self.rows_file.read_spans(self.starts[texts], lengths)), lengths
        index, lengths = self.token_rows(texts)
        return torch.index_select(self.vecs, 0, torch.from_numpy(index)), lengths  # rows: 6x faster than vecs[index]

    def token_ids(self, k: int) -> Tensor:
        """Return the vocabulary ids [lengths[k]] of text k's tokens (needs `ids`, kept with `keep_ids`)."""
        return self.ids[int(self.starts[k]) : int(self.starts[k] + self.lengths[k])]

    def token_rows(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """Return (the rows of `vecs` holding the tokens of `texts`, text after text; each text's token count)."""
        texts = np.asarray(texts, dtype=np.int64)
        starts, lengths = self.starts[texts], self.lengths[texts]
        first = np.cumsum(lengths) - lengths  # where each text's tokens start in the result
        return np.repeat(starts - first, lengths) + np.arange(int(lengths.sum())), lengths

    def _rows(self, index) -> tuple[np.ndarray, Tensor, Tensor]:
        index = np.asarray(index, dtype=np.int64)
        starts, lens = self.starts[index], self.lengths[index]
        ar = np.arange(int(lens.max()) if len(index) else 0)
        mask = ar[None, :] < lens[:, None]
        return index, torch.from_numpy(np.where(mask, starts[:, None] + ar[None, :], 0)), torch.from_numpy(mask)

    def padded(self, index) -> Encoded:
        """Return texts `index` as an `Encoded` batch for the scoring functions.

        That is [n, L, D] token vectors (zero past each text's end) with their [n, L] mask, L = the longest of them,
        and their pooled vectors.
        """
        index, rows, mask = self._rows(index)
        tokens = self.vecs[rows] * mask[..., None].to(self.vecs.dtype)
        return Encoded(tokens, mask, None if self.sequence is None else self.sequence[torch.from_numpy(index)])

    def padded_ids(self, index) -> Tensor:
        """Return the vocabulary ids of `padded(index)`'s tokens [n, L], 0 on padding."""
        _, rows, mask = self._rows(index)
        return torch.where(mask, self.ids[rows], torch.zeros_like(rows))


def masked_mean(tokens: Tensor, mask: Tensor) -> Tensor:
    """Mean of the real token vectors: tokens [B, L, D], mask [B, L] -> [B, D] (zeros for a text with no token)."""
    m = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * m).sum(1) / m.sum(1).clamp_min(1.0)


@dataclass
class ParamGroup:
    """Parameters trained with their own learning rate (e.g. TK's kernel weights, position-bias paper section 3).

    The rate is `lr` when set, else `lr_scale` x optim.lr. Warm-up, schedule and the weight-decay split apply as to any
    group.
    """

    params: list[nn.Parameter] = field(default_factory=list)
    lr: float | None = None
    lr_scale: float = 1.0

    def resolve(self, base_lr: float) -> float:
        """Return the group's learning rate, given the run's `optim.lr` as `base_lr`."""
        return self.lr if self.lr is not None else self.lr_scale * base_lr


class Ranker(nn.Module):
    """Base of every ranker: a pre-trained backbone (`cfg.backbone`) with its tokenizer, and a score per pair.

    Subclasses are `BiEncoder` or `CrossEncoder` (`kind`); see the module docstring for the contract.
    """

    kind: ClassVar[str]  # "bi" or "cross"
    # what the ranker can do (capabilities.py); every registered ranker declares its own and registers the same object
    capabilities: ClassVar[RankerCapabilities] = RankerCapabilities(vectors="none")
    # softmax temperature of the ce loss when optim.temperature is null (see OptimConfig.temperature)
    ce_temperature: ClassVar[float] = 1.0

    def __init__(self, cfg: RankerConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder, self.tokenizer = load_backbone(cfg.backbone, getattr(cfg, "attn_implementation", "sdpa"))
        if cfg.fast_dropout:
            use_fast_dropout(self.encoder)
        self.hidden_size = self.encoder.config.hidden_size

    def score(self, batch: dict[str, Tensor]) -> Tensor:
        """Score a batch of tokenised (query, passage) pairs: [B]; the only call evaluation needs."""
        raise NotImplementedError

    def hinge_scores(self, scores: Tensor) -> Tensor:
        """Map scores to what the pairwise margin loss (optim.loss=hinge) compares.

        Identity by default; a ranker whose loss is defined on a transformed output (DGRe: sigmoid probabilities, its
        paper's Eq. 17 and 25) maps them here, while evaluation ranks by `score` (the same order, without saturating to
        ties).
        """
        return scores

    def param_groups(self) -> dict[str, ParamGroup]:
        """Return named parameter groups with their own learning rates; parameters in none of them train at optim.lr.

        Default: none (one learning rate for the whole ranker).
        """
        return {}


class BiEncoder(Ranker):
    """A ranker that encodes queries and passages separately and scores their vectors (ColBERT, RepBERT, TK, ...).

    Isotropy heads attach to `token_head` / `sequence_head`; see the module docstring.
    """

    kind = "bi"
    capabilities = RankerCapabilities(vectors="multi", token_vectors=True)

    def __init__(self, cfg: RankerConfig):
        super().__init__(cfg)
        # Isotropy heads plug in here: a token-wise head maps every token vector before pooling and scoring, a
        # sequence-wise head maps the pooled vector. None = the fine-tuned representations as they are. (Set on
        # the instance: a class-level None would shadow modules that nn.Module keeps in _modules.)
        self.token_head: nn.Module | None = None
        self.sequence_head: nn.Module | None = None

    # whether the rows `encode` is encoding are padded, when the host knows it (None: not known); read by the backbone
    # pass below rather than passed to `token_representations`, whose three arguments rankers override
    _padded: bool | None = None

    def token_representations(self, input_ids: Tensor, attention_mask: Tensor, side: str | None = None) -> Encoded:
        """Return the contextual token vectors x_j (isotropy paper notation), before any isotropy head.

        `side`: "query" or "doc" (the same backbone encodes both here, so it is not used). Inside `encode` with
        `padded` known, the backbone is told so (`backbone_mask`) instead of reading the mask back from the device.
        """
        mask = backbone_mask(self.encoder, attention_mask, self._padded)
        out = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return Encoded(tokens=out, mask=attention_mask.bool())

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor, side: str | None = None, padded: bool | None = None
    ) -> Encoded:
        """Encode [B, L] token ids into what the ranker scores with (`token_representations`, then `finish`).

        `padded`: whether any row is padded, as the host knows it (`HOST_LENGTHS`); None: not known here (what an
        enclosing `padding_known` says, if any).
        """
        with self.padding_known(padded if padded is not None else self._padded):
            return self.finish(self.token_representations(input_ids, attention_mask, side=side))

    @contextlib.contextmanager
    def padding_known(self, padded: bool | None):
        """Tell the backbone passes in the block whether any row of their batch is padded (`padded`; None: not known).

        They then take it instead of reading the mask back from the device. For callers that run
        `token_representations` through their own forward (the encoder's batches, models/encoding.py).
        """
        outer, self._padded = self._padded, padded
        try:
            yield
        finally:
            self._padded = outer

    def finish(self, raw: Encoded, heads: bool = True) -> Encoded:
        """Turn token representations into what the ranker scores with: token head, pooling, sequence head.

        `raw` is left as it is, so one encoding serves both `heads=True` and `heads=False` (the "Ft" and
        "Ft -> head" columns of the isotropy paper from a single pass of the frozen backbone).
        """
        enc = Encoded(raw.tokens, raw.mask)
        if heads and self.token_head is not None:
            enc.tokens = self.token_head(enc.tokens)
        enc = self.pool(enc)
        if heads and self.sequence_head is not None and enc.sequence is not None:
            enc.sequence = self.sequence_head(enc.sequence)
        return enc

    def scoring_vectors(self, x: Tensor) -> Tensor:
        """Token or pooled vectors as the score function compares them (unit length for cosine rankers)."""
        return x

    def pool(self, enc: Encoded) -> Encoded:
        """Fill `enc.sequence` (single-vector rankers); multi-vector rankers keep it None."""
        return enc

    def encode_queries(self, batch: dict[str, Tensor]) -> Encoded:
        """Encode the queries of a batch (`q_input_ids`, `q_attention_mask`)."""
        ids, mask = batch["q_input_ids"], batch["q_attention_mask"]
        return self.encode(ids, mask, side="query", padded=host_padded(batch, "q_attention_mask", ids.shape[1]))

    def encode_docs(self, batch: dict[str, Tensor]) -> Encoded:
        """Encode the passages of a batch (`d_input_ids`, `d_attention_mask`), in length buckets (`encode_bucketed`)."""
        lengths = batch.get(HOST_LENGTHS, {}).get("d_attention_mask")
        return self.encode_bucketed(batch["d_input_ids"], batch["d_attention_mask"], side="doc", lengths=lengths)

    def encode_bucketed(
        self, input_ids: Tensor, attention_mask: Tensor, side: str | None = None, lengths: np.ndarray | None = None
    ) -> Encoded:
        """Return `encode` of the batch, run in groups of similar length to pad less (`length_groups`).

        Each group is cut to its own longest sequence, then put back in order and padded to the batch's length (zeros
        past a group's length; padding is masked, as everywhere). Right padding only; otherwise, or for one bucket,
        `encode` as it is. `lengths`: the rows' token counts as the host knows them (`HOST_LENGTHS`), so that the
        groups are cut without reading the mask on the host (a sync per group on a GPU); the same groups either way.
        """
        k = min(length_groups(getattr(self.cfg, "length_buckets", 1), input_ids.device), input_ids.shape[0])
        if k <= 1 or self.tokenizer.padding_side != "right":
            padded = padded_rows(lengths, input_ids.shape[1])
            return self.encode(input_ids, attention_mask, side=side, padded=padded)
        width = input_ids.shape[1]
        parts = []
        if lengths is None:
            dev_lengths = attention_mask.sum(1)
            order = torch.argsort(dev_lengths, descending=True, stable=True)
            for idx in torch.tensor_split(order, k):
                n = int(dev_lengths[idx].max())
                parts.append(self.encode(input_ids[idx, :n], attention_mask[idx, :n], side=side))
            inverse = torch.argsort(order)
        else:  # the same order as above: stable, longest first
            host_order = np.argsort(-np.asarray(lengths), kind="stable")
            for host_idx in np.array_split(host_order, k):
                n = int(lengths[host_idx].max())
                idx = to_device(host_idx, input_ids.device)
                padded = padded_rows(lengths[host_idx], n)
                parts.append(self.encode(input_ids[idx, :n], attention_mask[idx, :n], side=side, padded=padded))
            inverse = to_device(np.argsort(host_order), input_ids.device)
        return Encoded(
            tokens=torch.cat([F.pad(p.tokens, (0, 0, 0, width - p.tokens.shape[1])) for p in parts])[inverse],
            mask=torch.cat([F.pad(p.mask, (0, width - p.mask.shape[1])) for p in parts])[inverse],
            sequence=None if parts[0].sequence is None else torch.cat([p.sequence for p in parts])[inverse],
        )

    def score_pairs(self, q: Encoded, d: Encoded) -> Tensor:
        """Score query i against passage i: [B]."""
        raise NotImplementedError

    def score_all(self, q: Encoded, d: Encoded) -> Tensor:
        """Score every query against every passage: [Bq, Bd]."""
        raise NotImplementedError

    def score(self, batch: dict[str, Tensor]) -> Tensor:
        """Encode the batch's queries and passages and score query i against passage i: [B]."""
        return self.score_pairs(self.encode_queries(batch), self.encode_docs(batch))

    def score_indexed(self, q: Encoded, d: Encoded, iq: Tensor, id_: Tensor) -> Tensor:
        """score_pairs of (q[iq[k]], d[id_[k]]): evaluation encodes each text once and scores by index."""
        return self.score_pairs(take(q, iq), take(d, id_))


class SingleVectorEncoder(BiEncoder):
    """Bi-encoders that score one pooled vector per text; `pool` fills `Encoded.sequence`."""

    cosine: ClassVar[bool] = False
    capabilities = RankerCapabilities(vectors="single", index="dense", token_vectors=True, sequence_vectors=True)

    def _prep(self, x: Tensor) -> Tensor:
        return cosine_normalize(x) if self.cosine else x

    def scoring_vectors(self, x: Tensor) -> Tensor:
        """Return the vectors as scored: unit length for cosine rankers, as they are otherwise."""
        return self._prep(x)

    def score_pairs(self, q: Encoded, d: Encoded) -> Tensor:
        """Score pooled query i against pooled passage i (dot product, or cosine): [B]."""
        return (self._prep(q.sequence) * self._prep(d.sequence)).sum(-1)

    def score_all(self, q: Encoded, d: Encoded) -> Tensor:
        """Score every pooled query against every pooled passage: [Bq, Bd]."""
        return self._prep(q.sequence) @ self._prep(d.sequence).T

    def score_indexed(self, q: Encoded, d: Encoded, iq: Tensor, id_: Tensor) -> Tensor:
        """Score (q[iq[k]], d[id_[k]]) from the pooled vectors only: [K]."""
        # only the pooled vectors are indexed: copying [P, L, D] token tensors would dominate the cost
        return (self._prep(q.sequence)[iq] * self._prep(d.sequence)[id_]).sum(-1)


def take(enc: Encoded, index) -> Encoded:
    """Rows `index` (a slice or index tensor) of an Encoded batch."""
    return Encoded(enc.tokens[index], enc.mask[index], None if enc.sequence is None else enc.sequence[index])


@dataclass
class TripletOutput:
    """A cross-encoder's training forward over a triplet batch (pairs 0..B-1 positives, B..2B-1 negatives)."""

    pos: Tensor  # [B] s(q_i, p+_i)
    neg: Tensor  # [B] s(q_i, p-_i)
    # added to the training loss as they are (the ranker applies its own weights), logged as train/<name>
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    # further values logged as train/<name> (detached; not part of the loss)
    logs: dict[str, Tensor] = field(default_factory=dict)


class CrossEncoder(Ranker):
    """A ranker that reads `[CLS] q [SEP] p [SEP]` through the backbone and scores each pair (BERT_CAT, DGRe).

    `score_triplets` is its training hook (module docstring).
    """

    kind = "cross"
    capabilities = RankerCapabilities(vectors="none")

    def score(self, batch: dict[str, Tensor]) -> Tensor:
        """Score a batch of tokenised (query, passage) pairs (`input_ids`, `attention_mask`, ...): [B]."""
        raise NotImplementedError

    def passage_token_representations(self, batch: dict[str, Tensor]) -> Encoded:
        """Return the contextual vectors of the passage's tokens in `[CLS] q [SEP] p [SEP]`.

        They are the backbone's last layer (what the position-bias paper's ATS reads for a cross-encoder): `mask` is
        True on passage tokens (segment 1) that are not special tokens, so [SEP] and the query never count.
        """
        if "token_type_ids" not in batch:
            raise ValueError("passage_token_representations needs token_type_ids to tell the passage from the query")
        ids, am = batch["input_ids"], batch["attention_mask"]
        # told whether the pairs are padded where the batch carries its lengths (as scoring is), not read back
        mask_arg = backbone_mask(self.encoder, am, host_padded(batch, "attention_mask", ids.shape[1]))
        out = self.encoder(
            input_ids=ids, attention_mask=mask_arg, token_type_ids=batch["token_type_ids"]
        ).last_hidden_state
        special = to_device(np.asarray(self.tokenizer.all_special_ids), batch["input_ids"].device)
        mask = (
            batch["attention_mask"].bool() & (batch["token_type_ids"] == 1) & ~torch.isin(batch["input_ids"], special)
        )
        return Encoded(tokens=out, mask=mask)

    def score_triplets(self, batch: dict[str, Tensor]) -> TripletOutput:
        """Run the training forward over a triplet batch (PairTokenizer.triplets: B positive pairs, then B negatives).

        Default: the scores only; rankers with auxiliary losses override it and compute everything in one pass.
        """
        s = self.score(batch)
        b = s.shape[0] // 2
        return TripletOutput(pos=s[:b], neg=s[b:])


def cosine_normalize(x: Tensor) -> Tensor:
    """Scale vectors [..., D] to unit length, so that dot products are cosines; a zero vector stays zero."""
    # eps keeps an all-zero (masked or collapsed) vector at cosine 0 instead of NaN
    return F.normalize(x, p=2, dim=-1, eps=1e-12)


__all__ = [
    "RUNTIME_KEYS",
    "RankerConfig",
    "Encoded",
    "ParamGroup",
    "Ranker",
    "BiEncoder",
    "SingleVectorEncoder",
    "CrossEncoder",
    "TripletOutput",
    "masked_mean",
    "cosine_normalize",
    "take",
    "host_padded",
    "padded_rows",
]
