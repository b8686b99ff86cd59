r"""BM25 with bm25s: the first stage of re-ranking evaluation, the source of BM25 negatives, and a baseline run.

Scoring: bm25s' variants (Kamphuis et al. 2020), "lucene" by default (k1 = 1.5, b = 0.75):

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)),

summed over the query's tokens as they occur (a repeated query term counts twice, as in Lucene's BooleanQuery
of term clauses), over bm25s' tokenizer rules: lower-cased, tokens `(?u)\b\w\w+\b`, English stopwords removed,
stemmed with PyStemmer's English Snowball stemmer only when PyStemmer is installed (optional; the stemmer, with its
exact version, is part of the cache key). Documents are indexed in sorted doc-id order; a query's ranking holds the
documents with a score > 0 (for lucene, robertson and atire: those sharing at least one term with it), best first,
ties broken by doc id, at most k, so the result does not depend on dict order and is the same in every process.
Scores are bm25s' float32 scores, bit for bit: tests/test_bm25_index.py compares runs with bm25s' own index (the
previous implementation), tests/test_bm25.py scores with an independent float64 BM25.

Index, built once per collection: `<cache_dir>/bm25/index-<digest>/`, digest = SHA-256 of (the collection's content,
tokenizer and stemmer settings, BM25 variant and parameters, bm25s version), not of the queries or k, so every run
over one collection (any split, depth or DDP rank) shares it. The collection's content is its `fingerprint` when it
has one (a DocStore: the SHA-256 of its source files), else a hash of its sorted (id, text) items. The folder holds
bm25s' own save (CSC score matrix `*.csc.index.npy`, `vocab.index.json`, `params.index.json`, the non-occurrence
array of bm25l / bm25+), `doc_ids.npy` (the doc id of each index row) and `manifest.json` (counts, settings, byte
size, SHA-256 and stat of every file: sizes are compared at every load, the bytes when a file's stat moved). It is
loaded with bm25s' `load(mmap=True)`: the arrays stay in the page cache,
shared by every process. A manifest that does not match its files is rebuilt with a warning. The folder is written
as a whole (core.io.AtomicDir), and one process builds while the others wait on `.index-<digest>.lock`
(core.lock.claim), then all load it.

Build memory: the collection is read CHUNK_DOCS documents at a time and tokenised straight into term ids; a chunk's
(term id, tf) pairs go to an unlinked temp file, and what stays in memory is the word -> term vocabulary, the sorted
doc ids and two counts per document. A second pass scores the pairs chunk by chunk and counting-sorts them into the
CSC arrays bm25s saves (8 bytes per distinct (document, term): about 375 MB for 1M passages). No list of the
collection's texts or token strings exists (bm25s' own `index` held both, plus Python lists of every token). Measured
on 1M synthetic MS MARCO-shaped passages held in a 0.6 GB dict: peak process RSS 1.3 GB, against 3.7 GB before.

Runs: `<cache_dir>/bm25/<key>-<digest>.json`, digest = SHA-256 of (collection content, queries, settings, k), on top
of the index, so a repeated evaluation is read back; `<file>.sha256` beside it is its record (bytes, SHA-256,
stat when written: core.digests), and a run that no longer matches it (a same-size edit) is recomputed with a
warning. Written atomically (core.io.atomic_open) by one process while
the others wait on its lock (`.<file>.lock`), as the index is.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.bm25s_lib import bm25s_module, bm25s_submodule, stopwords_en
from core.digests import file_record, record_problem, sidecar_problem, write_sidecar
from core.errors import InputError, check_choice
from core.io import AtomicDir, atomic_open
from core.lock import claim
from core.progress import phase
from core.versions import distribution_version

# bm25s variants (Kamphuis et al. 2020)
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
STOPWORDS = "en"
CACHE_VERSION = 2  # 2: scores kept with the doc ids
INDEX_VERSION = 1
CHUNK_DOCS = 20_000  # documents tokenised (and scored) at a time while building an index
DOC_IDS = "doc_ids.npy"
MANIFEST = "manifest.json"
RANK_BATCH = 4096  # queries handed to the threads at a time
POLL_S = 1.0  # how often a process waiting for another's index or run looks again

_split = re.compile(TOKEN_PATTERN).findall
log = logging.getLogger(__name__)

# (doc id, score) best first
Ranking = list[tuple[str, float]]


@dataclass(frozen=True)
class BM25Params:
    """A BM25 variant and its parameters; the method is checked on construction.

    `method` is one of METHODS, bm25s' variants (Kamphuis et al. 2020); the defaults are Lucene's (k1 = 1.5,
    b = 0.75), which BM25 candidates and negatives use; `model=bm25` sets them from `model.method`, `model.k1` and
    `model.b`. Part of the index's and the run cache's keys.
    """

    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self):
        check_choice("bm25.method", self.method, METHODS)


@dataclass
class BM25Index:
    """A collection's BM25 index: bm25s' retriever and the doc id of each row.

    The retriever holds the CSC score matrix and the vocabulary stem -> term id; the doc ids are sorted (a NumPy array,
    memory-mapped when loaded).
    """

    retriever: Any
    doc_ids: np.ndarray


def _stemmer():
    """(stemmer or None, its name with the exact version, as settings and every record give it)."""
    try:
        import Stemmer  # PyStemmer, optional
    except ImportError:
        return None, "none"
    # PyStemmer has no __version__ (its `version()` is the Snowball library's): the installed distribution's metadata
    # says which release stems, as the other libraries' versions are read (core/versions.py)
    return Stemmer.Stemmer("english"), f"pystemmer-english-{distribution_version('PyStemmer')}"


def stemmer_name() -> str:
    """Return the stemmer BM25 stems with and its exact version (`pystemmer-english-3.1.0`), or `none`."""
    return _stemmer()[1]


def settings(params: BM25Params = BM25Params()) -> dict:
    """Return everything besides the texts that decides a BM25 run: the parameters, tokenizer, stemmer, cache version.

    Written into each run cache file and hashed into its name, so a change of any of them recomputes the run.
    """
    return {
        **asdict(params),
        "token_pattern": TOKEN_PATTERN,
        "lower": True,
        "stopwords": STOPWORDS,
        "stemmer": stemmer_name(),
        "version": CACHE_VERSION,
    }


def _hash_items(h, tag: bytes, items: Mapping[str, str]) -> None:
    h.update(tag)
    for ident in sorted(items):
        i, t = ident.encode("utf-8"), items[ident].encode("utf-8")
        h.update(len(i).to_bytes(8, "little") + i + len(t).to_bytes(8, "little") + t)


def collection_digest(docs: Mapping[str, str]) -> str:
    """Return a SHA-256 digest of the collection's content, the key its BM25 index and runs are cached under.

    Its `fingerprint` when it has one (a DocStore's SHA-256 of its sources, so nothing is read), else a SHA-256 of its
    sorted (id, text) items (read one at a time).
    """
    fp = getattr(docs, "fingerprint", None)
    if isinstance(fp, str):
        return hashlib.sha256(b"fingerprint\0" + fp.encode("utf-8")).hexdigest()
    h = hashlib.sha256(b"items\0")
    _hash_items(h, b"D", docs)
    return h.hexdigest()


def _run_digest(collection: str, queries: Mapping[str, str], k: int, params: BM25Params) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({**settings(params), "k": int(k)}, sort_keys=True).encode())
    h.update(b"D" + collection.encode())
    _hash_items(h, b"Q", queries)
    return h.hexdigest()


def index_settings(params: BM25Params) -> dict:
    """Return `settings` plus the index format's version and bm25s' version: what an index was built with."""
    return {**settings(params), "index_version": INDEX_VERSION, "bm25s": bm25s_module().__version__}


# ---- tokenizer: bm25s.tokenize's rules (tests/test_bm25_index.py checks they give its tokens) ----------------------
def _analyzer() -> tuple[frozenset[str], Callable[[str], str]]:
    """(stop words, stem of a word): words are dropped before stemming, as bm25s.tokenize does."""
    stemmer, _ = _stemmer()
    return stopwords_en(), (stemmer.stemWord if stemmer is not None else str)


def tokenize(texts: list[str]) -> list[list[str]]:
    """Each text's terms (stems), in order, repeats kept: how queries are read."""
    stop, stem = _analyzer()
    return [[stem(w) for w in _split(text.lower()) if w not in stop] for text in texts]


class _Terms(dict):
    """Map word -> term id while an index is built (-1: a stop word).

    A word seen for the first time is stemmed and its stem gets the next id (`stems`: stem -> term id), so a token costs
    one dict lookup.
    """

    def __init__(self):
        stop, self._stem = _analyzer()
        super().__init__(dict.fromkeys(stop, -1))
        self.stems: dict[str, int] = {}

    def __missing__(self, word: str) -> int:
        term = self[word] = self.stems.setdefault(self._stem(word), len(self.stems))
        return term


def _encode(texts: list[str], terms: _Terms) -> tuple[np.ndarray, np.ndarray]:
    """(term ids of a chunk's tokens, int64; the chunk row of each token), stop words dropped."""
    get = terms.__getitem__
    ids: list[int] = []
    counts = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        before = len(ids)
        ids += map(get, _split(text.lower()))
        counts[i] = len(ids) - before
    tok = np.array(ids, dtype=np.int64)
    row = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
    keep = tok >= 0
    return tok[keep], row[keep]


# ---- building -----------------------------------------------------------------------------------------------------
def _pair_scores(
    terms: np.ndarray, tf: np.ndarray, lengths: np.ndarray, idf: np.ndarray, nonocc, avgdl, r
) -> np.ndarray:
    """Return bm25s' score of each (document, term) pair, computed as bm25s' index computes it.

    As in scoring._build_scores_and_indices_for_matrix: its tf scorer called with the document length as a Python int,
    float32 tf and idf, one call per distinct length here (not per document), so the scores are bm25s' to the bit
    under NumPy's promotion rules of any version.
    """
    tfc_fn = bm25s_submodule("scoring")._select_tfc_scorer(r.method)
    out = np.empty(len(tf), dtype=r.dtype)
    order = np.argsort(lengths, kind="stable")
    for seg in np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1):
        if not len(seg):
            continue
        tfc = tfc_fn(tf_array=tf[seg], l_d=int(lengths[seg[0]]), l_avg=avgdl, k1=r.k1, b=r.b, delta=r.delta)
        s = idf[terms[seg]] * tfc
        if nonocc is not None:
            s -= nonocc[terms[seg]]
        out[seg] = s
    return out


