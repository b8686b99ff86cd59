"""One interface for every full-ranking index: `Index`, the `INDEXES` registry of index families, and their checks.

    cls = index_for(ranker)                                 # by capabilities_of(ranker).index: DenseIndex, ColBERTIndex
    index = cls.build(ranker, docs, **cls.options("build", offered))
    run = index.search(queries, k=100)                      # {qid: {doc id: score}}
    path = index.save("outputs/x/index")
    index = cls.load(path)                                  # no ranker: re-opened from the recorded checkpoint
    index = open_index(path)                                # any family, by the manifest's format

    index = index_class("bm25").build(None, docs)           # BM25: a first-stage family, no ranker

Every index family (as Lightning IR's indexer / searcher and PyLate's index base) is a subclass of `Index` that
declares, as class attributes:

- `family`: its name in the `INDEXES` registry; for a ranker's index the name `RankerCapabilities.index` uses
  (``"dense"``, ``"colbert"``), for a first-stage index one of its own (``"bm25"``);
- `format`: the ``format`` string of its ``manifest.json``, which `load` checks;
- `needs_ranker`: whether it indexes a ranker's encodings (False: BM25, whose `build` takes ``None``);
- `encoding`: what `retrieval.encode.encode_docs` yields for it (``"sequence"``, ``"tokens"``; None: nothing);
- `build_options`, `search_options`, `load_options`: every keyword argument its `build`, `search` and `load` take,
  so a caller offering many (retrieval/retrieve.py) passes each family its own (`Index.options`).

and implements `build` (classmethod), `search`, `save`, `load` (classmethod) and `__len__`. The base holds what is
the same for all: the manifest (`format`, `params`, `checkpoint`), reading manifests (`read_manifest`) and doc-id
files (`read_doc_ids`, `record_doc_ids`), the ranker checks (`check_ranker`: the ranker's index family is this one;
`check_ranker_matches`: it is the ranker the manifest records), `ensure_ranker` (an index loaded without a ranker
re-opens its recorded checkpoint with `models.loading.load_ranker`) and `from_checkpoint` (load a checkpoint's ranker,
index `docs` with it).

Adding a family: subclass `Index` in a module of `retrieval/`, set the attributes above, implement the five methods,
decorate the class with `@register_index`, and import the module in `retrieval/__init__.py` (so that importing
`retrieval` registers it). tests/test_index_interface.py checks every registered family against this contract.
"""

from __future__ import annotations

import inspect
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sized
from pathlib import Path
from typing import Any, ClassVar, Literal

from core.errors import InputError
from core.progress import phase
from core.registry import Registry
from models.loading import load_ranker, pair_tokenizer_for
from models.rankers import rankers_with
from models.rankers.capabilities import capabilities_of

__all__ = [
    "sampled_queries",
    "ENCODING_OPTIONS",
    "INDEXES",
    "Index",
    "Run",
    "register_index",
    "index_class",
    "index_for",
    "open_index",
    "read_manifest",
    "read_doc_ids",
    "record_doc_ids",
    "check_ranker_matches",
    "build_phase",
    "search_phase",
]

Run = dict[str, dict[str, float]]  # {qid: {doc id: score}}, the pipeline's run form

# family -> its Index subclass (the entry's `build`); filled by @register_index when retrieval is imported
INDEXES: Registry = Registry("index family")
# the `build` keywords of every family that encodes the collection with a ranker (retrieval/encode.py's options)
ENCODING_OPTIONS = ("pair_tokenizer", "batch_size", "device", "precision", "sort_window", "checkpoint", "encoded")


# ---- shared checks ----------------------------------------------------------------------------------------------
def sampled_queries(ds, split: str, queries: dict, qrels: dict, dc, seed: int, split_key: str) -> tuple[dict, dict]:
    """Return (queries, qrels) restricted to the questions a re-ranker's evaluation of `split` scores.

    The sample of `data.max_eval_queries` (`datamodules.corpus.IRDataset.eval_sample`), so that a grid's BM25 or
    dense row is scored on its re-rankers' questions. Unset: everything as given. Set for another split (`split_key`
    names the key that chose it): an InputError, since no such sample exists.
    """
    keep = ds.eval_sample(split, dc, seed, split_key)
    if keep is None:
        return queries, qrels
    return {q: queries[q] for q in keep}, {q: qrels[q] for q in keep}


