"""Isotropy heads (isotropy paper, section 4): maps applied to a bi-encoder's representations before cosine scoring.

`head.name` in YAML picks one (`none`, `whitening`, `nice`, `glow`); `head.granularity` says where it acts:
`token` maps every non-padding token vector (ColBERT, and RepBERT before mean pooling: `BiEncoder.token_head`),
`sequence` maps the pooled vector (RepBERT only: `BiEncoder.sequence_head`).

Every head is an `IsotropyHead`: `forward(x) -> z` on [..., D] vectors (what scoring sees), and
`nll(x) -> [...]` the per-vector negative log-likelihood under a standard Gaussian in z (flows train on it,
isotropy paper Eq. 5; whitening has no parameters to train but reports it too, for comparison). Each registered head
declares how it is fitted (`HeadCapabilities`: closed form or by gradient), which the head stage asks
(`head_capabilities`).
"""

from core.errors import InputError, check_unused
from core.registry import Registry

HEADS: Registry = Registry("isotropy head")

from models.heads.base import (  # noqa: E402
    HEAD_SLOTS,
    HeadCapabilities,
    HeadConfig,
    IsotropyHead,
    attach_head,
    build_head,
    head_config,
    head_input_dim,
)

HEADS.register("none", schema=HeadConfig)(lambda cfg, dim: None)  # no head: nothing to fit, no capabilities

from models.heads import flows, whitening  # noqa: E402,F401


def head_capabilities(name: str, where: str = "head.name") -> HeadCapabilities:
    """Return how the head registered as `name` is fitted, from the name alone (an InputError at `where` for none).

    `none` is no head and has no capabilities: asking for them is an InputError too.
    """
    caps = HEADS.get(name, where).capabilities
    if caps is None:
        heads = [n for n in HEADS.names() if HEADS.get(n).capabilities is not None]
        raise InputError(where, f"'{name}' is no isotropy head; expected one of {heads}")
    return caps


# the keys of a fit by gradient (head_stage.py: epochs of Adam over batches of cached vectors, validated after each)
GRADIENT_FIT_KEYS = ("epochs", "lr", "batch_size", "val_memory_gib")


def check_fit_keys(head: HeadConfig) -> None:
    """Refuse the gradient fit's keys, away from their defaults, for a head fitted in closed form (silently unused).

    At composition (pipeline/config.py `compose`), not in `HeadConfig`, so that a head checkpoint that recorded them
    still loads.
    """
    caps = HEADS.get(head.name, "head.name").capabilities
    if caps is None or caps.fit != "closed_form":  # no head, or one fitted by gradient
        return
    why = f"head '{head.name}' is fitted in closed form, in one pass over the cached vectors (no optimiser, no epochs)"
    check_unused("head", head, GRADIENT_FIT_KEYS, why, "choose a head fitted by gradient (head=nice or head=glow)")


__all__ = [
    "GRADIENT_FIT_KEYS",
    "HEADS",
    "HEAD_SLOTS",
    "HeadCapabilities",
    "HeadConfig",
    "IsotropyHead",
    "attach_head",
    "check_fit_keys",
    "build_head",
    "head_capabilities",
    "head_config",
    "head_input_dim",
]
