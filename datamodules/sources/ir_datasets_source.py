"""Any dataset of the `ir_datasets` catalogue (`data.source: ir_datasets`), one id per split.

    train_id: msmarco-passage/train/triples-small      # docpairs -> training triples
    val_id:   msmarco-passage/trec-dl-2019/judged      # qrels (+ scoreddocs -> candidates)
    test_id:  msmarco-passage/trec-dl-2020/judged

Per split, whatever the dataset provides is used: `queries_iter`, `qrels_iter`, `docpairs_iter` (-> triples, at most
`max_docpairs`) and `scoreddocs_iter` (-> candidates, ordered by score). A split without docpairs gets
`triples=None` (negatives are sampled), one without scoreddocs `candidates=None` (BM25 top-k); a null id gives an
empty split. Queries kept per split: those named by its triples when it has docpairs, else those with qrels,
else all its queries; `max_queries_per_split` keeps the first N of them in file order (deterministic), and the
qrels, triples and candidates are cut to the kept queries.

The collection comes from `docs_id`, or when null from the first of train/val/test that has docs; with
`only_referenced_docs` only the passages named by some split's qrels, triples or candidates are kept (re-ranking
MS MARCO without holding 8.8M passages; BM25 negatives and candidates then come from that subset).

Queries that carry answer strings (`answers`, e.g. `msmarco-qna/train`, `msmarco-qna/dev`) get answer spans in
their relevant passages by string matching (datamodules/answer_matching.py), for the answer-position analysis and
the position-biased training split.

ir_datasets downloads into IR_DATASETS_HOME on first use (network needed once); a dataset registered from local
files (`ir_datasets.registry.register(name, ir_datasets.Dataset(TsvDocs(LocalDownload(path)), ...))`) needs none.
"""
from __future__ import annotations

from dataclasses import dataclass

from datamodules.answer_matching import match_answer_spans
from datamodules.config import DataConfig
from datamodules.corpus import IRDataset, Split
from datamodules.sources import SOURCES
from pipeline.errors import InputError


@dataclass
class IrDatasetsConfig(DataConfig):
    source: str = "ir_datasets"
    train_id: str | None = "msmarco-passage/train/triples-small"
    val_id: str | None = "msmarco-passage/trec-dl-2019/judged"
    test_id: str | None = "msmarco-passage/trec-dl-2020/judged"
    docs_id: str | None = None  # null: the docs of the first split id that has docs
    max_docpairs: int | None = 100_000  # training triples read from docpairs_iter
    max_queries_per_split: int | None = None
    only_referenced_docs: bool = False


def _text(obj) -> str:
    if hasattr(obj, "default_text"):
        return obj.default_text()
    return getattr(obj, "text")


def _load(dataset_id: str, key: str):
    import ir_datasets

    try:
        return ir_datasets.load(dataset_id)
    except KeyError:
        raise InputError(f"data.{key}", f"unknown ir_datasets id '{dataset_id}'; expected an id from https://ir-datasets.com") from None


def _read(dataset_id: str, key: str, what: str, fn):
    try:
        return fn()
    except InputError:
        raise
    except Exception as e:  # download failures, malformed files (ir_datasets raises RuntimeError/ValueError)
        msg = " ".join(str(e).split())
        raise InputError(f"data.{key}", f"reading {what} of ir_datasets '{dataset_id}' failed ({type(e).__name__}: {msg})") from e


