"""Identities that change only the gradient passing back through them.

One autograd function for all of them: DGRe's gradient reversal (the MINE min-max, rankers/dgre/mi.py) and the
contiguous gradient that a cross-rank gather needs (lightning_modules/module.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class _MapGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_map):
        ctx.grad_map = grad_map
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.grad_map(grad), None


def map_gradient(x: Tensor, grad_map: Callable[[Tensor], Tensor]) -> Tensor:
    """Return `x` unchanged forward; backward, the gradient reaching it becomes `grad_map(gradient)`.

    >>> x = torch.ones(2, requires_grad=True)
    >>> (3 * map_gradient(x, torch.neg)).sum().backward()
    >>> x.grad.tolist()
    [-3.0, -3.0]
    """
    return _MapGradient.apply(x, grad_map)


def reverse_gradient(x: Tensor) -> Tensor:
    """Identity forward, negated gradient backward."""
    return map_gradient(x, torch.neg)


def contiguous_gradient(x: Tensor) -> Tensor:
    """Identity forward; backward, the gradient laid out contiguously.

    torch.distributed.nn's all_gather sends its output's gradient to the other ranks as it gets it; a strided one (what
    the in-batch scores' einsum hands back) reaches gloo's all-to-all as wrong values: two ranks' weights matched one
    process's only when an indexing copy stood between them.
    """
    return map_gradient(x, Tensor.contiguous)


__all__ = ["contiguous_gradient", "map_gradient", "reverse_gradient"]
