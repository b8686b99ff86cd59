"""The head contract and its shared config."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from core.errors import check_choice
from core.ranges import COUNT, NON_NEGATIVE, POSITIVE, check_ranges
from models.heads import HEADS

LOG_2PI = math.log(2 * math.pi)


@dataclass
class HeadConfig:
    """Keys shared by every head (`configs/head/*.yaml`), including how `train.py stage=head` trains it."""

    name: str = "none"
    granularity: str = "token"  # token | sequence (sequence: single-vector rankers only)
    epochs: int = 10  # flows: passes over the cached training representations (paper: 10, or 3 on MS MARCO)
    lr: float = 1e-4  # flows: Adam learning rate (paper: 1e-4)
    batch_size: int = 1024  # vectors per optimiser step
    cache_dtype: str = "float16"  # the on-disk representation cache: float16 | float32
    max_train_texts: int | None = None  # cap on the training queries + passages encoded into the cache (seeded sample)
    # flows: the validation split's ranker representations are kept in memory after the first validation (the
    # ranker is frozen), up to this many GiB; batches beyond it are re-encoded at every validation
    val_memory_gib: float = 2.0

    def __post_init__(self):
        check_choice("head.granularity", self.granularity, ("token", "sequence"))
        check_choice("head.cache_dtype", self.cache_dtype, ("float16", "float32"))
        check_ranges(
            "head",
            self,
            epochs=COUNT,
            lr=POSITIVE,
            batch_size=COUNT,
            max_train_texts=COUNT,
            val_memory_gib=NON_NEGATIVE,
        )


FITS = ("closed_form", "gradient")


@dataclass(frozen=True)
class HeadCapabilities:
    """How an isotropy head is fitted, declared where it is defined, so the head stage decides by it, not by name.

    Attributes
    ----------
    fit : str
        ``"closed_form"``: fitted in one pass over the cached representations by `IsotropyHead.fit_vectors` (no
        optimiser, no epochs, one `head.ckpt`); ``"gradient"``: trained by maximum likelihood (Eq. 5) for
        `head.epochs` epochs, validated after each, the best epoch kept.
    """

    fit: str

    def __post_init__(self):
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {self.fit!r}")


class IsotropyHead(nn.Module):
    """x [..., D] -> z [..., D]; `nll` is -log p(x) with p the density that makes z standard normal."""

    # how it is fitted; every registered head declares its own and registers the same object
    capabilities: ClassVar[HeadCapabilities] = HeadCapabilities(fit="gradient")

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward_and_logdet(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(z, log |det dz/dx|) per vector."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Map representations x [..., D] to z [..., D], the vectors scoring then compares."""
        return self.forward_and_logdet(x)[0]

    def inverse(self, z: Tensor) -> Tensor:
        """Map z [..., D] back to the representations x [..., D] (the inverse of `forward`)."""
        raise NotImplementedError

    def fit_vectors(self, vectors: np.ndarray) -> IsotropyHead:
        """Fit the head in closed form from representations [N, D] and return it (heads with `fit="closed_form"`)."""
        raise NotImplementedError(f"{type(self).__name__} is trained by gradient, not fitted in closed form")

    def nll(self, x: Tensor) -> Tensor:
        """-log p(x) = -log N(z; 0, I) - log |det dz/dx| (isotropy paper Eq. 5), per vector, in float32 or wider."""
        z, logdet = self.forward_and_logdet(x.float() if x.dtype in (torch.float16, torch.bfloat16) else x)
        return 0.5 * (z.pow(2).sum(-1) + self.dim * LOG_2PI) - logdet


def build_head(cfg, dim: int) -> IsotropyHead | None:
    """Build the head of `cfg` for vectors of width `dim`; None for `name: none`."""
    return HEADS.get(cfg.name, "head.name").build(cfg, dim)


def head_config(head: dict):
    """Turn a `head` dict (from YAML or a checkpoint) into the head's dataclass config, checked by its schema."""
    schema = HEADS.get(head["name"], "head.name").schema
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), head))


# where a head of each granularity sits in a bi-encoder (`BiEncoder.token_head` / `sequence_head`)
HEAD_SLOTS = {"token": "token_head", "sequence": "sequence_head"}


def head_input_dim(ranker) -> int:
    """Width of the vectors a head on `ranker` transforms: its `compress_dim` where it has one, else the backbone's."""
    compress = getattr(ranker.cfg, "compress_dim", None)
    return int(compress or ranker.hidden_size)


def attach_head(ranker, head: IsotropyHead | None, granularity: str) -> None:
    """Put `head` into the ranker's slot for `granularity` (None: score with the raw representations)."""
    setattr(ranker, HEAD_SLOTS[granularity], head)
