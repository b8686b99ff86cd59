"""bf16 on the CPU: whether this CPU has bf16 kernels, and the one warning every bf16 setting gives when it has not.

Under `torch.autocast("cpu", torch.bfloat16)` PyTorch runs bf16 matrix products through oneDNN where the CPU has
AVX-512 (with or without its BF16 extension) or AMX. On a CPU with AVX2 only, they fall back to a reference loop
(`at::native::cpublas`, `bf16_dot_with_fp32_arith`), many times slower than fp32: `python -m bench.bench_speed
precision=fp32,bf16` measures the ratio on the machine at hand (results/2026-11-28-cpu-bf16-emulated.md). The settings
stay the user's choice (a precision changes the numbers, so it is never switched silently); each says once why the run
is slow.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from core.errors import InputError

__all__ = [
    "autocast_cache_keeps_gradients",
    "cast_once",
    "check_fp16_device",
    "cpu_bf16_native",
    "full_precision",
    "set_matmul_precision",
    "warn_emulated_bf16",
]

_warned: set[tuple[str, str]] = set()  # (key, value) said in this process: e.g. the head stage's cache and trainer


@functools.cache
def cpu_bf16_native() -> bool:
    """Return whether PyTorch has oneDNN bf16 kernels for this CPU (its own test, `_is_mkldnn_bf16_supported`)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: no bf16 kernels either
        return False


def warn_emulated_bf16(key: str, value: object, device_type: str, fast: str) -> bool:
    """Warn when the setting `key`=`value` runs bf16 on a CPU without bf16 kernels; return whether it runs so.

    `device_type`: where the bf16 work runs ("cpu", "cuda", ...); `fast`: the value of `key` that runs fp32.
    Said once per process and setting, however many places of one run (or windows of an encoding) ask.
    """
    if device_type != "cpu" or cpu_bf16_native():
        return False
    if (key, str(value)) in _warned:
        return True
    _warned.add((key, str(value)))
    warnings.warn(
        f"{key}={value} on this CPU ({torch.backends.cpu.get_cpu_capability()}, no bf16 kernels) emulates bf16 "
        f"matrix products, several times slower than fp32 (python -m bench.bench_speed); {key}={fast} is faster here",
        UserWarning,
        stacklevel=2,
    )
    return True


def set_matmul_precision(value: str, device_type: str) -> str | None:
    """Apply `trainer.float32_matmul_precision` for a run on `device_type`; return what was set (None: nothing).

    `auto`: "high" on CUDA (TF32 tensor cores; Lightning's hint asks for it), nothing elsewhere, because the setting is
    global and on the CPU it reaches oneDNN too ("high" allows TF32 there, "medium" bf16: other numbers where the CPU
    has such kernels). Any other value is set as given.
    """
    if value == "auto":
        if device_type != "cuda":
            return None
        value = "high"
    torch.set_float32_matmul_precision(value)
    return value


def check_fp16_device(precision: str, accelerator: str, machine: bool = True) -> None:
    """Refuse `trainer.precision` fp16 (`16-mixed`, `16-true`) for a run on the CPU, before anything loads.

    Lightning swaps it for bf16-mixed on the CPU with a warning of its own, and the run's numbers are bf16 ones while
    its config.yaml says 16-mixed. `accelerator=cpu` is refused from the config alone (`--dry-run` too);
    `accelerator=auto` when `machine` (the job itself, not a dry run that may be composed on a login node) and this
    machine has no CUDA device.
    """
    if not str(precision).startswith("16"):
        return
    if accelerator == "cpu" or (machine and accelerator == "auto" and not torch.cuda.is_available()):
        raise InputError(
            "config key 'trainer.precision'",
            f"is {precision}, but fp16 needs a CUDA device and this run is on the CPU (Lightning would run bf16-mixed "
            "instead); use bf16-mixed or 32-true on the CPU",
        )


def full_precision(device_type: str) -> contextlib.AbstractContextManager:
    """Return a context that turns the caller's autocast off on `device_type` (a device without autocast has none).

    >>> with torch.autocast("cpu", dtype=torch.bfloat16), full_precision("cpu"):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.float32
    """
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


@functools.cache
def autocast_cache_keeps_gradients() -> bool:
    """Return whether this PyTorch's autocast cache is safe for training: a cast made under `no_grad` is not reused.

    Older releases cached a weight's cast made inside `torch.no_grad()` and handed the grad-less copy to a later
    forward, whose loss then had no gradient for that weight (Lightning issue #20644, why Lightning 2.6 turns the
    cache off). Tried once, on the CPU, with a 2x2 weight of ones: no random draw, so that the first training step of
    a process (a resumed one's included) draws the same dropout masks as any other.
    """
    weight = torch.nn.Parameter(torch.ones(2, 2))
    x = torch.ones(1, 2)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True):
            with torch.no_grad():
                torch.nn.functional.linear(x, weight)
            y = torch.nn.functional.linear(x, weight)
        y.float().sum().backward()
    except RuntimeError:  # no CPU autocast for bf16 here: no evidence either way
        return False
    return weight.grad is not None


def cast_once(device_type: str) -> contextlib.AbstractContextManager:
    """Return a context in which autocast casts each weight once, however many forward passes use it.

    Lightning 2.6's mixed precision runs `training_step` under `torch.autocast(..., cache_enabled=False)`, so every
    forward pass casts every weight again: a ColBERT step encodes queries and passages in separate passes (and more with
    length groups), so a MiniLM step of 32 called 161 more copy operators than the bare loop under bf16 autocast, 17
    more in fp32 (`python -m bench.bench_ops precision=bf16`). Inside this context the caller's autocast keeps its
    dtype and caches the casts of weights (leaves that require grad) until the outermost autocast context exits (the
    end of Lightning's step). A no-op without an enabled autocast on `device_type`, or where the cache would keep a
    `no_grad` cast (`autocast_cache_keeps_gradients`).

    >>> with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), cast_once("cpu"):
    ...     torch.is_autocast_cache_enabled(), torch.get_autocast_dtype("cpu")
    (True, torch.bfloat16)
    """
    if not (
        torch.amp.is_autocast_available(device_type)
        and torch.is_autocast_enabled(device_type)
        and autocast_cache_keeps_gradients()
    ):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=True)
