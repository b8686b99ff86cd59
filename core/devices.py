"""Whether this machine has the devices a config names, asked before anything loads.

A run that names a CUDA or MPS device this machine lacks would otherwise load its data and weights and then stop in
PyTorch's `AssertionError: Torch not compiled with CUDA enabled` (`retrieval.device=cuda`) or Lightning's
`MisconfigurationException: No supported gpu backend found!` (`trainer.accelerator=gpu`), each a traceback. The
checks are the machine's, so a `--dry-run` (composed on a login node for a GPU node) does not make them.

>>> check_device("config key 'retrieval.device'", "cpu")
>>> check_device("config key 'retrieval.device'", None)
"""

from __future__ import annotations

import torch

from core.errors import InputError

__all__ = ["check_accelerator", "check_device"]


def _have(kind: str) -> int:
    """Return how many devices of `kind` ("cuda", "mps") this machine has (0: none usable)."""
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    return 1  # cpu, and accelerators PyTorch does not enumerate (xla): Lightning checks those itself


def _lacks(key: str, kind: str, wanted: int, have: int, advice: str) -> InputError:
    if have == 0:
        what = "no CUDA device (torch.cuda.is_available() is False)" if kind == "cuda" else f"no {kind} device"
        return InputError(key, f"names {kind}, but this machine has {what}; {advice}")
    return InputError(key, f"needs {wanted} {kind} device(s), but this machine has {have}; {advice}")


def check_device(key: str, device: str | None, processes: int = 1) -> None:
    """Refuse `key`=`device` (a torch device string: cpu, cuda, cuda:N, mps; None: the CPU) this machine lacks.

    `processes` > 1 with `device="cuda"`: one process per GPU, GPUs 0..processes-1.
    """
    if device is None:
        return
    kind, _, index = str(device).partition(":")
    have = _have(kind)
    wanted = int(index) + 1 if index else (processes if kind == "cuda" else 1)
    if have == 0:
        raise _lacks(key, kind, wanted, have, "use cpu (or null), or run on a machine that has one")
    if have < wanted:
        shown = f"{device!r}" + (f" with {processes} processes (GPUs 0..{processes - 1})" if not index else "")
        raise InputError(key, f"is {shown}, but this machine has {have} {kind} device(s)")


def check_accelerator(accelerator: str, devices: object) -> None:
    """Refuse `trainer.accelerator` (with `trainer.devices`) naming GPUs this machine lacks.

    `gpu` is Lightning's CUDA-or-MPS; `auto` picks what the machine has, so it is never refused. `devices`: a count,
    -1 / "auto" (all there are), a list of indices or Lightning's "0,1".
    """
    kind = {"gpu": "mps" if _have("cuda") == 0 and _have("mps") else "cuda"}.get(accelerator, accelerator)
    if kind not in ("cuda", "mps"):
        return
    if isinstance(devices, str) and devices.strip() not in ("auto", "-1"):
        devices = [int(d) for d in devices.split(",") if d.strip()]
    if isinstance(devices, (list, tuple)):
        wanted, key = (max(int(d) for d in devices) + 1 if devices else 1), "config key 'trainer.devices'"
    elif isinstance(devices, int) and devices > 0:
        wanted, key = devices, "config key 'trainer.devices'"
    else:
        wanted, key = 1, "config key 'trainer.accelerator'"
    have = _have(kind)
    if have == 0:
        raise _lacks("config key 'trainer.accelerator'", kind, wanted, have, "use trainer.accelerator=cpu or auto")
    if have < wanted:
        raise _lacks(key, kind, wanted, have, f"use at most trainer.devices={have}")
