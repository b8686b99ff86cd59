"""Passage term occurrences with their contextual vectors: the input of ATS / MATS.

ATS / MATS are the position-bias paper's Eq. 8-9 (metrics/ats.py); the occurrences come from any ranker that has term
representations.

- Bi-encoders (TK, ColBERT, RepBERT, BERT_DOT): `token_representations(side="doc")`, the hook the isotropy callback
  and heads use (TK: p^ of its Eq. 4; BERT rankers: the backbone's last layer, ColBERT after its optional
  compression), before any isotropy head.
- Cross-encoders (BERT_CAT, DGRe): the passage-side tokens of `[CLS] q [SEP] p [SEP]`
  (`CrossEncoder.passage_token_representations`), each passage paired with a query (the caller's list, cycled).

A term is a WordPiece id; special tokens ([CLS], [SEP], [UNK], padding) are never terms. A term's position is its
index among its passage's terms (0 for the first), so it is the absolute position up to the constant shift of
[CLS] or of the query, which deltas do not see.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from core.transfers import to_device
from models.rankers.base import Ranker

__all__ = ["PassageTerms", "passage_terms"]


@dataclass
class PassageTerms:
    """Every term occurrence of some passages, row-aligned: its vector, term id, position and passage index.

    The four fields are what `metrics.ats.average_term_similarity` takes.
    """

    vectors: Tensor  # [N, d] float32, on CPU
    terms: Tensor  # [N] token ids
    positions: Tensor  # [N] index among the passage's terms
    passages: Tensor  # [N] passage index (first_passage + index in `docs`)


@torch.inference_mode()
def passage_terms(
    ranker: Ranker,
    pair_tokenizer,
    docs: list[str],
    queries: list[str] | None = None,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    first_passage: int = 0,
    autocast=None,
) -> PassageTerms:
    """Return every term occurrence of `docs` with its vector, in eval mode (the ranker's mode is restored).

    `queries` (cross-encoders only, required there) are paired with the passages cyclically. `autocast`: a context
    manager factory for the forward passes (e.g. Lightning's precision plugin), none by default.
    """
    cross = ranker.kind == "cross"
    if cross and not queries:
        raise ValueError("a cross-encoder's passage vectors depend on a query: pass `queries`")
    special = to_device(np.asarray(ranker.tokenizer.all_special_ids), device)
    out: dict[str, list[Tensor]] = {"vectors": [], "terms": [], "positions": [], "passages": []}
    was_training = ranker.training
    ranker.eval()
    try:
        for s in range(0, len(docs), batch_size):
            texts = docs[s : s + batch_size]
            with autocast() if autocast is not None else nullcontext():
                if cross:
                    qs = [queries[(s + i) % len(queries)] for i in range(len(texts))]
                    batch = {k: v.to(device) for k, v in pair_tokenizer.pairs(qs, texts).items()}
                    ids, enc = batch["input_ids"], ranker.passage_token_representations(batch)
                else:
                    batch = pair_tokenizer.docs(texts)
                    ids, mask = batch["d_input_ids"].to(device), batch["d_attention_mask"].to(device)
                    enc = ranker.token_representations(ids, mask, side="doc")
            is_term = enc.mask & ~torch.isin(ids, special)
            position = is_term.long().cumsum(1) - 1
            row = torch.arange(len(texts), device=device)[:, None].expand_as(ids)
            out["vectors"].append(enc.tokens[is_term].float().cpu())
            out["terms"].append(ids[is_term].cpu())
            out["positions"].append(position[is_term].cpu())
            out["passages"].append((row[is_term] + first_passage + s).cpu())
    finally:
        ranker.train(was_training)
    if not out["vectors"]:
        return PassageTerms(torch.zeros(0, 1), *(torch.zeros(0, dtype=torch.long) for _ in range(3)))
    return PassageTerms(**{k: torch.cat(v) for k, v in out.items()})
