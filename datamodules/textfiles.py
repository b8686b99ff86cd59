"""The line readers every file-based data source shares (tsv, beir, classic, squad, ir_datasets).

They read gzip or plain UTF-8 text, TSV rows, TREC qrels and candidate runs, JSONL; each raises
`InputError("FILE:LINE", what was expected)` on the first malformed line.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

from core.errors import InputError


def resolve_path(value: str | None, key: str, what: str = "file", must_be_dir: bool = False) -> Path:
    """Config path -> existing Path. Relative paths are taken relative to the current working directory.

    A null or missing path raises InputError naming the config key (`data.<key>`) and the path.
    """
    if value is None or str(value).strip() == "":
        raise InputError(f"data.{key}", f"is not set; expected the path of the {what}")
    p = Path(str(value)).expanduser()
    if not p.exists():
        raise InputError(
            f"data.{key}", f"path '{value}' does not exist (resolved to {p.absolute()}); expected the {what}"
        )
    if must_be_dir and not p.is_dir():
        raise InputError(f"data.{key}", f"path '{value}' is not a directory; expected the {what}")
    if not must_be_dir and p.is_dir():
        raise InputError(f"data.{key}", f"path '{value}' is a directory; expected the {what} (a file)")
    return p


def check_id(ident: str, where: str, what: str) -> str:
    r"""Return `ident` when its characters are printable and none is a space; else InputError at `where` (file:line).

    An id with a NUL byte, another control character, a no-break space or a zero-width character in it would match no
    id of the files that refer to it (they look alike on screen), and the error would then name the referring file,
    not the line that holds the fault. A space would split it in the TREC run written at the end of the job.

    >>> check_id("D8", "collection.tsv:8", "passage id")
    'D8'
    >>> check_id("D8\x00", "collection.tsv:8", "passage id")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    core.errors.InputError: collection.tsv:8: passage id 'D8\x00' holds the non-printable character U+0000 at ...
    >>> check_id("D 8", "collection.tsv:8", "passage id")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    core.errors.InputError: collection.tsv:8: passage id 'D 8' holds a space at position 1; expected an id without ...
    """
    if not ident.isprintable():  # str.isprintable: C speed, at every line of a collection
        at, ch = next((i, c) for i, c in enumerate(ident) if not c.isprintable())
        raise InputError(
            where,
            f"{what} {ident!r} holds the non-printable character U+{ord(ch):04X} at position {at}; "
            "expected an id of printable characters",
        )
    if " " in ident:  # the only whitespace isprintable lets through; a run or qrels line would split the id
        raise InputError(
            where,
            f"{what} {ident!r} holds a space at position {ident.index(' ')}; expected an id without whitespace "
            "(TREC run and qrels files separate their fields by whitespace)",
        )
    return ident


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its newline) for a UTF-8 text file, gzip-compressed when named *.gz.

    A leading byte-order mark is dropped.

    Undecodable bytes or a corrupt gzip stream raise InputError naming the file (and line).
    """
    path = Path(path)
    lineno = 0
    try:
        raw = gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
        with raw as f:
            for lineno, bline in enumerate(f, start=1):
                if lineno == 1:
                    # Excel and many Windows tools start UTF-8 files with a BOM; it must not become part of the first id
                    bline = bline.removeprefix(codecs.BOM_UTF8)
                try:
                    line = bline.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(
                        f"{path}:{lineno}", f"is not valid UTF-8 ({e.reason} at byte {e.start}); expected UTF-8 text"
                    ) from e
                yield lineno, line.rstrip("\r\n")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(
            f"{path}:{lineno + 1}", f"is not a valid gzip stream ({e}); expected a gzip-compressed text file"
        ) from e


RUN_COLUMNS = ("qid", "Q0", "docid", "rank", "score", "tag")
JSONL_EXPECTED = "one JSON object a line"
QRELS_COLUMNS = {4: ("qid", "iter", "docid", "rel"), 3: ("qid", "docid", "rel")}


def id_text_columns(kind: str) -> tuple[str, str]:
    """Return the columns of an `id<TAB>text` file of `kind` ("passage" or "query")."""
    return (f"{kind} id", f"{kind} text")


def rows_expected(columns: tuple[str, ...], tabs: bool = True) -> str:
    """Return what a file read by `iter_rows(path, columns, tabs)` should hold, as its errors say it.

    >>> rows_expected(("qid", "positive doc id", "negative doc id"))
    'lines of 3 tab-separated columns (qid, positive doc id, negative doc id)'
    """
    return f"lines of {len(columns)} {'tab' if tabs else 'whitespace'}-separated columns ({', '.join(columns)})"


def check_not_empty(path: Path, expected: str) -> Path:
    """Return `path` when a line of it holds more than blanks; else the InputError its reader would raise.

    Reads up to that first line only, so that a job can refuse an empty data file before it writes anything (a
    collection's store, a triples cache), with the message of the reader that comes later ("is empty; expected ...").
    """
    for _, line in iter_lines(path):
        if line.strip():
            return path
    raise InputError(str(path), f"is empty; expected {expected}")


def iter_rows(path: Path, columns: tuple[str, ...], tabs: bool = True) -> Iterator[tuple[int, list[str]]]:
    """Yield (line number, columns) of each non-blank line, split on tabs (or on whitespace with tabs=False).

    A line with another number of columns, or a file without any line, raises InputError naming the file (and line).
    """
    sep, kind = ("\t", "tab") if tabs else (None, "whitespace")
    rows = 0
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        cols = line.split(sep)
        if len(cols) != len(columns):
            raise InputError(
                f"{path}:{lineno}",
                f"expected {len(columns)} {kind}-separated columns ({', '.join(columns)}), got {len(cols)}",
            )
        rows += 1
        yield lineno, cols
    if not rows:
        # a configured file with nothing in it is a wrong path or a failed export, not a deliberate empty set
        raise InputError(str(path), f"is empty; expected {rows_expected(columns, tabs)}")


