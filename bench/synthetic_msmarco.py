"""MS MARCO-shaped synthetic files in the `data=tsv` layout, for scale benchmarks (bench/bench_scale.py).

    python -m bench.synthetic_msmarco [passages=100000] [seed=0] [data_dir=bench/results/scale-data]

Writes `<data_dir>/synth-<passages>-s<seed>-<digest>/` (digest: the other settings), or reuses it when its
`manifest.json` (written last, with the folder renamed into place whole) says it holds the same settings:

| file | lines | layout |
|---|---|---|
| `collection.tsv` | passages, pids 0..N-1 | `pid<TAB>text` |
| `queries.train.tsv`, `qrels.train.tsv` | ~0.057 N (see below) | `qid<TAB>text`; `qid 0 pid 1` |
| `triples.train.ids.tsv` | `triples_per_passage` x N (4.5: 39.8M at 8.8M) | `qid<TAB>pos pid<TAB>neg pid` |
| `queries.dev.tsv`, `qrels.dev.tsv` | `val_queries` (validation) | |
| `queries.test.tsv`, `qrels.test.tsv` | `test_queries` (6,980, as MS MARCO dev small) | |
| `queries.other.tsv`, `qrels.other.tsv` | `other_queries`, disjoint ids: a second query set over the same index | |

Train queries: ~0.057 N, as MS MARCO (502k judged train queries for 8.8M passages).

Text: a vocabulary of `vocab` made-up words of 2-3 syllables, shortest first, drawn Zipf-Mandelbrot
(p(rank r) ~ (r + 2.7)^-s); passage lengths Gamma(7, 8) words (mean 56, sd 21, clipped to [8, 200]). Each query has
one relevant passage (distinct passages while the collection has enough) and `query_words` words drawn from that
passage's words, so BM25 finds it.
A triple's query is a uniform train query, its positive that query's relevant passage, its negative a uniform other
passage. Every draw comes from a generator seeded by (seed, stream, chunk), so the files are the same byte for byte for
the same settings. Lines are assembled with NumPy gathers over a byte pool of the words, 50,000 passages (or 1M
triples) at a time: about 3.5 GB of collection and 1 GB of triples at 8.8M passages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import options
from core.io import AtomicDir

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "bench" / "results" / "scale-data"
VERSION = 1
PASSAGE_CHUNK = 50_000
TRIPLE_CHUNK = 1 << 20
QUERY_SETS = ("train", "dev", "test", "other")  # in qid order: train qids first, then dev, test, other
_TENS = 10 ** np.arange(1, 19, dtype=np.int64)


@dataclass
class Spec:
    passages: int = 100_000
    seed: int = 0
    triples_per_passage: float = 4.5
    train_query_fraction: float = 0.057  # train queries per passage (MS MARCO: 502,939 judged / 8,841,823)
    val_queries: int = 1000
    test_queries: int = 6980
    other_queries: int = 1000
    vocab: int = 50_000
    zipf_s: float = 1.0
    mean_words: int = 56
    query_words: int = 6

    def counts(self) -> dict[str, int]:
        return {
            "train": max(1, round(self.passages * self.train_query_fraction)),
            "dev": self.val_queries,
            "test": self.test_queries,
            "other": self.other_queries,
        }

    def folder_name(self) -> str:
        rest = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("passages", "seed")}
        digest = hashlib.sha256(json.dumps({"version": VERSION, **rest}, sort_keys=True).encode()).hexdigest()[:8]
        return f"synth-{self.passages}-s{self.seed}-{digest}"


def files(folder: str | Path) -> dict[str, Path]:
    """The file of each role: collection, triples, queries.<set>, qrels.<set>."""
    folder = Path(folder)
    out = {"collection": folder / "collection.tsv", "triples": folder / "triples.train.ids.tsv"}
    for s in QUERY_SETS:
        out[f"queries.{s}"] = folder / f"queries.{s}.tsv"
        out[f"qrels.{s}"] = folder / f"qrels.{s}.tsv"
    return out


# ---- vectorised line assembly --------------------------------------------------------------------------------
def n_digits(x: np.ndarray) -> np.ndarray:
    """Decimal digits of non-negative integers."""
    return np.searchsorted(_TENS, np.asarray(x, dtype=np.int64), side="right") + 1


def int_rows(cols: list[np.ndarray], seps: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Rows `str(cols[0][i]) seps[0] str(cols[1][i]) seps[1] ...` as one uint8 buffer, and each row's byte length."""
    cols = [np.asarray(c, dtype=np.int64) for c in cols]
    n = len(cols[0])
    nds = [n_digits(c) for c in cols]
    widths = [int(d.max()) if n else 1 for d in nds]
    mat = np.empty((n, sum(w + 1 for w in widths)), dtype=np.uint8)
    keep = np.ones(mat.shape, dtype=bool)
    at = 0
    for c, nd, w, sep in zip(cols, nds, widths, seps):
        x = c.copy()
        for k in range(w):  # k-th digit from the right
            mat[:, at + w - 1 - k] = x % 10 + 48
            keep[:, at + w - 1 - k] = k < nd
            x //= 10
        mat[:, at + w] = sep
        at += w + 1
    return mat[keep], sum(nd + 1 for nd in nds)


