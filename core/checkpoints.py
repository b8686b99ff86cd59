"""Reading a checkpoint of this pipeline.

A missing, truncated, foreign, non-finite or other-version file is one clear line.

- `read_checkpoint`: the whole checkpoint, then every check registered with `register_check` (the layers above add
  theirs: lightning_modules/loading.py checks the hyper-parameters against this version's schemas), then a
  finiteness scan of its floating-point parameters.
- `read_header`: `--dry-run`'s look at a checkpoint without loading a tensor: the zip archive torch writes, its
  `data.pkl` unpickled with every class stubbed (no storage is read), the top-level keys and the hyper-parameters.
- `check_finite`: before a checkpoint is written, so that none is ever written with non-finite parameters.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from core.errors import InputError, TrainingStopped

# (ckpt dict, path, config key) -> None or InputError; registered by the layers that know the schemas
_CHECKS: list[Callable[[dict, str, str], None]] = []


def register_check(check: Callable[[dict, str, str], None]) -> None:
    """Add `check` to the checks `read_checkpoint` and `read_header` run on every checkpoint (once, however often).

    `check(ckpt, path, key)` raises InputError for a checkpoint it rejects; the layers that know the schemas register
    theirs (lightning_modules/loading.py checks the hyper-parameters against this version's schemas).
    """
    if check not in _CHECKS:
        _CHECKS.append(check)


def run_checks(ckpt: dict, path: str, key: str) -> None:
    """Run every registered check on `ckpt`, read from `path`; a rejected checkpoint raises InputError naming `key`."""
    for check in _CHECKS:
        check(ckpt, path, key)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _is_ours(ckpt) -> bool:
    return (
        isinstance(ckpt, Mapping)
        and "state_dict" in ckpt
        and isinstance(ckpt.get("hyper_parameters"), Mapping)
        and "model" in ckpt["hyper_parameters"]
    )


def _not_a_file(p: Path, path: str, key: str) -> InputError:
    """Return the error for a checkpoint path that is not a file.

    A folder is named as one: "does not exist" of a folder that exists sends the user looking for another fault.
    """
    if p.is_dir():
        # ckpt= also takes an export folder; the callers that accept one look for its isorank.json before this
        if (p / "isorank.json").is_file():
            return InputError(
                key,
                f"'{path}' is an export folder (train.py stage=export), which this job does not read; give the "
                ".ckpt file it was exported from",
            )
        export = " nor an export folder from train.py stage=export (it has no isorank.json)" if key == "ckpt" else ""
        return InputError(key, f"'{path}' is a folder, not a checkpoint file{export}; expected a .ckpt file")
    return InputError(key, f"checkpoint '{path}' does not exist")


def read_checkpoint(path: str, key: str) -> dict:
    """Return the checkpoint dict at `path` (named by config key `key` in errors), checked.

    It must hold a ranker's hyper-parameters that this version knows (the registered checks) and finite parameters;
    otherwise InputError.
    """
    p = Path(path)
    if not p.is_file():
        raise _not_a_file(p, path, key)
    try:
        # Our checkpoints carry RNG states (numpy arrays), which the weights-only unpickler refuses.
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:
        raise InputError(
            key,
            f"cannot read checkpoint '{path}' ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "it is truncated or not a torch file",
        ) from e
    if not _is_ours(ckpt):
        raise InputError(key, f"'{path}' is not a checkpoint of this pipeline (no ranker hyper-parameters)")
    run_checks(ckpt, str(path), key)
    bad = nonfinite_tensors(ckpt["state_dict"])
    if bad:
        raise InputError(
            key,
            f"checkpoint '{path}' holds non-finite parameters ({describe_nonfinite(bad)}); it cannot be used: "
            "retrain it (or take an earlier checkpoint)",
        )
    return ckpt


def nonfinite_tensors(state: Mapping) -> dict[str, int]:
    """{name: count of NaN/inf values} over the floating-point tensors of a state dict."""
    bad = {}
    for name, t in state.items():
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            n = int((~torch.isfinite(t)).sum())
            if n:
                bad[name] = n
    return bad


def describe_nonfinite(bad: dict[str, int]) -> str:
    """Describe `nonfinite_tensors`' result in a message: the first three tensors and their counts, how many more."""
    first = ", ".join(f"{k}: {v} value{'s' if v > 1 else ''}" for k, v in list(bad.items())[:3])
    return first + (f" and {len(bad) - 3} more tensors" if len(bad) > 3 else "")


def check_finite(state: Mapping, path, what: str) -> None:
    """Check, before the checkpoint `path` is written, that its parameters `state` are finite.

    Otherwise TrainingStopped (exit 3), naming `what`, and nothing is written (a checkpoint that looks complete but
    holds NaN would only fail later, at evaluation).
    """
    bad = nonfinite_tensors(state)
    if bad:
        raise TrainingStopped(
            f"{what} has non-finite parameters ({describe_nonfinite(bad)}); '{path}' was not written "
            "(earlier files are unchanged)"
        )


# ---- --dry-run: the header only ----------------------------------------------------------------------------------
class _Stub(dict):
    """Stand-in for every class in a checkpoint's pickle.

    Tensors, storages, numpy arrays become empty stubs; dict subclasses (Lightning's AttributeDict) keep their items,
    so the top-level keys and hyper-parameters are read.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.update(state)

    def append(self, _):
        pass

    def extend(self, _):
        pass


_PLAIN = {
    ("builtins", n)
    for n in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bool", "complex", "slice")
} | {("collections", "OrderedDict")}


class _HeaderUnpickler(pickle.Unpickler):
    def __init__(self, file, storages: list):
        super().__init__(file)
        self.storages = storages

    def find_class(self, module, name):
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        return _Stub

    def persistent_load(self, pid):
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            self.storages.append(str(pid[2]))


def _plain(value):
    """Stubs and OrderedDicts as plain dicts, recursively (for the hyper-parameter checks)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value) if isinstance(value, list) else tuple(_plain(v) for v in value)
    return value


