"""`load_ranker`: one loader for every trained (or untrained) ranker, whatever holds it.

    from models.loading import load_ranker

    ranker, tokenizer, head = load_ranker("outputs/run/checkpoints/best-60.ckpt")
    ranker, tokenizer, head = load_ranker("outputs/run-glow/checkpoints/best-3.ckpt")  # a head checkpoint
    ranker, tokenizer, head = load_ranker("exported/colbert-glow")  # a folder of `train.py stage=export`
    ranker, tokenizer, head = load_ranker("sentence-transformers/all-MiniLM-L6-v2", model={"name": "colbert"})
    ranker, tokenizer, head = load_ranker(model={"name": "repbert", "backbone": "minilm"})  # untrained

What it reads, by what `path` is:

- a checkpoint file of `train.py` (fine-tuning): the ranker its `hyper_parameters.model` describes, with the
  `ranker.*` weights of its `state_dict`;
- a head checkpoint of `train.py stage=head` (it records `base_ckpt`): the base ranker, loaded as above, with the
  head attached in the slot of its granularity;
- a folder holding `isorank.json` (pipeline/export.py writes it): the exported backbone, ranker and head weights;
- anything else, with `model=`: a Hugging Face id or folder, the backbone of an untrained `model` ranker; no `path`:
  the untrained `model` as configured.

The result unpacks as `(ranker, tokenizer, head)`: the `nn.Module` in eval mode (head attached, when there is one),
the `PairTokenizer` with its query and passage lengths, and the head or None. Its other fields say what was loaded
(`config`, `hparams`, `source`, `rerank_depth`), for a LightningModule to wrap it or an analysis to label it.
Nothing here reads a checkpoint's internals for its callers: analyses and retrieval ask this module.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file

from core.checkpoints import read_checkpoint, read_header, register_check
from core.errors import InputError
from datamodules.tokenization import PairTokenizer
from models.heads import HEAD_SLOTS, HEADS, IsotropyHead, attach_head, build_head, head_config, head_input_dim
from models.rankers import RANKERS, build_ranker, ranker_config
from models.rankers.base import RUNTIME_KEYS, Ranker, RankerConfig

__all__ = [
    "EXPORT_FORMAT",
    "LoadedRanker",
    "check_group",
    "check_hparams",
    "load_configured",
    "load_ranker",
    "load_ranker_weights",
    "pair_tokenizer_for",
    "read_export_info",
    "recorded_model",
]

EXPORT_FORMAT = "isorank-export-1"
RANKER_PREFIX = "ranker."  # a RankingModule holds its ranker as `self.ranker`: its state_dict keys start so
ENCODER_PREFIX = "ranker.encoder."  # the backbone, which an export keeps in its own save_pretrained files


def pair_tokenizer_for(ranker: Ranker) -> PairTokenizer:
    """Return the tokenizer for `ranker`'s texts: its query / passage maximum lengths and its layout (bi or cross)."""
    c = ranker.cfg
    return PairTokenizer(ranker.tokenizer, ranker.kind, c.query_max_len, c.doc_max_len)


@dataclass
class LoadedRanker:
    """A loaded ranker: unpacks as `(ranker, tokenizer, head)`; the other fields say what was loaded.

    Attributes
    ----------
    ranker : Ranker
        The `nn.Module`, in eval mode, with `head` attached when there is one.
    tokenizer : PairTokenizer
        Tokenises its queries, passages and pairs at its configured lengths.
    head : IsotropyHead or None
        The isotropy head of a head checkpoint or of an export with one.
    hparams : dict
        The recorded configs as plain dicts: `model`, `optim` (when recorded), `head` (with a head).
    source : str
        "checkpoint", "head checkpoint", "export", "hub" (an untrained ranker on a Hugging Face backbone) or
        "config" (untrained, as configured).
    path : str or None
        What was read (for a head checkpoint, the head's file; `base_path` is its ranker's).
    base_path : str or None
        The ranker checkpoint a head checkpoint belongs to.
    rerank_depth : int or None
        The re-ranking depth the checkpoint's validation chose (`eval.rerank_depths`), when it chose one.
    """

    ranker: Ranker
    tokenizer: PairTokenizer
    head: IsotropyHead | None = None
    hparams: dict = field(default_factory=dict)
    source: str = "config"
    path: str | None = None
    base_path: str | None = None
    rerank_depth: int | None = None

    def __iter__(self):
        return iter((self.ranker, self.tokenizer, self.head))

    @property
    def config(self):
        """The ranker's dataclass config (`ranker.cfg`)."""
        return self.ranker.cfg

    @property
    def name(self) -> str:
        """The ranker's registered name (`model.name`)."""
        return self.ranker.cfg.name

    def to(self, device) -> LoadedRanker:
        """Move the ranker (and its head) to `device`; return self."""
        self.ranker.to(device)
        return self


