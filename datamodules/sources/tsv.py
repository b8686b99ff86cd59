"""MS MARCO-style local files (`data.source: tsv`), plus the line readers every file-based source shares.

Files (each may be gzip-compressed, `.gz`):

- collection: `docid<TAB>text`, one passage a line.
- `<split>_queries`: `qid<TAB>text`.
- `<split>_qrels`: TREC qrels `qid iter docid rel` (whitespace separated, rel an integer; <= 0 is not relevant).
- `train_triples`: `qid<TAB>pos docid<TAB>neg docid` (`triples_format: ids`) or
  `query text<TAB>positive text<TAB>negative text` (`triples_format: text`, as MS MARCO `triples.train.small.tsv`).
  Text triples get ids deterministically: a passage whose text equals a collection passage takes that passage's id,
  any other text gets `h<sha1 of the text>[:16]` (queries likewise, `q<sha1>[:16]`, unless the text equals a query of
  `train_queries`), and the new passages / queries are added to the collection / train queries.
- `<split>_run`: candidate lists as a TREC run `qid Q0 docid rank score tag`, ordered by score (desc), then rank.

Optional files may be null: no triples -> `Split.triples = None` (negatives are sampled), no run ->
`Split.candidates = None` (BM25 top-k). Every reader raises `InputError("FILE:LINE", what was expected)` on the
first malformed line; nothing is written.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from core.errors import InputError
from datamodules.config import DataConfig
from datamodules.corpus import IRDataset, Split
from datamodules.sources import SOURCES

# --------------------------------------------------------------------------------------------------------------
# Shared readers (also used by the beir, classic, squad and ir_datasets sources)
# --------------------------------------------------------------------------------------------------------------


def resolve_path(value: str | None, key: str, what: str = "file", must_be_dir: bool = False) -> Path:
    """Config path -> existing Path. Relative paths are taken relative to the current working directory.

    A null or missing path raises InputError naming the config key (`data.<key>`) and the path."""
    if value is None or str(value).strip() == "":
        raise InputError(f"data.{key}", f"is not set; expected the path of the {what}")
    p = Path(str(value)).expanduser()
    if not p.exists():
        raise InputError(f"data.{key}", f"path '{value}' does not exist (resolved to {p.absolute()}); expected the {what}")
    if must_be_dir and not p.is_dir():
        raise InputError(f"data.{key}", f"path '{value}' is not a directory; expected the {what}")
    if not must_be_dir and p.is_dir():
        raise InputError(f"data.{key}", f"path '{value}' is a directory; expected the {what} (a file)")
    return p


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline) for a UTF-8 text file, gzip-compressed when named *.gz.

    Undecodable bytes or a corrupt gzip stream raise InputError naming the file (and line)."""
    path = Path(path)
    lineno = 0
    try:
        raw = gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
        with raw as f:
            for lineno, bline in enumerate(f, start=1):
                try:
                    line = bline.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"{path}:{lineno}", f"is not valid UTF-8 ({e.reason} at byte {e.start}); expected UTF-8 text") from e
                yield lineno, line.rstrip("\r\n")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(f"{path}:{lineno + 1}", f"is not a valid gzip stream ({e}); expected a gzip-compressed text file") from e


def iter_rows(path: Path, columns: tuple[str, ...], tabs: bool = True) -> Iterator[tuple[int, list[str]]]:
    """(line number, columns) of each non-blank line, split on tabs (or on whitespace with tabs=False); a line with
    another number of columns raises InputError naming file:line and the expected columns."""
    sep, kind = ("\t", "tab") if tabs else (None, "whitespace")
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        cols = line.split(sep)
        if len(cols) != len(columns):
            raise InputError(f"{path}:{lineno}", f"expected {len(columns)} {kind}-separated columns ({', '.join(columns)}), got {len(cols)}")
        yield lineno, cols


def read_text(path: Path) -> str:
    return "\n".join(line for _, line in iter_lines(path))


def read_id_text_tsv(path: Path, kind: str, into: dict[str, str] | None = None) -> dict[str, str]:
    """`id<TAB>text` lines -> {id: text}. kind = "passage" or "query" (for messages). Blank lines are skipped."""
    out: dict[str, str] = {} if into is None else into
    first_line: dict[str, int] = {}
    for lineno, cols in iter_rows(path, (f"{kind} id", f"{kind} text")):
        ident, text = cols[0].strip(), cols[1]
        if not ident:
            raise InputError(f"{path}:{lineno}", f"empty {kind} id; expected '{kind} id<TAB>{kind} text'")
        if not text.strip():
            raise InputError(f"{path}:{lineno}", f"empty {kind} text for id '{ident}'; expected a non-empty {kind}")
        if ident in out:
            where = f" (first at line {first_line[ident]})" if ident in first_line else ""
            raise InputError(f"{path}:{lineno}", f"duplicate {kind} id '{ident}'{where}; expected unique ids")
        first_line[ident] = lineno
        out[ident] = text
    return out


