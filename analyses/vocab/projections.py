r"""Vocabulary projections (Ram et al., section 3, Eq. 1-3) and the statistics of sections 5-6 on them.

    Q = MLM-Head(e_q),  P = MLM-Head(e_p)                                                  (Eq. 3)

e is what the ranker scores with before any normalisation: the pooled vector of a single-vector ranker (RepBERT's
mean, BERT_DOT's [CLS]); for ColBERT, every token vector is projected and a text's distribution is the maximum
over its tokens of the per-token log-probabilities (SPLADE's max pooling; the paper has single vectors only).
rank_X(t) = 1 + the number of vocabulary items with a larger logit than t in X (rank 1 = top; a logit tie goes
to t, an event of measure zero for real vectors).

Token sets are WordPiece ids of the text as the ranker encodes it (truncated at its maximum length), without
special tokens: T_q, T_p, shared S = T_q & T_p. `content` drops stopwords (the 33-word Lucene list the project's
BM25 uses) and punctuation-only tokens, as the paper does for query expansion (section 5.3) and token amnesia
(section 6.1).

- `coverage` (Figure 3): for each k, the share of shared tokens (pooled over the pairs) ranked in the top-k of Q,
  and of P;
- `token_mrr` (Table 2): mean over (pair, token) of 1 / rank_P(t), for t in S and for t in T_p \ T_q;
- `expansion` (Figure 4): for each k, the share of queries with a query-expansion token in the top-k of Q: a
  content token not in T_q but in T_p; and the share of Q's top-5 tokens that are expansion tokens (App. B);
- `amnesia` (Figure 5): over queries whose gold passage p is in BM25's top-5, T = content tokens of S; the max
  (worst) and median rank of T in P and in Q, split by whether the ranker ranks p in its own top-5.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from analyses.whitebox.words import STOPWORDS


def is_content(token: str) -> bool:
    """Not a stopword and not punctuation only (a WordPiece continuation '##x' counts by its letters)."""
    t = token.removeprefix("##")
    return any(ch.isalnum() for ch in t) and t not in STOPWORDS


@torch.inference_mode()
def project(head, vectors: Tensor, mask: Tensor | None = None, batch_size: int = 256) -> Tensor:
    """Project texts onto the vocabulary: Eq. 3 as log-probabilities [N, V].

    One vector per text ([N, d]), or token vectors [N, L, d] with their mask, max-pooled over the real tokens
    (ColBERT).
    """
    out = []
    if vectors.dim() == 3:  # [n, L, V] log-probabilities: keep a chunk to ~4k token rows (~0.5 GB at V = 30k)
        batch_size = max(1, min(batch_size, 4096 // max(vectors.shape[1], 1)))
    for s in range(0, vectors.shape[0], batch_size):
        v = vectors[s : s + batch_size].float()
        logp = torch.log_softmax(head(v), dim=-1)
        if v.dim() == 3:
            m = mask[s : s + batch_size]
            logp = logp.masked_fill(~m[..., None], float("-inf")).max(dim=1).values
        out.append(logp)
    return torch.cat(out) if out else torch.empty(0, head.vocab_size)


def ranks_of(logp: Tensor, tokens) -> dict[int, int]:
    """Rank of each token id in one projection [V] (1 = top)."""
    ids = torch.as_tensor(sorted(set(int(t) for t in tokens)), dtype=torch.long)
    if len(ids) == 0:
        return {}
    r = (logp[None, :] > logp[ids][:, None]).sum(1) + 1
    return dict(zip(ids.tolist(), r.tolist()))


def top_tokens(logp: Tensor, k: int) -> list[int]:
    """Return the k best token ids, best first (ties by id)."""
    order = np.lexsort((np.arange(logp.shape[0]), -logp.double().numpy()))
    return order[:k].tolist()


@dataclass
class PairStats:
    """What the statistics need of one (query, gold passage) pair: token sets, ranks in Q and P, Q's top list."""

    qid: str
    q_tokens: set[int]
    p_tokens: set[int]
    rank_q: dict[int, int]  # rank in Q of every token of T_q | T_p
    rank_p: dict[int, int]  # rank in P of every token of T_q | T_p
    top_q: list[int]  # Q's top-K_max ids
    content: set[int] = field(default_factory=set)  # the content tokens among T_q | T_p

    @property
    def shared(self) -> set[int]:
        """The shared tokens S = T_q & T_p."""
        return self.q_tokens & self.p_tokens