def read_manifest(path: str | os.PathLike, fmt: str | None) -> dict:
    """Return the `manifest.json` of the index directory `path`, checked to be a JSON object of format `fmt`.

    Parameters
    ----------
    path : str or PathLike
        The index directory.
    fmt : str or None
        The ``format`` it must record; None accepts any (the caller checks).

    Raises
    ------
    InputError
        No manifest (not an index directory), an unreadable one, or another format, naming the path.
    """
    mpath = Path(path) / "manifest.json"
    if not mpath.is_file():
        raise InputError(str(path), "is not an index directory (no manifest.json)")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(str(mpath), f"unreadable manifest ({type(e).__name__}: {e})") from e
    if not isinstance(manifest, dict) or (fmt is not None and manifest.get("format") != fmt):
        raise InputError(
            str(mpath),
            f"format is {manifest.get('format') if isinstance(manifest, dict) else None!r}; expected '{fmt}'",
        )
    return manifest


def read_doc_ids(path: Path, count: int) -> list[str]:
    """Return the doc ids of a `doc_ids.json` (row -> doc id), which must hold `count` of them (the manifest's)."""
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(str(path), f"unreadable doc ids ({type(e).__name__}: {e})") from e
    if not isinstance(ids, list) or len(ids) != count:
        raise InputError(
            str(path), f"holds {len(ids) if isinstance(ids, list) else 'no list of'} doc ids; the manifest says {count}"
        )
    return [str(i) for i in ids]


def record_doc_ids(ids, doc_ids: list[str], seen: set[str]) -> None:
    """Append an encoded batch's ids (as strings) to `doc_ids`, the index's row -> doc id map.

    A repeated id (tracked in `seen`) is an input error: two rows could not be told apart in a run.
    """
    for i in ids:
        s = str(i)
        if s in seen:
            raise InputError("docs", f"duplicate doc id '{s}'")
        seen.add(s)
        doc_ids.append(s)


def build_phase(docs, family: str, encoding: bool):
    """Return the phase (core/progress.py) of an index build over `docs`, counting passages: `advance(len(ids))`.

    `encoding`: the build encodes the passages itself (else it indexes the batches of a split encoding).
    """
    n = len(docs) if isinstance(docs, Sized) else None
    verb = "encoding and indexing" if encoding else "indexing"
    size = f"{n:,} passages" if n is not None else "the collection"
    return phase(f"{verb} {size} ({family} index)", total=n, unit="passages", key=f"{verb} the collection")


def search_phase(queries, family: str):
    """Return the phase (core/progress.py) of a search for `queries`, counting queries: `advance(len(qids))`."""
    n = len(queries) if isinstance(queries, Sized) else None
    size = f"{n:,} queries" if n is not None else "the queries"
    return phase(f"{family} search ({size})", total=n, unit="queries", key=f"{family} search")


def check_ranker_matches(ranker, manifest: dict, path) -> None:
    """Check that `ranker` (None: nothing to check) is the ranker the index at `path` was built with, by name."""
    if ranker is not None and ranker.cfg.name != manifest["ranker"]:
        raise InputError(
            "ranker", f"index '{path}' was built with ranker '{manifest['ranker']}', got '{ranker.cfg.name}'"
        )


def _name(ranker) -> str:
    return getattr(getattr(ranker, "cfg", None), "name", type(ranker).__name__)


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _same_class(a: type, b: type) -> bool:
    """Tell whether `a` and `b` are one source definition imported twice (as `core.registry` tells functions)."""
    try:
        return a.__qualname__ == b.__qualname__ and inspect.getfile(a) == inspect.getfile(b)
    except TypeError:  # a class without a source file
        return False


