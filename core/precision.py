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

__all__ = ["check_fp16_device", "cpu_bf16_native", "full_precision", "set_matmul_precision", "warn_emulated_bf16"]

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