def gather(pool: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """pool[starts[0]:starts[0]+lens[0]] + pool[starts[1]:...] + ..., without a Python loop."""
    ends = np.cumsum(lens, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    idx_t = np.int32 if max(total, len(pool)) < 2**31 - 1 else np.int64
    shift = np.repeat((starts - (ends - lens)).astype(idx_t), lens)
    shift += np.arange(total, dtype=idx_t)
    return pool[shift]


class Words:
    """The vocabulary as a byte pool: word i is pool[start[i]:start[i] + length[i]], a trailing space included."""

    def __init__(self, words: list[str]):
        self.words = words
        enc = [w.encode("ascii") + b" " for w in words]
        self.pool = np.frombuffer(b"".join(enc), dtype=np.uint8)
        self.length = np.array([len(e) for e in enc], dtype=np.int64)
        self.start = np.cumsum(self.length) - self.length

    def lines(self, ids: np.ndarray, tokens: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """`id<TAB>w w w\\n` per line: line i holds the next counts[i] word ids of `tokens`."""
        prefix, plen = int_rows([ids], b"\t")
        n, n_tok = len(ids), len(tokens)
        pool = np.concatenate([prefix, self.pool])
        first = np.arange(n) + np.cumsum(counts) - counts  # piece index of each line's prefix
        is_prefix = np.zeros(n + n_tok, dtype=bool)
        is_prefix[first] = True
        starts = np.empty(n + n_tok, dtype=np.int64)
        lens = np.empty(n + n_tok, dtype=np.int64)
        starts[is_prefix], lens[is_prefix] = np.cumsum(plen) - plen, plen
        starts[~is_prefix], lens[~is_prefix] = self.start[tokens] + len(prefix), self.length[tokens]
        buf = gather(pool, starts, lens)
        buf[np.cumsum(lens)[first + counts] - 1] = ord("\n")  # the last word's space ends the line
        return buf


class Zipf:
    """Draws word ranks with P(r) ~ (r + 2.7)^-s: exactly `searchsorted(cdf, u)`, started from a 2^22-entry table of
    the cdf (3-4x faster than the binary search, whose random accesses miss the cache)."""

    BITS = 22

    def __init__(self, vocab: int, s: float):
        cdf = np.cumsum((np.arange(1, vocab + 1, dtype=np.float64) + 2.7) ** -s)
        self.cdf = cdf / cdf[-1]
        self.cdf[-1] = 1.0
        self.table = np.searchsorted(self.cdf, np.arange(2**self.BITS) / 2**self.BITS).astype(np.int32)

    def draw(self, u: np.ndarray) -> np.ndarray:
        """Ranks of uniforms u in [0, 1): the first r with cdf[r] >= u."""
        idx = self.table[(u * 2**self.BITS).astype(np.int64)]
        while len(low := np.flatnonzero(self.cdf[idx] < u)):
            idx[low] += 1
        return idx


def make_vocab(n: int, seed: int) -> list[str]:
    """n distinct made-up words of 2-3 syllables (lower-case ASCII, 4-12 letters), shortest first (Zipf rank 0 is
    the most frequent: frequent words are short, as in English), in random order within a length."""
    rng = np.random.default_rng([seed, 9])
    onsets = "b c d f g h j k l m n p r s t v w z br st tr ch sh".split()
    vowels = "a e i o u ou ai".split()
    codas = ["", "n", "r", "s", "l", "k", "t"]
    syl = [o + v + c for o in onsets for v in vowels for c in codas]
    weight = np.array([4.0 if len(v) == 1 and not c else 1.0 for o in onsets for v in vowels for c in codas])
    weight /= weight.sum()
    out: dict[str, None] = {}
    while len(out) < n:
        m = 2 * (n - len(out)) + 1000
        k = rng.choice([2, 3], m, p=[0.7, 0.3])
        picks = rng.choice(len(syl), (m, 3), p=weight)
        for j in range(m):
            out["".join(syl[s] for s in picks[j, : k[j]])] = None
    words = list(out)[:n]
    return sorted(words, key=len)  # stable: random order within a length


# ---- generation ----------------------------------------------------------------------------------------------
def _write(f, buf: np.ndarray) -> None:
    f.write(memoryview(buf))


def _qrels(f, qids: np.ndarray, pids: np.ndarray) -> None:
    ones = np.ones_like(qids)
    zeros = np.zeros_like(qids)
    buf, _ = int_rows([qids, zeros, pids, ones], b"   \n")
    _write(f, buf)


def generate(folder: Path, spec: Spec, log=print) -> dict:
    """Write every file of `spec` into `folder` (which must not be a complete set already); returns the manifest."""
    t0 = time.perf_counter()
    n = spec.passages
    if n < 2:
        raise ValueError("passages must be at least 2 (a triple's negative differs from its positive)")
    counts = spec.counts()
    first_qid = dict(zip(QUERY_SETS, np.cumsum([0] + [counts[s] for s in QUERY_SETS])[:-1].tolist()))
    n_q = sum(counts.values())
    rng0 = np.random.default_rng([spec.seed, 0])
    rel = (rng0.choice(n, n_q, replace=False) if n_q <= n else rng0.integers(0, n, n_q)).astype(np.int64)
    by_pid = np.argsort(rel, kind="stable")
    rel_sorted = rel[by_pid]
    words = Words(make_vocab(spec.vocab, spec.seed))
    zipf = Zipf(spec.vocab, spec.zipf_s)
    qtok = np.empty((n_q, spec.query_words), dtype=np.int32)
    f = files(folder)
    n_tokens, sizes = 0, {}
    with open(f["collection"], "wb") as out:
        for c, a in enumerate(range(0, n, PASSAGE_CHUNK)):
            b = min(n, a + PASSAGE_CHUNK)
            rng = np.random.default_rng([spec.seed, 1, c])
            lens = np.clip(np.rint(rng.gamma(7.0, spec.mean_words / 7.0, b - a)), 8, 200).astype(np.int64)
            tokens = zipf.draw(rng.random(int(lens.sum())))
            _write(out, words.lines(np.arange(a, b), tokens, lens))
            # the queries whose relevant passage is in this chunk draw their words from it
            lo, hi = np.searchsorted(rel_sorted, [a, b])
            if hi > lo:
                q = by_pid[lo:hi]
                p = rel[q] - a
                offs = np.cumsum(lens) - lens
                pos = (rng.random((hi - lo, spec.query_words)) * lens[p][:, None]).astype(np.int64)
                qtok[q] = tokens[offs[p][:, None] + pos]
            n_tokens += int(lens.sum())
            if c % 20 == 0:
                log(f"  collection: {b}/{n} passages ({time.perf_counter() - t0:.0f} s)")
    t_coll = time.perf_counter() - t0
    for s in QUERY_SETS:
        q = np.arange(first_qid[s], first_qid[s] + counts[s])
        with open(f[f"queries.{s}"], "wb") as out:
            _write(out, words.lines(q, qtok[q].ravel(), np.full(len(q), spec.query_words)))
        with open(f[f"qrels.{s}"], "wb") as out:
            _qrels(out, q, rel[q])
    n_triples = round(spec.triples_per_passage * n)
    n_train = counts["train"]
    with open(f["triples"], "wb") as out:
        for c, a in enumerate(range(0, n_triples, TRIPLE_CHUNK)):
            m = min(n_triples, a + TRIPLE_CHUNK) - a
            rng = np.random.default_rng([spec.seed, 2, c])
            qi = rng.integers(0, n_train, m)  # train qids are 0..n_train-1
            pos = rel[qi]
            neg = rng.integers(0, n - 1, m)
            neg += neg >= pos  # uniform over the other passages
            _write(out, int_rows([qi, pos, neg], b"\t\t\n")[0])
    sizes = {k: p.stat().st_size for k, p in f.items()}
    manifest = {
        "version": VERSION,
        "spec": dataclasses.asdict(spec),
        "passages": n,
        "tokens": n_tokens,
        "mean_words": n_tokens / n,
        "queries": counts,
        "first_qid": first_qid,
        "triples": n_triples,
        "bytes": sizes,
        "seconds": {"collection": round(t_coll, 2), "total": round(time.perf_counter() - t0, 2)},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def ensure(data_dir: str | Path, spec: Spec, log=print) -> tuple[Path, dict, bool]:
    """(folder, manifest, reused): the files of `spec` under `data_dir`, generated unless a complete set exists."""
    folder = Path(data_dir) / spec.folder_name()
    mpath = folder / "manifest.json"
    if mpath.is_file():
        manifest = json.loads(mpath.read_text())
        if (
            manifest.get("version") == VERSION
            and manifest.get("spec") == dataclasses.asdict(spec)
            and all(p.is_file() and p.stat().st_size == manifest["bytes"][k] for k, p in files(folder).items())
        ):
            return folder, manifest, True
    with AtomicDir(folder, kind="a synthetic data folder") as tmp:
        manifest = generate(tmp, spec, log)
    return folder, manifest, False


@dataclass
class Options(Spec):
    data_dir: Path = DATA_DIR


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    spec = Spec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Spec)})
    t0 = time.perf_counter()
    folder, manifest, reused = ensure(args.data_dir, spec)
    print(
        json.dumps(
            {
                "folder": str(folder),
                "reused": reused,
                "seconds": round(time.perf_counter() - t0, 2),
                "passages": manifest["passages"],
                "triples": manifest["triples"],
                "queries": manifest["queries"],
                "bytes": sum(manifest["bytes"].values()),
            }
        )
    )
    return manifest


if __name__ == "__main__":
    main()