def _build_index(docs: Mapping[str, str], params: BM25Params, spill_dir: Path | None = None) -> BM25Index | None:
    """Build the index of `docs` in memory (`_index_passes`), a phase with its progress (core/progress.py)."""
    n = len(docs)
    with phase(f"building the BM25 index ({n:,} passages)", unit="passages", key="building the BM25 index") as ph:
        return _index_passes(docs, params, spill_dir, ph)


def _check_spill(spill, expected: int, spill_dir: Path | None) -> None:
    """Raise OSError (File too large) when the spill file holds fewer bytes than were written to it.

    NumPy's tofile reports a short write of its own, but the tail a buffered write leaves for the close is lost
    silently under a file-size limit or a full disk; read back short, the scoring pass would index past its pairs.
    """
    spill.flush()
    size = os.fstat(spill.fileno()).st_size
    if size != expected:
        where = Path(spill_dir or tempfile.gettempdir()) / "<the BM25 build's temporary spill file>"
        raise OSError(errno.EFBIG, f"the write stopped short, {size} of {expected} bytes written", str(where))


def _index_passes(docs: Mapping[str, str], params: BM25Params, spill_dir: Path | None, ph) -> BM25Index | None:
    """Build the index of `docs` in memory (module docstring: build memory); None when no document has a token.

    Two passes over chunks of CHUNK_DOCS documents in sorted doc-id order. The first tokenises a chunk into its
    (term id, tf) pairs, counts document frequencies and lengths, and spills the pairs to an unlinked temp file in
    `spill_dir` (the system's when None): idf and avgdl need the whole collection before any score, and NumPy's
    freed chunks do not go back to the OS (glibc keeps them), so holding the pairs would cost their 6 bytes each on
    top of the index's 8. The second reads them back, scores them and counting-sorts them into the CSC arrays. `ph`:
    the phase whose stages (tokenising, scoring) count the documents of each pass.
    """
    bm25s, scoring = bm25s_module(), bm25s_submodule("scoring")
    doc_ids = np.array(sorted(docs))
    n = len(doc_ids)
    ph.stage("tokenising", total=n)
    terms = _Terms()
    dl = np.zeros(n, dtype=np.int32)  # tokens per document
    npairs = np.zeros(n, dtype=np.int32)  # distinct terms per document
    df = np.zeros(0, dtype=np.int64)
    tf_types = []  # per chunk, the dtype its tfs were spilled as
    spilled = 0  # bytes written to the spill file
    with tempfile.TemporaryFile(dir=spill_dir) as spill:
        for start in range(0, n, CHUNK_DOCS):
            chunk = doc_ids[start : start + CHUNK_DOCS].tolist()
            tok, row = _encode([docs[d] for d in chunk], terms)
            dl[start : start + len(chunk)] = np.bincount(row, minlength=len(chunk))
            key, tf = np.unique((row << 32) | tok, return_counts=True)  # by document, then term
            del tok, row
            npairs[start : start + len(chunk)] = np.bincount(key >> 32, minlength=len(chunk))
            t = (key & 0xFFFFFFFF).astype(np.int32)
            counts = np.bincount(t)
            if len(counts) > len(df):
                df = np.concatenate([df, np.zeros(len(counts) - len(df), dtype=np.int64)])
            df[: len(counts)] += counts
            tf_types.append(np.uint16 if len(tf) and tf.max() < 1 << 16 else np.uint32)
            t.tofile(spill)
            tf.astype(tf_types[-1]).tofile(spill)
            spilled += t.nbytes + len(tf) * np.dtype(tf_types[-1]).itemsize
            ph.advance(len(chunk))
        _check_spill(spill, spilled, spill_dir)
        nnz, vocab = int(npairs.sum(dtype=np.int64)), len(terms.stems)
        if nnz == 0:
            return None
        df = np.concatenate([df, np.zeros(vocab - len(df), dtype=np.int64)])
        r = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
        dfs = dict(enumerate(df.tolist()))
        avgdl = dl.mean()  # float64, as bm25s' np.array(lengths).mean() (the sum is exact)
        idf_fn = scoring._select_idf_scorer(r.idf_method)
        idf = scoring._build_idf_array(doc_frequencies=dfs, n_docs=n, compute_idf_fn=idf_fn, dtype=r.dtype)
        nonocc = None
        if r.method in r.methods_requiring_nonoccurrence:
            nonocc = scoring._build_nonoccurrence_array(
                doc_frequencies=dfs,
                n_docs=n,
                compute_idf_fn=idf_fn,
                calculate_tfc_fn=scoring._select_tfc_scorer(r.method),
                l_d=avgdl,
                l_avg=avgdl,
                k1=r.k1,
                b=r.b,
                delta=r.delta,
                dtype=r.dtype,
            )
        del dfs
        # CSC (term-major, documents ascending within a term: bm25s' layout), filled by a counting sort per chunk
        indptr = np.zeros(vocab + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        del df
        data = np.empty(nnz, dtype=r.dtype)
        indices = np.empty(nnz, dtype=r.int_dtype)
        heads = indptr[:-1].copy()
        spill.seek(0)
        ph.stage("scoring", total=n)
        for c, start in enumerate(range(0, n, CHUNK_DOCS)):
            m = min(CHUNK_DOCS, n - start)
            ph.advance(m)
            p = int(npairs[start : start + m].sum(dtype=np.int64))
            t = np.fromfile(spill, dtype=np.int32, count=p)
            tf = np.fromfile(spill, dtype=tf_types[c], count=p).astype(np.float32)  # bm25s' tf dtype
            if not p:  # a chunk of token-less documents
                continue
            doc = np.repeat(np.arange(start, start + m, dtype=np.int32), npairs[start : start + m])
            scores = _pair_scores(t, tf, dl[doc], idf, nonocc, avgdl, r)
            order = np.argsort(t, kind="stable")  # by term, documents ascending
            ts = t[order]
            first = np.flatnonzero(np.concatenate(([True], ts[1:] != ts[:-1])))
            run = np.diff(np.append(first, len(ts)))
            pos = heads[ts] + (np.arange(len(ts)) - np.repeat(first, run))
            data[pos] = scores[order]
            indices[pos] = doc[order]
            heads[ts[first]] += run
    r.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n}
    r.vocab_dict = {**terms.stems, "": vocab}  # bm25s' empty token, as its index() adds it
    r.nonoccurrence_array = nonocc
    return BM25Index(r, doc_ids)


