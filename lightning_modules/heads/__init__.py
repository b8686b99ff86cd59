"""Isotropy heads (isotropy paper, section 4): maps applied to a bi-encoder's representations before cosine scoring.

`head.name` in YAML picks one (`none`, `whitening`, `nice`, `glow`); `head.granularity` says where it acts:
`token` maps every non-padding token vector (ColBERT, and RepBERT before mean pooling: `BiEncoder.token_head`),
`sequence` maps the pooled vector (RepBERT only: `BiEncoder.sequence_head`).

Every head is an `IsotropyHead`: `forward(x) -> z` on [..., D] vectors (what scoring sees), and
`nll(x) -> [...]` the per-vector negative log-likelihood under a standard Gaussian in z (flows train on it,
isotropy paper Eq. 5; whitening has no parameters to train but reports it too, for comparison).
"""

from core.registry import Registry

HEADS: Registry = Registry("isotropy head")

from lightning_modules.heads.base import HeadConfig, IsotropyHead, build_head  # noqa: E402

HEADS.register("none", schema=HeadConfig)(lambda cfg, dim: None)

from lightning_modules.heads import flows, whitening  # noqa: E402,F401

__all__ = ["HEADS", "HeadConfig", "IsotropyHead", "build_head"]
