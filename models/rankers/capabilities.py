"""What a ranker can do, declared where it is defined, so that code decides by capability instead of by name.

Every ranker class declares a `RankerCapabilities` as its class attribute `capabilities` and registers the same object
(`RANKERS.register(name, schema=..., capabilities=Cls.capabilities)`). A config's `model.name` then answers
(`models.rankers.ranker_capabilities`) before any weights load, as grids and config checks need, and a
built ranker answers for itself (`capabilities_of(ranker)`). tests/test_capabilities.py checks every declaration
against what the ranker really does.

Who asks what:

- `vectors`: which vectors the analyses keep (vocabulary projections), lexical enrichment (one vector per text), what a
  split index encoding ships (retrieval/split.py), whether a collection can be encoded at all (retrieval/encode.py);
- `index`: full ranking (retrieval/retrieve.py and the indexes' own checks), the white-box analysis (Eq. 1), the
  vocabulary projections (their candidate scores are the index family's score function);
- `token_vectors` / `sequence_vectors`: isotropy heads by `head.granularity` (HeadModule);
- `trainable`: train.py and grids (an entry with nothing to train is only evaluated);
- `encodes_texts` (from `vectors`): the isotropy protocols (callbacks/isotropy.py) and which eval and optim keys the
  jobs read beside it (pipeline/jobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

VECTORS = ("multi", "single", "none")
INDEXES = ("colbert", "dense")
_INDEX_VECTORS = {"colbert": "multi", "dense": "single"}


@dataclass(frozen=True)
class RankerCapabilities:
    """What a ranker, or another choice of the `model` config group, can do.

    Attributes
    ----------
    vectors : str
        What it scores from separately encoded texts: ``"multi"`` (token vectors, `Encoded.tokens`), ``"single"`` (one
        pooled vector per text, `Encoded.sequence`) or ``"none"`` (no separate encodings: a cross-encoder, BM25).
    index : str or None
        The full-ranking index family that reproduces its score: ``"colbert"`` (ColBERT's Eq. 1, the sum over query
        tokens of the best cosine with a passage token: `retrieval.colbert_e2e.ColBERTIndex`), ``"dense"`` (dot product
        or cosine of the pooled vectors: `retrieval.dense.DenseIndex`), or None (no index serves it).
    token_vectors : bool
        It has token vectors before pooling and scoring (`BiEncoder.token_head`): token-wise isotropy heads apply.
    sequence_vectors : bool
        It scores a pooled vector per text (`BiEncoder.sequence_head`): sequence-wise isotropy heads apply.
    trainable : bool
        It has weights for train.py to fine-tune; otherwise evaluate.py only evaluates it (and grids never train it).
    """

    vectors: str
    index: str | None = None
    token_vectors: bool = False
    sequence_vectors: bool = False
    trainable: bool = True

    @property
    def encodes_texts(self) -> bool:
        """Whether it encodes queries and passages into vectors of their own (a bi-encoder), as ``vectors`` says.

        What in-batch negatives score and the isotropy protocols measure (pipeline/jobs.py, callbacks/isotropy.py).
        """
        return self.vectors != "none"

    def __post_init__(self):
        # a wrong declaration is the ranker author's mistake, not the user's: ValueError at import, not InputError
        if self.vectors not in VECTORS:
            raise ValueError(f"vectors must be one of {VECTORS}, got {self.vectors!r}")
        if self.index is not None and self.index not in INDEXES:
            raise ValueError(f"index must be one of {INDEXES} or None, got {self.index!r}")
        if self.index is not None and _INDEX_VECTORS[self.index] != self.vectors:
            raise ValueError(f"index {self.index!r} needs vectors={_INDEX_VECTORS[self.index]!r}, got {self.vectors!r}")
        if (self.token_vectors or self.sequence_vectors) and self.vectors == "none":
            raise ValueError("token or sequence vectors need separately encoded texts (vectors 'multi' or 'single')")


# A `model` choice that is no ranker (a first-stage retriever such as BM25): no vectors, no index, nothing to train.
NO_CAPABILITIES = RankerCapabilities(vectors="none", trainable=False)


def capabilities_of(ranker) -> RankerCapabilities:
    """Return what a built ranker declares it can do; an object that declares nothing can do none of it."""
    return getattr(ranker, "capabilities", NO_CAPABILITIES)


__all__ = ["RankerCapabilities", "NO_CAPABILITIES", "VECTORS", "INDEXES", "capabilities_of"]