def coverage(pairs: list[PairStats], ks: list[int]) -> dict[int, dict[str, float | int]]:
    """Return Figure 3's coverage: k -> {"Q": share, "P": share, "shared_tokens": n}.

    The share of shared tokens in the top-k of Q and of P, pooled over pairs.
    """
    n = sum(len(p.shared) for p in pairs)
    out = {}
    for k in ks:
        hq = sum(1 for p in pairs for t in p.shared if p.rank_q[t] <= k)
        hp = sum(1 for p in pairs for t in p.shared if p.rank_p[t] <= k)
        out[k] = {"Q": hq / n if n else None, "P": hp / n if n else None, "shared_tokens": n}
    return out


def token_mrr(pairs: list[PairStats]) -> dict[str, dict[str, float | int | None]]:
    """Table 2: MRR in P of the shared tokens and of the other passage tokens (and of query-only tokens)."""
    groups = {
        "shared": lambda p: p.shared,
        "passage_only": lambda p: p.p_tokens - p.q_tokens,
        "query_only": lambda p: p.q_tokens - p.p_tokens,
    }
    out = {}
    for name, pick in groups.items():
        rr = [1.0 / p.rank_p[t] for p in pairs for t in pick(p)]
        out[name] = {"mrr": float(np.mean(rr)) if rr else None, "tokens": len(rr)}
    return out


def expansion_tokens(p: PairStats, k: int) -> list[int]:
    """Query-expansion tokens in Q's top-k: content tokens of the gold passage that are not in the query."""
    return [t for t in p.top_q[:k] if t not in p.q_tokens and t in p.p_tokens and t in p.content]


def expansion(pairs: list[PairStats], ks: list[int], share_k: int = 5) -> dict:
    """Return Figure 4's share of queries with an expansion token in the top-k of Q, per k.

    Also the share of Q's top-`share_k` tokens that are expansion tokens (App. B).
    """
    per_k = {k: (float(np.mean([bool(expansion_tokens(p, k)) for p in pairs])) if pairs else None) for k in ks}
    top = sum(len(p.top_q[:share_k]) for p in pairs)
    share = sum(len(expansion_tokens(p, share_k)) for p in pairs) / top if top else None
    return {"queries_with_expansion": per_k, f"top{share_k}_expansion_share": share, "queries": len(pairs)}


def amnesia_row(p: PairStats, ranker_rank: int, top: int = 5) -> dict | None:
    """Return one query's row of Figure 5 (token amnesia): max and median ranks of the shared content tokens.

    The query's gold passage is already known to be in BM25's top-5; the ranks are those in P and Q; None when
    they share no content token.
    """
    t = sorted(x for x in p.shared if x in p.content)
    if not t:
        return None
    rp = [p.rank_p[x] for x in t]
    rq = [p.rank_q[x] for x in t]
    return {
        "qid": p.qid,
        "tokens": len(t),
        "ranker_rank": int(ranker_rank),
        "retrieved": ranker_rank <= top,
        "max_rank_P": max(rp),
        "median_rank_P": float(np.median(rp)),
        "max_rank_Q": max(rq),
        "median_rank_Q": float(np.median(rq)),
    }


def amnesia_summary(rows: list[dict]) -> dict:
    """Summarise the token-amnesia rows (Figure 5) per group, retrieved or missed by the ranker.

    Per group: count and the median over queries of each rank statistic; a one-sided Mann-Whitney U p-value that
    the missed group's ranks are larger.
    """
    from scipy.stats import (
        mannwhitneyu,  # lazy: scipy.stats loads slowly, only significance tests need it
    )

    keys = ("max_rank_P", "median_rank_P", "max_rank_Q", "median_rank_Q")
    out: dict = {}
    for g, flag in (("retrieved", True), ("missed", False)):
        rs = [r for r in rows if r["retrieved"] == flag]
        out[g] = {
            "queries": len(rs),
            **{f"median_{k}": (float(np.median([r[k] for r in rs])) if rs else None) for k in keys},
        }
    hit = [r for r in rows if r["retrieved"]]
    miss = [r for r in rows if not r["retrieved"]]
    out["mann_whitney_p_missed_greater"] = {
        k: (
            float(mannwhitneyu([r[k] for r in miss], [r[k] for r in hit], alternative="greater").pvalue)
            if hit and miss
            else None
        )
        for k in keys
    }
    return out


def rank_in(scores: np.ndarray, index: int) -> int:
    """1 + the number of candidates scored strictly above candidate `index`."""
    return int((scores > scores[index]).sum()) + 1