def read_header(path: str, key: str, head: bool = False) -> dict:
    """Check the checkpoint at `path` for `--dry-run` without loading a tensor; return its top-level dict.

    The checkpoint must be a readable torch zip file holding `state_dict` and ranker `hyper_parameters` (`head`: also
    `base_ckpt`, a head checkpoint), with every tensor's storage present, and its hyper-parameters must pass the
    registered checks; otherwise InputError naming `key`. No tensor is loaded. Returns the top-level dict, tensors
    stubbed.
    """
    p = Path(path)
    if not p.is_file():
        raise _not_a_file(p, path, key)
    unreadable = f"cannot read checkpoint '{path}'"
    if p.stat().st_size == 0:
        raise InputError(key, f"{unreadable} (it is empty, 0 bytes); it is truncated or not a torch file")
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
            pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None:
                raise InputError(
                    key, f"{unreadable} (a zip file without data.pkl); it is truncated or not a torch file"
                )
            prefix = pkl[: -len("data.pkl")]
            storages: list[str] = []
            with z.open(pkl) as f:
                ckpt = _HeaderUnpickler(f, storages).load()
    except InputError:
        raise
    except Exception as e:  # zipfile.BadZipFile, pickle errors, EOFError, ...
        raise InputError(key, f"{unreadable} ({_first_line(e)}); it is truncated or not a torch file") from e
    missing = [s for s in storages if f"{prefix}data/{s}" not in names]
    if missing:
        raise InputError(
            key,
            f"{unreadable} (the archive lacks {len(missing)} of its {len(storages)} tensor storages); "
            "it is truncated or not a torch file",
        )
    ckpt = _plain(ckpt)
    if not _is_ours(ckpt):
        raise InputError(key, f"'{path}' is not a checkpoint of this pipeline (no ranker hyper-parameters)")
    if head and "base_ckpt" not in ckpt:
        raise InputError(
            key, f"'{path}' is not a head checkpoint (from train.py stage=head); pass ranker checkpoints as ckpt="
        )
    run_checks(ckpt, str(path), key)
    return ckpt


def check_same_ranker(ckpt: dict, cfg, key: str, path: str) -> None:
    """Check that the checkpoint holds the ranker that `cfg.model.name` asks for; otherwise InputError naming `key`."""
    saved = ckpt["hyper_parameters"]["model"]["name"]
    if saved != cfg.model.name:
        raise InputError(key, f"checkpoint '{path}' holds ranker '{saved}' but model.name is '{cfg.model.name}'")
