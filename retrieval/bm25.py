"""BM25 (bm25s) as a first-stage retriever: `BM25Index`, and full-collection runs evaluated with trec_eval semantics.

    index = BM25Index.build(None, docs, method="lucene", k1=1.5, b=0.75, cache_dir=".cache")
    run = index.search(queries, k=1000)                         # {qid: {doc id: score}}
    index.save("outputs/x/bm25-index"); BM25Index.load("outputs/x/bm25-index")

    python evaluate.py model=bm25 data=cranfield output_dir=outputs/bm25-cranfield [model.split=all] [model.depth=1000]
                       [model.method=lucene] [model.k1=1.5] [model.b=0.75]

Any data source (`data=vaswani`, `data=tsv data.collection=...`, `data=ir_datasets ...`, folds with
`data.num_folds=5 data.fold=k`). `model.split` picks the queries: `train`, `val`, `test` (default, the split neural
rankers are tested on, so rows compare) or `all` (every judged query of every split, the usual setting for published
BM25 figures on the classic collections). Writes into `output_dir`, as evaluate.py does: `run.trec`,
`per_query.json` and `metrics.json` (means over `eval.measures`, plus the BM25 settings); metrics.json last,
atomically, so the experiment runner treats the folder as a finished cell. Scoring and tie-breaking:
datamodules/bm25.py; the config keys and the registration as `model=bm25`: retrieval/first_stage.py (`BM25Config`).

`BM25Index` is the ``bm25`` family of the one index interface (`retrieval.base.Index`), a first-stage family: it
takes no ranker (`build(None, docs)`). It holds one collection's index of datamodules/bm25.py, the one BM25
implementation (which BM25 candidates and negatives use too): its scores, tokenizer, cache and on-disk format.
- `build(None, docs, method=, k1=, b=, cache_dir=)`: names the collection's index, opened on first use: loaded from
  `<cache_dir>/bm25/index-<digest>/`, or built (and saved there when `cache_dir` is given). A run read back from the
  run cache needs no index, as before.
- `search(queries, k, cache_key=)`: the ranking of datamodules.bm25.rank; with `cache_key` and a `cache_dir`, the run is
  cached as `<cache_dir>/bm25/<cache_key>-<digest>.json` (datamodules.bm25.bm25_run), as `model=bm25` caches it.
- `save(path)` writes the cache's folder format (bm25s' files, `doc_ids.npy`, `manifest.json` with sizes and
  checksums) plus the interface's manifest keys (`format`, `family`, `params`, `checkpoint`); `load(path)` reads
  such a folder, or a cache folder `index-<digest>/` itself (its manifest has no `format`), after checking its files
  and that it was tokenised as this version tokenises queries.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

import datamodules.bm25 as bm25_lib
from core.errors import InputError
from datamodules.bm25 import BM25Params, no_candidates_warning, settings, stemmer_name
from datamodules.config import empty_split
from datamodules.corpus import SPLITS
from datamodules.sources import data_config, load_dataset, used_splits
from metrics.ir import evaluate_run
from metrics.results import write_result_dir
from retrieval.base import Index, Run, read_manifest, register_index, sampled_queries

__all__ = ["BM25Index", "split_queries", "run_bm25"]

FORMAT, VERSION = "isorank-bm25-index", 1
# settings a saved index must share with this version: they decide how queries are tokenised against its vocabulary
TOKENIZER_SETTINGS = ("token_pattern", "lower", "stopwords", "stemmer", "index_version")
_UNOPENED = object()


@register_index
class BM25Index(Index):
    """BM25 (bm25s) over a collection: the first-stage ``bm25`` family of `retrieval.base.Index`, no ranker.

    Parameters
    ----------
    manifest : dict
        ``format``, ``family``, ``params`` (method, k1, b), ``checkpoint`` (None), ``collection`` (its digest; None
        until needed), ``settings`` (datamodules.bm25.index_settings) and ``num_docs``.
    bm25 : datamodules.bm25.BM25Index or None
        The open index (None: no document has a token); left out, it is opened on first use from `docs`.
    docs : Mapping or None
        The collection, for an index opened on first use.
    cache_dir : str, PathLike or None
        Where the collection's index (and runs searched with a `cache_key`) are cached; None: built in memory.
    """

    family = "bm25"
    format = FORMAT
    needs_ranker = False
    serves = "no ranker"
    build_options = ("method", "k1", "b", "cache_dir")
    search_options = ("cache_key",)
    load_options = ()

    def __init__(self, manifest: dict, bm25=_UNOPENED, docs: Mapping[str, str] | None = None, cache_dir=None):
        self.manifest, self._bm25, self.docs, self.cache_dir = manifest, bm25, docs, cache_dir
        self.ranker = self.pair_tokenizer = None

    def __len__(self) -> int:
        return int(self.manifest["num_docs"])

    @property
    def bm25_params(self) -> BM25Params:
        """The BM25 variant and parameters (the manifest's ``params``)."""
        return BM25Params(**self.params)

    @property
    def digest(self) -> str:
        """The collection's digest (datamodules.bm25.collection_digest), computed on first use."""
        if self.manifest.get("collection") is None:
            self.manifest["collection"] = bm25_lib.collection_digest(self.docs)
        return self.manifest["collection"]

    @property
    def bm25(self):
        """The open datamodules.bm25.BM25Index (None when no document has a token): loaded or built on first use."""
        if self._bm25 is _UNOPENED:
            digest = self.digest if self.cache_dir is not None else None
            self._bm25 = (
                bm25_lib.bm25_index(self.docs, self.bm25_params, self.cache_dir, digest) if len(self.docs) else None
            )
        return self._bm25

    @classmethod
    def build(
        cls,
        ranker,
        docs: Mapping[str, str] | Iterable,
        *,
        method: str = "lucene",
        k1: float = 1.5,
        b: float = 0.75,
        cache_dir: str | os.PathLike | None = None,
    ) -> BM25Index:
        """Return the BM25 index of `docs` ({doc id: text}, or (id, text) pairs), opened on first use.

        `ranker` must be None. `method`, `k1`, `b`: datamodules.bm25.BM25Params. `cache_dir`: the index is loaded from
        `<cache_dir>/bm25/index-<digest>/`, or built and saved there (None: built in memory).
        """
        cls.check_ranker(ranker)
        params = BM25Params(method, k1, b)
        docs = docs if isinstance(docs, Mapping) else dict(docs)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "family": cls.family,
            "ranker": None,
            "checkpoint": None,
            "params": asdict(params),
            "collection": None,
            "settings": bm25_lib.index_settings(params),
            "num_docs": len(docs),
        }
        return cls(manifest, docs=docs, cache_dir=cache_dir)

    def _rank(self, queries: Mapping[str, str], k: int) -> dict[str, bm25_lib.Ranking]:
        if not queries:
            return {}
        index = self.bm25
        if index is None:  # only stopwords / one-letter tokens: nothing can match
            return {q: [] for q in queries}
        return bm25_lib.rank(index, queries, k)

    def search(self, queries: Mapping[str, str], k: int = 100, *, cache_key: str | None = None) -> Run:
        """Return the top-k documents (score > 0) of every query, best first, ties by doc id: {qid: {doc id: score}}.

        `cache_key`: with a `cache_dir`, the run is read from or written to the run cache under this name.
        """
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InputError("k", f"is {k!r}; expected a positive integer")
        if self.cache_dir is not None and cache_key is not None:
            rankings = bm25_lib.bm25_run(
                self.docs,
                queries,
                k,
                self.cache_dir,
                cache_key,
                self.bm25_params,
                digest=self.digest,
                compute=lambda: self._rank(queries, k),
            )
        else:
            rankings = self._rank(queries, k)
        return {q: dict(r) for q, r in rankings.items()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index directory `path` as a whole (the cache's folder format, module docstring); return it."""
        index = self.bm25
        if index is None:
            raise InputError("docs", "no document has a token; a BM25 index of them holds nothing to save")
        path = Path(path)
        manifest = {**self.manifest, "collection": self.digest}
        bm25_lib.save_index(index, path, manifest)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, ranker=None) -> BM25Index:
        """Read a folder that `save` wrote, or a cache folder `<cache_dir>/bm25/index-<digest>/`, checked.

        Raises
        ------
        InputError
            Not a BM25 index folder, another tokenizer than this version's, or files that do not match the manifest.
        """
        cls.check_ranker(ranker)
        path = Path(path)
        m = read_manifest(path, None)
        legacy = "format" not in m and {"collection", "settings", "num_docs"} <= m.keys()  # a cache folder
        if not legacy and m.get("format") != FORMAT:
            raise InputError(str(path / "manifest.json"), f"format is {m.get('format')!r}; expected '{FORMAT}'")
        try:
            s = m["settings"]
            params = BM25Params(s["method"], s["k1"], s["b"])
        except (KeyError, TypeError) as e:
            raise InputError(str(path / "manifest.json"), f"no BM25 settings ({type(e).__name__}: {e})") from e
        want = bm25_lib.index_settings(params)
        for key in TOKENIZER_SETTINGS:
            if s.get(key) != want[key]:
                raise InputError(
                    str(path),
                    f"was built with {key} {s.get(key)!r}, this version reads queries with {want[key]!r}; rebuild it",
                )
        index = bm25_lib.load_index(path, {k: m[k] for k in ("collection", "settings", "num_docs")}, warn=False)
        if index is None:
            raise InputError(str(path), "its files do not match its manifest (incomplete or damaged); rebuild it")
        manifest = {
            **m,
            "format": FORMAT,
            "family": cls.family,
            "ranker": None,
            "checkpoint": None,
            "params": asdict(params),
        }
        return cls(manifest, index)


def split_queries(ds, split: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Return (queries, qrels) of one split, or of all splits together for `all`."""
    if split != "all":
        s = ds.split(split)
        return dict(s.queries), dict(s.qrels)
    queries, qrels = {}, {}
    for name in SPLITS:
        if name in ds.splits:
            queries.update(ds.splits[name].queries)
            qrels.update(ds.splits[name].qrels)
    return queries, qrels


_DEFAULT_PARAMS = BM25Params()


def run_bm25(cfg, split: str = "test", k: int = 1000, params: BM25Params = _DEFAULT_PARAMS) -> dict[str, float]:
    """Rank the whole collection for `split`'s queries (`model.split`), keeping the top `k` (`model.depth`).

    Evaluates the run and writes it into `cfg.output_dir` (see the module docstring); returns the metric means.
    """
    if split not in (*SPLITS, "all"):
        raise InputError("config key 'model.split'", f"got '{split}'; expected one of {[*SPLITS, 'all']}")
    if k <= 0:
        raise InputError("config key 'model.depth'", f"is {k}; expected a positive number of documents per query")
    dc = data_config(cfg)
    ds = load_dataset(dc, cfg.seed, used_splits(split))  # validated before anything is written
    queries, qrels = split_queries(ds, split)
    queries, qrels = sampled_queries(ds, split, queries, qrels, dc, cfg.seed, "model.split")
    judged = sum(1 for q in qrels if any(g > 0 for g in qrels[q].values()))
    if not judged:
        raise empty_split(
            dc, split, f"has no judged query to evaluate ({len(queries)} queries, none with a relevant document)"
        )
    index = BM25Index.build(None, ds.docs, **asdict(params), cache_dir=dc.cache_dir)
    run = index.search(queries, k, cache_key=f"{ds.name}-{split}-run")
    empty = [q for q in sorted(queries) if not run[q] and any(g > 0 for g in qrels.get(q, {}).values())]
    if empty:
        warnings.warn(no_candidates_warning(f"model=bm25, split '{split}'", empty), stacklevel=2)
    means, per_query = evaluate_run(run, qrels, list(cfg.eval.measures))
    write_result_dir(
        cfg.output_dir,
        {
            **means,
            "bm25": {
                **settings(params),
                "split": split,
                "k": k,
                "docs": len(index),
                "queries": len(queries),
                "judged_queries": judged,
            },
        },
        per_query,
        run,
        tag=f"bm25-{params.method}",
        config=OmegaConf.to_yaml(cfg),
        versions={"stemmer": stemmer_name()},
    )
    return means
