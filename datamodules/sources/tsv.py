"""MS MARCO-style local files (`data.source: tsv`); the line readers are in datamodules/textfiles.py.

Files (each may be gzip-compressed, `.gz`):

- collection: `docid<TAB>text`, one passage a line.
- `<split>_queries`: `qid<TAB>text`.
- `<split>_qrels`: TREC qrels `qid iter docid rel` (whitespace separated, rel an integer; <= 0 is not relevant).
- `train_triples`: `qid<TAB>pos docid<TAB>neg docid` (`triples_format: ids`) or
  `query text<TAB>positive text<TAB>negative text` (`triples_format: text`, as MS MARCO `triples.train.small.tsv`).
  Text triples get ids deterministically: a passage whose text equals a collection passage takes that passage's id,
  any other text gets `h<sha1 of the text>[:16]` (queries likewise, `q<sha1>[:16]`, unless the text equals a query of
  `train_queries`), and the new passages / queries are added to the collection / train queries. (When several
  collection passages, or train queries, share a text, the last one in file order gives its id.) Both formats are
  parsed once into a memory-mapped array in `data.cache_dir` (datamodules/triples.py, datamodules/text_triples.py);
  the collection is a document store either way, with the passages text triples add in a second store after it.
- `<split>_run`: candidate lists as a TREC run `qid Q0 docid rank score tag`, ordered by score (desc), then rank.

Optional files may be null: no triples -> `Split.triples = None` (negatives are sampled), no run ->
`Split.candidates = None` (BM25 top-k). Every reader raises `InputError("FILE:LINE", what was expected)` on the
first malformed line; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from core.errors import InputError, check_choice
from datamodules.config import DataConfig
from datamodules.corpus import SPLITS, IRDataset, Split
from datamodules.docstore import fingerprint, open_store
from datamodules.sources.registry import SOURCES
from datamodules.text_triples import COLUMNS as TEXT_TRIPLE_COLUMNS
from datamodules.text_triples import read_text_triples
from datamodules.textfiles import (
    QRELS_COLUMNS,
    RUN_COLUMNS,
    check_not_empty,
    id_text_columns,
    iter_id_text,
    read_id_text_tsv,
    read_trec_qrels,
    resolve_path,
    rows_expected,
    run_candidates,
)
from datamodules.triples import ID_TRIPLE_COLUMNS, read_id_triples

# --------------------------------------------------------------------------------------------------------------
# The tsv source
# --------------------------------------------------------------------------------------------------------------


@dataclass
class TsvConfig(DataConfig):
    """The `data` keys of the tsv source: the collection and each split's queries, qrels, triples and run files.

    Every file may be gzip-compressed; the optional ones may be null (module docstring). `triples_format` says
    whether `train_triples` holds ids or texts.
    """

    answers: ClassVar[bool | None] = False

    source: str = "tsv"
    collection: str | None = None
    train_queries: str | None = None
    train_qrels: str | None = None
    train_triples: str | None = None
    triples_format: str = "ids"  # ids: qid<TAB>pos id<TAB>neg id | text: query<TAB>pos text<TAB>neg text
    train_run: str | None = None
    val_queries: str | None = None
    val_qrels: str | None = None
    val_run: str | None = None
    test_queries: str | None = None
    test_qrels: str | None = None
    test_run: str | None = None

    def __post_init__(self):
        super().__post_init__()
        check_choice("data.triples_format", self.triples_format, ("ids", "text"))

    def split_keys(self) -> dict[str, frozenset[str]]:
        """Return each split's files as read with it; text triples and the training files, by every job.

        Text triples add their passages to the collection (and their queries take train_queries' ids), so every job
        reads them and the training split's files, to see the same collection (`build`).
        """
        keys = {f"{split}_{kind}": frozenset({split}) for split in SPLITS for kind in ("queries", "qrels", "run")}
        keys |= {"train_triples": frozenset({"train"}), "triples_format": frozenset({"train"})}
        if self.triples_format == "text" and self.train_triples is not None:
            keys = {k: by for k, by in keys.items() if "train" not in by}
        return keys


def _opt(cfg, key: str, what: str) -> Path | None:
    value = getattr(cfg, key, None)
    return None if value is None else resolve_path(value, key, what)


@SOURCES.register("tsv", schema=TsvConfig)
def build(cfg: TsvConfig, seed: int, splits: tuple[str, ...] | None = None) -> IRDataset:
    """Read the collection and the files of the splits in `splits` (None: every split); the others come back empty.

    Id triples are read only with the training split. Text triples are read whenever configured, since the passages
    they add are part of the document store (module docstring) and every job must see the same collection.
    """
    fmt = cfg.triples_format
    if getattr(cfg, "collection", None) is None:
        raise InputError("data.collection", "is not set; expected the path of collection.tsv (docid<TAB>text)")
    collection = resolve_path(cfg.collection, "collection", "collection TSV")
    used = ("train", "val", "test") if splits is None else splits
    # id triples with the training split only (`TsvConfig.split_keys`): a job that reads none does not look for them
    tpath = _opt(cfg, "train_triples", "training triples TSV") if "train" in used or fmt == "text" else None
    # every file this job reads is found before anything is written (the collection's digest memo, its store)
    wanted = [
        n for n in ("train", "val", "test") if n in used or (n == "train" and fmt == "text" and tpath is not None)
    ]
    paths = {
        (name, kind): _opt(cfg, f"{name}_{kind}", f"{name} {what}")
        for name in wanted
        for kind, what in (("queries", "queries TSV"), ("qrels", "TREC qrels"), ("run", "TREC run"))
    }
    # and holds a line: an empty file is refused here with its reader's message, not by its reader after the store
    expected = {
        "queries": rows_expected(id_text_columns("query")),
        "qrels": rows_expected(QRELS_COLUMNS[4], tabs=False),
        "run": rows_expected(RUN_COLUMNS, tabs=False),
    }
    check_not_empty(collection, rows_expected(id_text_columns("passage")))
    for (_, kind), path in paths.items():
        if path is not None:
            check_not_empty(path, expected[kind])
    if tpath is not None:
        check_not_empty(tpath, rows_expected(TEXT_TRIPLE_COLUMNS if fmt == "text" else ID_TRIPLE_COLUMNS))
    docs = open_store(
        cfg.cache_dir,
        fingerprint("tsv-collection", [collection], cache_dir=cfg.cache_dir),
        lambda: iter_id_text(collection, "passage"),
        origin=str(collection),
    )
    read: dict[str, Split] = {}
    for name in ("train", "val", "test"):
        if name not in wanted:
            read[name] = Split()
            continue
        qpath, qrels_path, run_path = (paths[name, kind] for kind in ("queries", "qrels", "run"))
        queries = read_id_text_tsv(qpath, "query") if qpath else {}
        split = Split(queries=queries, qrels=read_trec_qrels(qrels_path) if qrels_path else {})
        split.origins.update(
            {k: str(v) for k, v in (("queries", qpath), ("qrels", qrels_path), ("candidates", run_path)) if v}
        )
        if run_path:
            split.candidates = run_candidates(run_path)
        if name == "train" and tpath is not None:
            if fmt == "text":
                # text triples may add passages (module docstring): the collection becomes the store plus those
                split.triples = read_text_triples(tpath, docs, split.queries, cfg.cache_dir)
                docs = split.triples.docs
            else:
                split.triples = read_id_triples(tpath, docs, split.queries, cfg.cache_dir, str(tpath))
            split.origins["triples"] = str(tpath)
        read[name] = split if name in used else Split()
    return IRDataset(name="tsv", docs=docs, splits=read, docs_origin=str(collection))
