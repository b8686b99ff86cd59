"""Export a trained ranker (and its isotropy head) as a Hugging Face folder, and evaluate from that folder.

    python train.py stage=export ckpt=outputs/run/checkpoints/best-60.ckpt output_dir=exported/colbert
    python train.py stage=export head_ckpt=outputs/run-glow/checkpoints/best-3.ckpt output_dir=exported/colbert-glow
    python evaluate.py ckpt=exported/colbert data=cranfield output_dir=outputs/exported-on-cranfield

The folder (`output_dir`, new or empty; written atomically: a temporary sibling renamed into place), file: what:

- `config.json`, `model.safetensors`: the fine-tuned backbone, `save_pretrained`:
  `AutoModel.from_pretrained(folder)` loads it;
- tokenizer files: `AutoTokenizer.from_pretrained(folder)`;
- `ranker.safetensors`: the ranker's own weights outside the backbone (ColBERT's compression, BERT_CAT's
  classifier, TK's whole model);
- `isotropy_head.safetensors`: the head (whitening, NICE, Glow), when exported with `head_ckpt=`;
- `isorank.json`: ranker and head configs, format version, the checkpoints it came from;
- `README.md`: model card: what it is, how to load it, the training config and the test metrics of the run.

TK keeps no backbone Transformer (only its word embeddings, which live in `ranker.safetensors`); its folder holds
the tokenizer, and loading rebuilds TK from its recorded `backbone` before replacing every weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file

from core.errors import InputError
from core.io import AtomicDir, current_umask
from lightning_modules.head_module import HEAD_PREFIXES, HeadModule
from lightning_modules.loading import load_module
from lightning_modules.module import RankingModule
from pipeline.head_stage import load_head_module

FORMAT = "isorank-export-1"
ENCODER = "ranker.encoder."


def _split_state(module) -> tuple[dict, dict]:
    """(ranker weights outside the backbone, isotropy head weights) of a RankingModule / HeadModule."""
    rest, head = {}, {}
    for k, v in module.state_dict().items():
        if k.startswith(ENCODER) or k.startswith("runs."):
            continue
        (head if k.startswith(HEAD_PREFIXES) else rest)[k] = v.detach().cpu().contiguous().clone()
    return rest, head


def _run_dir(ckpt: str) -> Path:
    """Return the run folder of a checkpoint (`<run>/checkpoints/x.ckpt`), where config.yaml and metrics.json are."""
    return Path(ckpt).resolve().parent.parent


def model_card(info: dict, run: Path) -> str:
    """Return the exported folder's README.md: what the model is, how to load it, the run's test metrics and config.

    `info`: the folder's isorank.json; `run`: the run folder of the exported checkpoint, whose metrics.json (with the
    before-training or before-head column when recorded) and config.yaml are copied in when they exist.
    """
    model, head = info["model"], info.get("head")
    title = f"{model['name']}" + (f" -> {head['name']}" if head else "")
    lines = [
        "---",
        "library_name: transformers",
        f"tags: [isorank, information-retrieval, {model['name']}]",
        "---",
        "",
        f"# isorank {title}",
        "",
        f"A `{model['name']}` ranker fine-tuned with isorank"
        + (f", with a post-hoc `{head['name']}` isotropy head" if head else "")
        + f", exported from `{info['source']['ckpt']}`"
        + (f" and `{info['source']['head_ckpt']}`" if head else "")
        + ".",
        "",
        "## Load",
        "",
        "```bash",
        "python evaluate.py ckpt=<this folder> data=<collection>",
        "```",
        "",
        "```python",
        "from pipeline.export import load_exported",
        "module = load_exported('<this folder>')  # module.ranker: the nn.Module",
        "```",
        "",
        "The backbone alone: `transformers.AutoModel.from_pretrained('<this folder>')`."
        if info["encoder"]
        else "This ranker keeps no backbone Transformer; its weights are in `ranker.safetensors`.",
        "",
    ]
    metrics = run / "metrics.json"
    if metrics.is_file():
        m = json.loads(metrics.read_text())
        before_key = "before_head" if "before_head" in m else "before_training"
        before = m.get(before_key, {})
        m.pop("best_step", None)  # a step, not a measure
        lines += ["## Test metrics of the run", ""]
        if before:
            lines += [f"| metric | {before_key.replace('_', ' ')} | this model |", "|---|---|---|"]
            lines += [
                f"| {k} | {before[k]:.4f} | {v:.4f} |" if k in before else f"| {k} | - | {v:.4f} |"
                for k, v in m.items()
                if isinstance(v, (int, float))
            ]
        else:
            lines += ["| metric | this model |", "|---|---|"] + [
                f"| {k} | {v:.4f} |" for k, v in m.items() if isinstance(v, (int, float))
            ]
        lines.append("")
    config = run / "config.yaml"
    lines += [
        "## Training config",
        "",
        "```yaml",
        (
            config.read_text() if config.is_file() else yaml.safe_dump({"model": model, "head": head}, sort_keys=False)
        ).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def export(cfg: DictConfig, out: str) -> Path:
    """Export `ckpt=` (or `head_ckpt=`, with its head) into the new or empty folder `out`; return its path.

    `train.py stage=export`: `out` is `output_dir`.
    """
    out_path = Path(out)
    if out_path.exists() and (not out_path.is_dir() or any(out_path.iterdir())):
        raise InputError("output_dir", f"'{out}' exists and is not empty; export into a new folder")
    if cfg.head_ckpt:
        module, base = load_head_module(cfg)
        head_cfg = OmegaConf.to_container(cfg.head) if isinstance(cfg.head, DictConfig) else dict(cfg.head)
    elif cfg.ckpt:
        module, base, head_cfg = load_module(cfg, model_from_cli=False), cfg.ckpt, None
    else:
        raise InputError("ckpt", "export needs ckpt=<ranker checkpoint> (or head_ckpt=<head checkpoint>)")
    ranker = module.ranker
    rest, head = _split_state(module)
    model_cfg = dict(module.hparams["model"])
    info = {
        "format": FORMAT,
        "model": model_cfg,
        "optim": dict(module.hparams.get("optim") or {}),
        "head": head_cfg,
        "encoder": hasattr(ranker, "encoder"),
        "source": {
            "ckpt": str(Path(base).resolve()),
            "head_ckpt": str(Path(cfg.head_ckpt).resolve()) if cfg.head_ckpt else None,
        },
    }
    source = _run_dir(cfg.head_ckpt or base)
    with AtomicDir(out_path, marker="isorank.json", kind="an isorank export") as tmp:
        if info["encoder"]:
            ranker.encoder.save_pretrained(tmp)
        ranker.tokenizer.save_pretrained(tmp)
        save_file(rest, str(tmp / "ranker.safetensors"))
        if head:
            save_file(head, str(tmp / "isotropy_head.safetensors"))
        (tmp / "isorank.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(model_card(info, source))
        _shareable(tmp)
    return out_path


def _shareable(folder: Path) -> None:
    # mkdtemp and some writers create owner-only files; an exported model is meant to be read by others
    mask = current_umask()
    folder.chmod(0o777 & ~mask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~mask)


def read_info(folder: str | Path) -> dict:
    """Return an exported folder's isorank.json; a folder without one, or of another format, is an InputError."""
    p = Path(folder) / "isorank.json"
    if not p.is_file():
        raise InputError("ckpt", f"'{folder}' is a folder but not an isorank export (no isorank.json)")
    info = json.loads(p.read_text())
    if info.get("format") != FORMAT:
        raise InputError(str(p), f"format {info.get('format')!r}; expected {FORMAT!r}")
    return info


def load_exported(folder: str | Path, measures: list[str] | None = None):
    """Load the RankingModule (or HeadModule, with the head attached) of an exported folder, weights as exported."""
    folder = Path(folder).resolve()
    info = read_info(folder)
    model = dict(info["model"])
    if info["encoder"]:
        model["backbone"] = str(folder)  # the fine-tuned backbone, saved by save_pretrained
    if info.get("head"):
        module = HeadModule(model, info["optim"], measures, info["head"], str(folder))
    else:
        module = RankingModule(model, info["optim"], measures)
    state = load_file(str(folder / "ranker.safetensors"))
    if (folder / "isotropy_head.safetensors").is_file():
        state.update(load_file(str(folder / "isotropy_head.safetensors")))
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(ENCODER) and not k.startswith("runs.")]
    if missing or unexpected:
        raise InputError(
            str(folder), f"does not match ranker '{model['name']}' (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    module.hparams["model"] = model
    return module
