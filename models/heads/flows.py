"""Normalizing-flow heads for vectors: NICE and Glow (isotropy paper section 4.1.1, Eq. 5), built from zuko.

Both map a representation x to z = f(x) and train f by maximum likelihood under a standard Gaussian in z
(`IsotropyHead.nll`: -log p_X(x) = -log N(f(x); 0, I) - log|det Df(x)|, Eq. 5); scoring then uses z.

- NICE (Dinh et al. 2014): `couplings` additive coupling layers with alternating halves (zuko's
  `GeneralCouplingTransform` with `AdditiveTransform`), each coupling function an MLP of `hidden_layers` x
  `hidden_units` ReLU units, then NICE's diagonal scaling layer (an element-wise affine map; without it additive
  couplings preserve volume and could not reach unit variance). The paper's "five-layer network with 1000 units in
  each layer" is read as the coupling MLP, as in the NICE paper (hidden_layers=5, hidden_units=1000).
- Glow (Kingma & Dhariwal 2018) for vectors, "two levels and depth of three" as in BERT-flow (Li et al. 2020):
  each step is ActNorm (element-wise affine) -> invertible linear map in LU form (zuko's `LULinearTransform`, the
  vector form of Glow's 1x1 convolution) -> affine coupling (zuko's `GeneralCouplingTransform` with
  `MonotonicAffineTransform`); after each level but the last, half of the remaining dimensions are factored out
  straight to the Gaussian (multi-scale architecture), the next level acting on the other half. The only piece
  zuko lacks, "apply this transform to the first k features", is `_OnFirst` below.

Numerics: zuko's affine transforms soft-clip log-scales to |log s| < log(1000), so exp never overflows; the first
ActNorm is initialised from the first training batch (`init_from`), which puts raw BERT vectors (norms of 5-20,
a few huge dimensions) at unit scale before any coupling sees them. Log-determinants are summed per vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from torch.distributions import Transform, constraints
from zuko.flows import GeneralCouplingTransform, UnconditionalTransform
from zuko.lazy import LazyComposedTransform, LazyTransform
from zuko.transforms import (
    AdditiveTransform,
    CouplingTransform,
    DependentTransform,
    LULinearTransform,
    MonotonicAffineTransform,
)

from core.ranges import COUNT, NON_NEGATIVE, check_ranges
from models.heads import HEADS
from models.heads.base import HeadCapabilities, HeadConfig, IsotropyHead

_SLOPE = 1e-3  # zuko's MonotonicAffineTransform default: |log scale| < -log(slope)


def _elementwise_affine(shift: Tensor, scale: Tensor) -> Transform:
    # element-wise map as a vector transform, so its log-det is summed over the features
    return DependentTransform(MonotonicAffineTransform(shift, scale, slope=_SLOPE), 1)


def _lu(lu: Tensor) -> Transform:
    return LULinearTransform(lu)


class _HalvesCoupling(CouplingTransform):
    """zuko's coupling with x_a = one contiguous half of the features and x_b = the other.

    zuko splits by a boolean mask through index gathers and an index_put merge; with contiguous halves the split
    is two views and the merge one `cat`: a Glow training step at 768 dims, batch 1,024, fp32 went from 330 to
    250 ms on the 2-core CPU (the gathers, scatters and their zero-filled gradients were ~20 % of it). Which
    features form x_a is a free choice for Glow (the invertible linear map before each coupling mixes all features;
    Glow itself splits channels into halves) and, for NICE, a fixed permutation of its alternating partition.
    """

    def __init__(self, meta, k: int, a_first: bool):
        Transform.__init__(self)
        self.meta, self.k, self.a_first = meta, k, a_first

    def split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # `split`, not two slices: its backward concatenates the two gradients, where two slices' backward would
        # each zero-fill a full-size gradient
        head, tail = x.split([self.k, x.shape[-1] - self.k], -1)
        return (head, tail) if self.a_first else (tail, head)

    def merge(self, x_a: Tensor, x_b: Tensor, shape) -> Tensor:
        return torch.cat([x_a, x_b] if self.a_first else [x_b, x_a], -1)


class HalvesCouplingTransform(GeneralCouplingTransform):
    """`GeneralCouplingTransform` that splits the features into contiguous halves (fast path, `_HalvesCoupling`).

    Its mask is a prefix (x_a = the first features) or a suffix of the features, applied with `_HalvesCoupling`. A mask
    loaded from an older checkpoint that is neither (the alternating even/odd masks heads were first trained with) still
    works, through zuko's gather/scatter coupling.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._read_mask()
        # a loaded checkpoint may bring another mask: read it again then, not at every forward (a device sync)
        self.register_load_state_dict_post_hook(_reread_mask)  # a function, not a lambda: the module pickles

    def _read_mask(self) -> None:
        mask = self.mask.cpu()
        k = int(mask.sum())
        self._halves = (
            (k, True) if bool(mask[:k].all()) else (mask.numel() - k, False) if bool(mask[-k:].all()) else None
        )

    def forward(self, c: Tensor | None = None) -> Transform:
        """Return the coupling transform (context `c`, None for the heads' unconditional flows)."""
        if self._halves is None:
            return CouplingTransform(partial(self.meta, c), self.mask)
        return _HalvesCoupling(partial(self.meta, c), *self._halves)


