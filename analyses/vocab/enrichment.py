"""Lexical enrichment (Ram et al., section 6.2, Eq. 4-5).

    s_t = argmax_s log MLM-Head(s)[t]                                                      (Eq. 4)
    e_lex(x) = 1/n sum_i w_{x_i} s_{x_i},   e'(x) = e(x) + lambda * e_lex(x) / ||e_lex(x)||     (Eq. 5)

`single_token_embeddings` solves Eq. 4 for many vocabulary items at once: one free input vector per item, Adam
(lr 0.01, the paper's), the summed per-item cross-entropy (Adam is element-wise, so each item's trajectory is its
own whatever else is in the batch), each item's vector kept at the first step its cross-entropy reaches the
threshold (0.1, the paper's) and the item then left out of the computation. It starts from the item's static input
embedding v_t (footnote 3: v_t alone need not decode to t). `whiten` is Jung et al.'s whitening (mean removed,
covariance to identity) fitted on the s_t.
w = IDF over the collection (BM25's form, analyses/whitebox/idf.py), x_1..x_n the text's WordPiece tokens as the
ranker encodes them (truncated, special tokens excluded, repeats counted). The ablations of section 6.4 are
switches: `idf=False` (w = 1), static embeddings v_t for s_t, no whitening, no normalisation (e + lambda e_lex).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class SingleTokens:
    """The single-token embeddings s_t of Eq. 4 found for vocabulary items, with the steps and cross-entropy reached."""

    token_ids: Tensor  # [n] vocabulary items
    vectors: Tensor  # [n, d] s_t (Eq. 4)
    steps: Tensor  # [n] Adam steps until the cross-entropy reached the threshold (max_steps + 1: never)
    cross_entropy: Tensor  # [n] at the kept vector

    def reached(self, threshold: float) -> Tensor:
        """Return a bool mask [n] of the items whose kept vector decodes to them with cross-entropy <= `threshold`."""
        return self.cross_entropy <= threshold


def single_token_embeddings(
    head,
    token_ids,
    init: Tensor,
    lr: float = 0.01,
    threshold: float = 0.1,
    max_steps: int = 1000,
    batch_size: int = 1024,
    log=None,
) -> SingleTokens:
    """Eq. 4 for every item of `token_ids`, `batch_size` items per optimisation; `init` [n, d] the start vectors."""
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    out = init.detach().clone().float()
    steps = torch.full((len(ids),), max_steps + 1, dtype=torch.long)
    ce_out = torch.full((len(ids),), float("inf"))
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    for s in range(0, len(ids), batch_size):
        t = ids[s : s + batch_size]
        x = torch.nn.Parameter(out[s : s + batch_size].clone())
        opt = torch.optim.Adam([x], lr=lr)
        done = torch.zeros(len(t), dtype=torch.bool)
        for step in range(max_steps + 1):
            act = torch.nonzero(~done).squeeze(1)
            # only the items still above the threshold are computed: the cost follows the stragglers
            ce = F.cross_entropy(head(x[act]), t[act], reduction="none")
            with torch.no_grad():
                hit = ce.detach() <= threshold
                keep = act if step == max_steps else act[hit]
                out[keep + s] = x.detach()[keep]
                ce_out[keep + s] = ce.detach() if step == max_steps else ce.detach()[hit]
                steps[act[hit] + s] = step
                done[keep] = True
            if bool(done.all()):
                break
            opt.zero_grad(set_to_none=True)
            ce[~hit].sum().backward()
            opt.step()
        if log:
            log(
                f"single-token embeddings {min(s + batch_size, len(ids)):,}/{len(ids):,}: "
                f"{int((ce_out[s : s + batch_size] <= threshold).sum())} "
                f"of {len(t)} reached CE <= {threshold} (last step {step})"
            )
    return SingleTokens(ids, out, steps, ce_out)


def whiten(x: Tensor, eps: float = 1e-8) -> tuple[Tensor, Tensor, Tensor]:
    """Whiten the rows of `x` (Jung et al., 2022): return (whitened rows, mean, W).

    (x - mu) W has identity covariance, W = U diag(lambda^-1/2) of the covariance. Float64 for the
    eigendecomposition.
    """
    x64 = x.double()
    mu = x64.mean(0)
    c = x64 - mu
    cov = c.T @ c / len(x64)
    lam, U = torch.linalg.eigh(cov)
    W = U / torch.sqrt(lam.clamp_min(0) + eps)
    return (c @ W).to(x.dtype), mu.to(x.dtype), W.to(x.dtype)


def lexical_vectors(
    texts: list[list[int]], table: dict[int, int], vectors: Tensor, idf: dict[int, float] | None
) -> Tensor:
    """Return e_lex of Eq. 5 per text: 1/n sum_i w_{x_i} s_{x_i} over its tokens.

    `table`: token id -> row of `vectors`; `idf` None: w = 1. A text without tokens gets a zero vector.
    """
    out = torch.zeros(len(texts), vectors.shape[1], dtype=vectors.dtype)
    for k, toks in enumerate(texts):
        if not toks:
            continue
        rows = torch.tensor([table[t] for t in toks])
        w = (
            torch.tensor([idf[t] for t in toks], dtype=vectors.dtype)
            if idf is not None
            else torch.ones(len(toks), dtype=vectors.dtype)
        )
        out[k] = (w[:, None] * vectors[rows]).sum(0) / len(toks)
    return out


def enrich(e: Tensor, e_lex: Tensor, lam: float, normalize: bool = True) -> Tensor:
    """Return the enriched vectors e' = e + lambda * e_lex / ||e_lex|| (Eq. 5).

    `normalize=False`: e + lambda * e_lex. Zero e_lex adds nothing.
    """
    if normalize:
        e_lex = e_lex / e_lex.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return e + lam * e_lex


def text_tokens(tokenizer, texts: list[str], max_len: int) -> list[list[int]]:
    """WordPiece ids of each text as the ranker encodes it (truncated at max_len with [CLS]/[SEP]), specials dropped."""
    special = set(tokenizer.all_special_ids)
    ids = tokenizer(texts, truncation=True, max_length=max_len)["input_ids"]
    return [[t for t in x if t not in special] for x in ids]


def idf_weights(idf, token_ids) -> dict[int, float]:
    """Return Eq. 5's weights w_t: token id -> collection IDF of the subword (`CollectionIDF.subword`)."""
    return {int(t): float(idf.subword(t)) for t in token_ids}


def vocabulary_of(texts: list[list[int]]) -> list[int]:
    """Return the sorted distinct token ids of `texts`: the items whose s_t (Eq. 4) the enrichment needs."""
    return sorted({t for x in texts for t in x})