def parse_int(value: str, where: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InputError(where, f"{what} '{value}' is not an integer") from None


def read_trec_qrels(path: Path, columns: int = 4) -> dict[str, dict[str, int]]:
    """TREC qrels `qid iter docid rel` (columns=4) or `qid docid rel` (columns=3) -> {qid: {docid: rel}}.
    A pair listed twice keeps its highest grade."""
    qrels: dict[str, dict[str, int]] = {}
    layout = ("qid", "iter", "docid", "rel") if columns == 4 else ("qid", "docid", "rel")
    for lineno, cols in iter_rows(path, layout, tabs=False):
        qid, did, rel = (cols[0], cols[2], cols[3]) if columns == 4 else (cols[0], cols[1], cols[2])
        grade = parse_int(rel, f"{path}:{lineno}", "relevance")
        judged = qrels.setdefault(qid, {})
        judged[did] = max(grade, judged.get(did, grade))
    return qrels


def read_trec_run(path: Path) -> dict[str, list[str]]:
    """TREC run `qid Q0 docid rank score tag` -> {qid: [docid, ...]} ordered by score (desc), then rank (asc).
    A doc listed twice for a query keeps its first (best) position."""
    rows: dict[str, list[tuple[float, int, str]]] = {}
    for lineno, cols in iter_rows(path, ("qid", "Q0", "docid", "rank", "score", "tag"), tabs=False):
        qid, _, did, rank, score, _ = cols
        r = parse_int(rank, f"{path}:{lineno}", "rank")
        try:
            s = float(score)
        except ValueError:
            raise InputError(f"{path}:{lineno}", f"score '{score}' is not a number") from None
        if s != s:
            raise InputError(f"{path}:{lineno}", "score is NaN; expected a number")
        rows.setdefault(qid, []).append((-s, r, did))
    out: dict[str, list[str]] = {}
    for qid, lst in rows.items():
        lst.sort(key=lambda t: (t[0], t[1]))
        seen: set[str] = set()
        out[qid] = [d for _, _, d in lst if not (d in seen or seen.add(d))]
    return out


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a malformed line or a non-object raises InputError."""
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{lineno}", f"malformed JSON ({e.msg} at column {e.colno}); expected one JSON object a line") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{lineno}", f"expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def content_id(prefix: str, text: str) -> str:
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------------------------
# The tsv source
# --------------------------------------------------------------------------------------------------------------


@dataclass
class TsvConfig(DataConfig):
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


def _opt(cfg, key: str, what: str) -> Path | None:
    value = getattr(cfg, key, None)
    return None if value is None else resolve_path(value, key, what)


def _read_triples_ids(path: Path) -> list[tuple[str, str, str]]:
    triples = []
    for lineno, cols in iter_rows(path, ("qid", "positive doc id", "negative doc id")):
        if not all(c.strip() for c in cols):
            raise InputError(f"{path}:{lineno}", "empty id; expected qid<TAB>positive doc id<TAB>negative doc id")
        triples.append((cols[0].strip(), cols[1].strip(), cols[2].strip()))
    return triples


def _read_triples_text(path: Path, docs: dict[str, str], queries: dict[str, str]) -> list[tuple[str, str, str]]:
    doc_by_text = {t: d for d, t in docs.items()}
    query_by_text = {t: q for q, t in queries.items()}
    triples = []
    for lineno, cols in iter_rows(path, ("query text", "positive passage", "negative passage")):
        for col, what in zip(cols, ("query", "positive passage", "negative passage")):
            if not col.strip():
                raise InputError(f"{path}:{lineno}", f"empty {what} text; expected non-empty text")
        q, pos, neg = cols
        qid = query_by_text.get(q)
        if qid is None:
            qid = content_id("q", q)
            queries[qid] = q
            query_by_text[q] = qid
        ids = []
        for text in (pos, neg):
            did = doc_by_text.get(text)
            if did is None:
                did = content_id("h", text)
                docs[did] = text
                doc_by_text[text] = did
            ids.append(did)
        triples.append((qid, ids[0], ids[1]))
    return triples


@SOURCES.register("tsv", schema=TsvConfig)
def build(cfg: TsvConfig, seed: int) -> IRDataset:
    fmt = getattr(cfg, "triples_format", "ids")
    if fmt not in ("ids", "text"):
        raise InputError("data.triples_format", f"'{fmt}' is not supported; expected 'ids' or 'text'")
    docs: dict[str, str] = {}
    if getattr(cfg, "collection", None) is None:
        raise InputError("data.collection", "is not set; expected the path of collection.tsv (docid<TAB>text)")
    collection = resolve_path(cfg.collection, "collection", "collection TSV")
    read_id_text_tsv(collection, "passage", into=docs)
    splits: dict[str, Split] = {}
    for name in ("train", "val", "test"):
        qpath = _opt(cfg, f"{name}_queries", f"{name} queries TSV")
        qrels_path = _opt(cfg, f"{name}_qrels", f"{name} TREC qrels")
        run_path = _opt(cfg, f"{name}_run", f"{name} TREC run")
        queries = read_id_text_tsv(qpath, "query") if qpath else {}
        split = Split(queries=queries, qrels=read_trec_qrels(qrels_path) if qrels_path else {})
        split.origins.update({k: str(v) for k, v in (("queries", qpath), ("qrels", qrels_path), ("candidates", run_path)) if v})
        if run_path:
            split.candidates = read_trec_run(run_path)
        if name == "train":
            tpath = _opt(cfg, "train_triples", "training triples TSV")
            if tpath is not None:
                split.triples = _read_triples_ids(tpath) if fmt == "ids" else _read_triples_text(tpath, docs, split.queries)
                split.origins["triples"] = str(tpath)
        splits[name] = split
    return IRDataset(name="tsv", docs=docs, splits=splits, docs_origin=str(collection))