def _reread_mask(module: HalvesCouplingTransform, incompatible_keys) -> None:
    module._read_mask()


def _halves_mask(dim: int, i: int) -> Tensor:
    """Coupling i conditions on the first half of the features when i is even, on the second half when odd."""
    first = torch.arange(dim) < dim // 2
    return first if i % 2 == 0 else ~first


class _OnFirst(Transform):
    """`inner` applied to x[..., :k], the other features passed through (Glow's factored-out half)."""

    domain = constraints.real_vector
    codomain = constraints.real_vector
    bijective = True

    def __init__(self, inner: Transform, k: int):
        super().__init__()
        self.inner, self.k = inner, k

    def _halves(self, x: Tensor) -> list[Tensor]:
        return list(x.split([self.k, x.shape[-1] - self.k], -1))  # see _HalvesCoupling.split

    def _call(self, x: Tensor) -> Tensor:
        a, b = self._halves(x)
        return torch.cat([self.inner(a), b], -1)

    def _inverse(self, y: Tensor) -> Tensor:
        a, b = self._halves(y)
        return torch.cat([self.inner.inv(a), b], -1)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.inner.log_abs_det_jacobian(self._halves(x)[0], self._halves(y)[0])

    def call_and_ladj(self, x: Tensor) -> tuple[Tensor, Tensor]:
        a, b = self._halves(x)
        y, ladj = self.inner.call_and_ladj(a)
        return torch.cat([y, b], -1), ladj


class OnFirst(LazyTransform):
    """Lazy form of `_OnFirst`: the composed `transforms` act on the first `k` features, the rest pass through.

    One Glow level after the first, acting on the half of the features not yet factored out.
    """

    def __init__(self, transforms: list[LazyTransform], k: int):
        super().__init__()
        self.inner = LazyComposedTransform(*transforms)
        self.k = k

    def forward(self, c: Tensor | None = None) -> Transform:
        """Return the transform applying the inner transforms to x[..., :k] (context `c`, None here)."""
        return _OnFirst(self.inner(c), self.k)


def _actnorm(dim: int) -> UnconditionalTransform:
    return UnconditionalTransform(_elementwise_affine, torch.zeros(dim), torch.zeros(dim))