def read_text(path: Path) -> str:
    """Return a whole text file (gzip or plain UTF-8, as `iter_lines` reads it), lines joined by newlines."""
    return "\n".join(line for _, line in iter_lines(path))


def iter_id_text(path: Path, kind: str) -> Iterator[tuple[int, str, str]]:
    """Yield (line number, id, text) of each `id<TAB>text` line; kind = "passage" or "query" (for messages).

    Blank lines are skipped; an empty id or text raises InputError naming the line. Uniqueness is the caller's to
    check.
    """
    for lineno, cols in iter_rows(path, id_text_columns(kind)):
        ident, text = cols[0].strip(), cols[1]
        if not ident:
            raise InputError(f"{path}:{lineno}", f"empty {kind} id; expected '{kind} id<TAB>{kind} text'")
        check_id(ident, f"{path}:{lineno}", f"{kind} id")
        if not text.strip():
            raise InputError(f"{path}:{lineno}", f"empty {kind} text for id '{ident}'; expected a non-empty {kind}")
        yield lineno, ident, text


def read_id_text_tsv(path: Path, kind: str, into: dict[str, str] | None = None) -> dict[str, str]:
    """`id<TAB>text` lines -> {id: text}. kind = "passage" or "query" (for messages). Blank lines are skipped."""
    out: dict[str, str] = {} if into is None else into
    first_line: dict[str, int] = {}
    for lineno, ident, text in iter_id_text(path, kind):
        if ident in out:
            where = f" (first at line {first_line[ident]})" if ident in first_line else ""
            raise InputError(f"{path}:{lineno}", f"duplicate {kind} id '{ident}'{where}; expected unique ids")
        first_line[ident] = lineno
        out[ident] = text
    return out


def parse_int(value: str, where: str, what: str) -> int:
    """Return `value` as an int; InputError at `where` ("FILE:LINE") saying the `what` is not an integer otherwise."""
    try:
        return int(value)
    except ValueError:
        raise InputError(where, f"{what} '{value}' is not an integer") from None


def read_trec_qrels(path: Path, columns: int = 4) -> dict[str, dict[str, int]]:
    """Read TREC qrels `qid iter docid rel` (columns=4) or `qid docid rel` (columns=3) -> {qid: {docid: rel}}.

    A pair listed twice keeps its highest grade.
    """
    qrels: dict[str, dict[str, int]] = {}
    for lineno, cols in iter_rows(path, QRELS_COLUMNS[columns], tabs=False):
        qid, did, rel = (cols[0], cols[2], cols[3]) if columns == 4 else (cols[0], cols[1], cols[2])
        check_id(qid, f"{path}:{lineno}", "query id")
        check_id(did, f"{path}:{lineno}", "doc id")
        grade = parse_int(rel, f"{path}:{lineno}", "relevance")
        judged = qrels.setdefault(qid, {})
        judged[did] = max(grade, judged.get(did, grade))
    return qrels


def read_trec_run(path: Path) -> dict[str, dict[str, float]]:
    """Read a TREC run `qid Q0 docid rank score tag` -> {qid: {docid: score}}, in file order.

    The one reader of run files (candidate lists, and runs read back). The rank must be an integer and the score a
    finite number; a document listed twice for a query is an error, as in trec_eval.
    """
    return {qid: {d: score for d, (score, _) in docs.items()} for qid, docs in _run_rows(path).items()}


def run_candidates(path: Path) -> dict[str, list[str]]:
    """Read a TREC run as candidate lists, {qid: [docid, ...]}, best first: by score (descending), then rank."""
    return {qid: sorted(docs, key=lambda d: (-docs[d][0], docs[d][1])) for qid, docs in _run_rows(path).items()}


def _run_rows(path: Path) -> dict[str, dict[str, tuple[float, int]]]:
    if not Path(path).is_file():
        raise InputError(str(path), "no such TREC run file")
    run: dict[str, dict[str, tuple[float, int]]] = {}
    for lineno, cols in iter_rows(path, RUN_COLUMNS, tabs=False):
        qid, _, did, rank, score, _ = cols
        where = f"{path}:{lineno}"
        check_id(qid, where, "query id")
        check_id(did, where, "doc id")
        r = parse_int(rank, where, "rank")
        try:
            s = float(score)
        except ValueError:
            raise InputError(where, f"score '{score}' is not a number") from None
        if not math.isfinite(s):
            raise InputError(where, f"score '{score}' is not finite; expected a number")
        docs = run.setdefault(qid, {})
        if did in docs:
            raise InputError(where, f"document '{did}' listed twice for query '{qid}'")
        docs[did] = (s, r)
    return run


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for every non-blank line of a JSONL file.

    A malformed line, a non-object or an empty file raises InputError.
    """
    rows = 0
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        rows += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(
                f"{path}:{lineno}", f"malformed JSON ({e.msg} at column {e.colno}); expected one JSON object a line"
            ) from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{lineno}", f"expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj
    if not rows:
        raise InputError(str(path), f"is empty; expected {JSONL_EXPECTED}")


def content_id(prefix: str, text: str) -> str:
    """Return the id a text gets from its content: `prefix` + the first 16 hex digits of its UTF-8 SHA-1.

    Deterministic, so text triples (datamodules/text_triples.py) give a text the same id in every run and process.
    """
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
