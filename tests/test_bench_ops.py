"""bench/bench_ops.py: what it counts as a GPU step's kernels."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from bench.bench_ops import NO_KERNEL, counts


def test_counts_leave_views_and_allocations_out_of_the_work():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a = torch.zeros(4)  # an allocation and a fill
        b = a.view(2, 2)  # a view: no kernel
        c = b * b  # tensors only: a Python number would add a cast of its own
        c.add_(b)
        c.t().contiguous()  # a view, then a copy
    events, leaves, work, by_op = counts(prof)
    assert by_op["aten::mul"] == 1 and by_op["aten::add_"] == 1 and by_op["aten::copy_"] == 1
    assert not set(by_op) & NO_KERNEL and {"aten::zero_", "aten::fill_"} & set(by_op)
    assert work == sum(by_op.values()) == 4
    # the view, t and the allocations are leaves outside the work; zeros, contiguous and clone hold others
    assert leaves > work and events > leaves