# ---- the base -----------------------------------------------------------------------------------------------------
class Index(ABC):
    """A full-ranking index over a collection: build, search, save, load (module docstring).

    Attributes
    ----------
    family : str
        The index family, its name in `INDEXES` (for a ranker's index, `RankerCapabilities.index`).
    format : str
        The ``format`` of its ``manifest.json``.
    needs_ranker : bool
        Whether it indexes a ranker's encodings; False for a first-stage index (BM25).
    serves : str
        What it indexes, for errors (``"a single-vector ranker"``).
    encoding : str or None
        The `encode_docs` output it indexes (``"sequence"``, ``"tokens"``), None when it encodes nothing.
    build_options, search_options, load_options : tuple of str
        Every keyword argument its `build`, `search` and `load` take (`options` picks them).
    manifest : dict
        What the index is: ``format``, ``params`` (as built), ``checkpoint`` (the ranker's, or None), and the
        family's own fields; saved as ``manifest.json``.
    ranker : nn.Module or None
        The ranker that encodes queries (None until needed for an index loaded without one; always None for BM25).
    pair_tokenizer : PairTokenizer or None
        The ranker's tokenizer.
    """

    family: ClassVar[str]
    format: ClassVar[str]
    needs_ranker: ClassVar[bool] = True
    serves: ClassVar[str] = "a ranker"
    encoding: ClassVar[str | None] = None
    build_options: ClassVar[tuple[str, ...]] = ()
    search_options: ClassVar[tuple[str, ...]] = ()
    load_options: ClassVar[tuple[str, ...]] = ()

    manifest: dict
    ranker: Any = None
    pair_tokenizer: Any = None

    # -- the contract
    @classmethod
    @abstractmethod
    def build(cls, ranker, docs: Mapping | Iterable, **options) -> Index:
        """Index `docs` ({doc id: text}, or (id, text) pairs where the family streams) with `ranker` (None: BM25)."""

    @abstractmethod
    def search(self, queries: Mapping[str, str], k: int = 100, **options) -> Run:
        """Return the top `k` documents of every query: a run {qid: {doc id: score}}, best first."""

    @abstractmethod
    def save(self, path: str | os.PathLike) -> Path:
        """Write the index directory `path` (its files and ``manifest.json``) as a whole; return its path."""

    @classmethod
    @abstractmethod
    def load(cls, path: str | os.PathLike, ranker=None, **options) -> Index:
        """Read an index directory that `save` wrote (or the same format's older writes)."""

    @abstractmethod
    def __len__(self) -> int:
        """Return the number of indexed documents."""

    # -- the manifest
    @property
    def params(self) -> dict:
        """The index's parameters as built (the manifest's, so changes of search parameters are saved)."""
        return self.manifest["params"]

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint of the ranker the index was built with, as the manifest records it (None: not recorded)."""
        return self.manifest.get("checkpoint")

    @classmethod
    def read_manifest(cls, path: str | os.PathLike) -> dict:
        """Return the manifest of the index directory `path`, checked to be of this family's format."""
        return read_manifest(path, cls.format)

    # -- options
    @classmethod
    def options(cls, stage: Literal["build", "search", "load"], offered: Mapping[str, Any]) -> dict[str, Any]:
        """Return the keyword arguments among `offered` that this family's `stage` method takes (its declaration).

        Examples
        --------
        >>> from retrieval.colbert_e2e import ColBERTIndex
        >>> ColBERTIndex.options("search", {"batch_size": 8, "k_tokens": 64, "depth": 100, "store_dtype": "float32"})
        {'batch_size': 8, 'k_tokens': 64, 'depth': 100}
        """
        declared = {"build": cls.build_options, "search": cls.search_options, "load": cls.load_options}[stage]
        return {k: v for k, v in offered.items() if k in declared}

    # -- the ranker
    @classmethod
    def check_ranker(cls, ranker) -> None:
        """Check that this family serves `ranker`: its capabilities' index family is `family` (BM25: no ranker).

        Raises
        ------
        InputError
            On ``model.name``, naming the family that does serve it.
        """
        if not cls.needs_ranker:
            if ranker is not None:
                raise InputError("ranker", f"the {cls.family} index takes no ranker; got '{_name(ranker)}'")
            return
        family = capabilities_of(ranker).index
        if family == cls.family:
            return
        name = _name(ranker)
        hint = f"; for {name} use {_where(INDEXES.get(family).build)}" if family in INDEXES else ""
        serves = " and ".join(rankers_with(lambda c: c.index == cls.family))
        raise InputError(
            "model.name",
            f"'{name}' is not {cls.serves} (its index family is {family}); {cls.__name__} serves {serves}{hint}",
        )

    def ensure_ranker(self):
        """Return the ranker that encodes queries, loading it if needed (None for a family without one).

        That is the one given, else the one re-read with `models.loading.load_ranker` from the checkpoint the
        manifest records (checked against the manifest); its pair tokenizer likewise.
        """
        if not self.needs_ranker:
            return None
        if self.ranker is None:
            ckpt = self.checkpoint
            if not ckpt:
                raise InputError(
                    "ranker",
                    "this index was loaded without a ranker and records no checkpoint; "
                    f"pass ranker= to {type(self).__name__}.load",
                )
            self.ranker = load_ranker(ckpt, key="checkpoint").ranker
            check_ranker_matches(self.ranker, self.manifest, ckpt)
        if self.pair_tokenizer is None:
            self.pair_tokenizer = pair_tokenizer_for(self.ranker)
        return self.ranker

    @classmethod
    def from_checkpoint(cls, ckpt_path: str | os.PathLike, docs: Mapping | Iterable, *, device=None, **opts) -> Index:
        """Load the ranker of a checkpoint (`models.loading.load_ranker`) and index `docs` with it.

        Parameters
        ----------
        ckpt_path : str or PathLike
            A checkpoint file of train.py (or a head checkpoint, or an export folder); recorded in the manifest.
        docs : Mapping or Iterable
            The collection, as `build` takes it.
        device : str, torch.device or None
            Where the ranker encodes.
        **opts
            `build`'s other keyword arguments (batch_size, precision, index_type, ...).
        """
        if not cls.needs_ranker:
            raise InputError("ckpt", f"the {cls.family} index takes no checkpoint; build it with {cls.__name__}.build")
        if not Path(ckpt_path).exists():  # no model config here: a hub id is not meant, only a file or an export
            raise InputError("ckpt", f"checkpoint '{ckpt_path}' does not exist")
        ranker, tokenizer, _ = load_ranker(ckpt_path, key="ckpt", device=device)
        return cls.build(ranker, docs, pair_tokenizer=tokenizer, device=device, checkpoint=str(ckpt_path), **opts)


