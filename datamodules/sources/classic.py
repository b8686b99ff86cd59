"""Classic small test collections: Cranfield, Vaswani (NPL), CISI and CACM.

Picked with `data.source: cranfield | vaswani | cisi | cacm`. `data.path` is the collection folder (defaults:
../shared/data/<folder>).

Files read and how (see each folder's README):

- cranfield: `cran.all.1400` (SMART: `.I id`, `.T` title, `.A`, `.B`, `.W` abstract), `cran.qry`, `cranqrel`.
  Doc text = title + abstract. Query ids are the SEQUENTIAL position of the query in cran.qry (1..225), not its
  `.I` number (the qrels use positions). Relevance codes are reversed: gain = 5 - code for codes 1..4 (1 = complete
  answer -> 4); code -1 ("of no interest") and 5 -> grade 0, i.e. judged non-relevant (kept in the qrels, so
  they can serve as judged negatives; every metric treats 0 as non-relevant). Inside an abstract, stray marker lines
  (`.A`/`.B`/`.W` within docs 240, 576, 578) are dropped and the text goes on.
- vaswani: TREC SGML `doc-text.trec(.gz)` (`<DOC><DOCNO>`), `query-text.trec` (`<top><num><title>`), TREC `qrels`.
- cisi: SMART `CISI.ALL` (`.T`, `.A`, `.B`, `.W`, `.X`, `.K`, `.C`), `CISI.QRY`, `CISI.REL` (`qid docid 0 0.0`:
  every listed pair is relevant, grade 1). Doc and query text = title + abstract.
- cacm: `cacm.jsonl.gz` (`{"id", "contents"}`), `topics.cacm.txt` (`<DOC><DOCNO>`), TREC `qrels.cacm.txt`. The
  collection pads doc ids (CACM-0756) where the qrels do not (CACM-756): ids are used unpadded (CACM-756).

Whitespace inside texts is collapsed to single spaces (the line breaks are layout, not content). SMART records
with no title and no abstract are left out of the collection with a warning, together with any judgement naming
them: Cranfield docs 471 and 995 are empty in cran.all.1400 (so 1,398 of its 1,400 records are passages), and the
one judgement of an empty doc, (query 125, doc 995, code 3), is dropped. A text-less passage cannot be ranked by
its content, and IRDataset.validate() rejects empty passages.

No collection has predefined splits. The queries WITH at least one relevant document are permuted with
`split_seed` (independent of the run seed, so the test set is fixed across runs); the first `test_fraction` go to
test, the next `val_fraction` to val, the rest to train. Queries without any relevant document (CISI: 36 of 112,
CACM: 12 of 64) are left out of every split: they give no training signal, and trec_eval/pytrec_eval drop them
from the averages anyway, so keeping them would only skew val/test sizes. None of these files carries triples or
candidate lists (negatives are sampled, candidates are the BM25 top-k).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from core.errors import InputError
from core.ranges import FRACTION, SEED, check_ranges
from datamodules.config import DataConfig
from datamodules.corpus import IRDataset, Split
from datamodules.sources.registry import SOURCES
from datamodules.textfiles import (
    iter_lines,
    iter_rows,
    parse_int,
    read_jsonl,
    read_text,
    read_trec_qrels,
    resolve_path,
)

_log = logging.getLogger(__name__)


@dataclass
class ClassicConfig(DataConfig):
    """The `data` keys of the classic collections: the folder and the seeded query split (module docstring).

    `test_fraction` and `val_fraction` of the judged queries go to test and val, the rest to train, permuted with
    `split_seed` (independent of the run seed).
    """

    answers: ClassVar[bool | None] = False

    path: str = ""
    val_fraction: float = 0.15
    test_fraction: float = 0.25
    split_seed: int = 13

    def __post_init__(self):
        super().__post_init__()
        check_ranges("data", self, val_fraction=FRACTION, test_fraction=FRACTION, split_seed=SEED)


@dataclass
class CranfieldConfig(ClassicConfig):
    """`data.source: cranfield`, its files in ../shared/data/cranfield by default."""

    source: str = "cranfield"
    path: str = "../shared/data/cranfield"


@dataclass
class VaswaniConfig(ClassicConfig):
    """`data.source: vaswani` (NPL), its files in ../shared/data/vaswani_npl by default."""

    source: str = "vaswani"
    path: str = "../shared/data/vaswani_npl"


@dataclass
class CisiConfig(ClassicConfig):
    """`data.source: cisi`, its files in ../shared/data/cisi by default."""

    source: str = "cisi"
    path: str = "../shared/data/cisi"


@dataclass
class CacmConfig(ClassicConfig):
    """`data.source: cacm`, its files in ../shared/data/cacm by default."""

    source: str = "cacm"
    path: str = "../shared/data/cacm"


def _clean(text: str) -> str:
    return " ".join(text.split())


def _file(folder: Path, *names: str) -> Path:
    for name in names:
        if (folder / name).exists():
            return folder / name
    raise InputError("data.path", f"'{folder}' has no {' or '.join(names)}; expected the collection folder")


# ---------------------------------------------------------------------------------------------------- parsers


_MARKER = re.compile(r"^\.([A-Z])\s*$")


def parse_smart(path: Path, fields: str, after_text: str = "") -> list[tuple[int, str, dict[str, str]]]:
    """SMART tagged records -> [(line of `.I`, id, {field letter: text})].

    `fields` are the accepted field letters; once in `.W` only the letters in `after_text` start a new field, any
    other marker line inside the abstract is dropped (the text continues).
    """
    records: list[tuple[int, str, dict[str, list[str]]]] = []
    seen: dict[str, int] = {}
    field: str | None = None
    for lineno, line in iter_lines(path):
        if line.startswith(".I"):
            parts = line.split()
            if len(parts) != 2 or parts[0] != ".I":
                raise InputError(f"{path}:{lineno}", f"malformed record start {line.strip()!r}; expected '.I <id>'")
            ident = parts[1]
            if ident in seen:
                raise InputError(
                    f"{path}:{lineno}",
                    f"duplicate record id '.I {ident}' (first at line {seen[ident]}); expected unique ids",
                )
            seen[ident] = lineno
            records.append((lineno, ident, {}))
            field = None
            continue
        m = _MARKER.match(line)
        if not records:
            if line.strip():
                raise InputError(f"{path}:{lineno}", "text before the first record; expected '.I <id>'")
            continue
        if m:
            letter = m.group(1)
            if field == "W" and letter not in after_text:
                continue
            if letter not in fields:
                raise InputError(
                    f"{path}:{lineno}", f"unknown field marker '.{letter}'; expected one of {['.' + f for f in fields]}"
                )
            field = letter
            records[-1][2].setdefault(letter, [])
            continue
        if field is None:
            if line.strip():
                raise InputError(
                    f"{path}:{lineno}",
                    f"text before any field marker; expected one of {['.' + f for f in fields]} after '.I'",
                )
            continue
        records[-1][2][field].append(line)
    if not records:
        raise InputError(str(path), "is empty; expected SMART records starting with '.I <id>'")
    return [(ln, ident, {k: _clean(" ".join(v)) for k, v in flds.items()}) for ln, ident, flds in records]


def parse_trec_sgml(path: Path, record: str, id_tag: str) -> list[tuple[int, str, str]]:
    """TREC SGML records `<record> <id_tag>id</id_tag> text </record>` -> [(line, id, text without tags)]."""
    text = read_text(path)
    pattern = re.compile(rf"<{record}>(.*?)</{record}>", re.S | re.I)
    id_re = re.compile(rf"<{id_tag}>(.*?)</{id_tag}>", re.S | re.I)
    out: list[tuple[int, str, str]] = []
    seen: dict[str, int] = {}
    pos = 0

    newlines = np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == 10)

    def line_of(offset: int) -> int:
        return int(np.searchsorted(newlines, offset)) + 1

    def check_gap(start: int, end: int) -> None:
        gap = text[start:end]
        if gap.strip():
            off = start + len(gap) - len(gap.lstrip())
            if re.match(rf"<{record}>", text[off:], re.I):
                raise InputError(f"{path}:{line_of(off)}", f"<{record}> is never closed; expected </{record}>")
            raise InputError(
                f"{path}:{line_of(off)}", f"text outside a <{record}> record; expected <{record}> ... </{record}>"
            )

    for m in pattern.finditer(text):
        check_gap(pos, m.start())
        pos = m.end()
        lineno = line_of(m.start())
        body = m.group(1)
        if re.search(rf"<{record}>", body, re.I):
            raise InputError(
                f"{path}:{lineno}", f"<{record}> is never closed before the next <{record}>; expected </{record}>"
            )
        idm = id_re.search(body)
        if idm is None or not idm.group(1).strip():
            raise InputError(f"{path}:{lineno}", f"record has no <{id_tag}>; expected <{id_tag}>id</{id_tag}>")
        ident = idm.group(1).strip()
        content = _clean(re.sub(r"<[^>]*>", " ", body[: idm.start()] + " " + body[idm.end() :]))
        if not content:
            raise InputError(
                f"{path}:{lineno}", f"record '{ident}' has empty text; expected a non-empty passage or query"
            )
        if ident in seen:
            raise InputError(
                f"{path}:{lineno}", f"duplicate <{id_tag}> '{ident}' (first at line {seen[ident]}); expected unique ids"
            )
        seen[ident] = lineno
        out.append((lineno, ident, content))
    check_gap(pos, len(text))
    if not out:
        raise InputError(str(path), f"is empty; expected <{record}> ... </{record}> records")
    return out


def _texts(path: Path, records, parts: str, kind: str, dropped: set[str] | None = None) -> dict[str, str]:
    """{id: the given fields joined}; an empty record raises, or with `dropped` is left out and its id added."""
    out = {}
    for lineno, ident, flds in records:
        text = " ".join(flds[p] for p in parts if flds.get(p))
        if not text.strip():
            if dropped is not None:
                dropped.add(ident)
                _log.warning("%s:%d: %s '%s' has no text; left out of the collection", path, lineno, kind, ident)
                continue
            raise InputError(
                f"{path}:{lineno}",
                f"{kind} '{ident}' has empty text; expected non-empty {'/'.join('.' + p for p in parts)}",
            )
        out[ident] = text
    return out


# ---------------------------------------------------------------------------------------------------- collections


def load_cranfield(folder: Path):
    """Read Cranfield: return (docs, queries, qrels, ids of the records left out for having no text).

    Query ids are positions in cran.qry; codes 1..4 become gain 5 - code, codes -1 and 5 grade 0 (module docstring).
    """
    dpath, qpath, rpath = _file(folder, "cran.all.1400"), _file(folder, "cran.qry"), _file(folder, "cranqrel")
    empty: set[str] = set()
    docs = _texts(dpath, parse_smart(dpath, "TABW"), "TW", "document", dropped=empty)
    # qrels use the sequential position of the query, not its .I number
    raw_queries = _texts(qpath, parse_smart(qpath, "W"), "W", "query")
    queries = {str(i): text for i, text in enumerate(raw_queries.values(), start=1)}
    qrels: dict[str, dict[str, int]] = {}
    for lineno, cols in iter_rows(rpath, ("query position", "doc id", "relevance code"), tabs=False):
        code = parse_int(cols[2], f"{rpath}:{lineno}", "relevance code")
        if code in (1, 2, 3, 4):
            gain = 5 - code
        elif code in (-1, 5):
            gain = 0
        else:
            raise InputError(f"{rpath}:{lineno}", f"relevance code {code}; expected 1..4, 5 or -1")
        judged = qrels.setdefault(cols[0], {})
        judged[cols[1]] = max(gain, judged.get(cols[1], gain))
    return docs, queries, qrels, empty


def load_vaswani(folder: Path):
    """Read Vaswani (NPL) from its TREC files: return (docs, queries, qrels, no left-out ids)."""
    dpath = _file(folder, "doc-text.trec.gz", "doc-text.trec")
    qpath, rpath = _file(folder, "query-text.trec"), _file(folder, "qrels")
    docs = {i: t for _, i, t in parse_trec_sgml(dpath, "DOC", "DOCNO")}
    queries = {i: t for _, i, t in parse_trec_sgml(qpath, "top", "num")}
    return docs, queries, read_trec_qrels(rpath), set()


def load_cisi(folder: Path):
    """Read CISI: return (docs, queries, qrels with every listed pair grade 1, ids of records left out for no text)."""
    dpath, qpath, rpath = _file(folder, "CISI.ALL"), _file(folder, "CISI.QRY"), _file(folder, "CISI.REL")
    empty: set[str] = set()
    docs = _texts(dpath, parse_smart(dpath, "TABWXKC", after_text="XKC"), "TW", "document", dropped=empty)
    queries = _texts(qpath, parse_smart(qpath, "TABW", after_text="TAB"), "TW", "query")
    qrels: dict[str, dict[str, int]] = {}
    for _, cols in iter_rows(rpath, ("qid", "docid", "0", "0.0"), tabs=False):
        qrels.setdefault(cols[0], {})[cols[1]] = 1
    return docs, queries, qrels, empty


def load_cacm(folder: Path):
    """Read CACM: return (docs, queries, qrels, no left-out ids), doc ids in their unpadded form (CACM-756)."""
    dpath = _file(folder, "cacm.jsonl.gz", "cacm.jsonl", "cacm.json")
    qpath, rpath = _file(folder, "topics.cacm.txt"), _file(folder, "qrels.cacm.txt")
    docs: dict[str, str] = {}
    for lineno, obj in read_jsonl(dpath):
        ident, contents = obj.get("id"), obj.get("contents")
        if not isinstance(ident, str) or not ident:
            raise InputError(f"{dpath}:{lineno}", 'missing \'id\'; expected {"id": ..., "contents": ...}')
        if not isinstance(contents, str) or not contents.strip():
            raise InputError(f"{dpath}:{lineno}", f"empty 'contents' for id '{ident}'; expected a non-empty passage")
        ident = _cacm_id(ident)
        if ident in docs:
            raise InputError(f"{dpath}:{lineno}", f"duplicate id '{ident}'; expected unique ids")
        docs[ident] = _clean(contents)
    queries = {i: t for _, i, t in parse_trec_sgml(qpath, "DOC", "DOCNO")}
    qrels = {q: {_cacm_id(d): g for d, g in judged.items()} for q, judged in read_trec_qrels(rpath).items()}
    return docs, queries, qrels, set()


def _cacm_id(ident: str) -> str:
    """Return the unpadded form of a CACM id: the collection pads ids to four digits (CACM-0756), the qrels do not."""
    m = re.fullmatch(r"CACM-0*(\d+)", ident)
    return f"CACM-{int(m.group(1))}" if m else ident


def split_queries(queries: dict[str, str], qrels: dict[str, dict[str, int]], cfg) -> dict[str, Split]:
    """Split the judged queries into train, val and test by a `split_seed` permutation (module docstring).

    Only queries with a relevant document are split. A qrels query missing from the query file stays in train's
    qrels, so IRDataset.validate() reports it. InputError when there is no judged query or no training query is left.
    """

    def natural(q: str):
        return (0, int(q), q) if q.isdigit() else (1, 0, q)

    judged = sorted((q for q, d in qrels.items() if any(g > 0 for g in d.values()) and q in queries), key=natural)
    missing = sorted((q for q in qrels if q not in queries), key=natural)
    n = len(judged)
    if not n:
        raise InputError(
            f"data.path ({cfg.path})",
            "has no judged query (a query with a relevant document in the qrels); expected at least one",
        )
    n_test = int(round(float(cfg.test_fraction) * n))
    n_val = int(round(float(cfg.val_fraction) * n))
    if n_test + n_val >= n:
        raise InputError(
            "data.val_fraction",
            f"val ({n_val}) + test ({n_test}) queries leave none of the {n} judged queries for training",
        )
    order = np.random.default_rng(cfg.split_seed).permutation(n)
    parts = {"train": order[n_test + n_val :], "val": order[n_test : n_test + n_val], "test": order[:n_test]}
    splits = {}
    for name, idx in parts.items():
        qids = sorted((judged[i] for i in idx), key=natural)
        splits[name] = Split(queries={q: queries[q] for q in qids}, qrels={q: dict(qrels[q]) for q in qids})
    if missing:  # a qrels query absent from the query file: leave it in train so IRDataset.validate() reports it
        splits["train"].qrels.update({q: qrels[q] for q in missing})
    return splits


def _builder(name: str, loader):
    def build(cfg, seed: int, splits: tuple[str, ...] | None = None) -> IRDataset:
        """Read the collection's files whole.

        Its splits are a seeded permutation of all its queries, so `splits` changes nothing.
        """
        folder = resolve_path(cfg.path, "path", f"{name} collection folder", must_be_dir=True)
        docs, queries, qrels, empty = loader(folder)
        # judgements of documents left out for having no text (Cranfield 995, judged for query 125) go too
        qrels = {q: {d: g for d, g in judged.items() if d in docs or d not in empty} for q, judged in qrels.items()}
        splits = split_queries(queries, qrels, cfg)
        for split in splits.values():  # ids are rewritten by the readers (CACM padding, Cranfield numbering)
            split.origins = {kind: f"data.path ({folder})" for kind in ("queries", "qrels")}
        return IRDataset(name=name, docs=docs, splits=splits, docs_origin=f"data.path ({folder})")

    build.__name__ = f"build_{name}"
    build.__doc__ = f"{name}: see the module docstring."
    return build


build_cranfield = SOURCES.register("cranfield", schema=CranfieldConfig)(_builder("cranfield", load_cranfield))
build_vaswani = SOURCES.register("vaswani", schema=VaswaniConfig)(_builder("vaswani", load_vaswani))
build_cisi = SOURCES.register("cisi", schema=CisiConfig)(_builder("cisi", load_cisi))
build_cacm = SOURCES.register("cacm", schema=CacmConfig)(_builder("cacm", load_cacm))