def save_index(index: BM25Index, folder: Path, manifest: dict) -> None:
    """Write bm25s' save, the doc ids and the manifest (last: `manifest` plus counts and checksums) into `folder`.

    The folder is written as a whole (core.io.AtomicDir); retrieval.bm25.BM25Index.save writes its folders so too.
    """
    with AtomicDir(folder, marker=MANIFEST, kind="a BM25 index") as tmp:
        index.retriever.save(tmp, show_progress=False)
        np.save(tmp / DOC_IDS, index.doc_ids)
        files = {p.name: file_record(p) for p in sorted(tmp.iterdir())}
        s = index.retriever.scores
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(
                {**manifest, "nnz": len(s["data"]), "num_terms": len(s["indptr"]) - 1, "files": files}, f, indent=1
            )


def load_index(folder: Path, manifest: dict, warn: bool) -> BM25Index | None:
    """Load the index in `folder` when its manifest is `manifest` and its files match it (sizes, SHA-256, shapes).

    None when there is none, or (with a warning when `warn`) when it does not match.
    """
    if not (folder / MANIFEST).is_file():
        return None
    try:
        m = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        problem = None
        if {k: m.get(k) for k in manifest} != manifest:
            problem = "built for other settings or another collection"
        for name, f in sorted(m["files"].items()) if problem is None else ():
            # sizes at every load, the bytes when a file's (size, mtime, inode) moved since it was written
            if (problem := record_problem(folder / name, f)) is not None:
                break
        if problem is None:
            r = bm25s_module().BM25.load(folder, mmap=True, show_progress=False)
            ids = np.load(folder / DOC_IDS, mmap_mode="r")
            s, n = r.scores, manifest["num_docs"]
            shapes = (
                len(ids),
                s["num_docs"],
                len(s["data"]),
                len(s["indices"]),
                len(s["indptr"]),
                int(s["indptr"][-1]),
            )
            if shapes != (n, n, m["nnz"], m["nnz"], m["num_terms"] + 1, m["nnz"]):
                problem = "its arrays' shapes differ from the manifest's"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        problem = f"unreadable: {type(e).__name__}: {e}".replace("\n", " ")
    if problem is not None:
        if warn:
            warnings.warn(f"{folder}: BM25 index is incomplete or damaged ({problem}); rebuilding it", stacklevel=2)
        return None
    return BM25Index(r, ids)