# ---- checking recorded hyper-parameters -------------------------------------------------------------------------
def check_group(hp: dict, group: str, schema: type | None, path: str, key: str) -> None:
    """Check the recorded hyper-parameter group `hp[group]` against this version's `schema`; fill in its defaults.

    A key this version does not know stops with one line naming the key and the checkpoint (it would change what the
    checkpoint means); a key it lacks takes this version's default, with a warning.
    """
    values = hp.get(group)
    if values is None:
        return
    if isinstance(values, DictConfig):
        values = OmegaConf.to_container(values)
    if not isinstance(values, Mapping):
        raise InputError(
            key,
            f"checkpoint '{path}': hyper-parameter '{group}' is {type(values).__name__}; expected a mapping of keys",
        )
    if schema is None:
        return
    known = [f.name for f in fields(schema)]
    unknown = [k for k in values if k not in known]
    if unknown:
        raise InputError(
            key,
            f"checkpoint '{path}' has hyper-parameter '{group}.{unknown[0]}', which this version does not know "
            f"(a checkpoint of another version?); {group} '{schema.__name__}' accepts {sorted(known)}",
        )
    missing = [k for k in known if k not in values]
    if missing:
        defaults = OmegaConf.to_container(OmegaConf.structured(schema))
        warnings.warn(
            f"checkpoint '{path}' has no hyper-parameter {', '.join(f'{group}.{k}' for k in missing)} "
            f"(a checkpoint of another version?); taking the default{'s' if len(missing) > 1 else ''} "
            f"{', '.join(f'{k}={defaults[k]!r}' for k in missing)}",
            stacklevel=3,
        )
        hp[group] = {**{k: defaults[k] for k in missing}, **values}


def _registered_schema(group: str, values, path: str, key: str) -> type | None:
    registry, kind = (RANKERS, "ranker") if group == "model" else (HEADS, "head")
    name = values.get("name") if isinstance(values, Mapping) else None
    if name not in registry:
        raise InputError(
            key,
            f"checkpoint '{path}' holds {kind} '{name}', which this version does not know; "
            f"expected one of {registry.names()}",
        )
    return registry.get(name).schema


def check_hparams(ckpt: dict, path: str, key: str) -> None:
    """Check a checkpoint's `model` and `head` hyper-parameters against this version's schemas (`check_group`).

    Registered with `core.checkpoints.register_check`, so every checkpoint read runs it; the training loop's `optim`
    group is checked by lightning_modules/loading.py, which knows its schema.
    """
    hp = ckpt["hyper_parameters"]
    for group in ("model", "head"):
        values = hp.get(group)
        if isinstance(values, DictConfig):
            values = OmegaConf.to_container(values)
        if isinstance(values, Mapping):
            check_group(hp, group, _registered_schema(group, values, path, key), path, key)
        elif values is not None:
            check_group(hp, group, None, path, key)


register_check(check_hparams)