class FlowHead(IsotropyHead):
    """A zuko transform x -> z with its log-det; the base distribution is the standard Gaussian of `nll`."""

    capabilities = HeadCapabilities(fit="gradient")  # maximum likelihood, Eq. 5

    def __init__(self, dim: int, transforms: list[LazyTransform]):
        super().__init__(dim)
        self.flow = LazyComposedTransform(*transforms)
        self.register_buffer("initialized", torch.tensor(False))

    @torch.no_grad()
    def init_from(self, x: Tensor) -> None:
        """Initialise the first element-wise affine (ActNorm / input scaling) from data, once.

        It is set to give zero mean and unit variance per feature on this batch. Done once; the flag is saved with the
        head, so a resumed run does not redo it.
        """
        if bool(self.initialized):
            return
        first = self.flow.transforms[0]
        x = x.reshape(-1, self.dim).float()
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        c = -math.log(_SLOPE)
        log_s = (-std.log()).clamp(-0.9 * c, 0.9 * c)
        raw = log_s / (1 - log_s.abs() / c)  # inverse of zuko's soft clip a / (1 + |a| / c)
        shift_param, scale_param = first._0, first._1
        scale_param.copy_(raw)
        shift_param.copy_(-mean * log_s.exp())
        self.initialized.fill_(True)

    def forward_and_logdet(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return (z = f(x) [..., D], log |det Df(x)| [...]): the two terms of Eq. 5's likelihood."""
        return self.flow().call_and_ladj(x)

    def inverse(self, z: Tensor) -> Tensor:
        """Return x = f^-1(z) [..., D], through the flow's exact inverse."""
        return self.flow().inv(z)


@dataclass
class NICEConfig(HeadConfig):
    """`head: nice`: the NICE flow's coupling layers and their MLPs (module docstring; the paper's 5 x 1000)."""

    name: str = "nice"
    couplings: int = 4
    hidden_layers: int = 5
    hidden_units: int = 1000

    def __post_init__(self):
        super().__post_init__()
        check_ranges("head", self, couplings=COUNT, hidden_layers=NON_NEGATIVE, hidden_units=COUNT)


def build_nice(dim: int, couplings: int = 4, hidden_layers: int = 5, hidden_units: int = 1000) -> FlowHead:
    """Build a NICE flow head for `dim`-wide vectors (module docstring).

    Input scaling, `couplings` additive couplings on alternating halves (each an MLP of `hidden_layers` x
    `hidden_units` ReLU units), then NICE's diagonal scaling layer.
    """
    transforms: list[LazyTransform] = [_actnorm(dim)]  # input scaling (data-initialised), see init_from
    for i in range(couplings):
        transforms.append(
            HalvesCouplingTransform(
                dim,
                mask=_halves_mask(dim, i),
                univariate=AdditiveTransform,
                shapes=[()],
                hidden_features=[hidden_units] * hidden_layers,
            )
        )
    transforms.append(_actnorm(dim))  # NICE's diagonal scaling layer
    return FlowHead(dim, transforms)


@dataclass
class GlowConfig(HeadConfig):
    """`head: glow`: Glow's levels, steps per level and coupling networks ("two levels and depth of three")."""

    name: str = "glow"
    levels: int = 2
    depth: int = 3
    hidden_units: int = 32  # narrow coupling networks, as in BERT-flow's released Glow configurations (width 32)
    hidden_layers: int = 2

    def __post_init__(self):
        super().__post_init__()
        check_ranges("head", self, levels=COUNT, depth=COUNT, hidden_units=COUNT, hidden_layers=NON_NEGATIVE)


def _glow_step(dim: int, i: int, hidden: list[int]) -> list[LazyTransform]:
    return [
        _actnorm(dim),
        UnconditionalTransform(_lu, torch.eye(dim)),  # starts at the identity: L = tril(I), U = I
        HalvesCouplingTransform(
            dim, mask=_halves_mask(dim, i), univariate=MonotonicAffineTransform, shapes=[(), ()], hidden_features=hidden
        ),
    ]


def build_glow(dim: int, levels: int = 2, depth: int = 3, hidden_units: int = 32, hidden_layers: int = 2) -> FlowHead:
    """Build a Glow flow head for `dim`-wide vectors (module docstring).

    Input scaling, then `levels` multi-scale levels of `depth` steps (ActNorm, LU linear map, affine coupling with
    `hidden_layers` x `hidden_units` networks), each level after the first acting on half of the previous one's
    features.
    """
    hidden = [hidden_units] * hidden_layers
    transforms: list[LazyTransform] = [_actnorm(dim)]  # data-initialised input scaling
    # level l acts on the first k_l features: k_0 = dim, then half of the previous level's (the rest is factored out)
    k = dim
    for _level in range(levels):
        if k < 2:
            break
        steps = [t for i in range(depth) for t in _glow_step(k, i, hidden)]
        transforms.append(OnFirst(steps, k) if k < dim else LazyComposedTransform(*steps))
        k //= 2
    return FlowHead(dim, transforms)


@HEADS.register("nice", schema=NICEConfig, capabilities=FlowHead.capabilities)
def _nice(cfg: NICEConfig, dim: int) -> FlowHead:
    return build_nice(dim, cfg.couplings, cfg.hidden_layers, cfg.hidden_units)


@HEADS.register("glow", schema=GlowConfig, capabilities=FlowHead.capabilities)
def _glow(cfg: GlowConfig, dim: int) -> FlowHead:
    return build_glow(dim, cfg.levels, cfg.depth, cfg.hidden_units, cfg.hidden_layers)