def _split(dataset_id: str | None, key: str, cfg, answer_texts: dict[str, tuple[str, ...]]) -> Split:
    """One split; the answer strings of queries that carry them (`answers`, MS MARCO QnA) go into `answer_texts`."""
    if dataset_id is None:
        return Split()
    ds = _load(dataset_id, key)
    triples = None
    if ds.has_docpairs():
        def pairs():
            out = []
            for pair in ds.docpairs_iter():
                if cfg.max_docpairs is not None and len(out) >= cfg.max_docpairs:
                    break
                out.append((str(pair.query_id), str(pair.doc_id_a), str(pair.doc_id_b)))
            return out

        triples = _read(dataset_id, key, "docpairs", pairs)
    qrels: dict[str, dict[str, int]] = {}
    if ds.has_qrels():
        def read_qrels():
            for q in ds.qrels_iter():
                judged = qrels.setdefault(str(q.query_id), {})
                judged[str(q.doc_id)] = max(int(q.relevance), judged.get(str(q.doc_id), int(q.relevance)))

        _read(dataset_id, key, "qrels", read_qrels)
    candidates = None
    if ds.has_scoreddocs():
        def read_scored():
            rows: dict[str, list[tuple[float, int, str]]] = {}
            for i, sd in enumerate(ds.scoreddocs_iter()):
                rows.setdefault(str(sd.query_id), []).append((-float(sd.score), i, str(sd.doc_id)))
            return {q: [d for _, _, d in sorted(lst)] for q, lst in rows.items()}

        candidates = _read(dataset_id, key, "scoreddocs", read_scored)
    all_queries: dict[str, str] = {}
    if ds.has_queries():
        def read_queries():
            for q in ds.queries_iter():
                all_queries[str(q.query_id)] = _text(q)
                if getattr(q, "answers", None):
                    answer_texts[str(q.query_id)] = tuple(q.answers)

        _read(dataset_id, key, "queries", read_queries)

    if triples is not None:
        wanted = dict.fromkeys(t[0] for t in triples)
    elif qrels:
        wanted = dict.fromkeys(qrels)
    else:
        wanted = dict.fromkeys(all_queries)
    # file order of the queries file; ids it lacks last (IRDataset.validate() names them)
    order = [q for q in all_queries if q in wanted] + [q for q in wanted if q not in all_queries]
    if cfg.max_queries_per_split is not None:
        order = order[: cfg.max_queries_per_split]
    keep = set(order)
    origin = f"data.{key} ({dataset_id})"
    return Split(
        origins={kind: origin for kind in ("queries", "qrels", "triples", "candidates")},
        queries={q: all_queries[q] for q in order if q in all_queries},
        qrels={q: qrels[q] for q in order if q in qrels},
        triples=None if triples is None else [t for t in triples if t[0] in keep],
        candidates=None if candidates is None else {q: candidates[q] for q in order if q in candidates},
    )


@SOURCES.register("ir_datasets", schema=IrDatasetsConfig)
def build(cfg: IrDatasetsConfig, seed: int) -> IRDataset:
    keys = {"train": "train_id", "val": "val_id", "test": "test_id"}
    if all(getattr(cfg, k) is None for k in keys.values()):
        raise InputError("data.train_id", "train_id, val_id and test_id are all null; expected at least one ir_datasets id")
    answer_texts: dict[str, tuple[str, ...]] = {}
    splits = {name: _split(getattr(cfg, key), key, cfg, answer_texts) for name, key in keys.items()}

    docs_key, docs_id = "docs_id", cfg.docs_id
    if docs_id is None:
        for key in keys.values():
            if getattr(cfg, key) is not None and _load(getattr(cfg, key), key).has_docs():
                docs_key, docs_id = key, getattr(cfg, key)
                break
    if docs_id is None:
        raise InputError("data.docs_id", "none of train_id/val_id/test_id provides docs; expected docs_id naming a dataset with docs")
    ds = _load(docs_id, docs_key)
    if not ds.has_docs():
        raise InputError(f"data.{docs_key}", f"ir_datasets '{docs_id}' provides no docs; expected a dataset with docs")

    referenced: set[str] | None = None
    if cfg.only_referenced_docs:
        referenced = set()
        for s in splits.values():
            for judged in s.qrels.values():
                referenced.update(judged)
            for _, pos, neg in s.triples or ():
                referenced.update((pos, neg))
            for lst in (s.candidates or {}).values():
                referenced.update(lst)

    def read_docs():
        docs: dict[str, str] = {}
        for doc in ds.docs_iter():
            did = str(doc.doc_id)
            if referenced is None or did in referenced:
                docs[did] = _text(doc)
        return docs

    docs = _read(docs_id, docs_key, "docs", read_docs)
    return IRDataset(name=f"ir_datasets:{docs_id}", docs=docs, splits=splits, docs_origin=f"data.{docs_key} ({docs_id})",
                     answers=_answer_spans(splits, docs, answer_texts))


def _answer_spans(splits: dict[str, Split], docs: dict[str, str], answer_texts: dict[str, tuple[str, ...]]):
    """(qid, relevant doc id) -> spans of the query's answer strings matched in the passage (answer_matching.py);
    pairs without a match are left out, as the position-bias paper omits unmatched MS MARCO answers."""
    answers = {}
    for split in splits.values():
        for qid, judged in split.qrels.items():
            for doc_id, grade in judged.items():
                if grade > 0 and qid in answer_texts and doc_id in docs:
                    spans = match_answer_spans(docs[doc_id], answer_texts[qid])
                    if spans:
                        answers[(qid, doc_id)] = spans
    return answers
