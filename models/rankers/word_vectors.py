"""Word vectors for TK's embedding layer, one row per token id of the backbone's WordPiece tokenizer.

The paper uses "pre-trained GloVe word embeddings with 300 dimensions" (section 3). GloVe cannot be downloaded
here, so the default takes the backbone's own input word embeddings (`model.embeddings=backbone`); a GloVe-format
text file can be given instead (`model.embeddings=/path/glove.42B.300d.txt`, `.gz` too):

    token v1 v2 ... vd            (one word a line, separated by single spaces; no header)

The width d is read from the first line; a first line of exactly two integers (word2vec's "count dim" header)
is skipped. A token may contain spaces (glove.840B has such lines): the last d fields are the vector. Every line
is checked for its field count, the numbers are parsed (and checked) for the tokenizer's tokens only, which keeps
a multi-gigabyte file to one pass of string splitting. Tokens are matched exactly (an uncased tokenizer wants an
uncased GloVe such as 42B); WordPiece continuations ("##ing") and special tokens are never in GloVe and, like any
token absent from the file, get random N(0, s^2) rows, s the standard deviation of the vectors found. How many
were found is printed and kept in `WordVectors.found` / `missing`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.errors import InputError
from datamodules.textfiles import iter_lines

KEY = "model.embeddings"


@dataclass
class WordVectors:
    """TK's word embedding rows, one per token id, with where they came from and how many were found there."""

    weight: Tensor  # [vocab, d] float32, row = token id
    source: str  # "backbone" or the file
    found: int  # rows taken from the source
    missing: int  # rows drawn at random


def from_backbone(encoder) -> WordVectors:
    """Return a copy of the backbone's input word embeddings (not its position / type embeddings or LayerNorm)."""
    weight = encoder.get_input_embeddings().weight.detach().to(torch.float32).clone()
    return WordVectors(weight, "backbone", found=weight.shape[0], missing=0)


def _is_header(fields: list[str]) -> bool:
    return len(fields) == 2 and all(f.isdigit() for f in fields)


def from_glove(path: str, vocab: dict[str, int], vocab_size: int) -> WordVectors:
    """Rows of `vocab` (token -> id, from the tokenizer) looked up in a GloVe-format file at `path`."""
    p = Path(path)
    if not p.is_file():
        raise InputError(KEY, f"'{path}' is neither 'backbone' nor an existing GloVe-format file")
    dim, vectors = None, {}
    for lineno, line in iter_lines(p):  # the shared reader: gzip, UTF-8 and a leading BOM handled
        fields = line.split(" ")
        if dim is None:
            if lineno == 1 and _is_header(fields):
                continue
            dim = len(fields) - 1
            if dim < 1:
                raise InputError(
                    f"{path}:{lineno}", "expected 'token v1 ... vd' (a token and its numbers); got one field"
                )
        if len(fields) < dim + 1:
            raise InputError(
                f"{path}:{lineno}",
                f"expected 'token v1 ... v{dim}' (a token and {dim} numbers, as on the first line); "
                f"got {len(fields)} fields",
            )
        token = " ".join(fields[:-dim])
        if token not in vocab or token in vectors:
            continue  # first occurrence wins
        try:
            vectors[token] = np.asarray(fields[-dim:], dtype=np.float32)
        except ValueError as e:
            raise InputError(f"{path}:{lineno}", f"expected {dim} numbers after the token '{token}' ({e})") from e
    if dim is None:
        raise InputError(KEY, f"'{path}' holds no word vectors")
    if not vectors:
        raise InputError(
            KEY, f"no token of the tokenizer's vocabulary is in '{path}' (an uncased tokenizer needs an uncased GloVe)"
        )
    found = np.stack(list(vectors.values()))
    # absent tokens drawn at the scale of the file's vectors, so they neither dominate nor vanish in the cosines
    weight = torch.randn(vocab_size, dim) * float(found.std())
    for token, v in vectors.items():
        weight[vocab[token]] = torch.from_numpy(v)
    rows_found = len({vocab[t] for t in vectors})
    result = WordVectors(weight, str(path), found=rows_found, missing=vocab_size - rows_found)
    print(
        f"{KEY}: {result.found:,} of {vocab_size:,} tokenizer tokens found in '{path}' (d={dim}); "
        f"{result.missing:,} drawn from N(0, {float(found.std()):.3f}^2)",
        file=sys.stderr,
        flush=True,
    )
    return result


__all__ = ["WordVectors", "from_backbone", "from_glove"]
