"""ATS / MATS (position-bias paper Eq. 8-9, metrics/ats.py) over 1M synthetic token vectors, and a
brute-force loop over occurrence pairs on a subsample as the peer.

    python -m bench.bench_ats [tokens=1000000] [dim=384] [vocab=30522] [zipf=1.07] [cap=100]
                              [peer_passages=40] [threads=2] [out=PATH.json]

Data: passages of 60-180 tokens (uniform) until `tokens` occurrences; term ids drawn from a Zipf law over the
WordPiece vocabulary (rank r with probability ~ 1/r^1.07, the exponent of natural-language word frequencies), so a
few terms hold most occurrences as in real text; vectors = the term's random embedding + noise + a sinusoidal
position code (the values do not change the cost). d = 384 (TK on MiniLM's embeddings).

Timed: `average_term_similarity` on all tokens with the per-term cap (the default 100); then, on the first
`peer_passages` passages with no cap, ours vs the peer (a Python loop over every pair of same-term occurrences in
different passages, one float64 NumPy cosine each, per-(term, delta) means then Eq. 8's mean over terms). Both give
the same curve (checked to 1e-9); the script prints both times, their ratio, and the peer's time extrapolated to the
capped 1M-token set by its pair count. Each timing records the CPU that other processes used meanwhile.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from bench import options
from bench.bench_retrieval import machine
from bench.bench_speed import Meter
from core.io import write_json
from metrics.ats import average_term_similarity


@dataclass
class Options:
    tokens: int = 1_000_000
    dim: int = 384
    vocab: int = 30522
    zipf: float = 1.07
    cap: int = 100
    peer_passages: int = 40
    threads: int = 2
    out: str | None = None


def synthetic(tokens: int, dim: int, vocab: int, zipf: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(int(rng.integers(60, 181)))
    lengths[-1] -= sum(lengths) - tokens
    passages = np.repeat(np.arange(len(lengths)), lengths)
    positions = np.concatenate([np.arange(n) for n in lengths])
    p = 1.0 / np.arange(1, vocab + 1) ** zipf
    terms = rng.choice(vocab, size=tokens, p=p / p.sum())
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(vocab, dim, generator=gen)
    x = emb[torch.from_numpy(terms)]
    x += 0.5 * torch.randn(tokens, dim, generator=gen)
    i = torch.arange(dim // 2)
    angle = torch.from_numpy(positions).float()[:, None] / (10000 ** (2 * i / dim))[None, :]
    x[:, : dim // 2] += 0.3 * torch.sin(angle)
    x[:, dim // 2 :] += 0.3 * torch.cos(angle)
    return x, torch.from_numpy(terms), torch.from_numpy(positions), torch.from_numpy(passages)


def brute_force(
    x: np.ndarray, terms: np.ndarray, positions: np.ndarray, passages: np.ndarray
) -> tuple[np.ndarray, int]:
    """Eq. 8 by a loop over every pair of same-term occurrences in different passages; (ATS curve, pairs)."""
    sums: dict[tuple[int, int], list[float]] = {}
    by_term: dict[int, list[int]] = {}
    for i, t in enumerate(terms.tolist()):
        by_term.setdefault(t, []).append(i)
    pairs = 0
    for t, occ in by_term.items():
        for a in range(len(occ)):
            i = occ[a]
            for b in range(a + 1, len(occ)):
                j = occ[b]
                if passages[i] == passages[j]:
                    continue
                c = float(x[i] @ x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j])))
                sums.setdefault((t, abs(int(positions[i]) - int(positions[j]))), []).append(c)
                pairs += 1
    span = int(positions.max() - positions.min())
    per_delta: list[list[float]] = [[] for _ in range(span + 1)]
    for (_t, d), v in sums.items():
        per_delta[d].append(math.fsum(v) / len(v))
    return np.array([math.fsum(v) / len(v) if v else np.nan for v in per_delta]), pairs


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    x, terms, positions, passages = synthetic(args.tokens, args.dim, args.vocab, args.zipf)
    print(
        f"data: {args.tokens:,} tokens, {int(passages.max()) + 1:,} passages, "
        f"{len(torch.unique(terms)):,} distinct terms, "
        f"d = {args.dim} ({time.perf_counter() - t0:.1f} s to generate)"
    )

    with Meter() as full:
        result = average_term_similarity(x, terms, positions, passages, max_occurrences=args.cap, seed=0)
    print(
        f"ours, all {args.tokens:,} tokens, cap {args.cap}: {full.wall:.1f} s "
        f"(other processes: {full.others_cores} cores); "
        f"{result.occurrences:,} occurrences of {result.vocabulary:,} terms kept, {int(result.pairs.sum()):,} pairs, "
        f"MATS {result.mats:.4f}"
    )

    sub = passages < args.peer_passages
    xs, ts, ps, gs = x[sub], terms[sub], positions[sub], passages[sub]
    with Meter() as ours_sub:
        mine = average_term_similarity(xs, ts, ps, gs, max_occurrences=None)
    with Meter() as peer:
        ref, peer_pairs = brute_force(xs.double().numpy(), ts.numpy(), ps.numpy(), gs.numpy())
    diff = float(np.nanmax(np.abs(mine.ats[: len(ref)] - ref)))
    if not diff < 1e-9:
        raise SystemExit(f"ours and the brute force disagree by {diff}")
    full_pairs = int(result.pairs.sum())
    extrapolated = peer.wall / max(peer_pairs, 1) * full_pairs
    print(
        f"subsample ({args.peer_passages} passages, {int(sub.sum()):,} tokens, {peer_pairs:,} pairs, no cap): "
        f"ours {ours_sub.wall:.3f} s, brute-force loop {peer.wall:.1f} s, ratio {peer.wall / ours_sub.wall:.0f}x; "
        f"max |difference| {diff:.1e}"
    )
    print(
        f"brute-force loop extrapolated to the capped 1M-token set ({full_pairs:,} pairs): {extrapolated:.0f} s "
        f"vs ours {full.wall:.1f} s ({extrapolated / full.wall:.0f}x)"
    )
    record = {
        "machine": machine(),
        "settings": vars(args),
        "ours_full_s": full.wall,
        "ours_full_others_cores": full.others_cores,
        "occurrences_kept": result.occurrences,
        "terms_kept": result.vocabulary,
        "pairs_full": full_pairs,
        "mats": result.mats,
        "subsample_tokens": int(sub.sum()),
        "subsample_pairs": peer_pairs,
        "ours_subsample_s": ours_sub.wall,
        "peer_subsample_s": peer.wall,
        "peer_others_cores": peer.others_cores,
        "ratio_subsample": peer.wall / ours_sub.wall,
        "peer_extrapolated_full_s": extrapolated,
        "max_abs_difference": diff,
    }
    if args.out:
        write_json(args.out, record)
        print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