def _once(lock: Path, load: Callable[[bool], Any], make: Callable[[], Any], what: str) -> Any:
    """Return `load(warn)`'s result, else `make()`'s, made by one process at a time.

    The one holding `lock` (core.lock.claim) looks again and makes it; the others wait until the lock is free, then load
    it (once: loading verifies checksums). claim does not wait, hence the polling; a holder that dies releases the lock
    (flock), and a waiter takes over.
    """
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fix = "move the file in its place away" if lock.parent.is_file() else "expected a writable data.cache_dir"
        raise InputError(str(lock.parent), f"cannot create the BM25 cache folder ({e.strerror}); {fix}") from None
    waited = False
    while True:
        got = load(False)
        if got is not None:
            return got
        with claim(lock) as mine:
            if mine:
                got = load(True)  # another process may have made it since
                return got if got is not None else make()
        if not waited:
            log.info("waiting for another process to write %s", what)
            waited = True
        with phase(f"waiting for another process to write {what}", key="waiting for another process"):
            free = False
            while not free:
                time.sleep(POLL_S)
                with claim(lock) as free:
                    pass


_NOTHING = object()  # a collection without a single token: no index, nothing to rank


def bm25_index(
    docs: Mapping[str, str], params: BM25Params = BM25Params(), cache_dir=None, digest: str | None = None
) -> BM25Index | None:
    """Return the index of `docs`: loaded from `<cache_dir>/bm25/index-<digest>/`, or built.

    A built index is saved there when cache_dir is given; None when no document has a token. `digest`: the
    collection_digest, when the caller has it.
    """
    if cache_dir is None:
        return _build_index(docs, params)
    digest = digest or collection_digest(docs)
    want = index_settings(params)
    key = hashlib.sha256(json.dumps(want, sort_keys=True).encode() + b"\0" + digest.encode()).hexdigest()
    folder = Path(cache_dir) / "bm25" / f"index-{key[:24]}"
    manifest = {"collection": digest, "settings": want, "num_docs": len(docs)}

    def make():
        built = _build_index(docs, params, folder.parent)
        if built is None:
            return _NOTHING
        save_index(built, folder, manifest)
        del built
        got = load_index(folder, manifest, warn=True)
        if got is None:
            raise OSError(f"{folder}: the BM25 index just written does not load back")
        return got

    got = _once(
        folder.parent / f".{folder.name}.lock",
        lambda warn: load_index(folder, manifest, warn),
        make,
        f"the BM25 index {folder}",
    )
    return None if got is _NOTHING else got