# ---- the registry -------------------------------------------------------------------------------------------------
def register_index(cls: type[Index]) -> type[Index]:
    """Register the Index subclass `cls` in `INDEXES` under its `family` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Index)):
        raise TypeError(f"{cls!r} is not an Index subclass")
    if cls.family in INDEXES and _same_class(INDEXES.get(cls.family).build, cls):
        return cls  # the same class imported twice (python -m retrieval.x): the first one stays
    INDEXES.register(cls.family)(cls)
    return cls


def index_class(family: str, where: str = "index family") -> type[Index]:
    """Return the Index subclass registered for `family`; an unknown one is an InputError at `where`.

    Examples
    --------
    >>> import retrieval
    >>> index_class("colbert").__name__, INDEXES.names()
    ('ColBERTIndex', ['bm25', 'colbert', 'dense'])
    """
    return INDEXES.get(family, where).build


def index_for(ranker) -> type[Index]:
    """Return the index class that serves `ranker`: the `INDEXES` entry of `capabilities_of(ranker).index`.

    Raises
    ------
    InputError
        On ``model.name`` when the ranker declares no index family (a cross-encoder), listing those that do.
    """
    family = capabilities_of(ranker).index
    if family is None:
        indexed = ", ".join(rankers_with(lambda c: c.index is not None))
        raise InputError("model.name", f"'{_name(ranker)}' has no index family; full ranking serves {indexed}")
    return index_class(family, "model.name")


def open_index(path: str | os.PathLike, ranker=None, **options) -> Index:
    """Load the index directory `path`, whatever its family: the registered class whose `format` its manifest has."""
    fmt = read_manifest(path, None).get("format")
    for family in INDEXES.names():
        cls = index_class(family)
        if cls.format == fmt:
            return cls.load(path, ranker, **options)
    formats = sorted(index_class(f).format for f in INDEXES.names())
    raise InputError(str(Path(path) / "manifest.json"), f"format is {fmt!r}; expected one of {formats}")