# ---- the kinds of source ------------------------------------------------------------------------------------
def load_ranker_weights(
    ranker: Ranker, state: Mapping, mismatch: str, key: str, allow_missing: Callable[[str], bool] = lambda k: False
) -> int:
    """Load the `ranker.*` entries of a LightningModule's state into `ranker`; return how many tensors were loaded.

    A missing (unless `allow_missing`), unexpected or wrong-shaped tensor is an InputError at `key`: `mismatch` (what
    does not match what), then the first tensors concerned.
    """
    own = {k[len(RANKER_PREFIX) :]: v for k, v in state.items() if k.startswith(RANKER_PREFIX)}
    try:
        missing, unexpected = ranker.load_state_dict(own, strict=False)
    except RuntimeError as e:  # a shape mismatch: another backbone or compress_dim
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e).splitlines()[0])
        raise InputError(key, f"{mismatch} ({first})") from e
    missing = [RANKER_PREFIX + k for k in missing if not allow_missing(RANKER_PREFIX + k)]
    unexpected = [RANKER_PREFIX + k for k in unexpected]
    if missing or unexpected:
        raise InputError(key, f"{mismatch} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return len(own)


def _load_head(ranker: Ranker, head_cfg: dict, state: Mapping, what: str, key: str) -> IsotropyHead:
    """Build the head `head_cfg` describes for `ranker`, load its weights from `state` and attach it."""
    cfg = head_config(head_cfg)
    head = build_head(cfg, head_input_dim(ranker))
    if head is None:
        raise InputError(key, f"{what} records head '{cfg.name}', which is no isotropy head")
    prefix = f"{RANKER_PREFIX}{HEAD_SLOTS[cfg.granularity]}."
    own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    missing, unexpected = head.load_state_dict(own, strict=False)
    if missing or unexpected:
        raise InputError(
            key, f"{what} does not match head '{cfg.name}' (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    attach_head(ranker, head, cfg.granularity)
    return head


def _check_expected(recorded: str, expect: str | None, what: str, key: str) -> None:
    """Refuse a source holding another ranker than the one asked for, before any weights are built."""
    if expect is not None and recorded != expect:
        raise InputError(key, f"{what} holds ranker '{recorded}' but model.name is '{expect}'")


def _from_state(ckpt: dict, path: str, key: str, runtime: Mapping | None = None) -> LoadedRanker:
    """Build the ranker a read (fine-tuning) checkpoint describes (`runtime` keys over its own) and load its weights."""
    hp = ckpt["hyper_parameters"]
    model = {**hp["model"], **(runtime or {})}
    ranker = build_ranker(ranker_config(model))
    load_ranker_weights(ranker, ckpt["state_dict"], f"'{path}' does not match ranker '{ranker.cfg.name}'", key)
    hparams = {"model": model, "optim": dict(hp.get("optim") or {})}
    rerank_depth = ckpt.get("rerank_depth")  # the depth its validation chose (eval.rerank_depths)
    return LoadedRanker(ranker, pair_tokenizer_for(ranker), None, hparams, "checkpoint", str(path), None, rerank_depth)


def _from_checkpoint(
    path: str, key: str, expect: str | None = None, base: str | None = None, runtime: Mapping | None = None
) -> LoadedRanker:
    ckpt = read_checkpoint(path, key)
    hp = ckpt["hyper_parameters"]
    _check_expected(hp["model"]["name"], expect, f"checkpoint '{path}'", key)
    if "base_ckpt" not in ckpt:
        return _from_state(ckpt, path, key, runtime)
    # a head checkpoint: the head's weights only, on its base ranker
    base_path, base_key = (str(base), "ckpt") if base else (str(ckpt["base_ckpt"]), key)
    base_ckpt = read_checkpoint(base_path, base_key)
    if base_ckpt["hyper_parameters"]["model"] != hp["model"]:  # before the base's weights are built
        raise InputError(
            base_key,
            f"'{base_path}' holds ranker {base_ckpt['hyper_parameters']['model']['name']} with other settings "
            f"than the head's base ({ckpt['base_ckpt']})",
        )
    loaded = _from_state(base_ckpt, base_path, base_key, runtime)
    del base_ckpt
    loaded.head = _load_head(loaded.ranker, hp["head"], ckpt["state_dict"], f"'{path}'", key)
    loaded.source, loaded.path, loaded.base_path = "head checkpoint", str(path), base_path
    loaded.hparams = {**loaded.hparams, "head": dict(hp["head"])}
    return loaded


def read_export_info(folder: str | os.PathLike, key: str = "ckpt") -> dict:
    """Return an exported folder's isorank.json; a folder without one, or of another format, is an InputError."""
    p = Path(folder) / "isorank.json"
    if not p.is_file():
        raise InputError(key, f"'{folder}' is a folder but not an isorank export (no isorank.json)")
    info = json.loads(p.read_text())
    if info.get("format") != EXPORT_FORMAT:
        raise InputError(str(p), f"format {info.get('format')!r}; expected {EXPORT_FORMAT!r}")
    return info


def _from_export(folder: Path, key: str, expect: str | None = None, runtime: Mapping | None = None) -> LoadedRanker:
    info = read_export_info(folder, key)
    _check_expected(info["model"]["name"], expect, f"checkpoint '{folder}'", key)
    model = {**info["model"], **(runtime or {})}
    if info["encoder"]:
        model["backbone"] = str(folder)  # the fine-tuned backbone, saved by save_pretrained
    ranker = build_ranker(ranker_config(model))
    state = load_file(str(folder / "ranker.safetensors"))
    mismatch = f"'{folder}' does not match ranker '{ranker.cfg.name}'"
    load_ranker_weights(ranker, state, mismatch, key, lambda k: k.startswith(ENCODER_PREFIX))
    head = None
    if info.get("head"):
        head_file = folder / "isotropy_head.safetensors"
        if not head_file.is_file():
            raise InputError(key, f"'{folder}' records head '{info['head']['name']}' but has no {head_file.name}")
        head = _load_head(ranker, info["head"], load_file(str(head_file)), f"'{folder}'", key)
    hparams = {"model": model, "optim": dict(info.get("optim") or {})}
    if head is not None:
        hparams["head"] = dict(info["head"])
    return LoadedRanker(ranker, pair_tokenizer_for(ranker), head, hparams, "export", str(folder))


def recorded_model(path: str | os.PathLike, key: str = "ckpt") -> dict:
    """Return the `model` config a checkpoint, head checkpoint or export folder records, without loading a tensor.

    For checks that must stop a job before any weights are built (which ranker, which backbone).
    """
    if Path(path).is_dir():
        return dict(read_export_info(path, key)["model"])
    return dict(read_header(str(path), key)["hyper_parameters"]["model"])


def _untrained(model: Mapping, source: str) -> LoadedRanker:
    model = OmegaConf.to_container(model) if isinstance(model, DictConfig) else dict(model)
    ranker = build_ranker(ranker_config(model))
    return LoadedRanker(ranker, pair_tokenizer_for(ranker), None, {"model": model}, source)


def load_ranker(
    path: str | os.PathLike | None = None,
    *,
    model: Mapping | None = None,
    key: str = "ckpt",
    device: str | torch.device | None = None,
    expect: str | None = None,
    base: str | os.PathLike | None = None,
    runtime: Mapping | None = None,
) -> LoadedRanker:
    """Load a ranker from a checkpoint, a head checkpoint, an export folder or a hub id (module docstring).

    Parameters
    ----------
    path : str, PathLike or None
        What to load; None: the untrained `model`.
    model : Mapping or None
        A `model` config (`{"name": ..., ...}`): the ranker to build when `path` is a Hugging Face id or folder
        (its backbone) or None. Checkpoints and exports record their own and ignore it.
    key : str
        The config key that named `path`, for the one-line errors.
    device : str, torch.device or None
        Where to put the ranker (default: where it was built, the CPU).
    expect : str or None
        The ranker name the caller asks for (the command line's `model.name`): a checkpoint or export holding another
        is an InputError before any weights are built.
    base : str, PathLike or None
        For a head checkpoint: the ranker checkpoint to put the head on (default: the `base_ckpt` it records), which
        must hold the ranker the head was fitted on (named `ckpt` in errors).
    runtime : Mapping or None
        `model` keys of `RUNTIME_KEYS` (how the ranker runs: attention implementation, length buckets, ...) to build
        a checkpoint's or export's ranker with, over the values it records (`runtime_overrides`).

    Returns
    -------
    LoadedRanker
        Unpacks as `(ranker, tokenizer, head)`; the ranker is in eval mode.

    Raises
    ------
    InputError
        A missing, foreign or mismatched file, or a hub id without `model`, in one line naming `key`.
    """
    if path is None:
        if model is None:
            raise InputError(key, "load_ranker needs a path (checkpoint, export folder or hub id) or a model config")
        loaded = _untrained(model, "config")
    elif Path(path).is_file():
        loaded = _from_checkpoint(str(path), key, expect, base, runtime)
    elif Path(path).is_dir() and (model is None or (Path(path) / "isorank.json").is_file()):
        loaded = _from_export(Path(path).resolve(), key, expect, runtime)  # without isorank.json: "not an export"
    elif model is not None:  # a hub id or a Hugging Face folder: the backbone of the untrained `model`
        loaded = _untrained({**model, "backbone": str(path)}, "hub")
        loaded.path = str(path)
    else:
        raise InputError(
            key,
            f"checkpoint '{path}' does not exist (a Hugging Face id loads as a backbone with the ranker's config: "
            "load_ranker(id, model={'name': ...}))",
        )
    loaded.ranker.eval()
    if device is not None:
        loaded.to(device)
    return loaded


def runtime_overrides(model: Mapping) -> dict:
    """Return the `RUNTIME_KEYS` of a run's `model` config set away from their defaults.

    A job that loads a checkpoint builds its ranker with these over the checkpoint's own (an evaluation on a GPU with
    `model.attn_implementation=flash_attention_2` of a ranker trained with sdpa); keys left at their defaults keep
    what the checkpoint records.
    """
    defaults = {f.name: f.default for f in fields(RankerConfig) if f.name in RUNTIME_KEYS}
    return {k: model[k] for k in RUNTIME_KEYS if k in model and model[k] != defaults[k]}


def load_configured(cfg, model_from_cli: bool = False, device: str | torch.device | None = None) -> LoadedRanker:
    """Load the ranker a run config names: `cfg.ckpt` (anything `load_ranker` reads), else `cfg.model` untrained.

    With a `ckpt`, `cfg.model` (and `cfg.head`, when it holds a head) become the configs it records, so that what the
    job writes (config.yaml, tags) describes the loaded ranker. `model_from_cli`: the command line picked the model,
    so `ckpt` must hold that ranker (checked before any weights are built).
    """
    if not cfg.ckpt:
        model = OmegaConf.to_container(cfg.model) if isinstance(cfg.model, DictConfig) else dict(cfg.model)
        return load_ranker(model=model, device=device)
    expect = cfg.model.name if model_from_cli else None
    loaded = load_ranker(cfg.ckpt, key="ckpt", expect=expect, device=device, runtime=runtime_overrides(cfg.model))
    cfg.model = loaded.hparams["model"]
    if "head" in loaded.hparams:
        cfg.head = loaded.hparams["head"]
    return loaded