# ---- retrieval ----------------------------------------------------------------------------------------------------
_SAMPLE_STRIDE = 16


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Return the indices of the k best positive scores, by score desc then index asc (deterministic under ties).

    On a large collection a threshold t > 0 is taken from a strided sample first, the sample's 2k/stride-th best, so
    that about 2k scores are >= t; when at least k are, they hold the k-th best score and all its ties, and only they
    are partitioned (a full partition of 1M scores costs ~12 ms, this ~2 ms). Otherwise every positive score is.
    """
    cand = None
    if len(scores) > 8 * _SAMPLE_STRIDE * k:
        sample = scores[::_SAMPLE_STRIDE]
        j = min(len(sample), 2 * (k // _SAMPLE_STRIDE) + 8)
        t = np.partition(sample, len(sample) - j)[len(sample) - j]
        if t > 0:
            above_t = np.flatnonzero(scores >= t)
            if len(above_t) >= k:
                cand = above_t
    if cand is None:
        cand = np.flatnonzero(scores > 0)
    if len(cand) > k:
        vals = scores[cand]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]  # the k-th largest score
        above = cand[vals > kth]
        ties = cand[vals == kth][: k - len(above)]
        cand = np.concatenate([above, ties])
    return cand[np.lexsort((cand, -scores[cand]))]


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank(index: BM25Index, queries: Mapping[str, str], k: int) -> dict[str, Ranking]:
    """Rank `index` for every query: qid -> up to k (doc id, score), best first.

    Queries run in parallel threads (NumPy's scoring and selection release the GIL). Each query's scores are bm25s'
    get_scores_from_ids (float32, its terms added in query order, a repeated term twice); bm25s' retrieve is not used:
    it returns exactly k documents, zero scores included, with ties in no defined order.
    """
    r, doc_ids, vocab = index.retriever, index.doc_ids, index.retriever.vocab_dict
    qids = list(queries)
    wanted = [[vocab[t] for t in toks if t and t in vocab] for toks in tokenize([queries[q] for q in qids])]
    names: dict[int, str] = {}  # one str per ranked document, shared by the rankings (7M results of 1M documents)

    def one(ids: list[int]) -> Ranking:
        if not ids:
            return []
        scores = r.get_scores_from_ids(ids)
        top = _top_k(scores, int(k))
        shared = [names.setdefault(i, d) for i, d in zip(top.tolist(), doc_ids[top].tolist())]
        return list(zip(shared, scores[top].tolist()))

    out: dict[str, Ranking] = {}
    with (
        phase(f"BM25 search ({len(qids):,} queries)", total=len(qids), unit="queries", key="BM25 search") as ph,
        ThreadPoolExecutor(max_workers=min(_threads(), max(1, len(qids)))) as pool,
    ):
        for s in range(0, len(qids), RANK_BATCH):  # map() submits every task at once: bounded for 500k queries
            out.update(zip(qids[s : s + RANK_BATCH], pool.map(one, wanted[s : s + RANK_BATCH])))
            ph.advance(len(qids[s : s + RANK_BATCH]))
    return out


def compute_bm25_run(
    docs: Mapping[str, str],
    queries: Mapping[str, str],
    k: int,
    params: BM25Params = BM25Params(),
    cache_dir=None,
    digest: str | None = None,
) -> dict[str, Ranking]:
    """Rank the collection for every query without a run cache: qid -> [(doc id, score)].

    Uses the collection's index (bm25_index: saved under cache_dir and reused, or in memory only when cache_dir is
    None).
    """
    if not len(docs) or not queries or k <= 0:
        return {q: [] for q in queries}
    index = bm25_index(docs, params, cache_dir, digest)
    if index is None:  # only stopwords / one-letter tokens: nothing can match
        return {q: [] for q in queries}
    return rank(index, queries, k)


class _Stale(Exception):
    """A cached run whose record says it changed since it was written."""


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key))[:80] or "bm25"


def _run_path(digest: str, queries, k: int, cache_dir, key: str, params: BM25Params) -> Path:
    return Path(cache_dir) / "bm25" / f"{_safe(key)}-{_run_digest(digest, queries, k, params)[:24]}.json"


def cache_path(
    docs: Mapping[str, str], queries: Mapping[str, str], k: int, cache_dir, key: str, params: BM25Params = BM25Params()
) -> Path:
    """Return the file `bm25_run` caches this run in: `<cache_dir>/bm25/<key>-<digest>.json` (module docstring)."""
    return _run_path(collection_digest(docs), queries, k, cache_dir, key, params)


def _write_run(f, expected: dict, result: dict[str, Ranking]) -> None:
    """Write a run cache file, {"settings": ..., "run": {qid: [[doc id, score], ...]}}, to the open file `f`.

    One query at a time with json.dumps: json.dump encodes in pure Python (its C encoder serves dumps only), 3x slower
    on a 1,000-query run.
    """
    f.write('{"settings":' + json.dumps(expected, separators=(",", ":")) + ',"run":{')
    for i, (qid, ranking) in enumerate(result.items()):
        f.write(("," if i else "") + json.dumps(qid) + ":" + json.dumps(ranking, separators=(",", ":")))
    f.write("}}")


def bm25_run(
    docs: Mapping[str, str],
    queries: Mapping[str, str],
    k: int,
    cache_dir=None,
    key: str = "bm25",
    params: BM25Params = BM25Params(),
    *,
    digest: str | None = None,
    compute: Callable[[], dict[str, Ranking]] | None = None,
) -> dict[str, Ranking]:
    """Return qid -> up to k (doc id, BM25 score), best first, cached on disk under cache_dir.

    cache_dir None: no cache, the index built in memory; `key` names the run's cache file (e.g. "squad-val"), the digest
    makes it specific to the inputs; the collection's index is shared by every run over it. `digest`: the
    collection_digest of `docs`, when the caller has it; `compute`: what ranks the queries when the run is not cached
    (default: compute_bm25_run over the collection's index; retrieval.bm25.BM25Index ranks with the index it holds).
    """
    if cache_dir is None:
        return compute() if compute is not None else compute_bm25_run(docs, queries, k, params)
    digest = digest or collection_digest(docs)
    path = _run_path(digest, queries, k, cache_dir, key, params)
    expected = {**settings(params), "k": int(k)}

    def load(warn: bool):
        """Return the cached run when it is sound: readable JSON, this run's settings and queries, finite scores.

        Else None (`warn`: say what was wrong before it is recomputed and overwritten).
        """
        if not path.exists():
            return None
        try:
            problem = sidecar_problem(path)  # its record: a same-size edit is found (the bytes, when the stat moved)
            if problem is not None:
                raise _Stale(problem)
            with open(path, encoding="utf-8") as f:
                payload = json.load(f)
            run = payload["run"]
            if payload.get("settings") != expected:
                problem = "its settings differ"
            elif set(run) != set(queries):
                problem = f"it holds {len(run)} ranked queries, not the {len(queries)} asked for"
            else:  # popped: one copy in memory
                got = {q: [(str(d), float(s)) for d, s in run.pop(q)] for q in queries}
                bad = next((q for q, r in got.items() if not all(np.isfinite(s) for _, s in r)), None)
                if bad is None:
                    return got
                problem = f"query '{bad}' has a non-finite score"
        except _Stale as e:
            problem = str(e)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            problem = f"it is unreadable ({type(e).__name__})"  # truncated, garbled or foreign
        if warn:
            warnings.warn(f"BM25 run cache '{path}': {problem}; recomputing it", stacklevel=2)
        return None

    def make():
        result = compute() if compute is not None else compute_bm25_run(docs, queries, k, params, cache_dir, digest)
        with atomic_open(path) as f:
            _write_run(f, expected, result)
        write_sidecar(path)  # after it: a reader that finds no record waits on the lock and reads again
        return result

    return _once(path.parent / f".{path.name}.lock", load, make, f"the BM25 run {path}")


def no_candidates_warning(where: str, qids: list[str], why: str = "no query term occurs in the collection") -> str:
    """Return the one-line warning listing the judged queries that have no candidate; "" when there are none.

    BM25 finds none of their terms in the collection (e.g. a query of punctuation only). Such queries score 0 on every
    measure and have no line in run.trec, which is what `trec_eval -c` does with them; trec_eval without -c leaves them
    out of its means. `why`: for candidates from a given run, that the run ranks nothing for them. The caller warns
    (once, on rank 0).
    """
    if not qids:
        return ""
    shown = ", ".join(repr(q) for q in qids[:20]) + (f" and {len(qids) - 20} more" if len(qids) > 20 else "")
    return (
        f"{where}: {len(qids)} judged quer{'y has' if len(qids) == 1 else 'ies have'} no candidate ({why}): "
        f"{shown}; scored 0 on every measure and absent from run.trec (as trec_eval -c "
        f"counts them)"
    )


def bm25_candidates(
    docs: Mapping[str, str], queries: Mapping[str, str], k: int, cache_dir=None, key: str = "bm25"
) -> dict[str, list[str]]:
    """Qid -> up to k doc ids (BM25 top-k with the default parameters, best first), cached as `bm25_run`."""
    return {q: [d for d, _ in ranking] for q, ranking in bm25_run(docs, queries, k, cache_dir, key).items()}
