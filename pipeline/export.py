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
from omegaconf import DictConfig
from safetensors.torch import save_file

from core.errors import InputError
from core.io import AtomicDir, current_umask
from lightning_modules.head_module import HEAD_PREFIXES
from models.loading import ENCODER_PREFIX, EXPORT_FORMAT, RANKER_PREFIX, load_ranker
from pipeline.head_stage import load_with_head


def _split_state(ranker) -> tuple[dict, dict]:
    """(ranker weights outside the backbone, isotropy head weights) of a loaded ranker, keyed as its module's."""
    rest, head = {}, {}
    for k, v in ranker.state_dict().items():
        k = RANKER_PREFIX + k
        if k.startswith(ENCODER_PREFIX):
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
        "from models.loading import load_ranker",
        "ranker, tokenizer, head = load_ranker('<this folder>')  # the nn.Module, its PairTokenizer, the head or None",
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
        loaded = load_with_head(cfg)
        base = loaded.base_path
    elif cfg.ckpt:
        loaded, base = load_ranker(cfg.ckpt, key="ckpt"), cfg.ckpt
    else:
        raise InputError("ckpt", "export needs ckpt=<ranker checkpoint> (or head_ckpt=<head checkpoint>)")
    ranker = loaded.ranker
    rest, head = _split_state(ranker)
    info = {
        "format": EXPORT_FORMAT,
        "model": dict(loaded.hparams["model"]),
        "optim": dict(loaded.hparams.get("optim") or {}),
        "head": loaded.hparams.get("head"),
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
