"""The LightningDataModule: training triplets and evaluation candidates from any source.

Optionally rotation-debiased (position-bias paper Eq. 7), sharded over DDP ranks without padding or dropping.

Rotation (`data.rotate_train`, `data.rotate_eval`, `data.rotation`; datamodules/rotation.py): with `per_passage`
(default, the paper's "debiased instance" of each passage) a passage has one cut, from (seed, doc id), in every
triple, every epoch and every evaluation; with `per_epoch` training redraws it per (seed, epoch, triple, doc id).
`rotation_draw` is the one place that says which (epoch, key) a cut is hashed from.

Every passage goes through `rotation.normalize` whether rotated or not, so rotated and original text differ
only in word order, never in spacing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from core.errors import InputError
from datamodules import rotation
from datamodules.bm25 import bm25_candidates
from datamodules.config import passage_window
from datamodules.corpus import IRDataset
from datamodules.guarded import GuardedLoader
from datamodules.negatives import sample_triples
from datamodules.passages import expand_pairs, training_passage
from datamodules.samplers import (
    DistributedTrainBatchSampler,
    ResumableLoader,
    shard_range,
)
from datamodules.sources import load_dataset
from datamodules.tokenization import HOST_LENGTHS, HOST_RANK_ROWS, PairTokenizer, host_lengths
from datamodules.tokenized import PassageTokens, QueryTokens, SplitTokens, store_rows

MAX_AUTO_WORKERS = 8  # enough to keep a GPU fed with cached tokens; each worker holds its own copy of the datasets


def loader_workers(setting: int | None, cuda: bool, devices: int) -> int:
    """Return the DataLoader workers per rank: `setting` (data.num_workers), or when null one per spare core on GPUs.

    Without a GPU the model runs on the cores the workers would take, so none. With one, the cores this process may
    use, shared by the `devices` ranks of the node, less one for the rank itself, at least 1 and at most 8.
    """
    if setting is not None:
        return int(setting)
    if not cuda:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_AUTO_WORKERS, cores // max(1, devices) - 1))


def passage_text(text: str, rotate: bool, seed: int, epoch: int, key: str) -> str:
    """Return the whitespace-normalized passage, rotated (Eq. 7) at `rotation_index(seed, epoch, key)` when `rotate`.

    Take (epoch, key) from `rotation_draw`.
    """
    words = rotation.normalize(text, [])[0]
    if not rotate:
        return words
    r = rotation.rotation_index(seed, epoch, key, len(words.split(" ")))
    return rotation.rotate(words, r, [])[0]


def train_rotation_key(index: int, doc_id: str) -> str:
    """Return the key of a training example's passage: triple index and doc id.

    The `per_epoch` rotation key (the positive and the negative of one triple, and the same passage in two triples, are
    cut independently, and analyses reproduce the cuts), and the key of the per-epoch passage-window draw
    (datamodules/passages.py).
    """
    return f"{index}:{doc_id}"


def eval_rotation_key(doc_id: str) -> str:
    """Return the rotation key of a passage cut once (at epoch 0): its doc id.

    So a passage is cut alike for every query and at every evaluation, and with `per_passage` also in every training
    triple and epoch (`rotation.passage_rotation_index`).
    """
    return doc_id


def rotation_draw(rotation_mode: str, epoch: int, doc_id: str, index: int | None = None) -> tuple[int, str]:
    """Return the (epoch, key) whose `rotation.rotation_index` is the Eq. 7 cut of passage `doc_id`.

    `per_passage` (and any evaluation passage, `index=None`) -> (0, doc id) at every epoch; `per_epoch` training
    passage of triple `index` -> (epoch, "index:doc id").
    """
    if rotation_mode not in rotation.ROTATIONS:
        raise ValueError(f"rotation mode {rotation_mode!r}; expected one of {list(rotation.ROTATIONS)}")
    if rotation_mode == "per_epoch" and index is not None:
        return int(epoch), train_rotation_key(index, doc_id)
    return 0, eval_rotation_key(doc_id)


@dataclass(frozen=True)
class TripletKeys:
    """Which documents a triplet holds, for the in-batch negatives.

    `doc_key` of its positive and negative, and of every document judged relevant to its query (another query's passage
    may be one of them).
    """

    pos: int
    neg: int
    relevant: tuple[int, ...]


def doc_key(doc_id: str) -> int:
    """Return a document id as a non-negative int64, the same in every process and DDP rank.

    Python's hash() is salted, so a BLAKE2b digest is used; 63 bits, so two different ids of one batch collide with
    probability 2^-63.
    """
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little") >> 1


class TripletDataset(Dataset):
    """Training dataset: item (epoch, i) -> (query, positive, negative) texts of triplet i, with its TripletKeys.

    With `rotate`, each passage is cut as `rotation_mode` says (`rotation_draw`: once per passage, or per epoch and
    triple). With `window` (size, stride) each document is replaced by one of its passages (datamodules/passages.py,
    `train_passage`: drawn per epoch, or the first), cut from the rotated document.
    """

    def __init__(
        self,
        ds: IRDataset,
        triples: Sequence[tuple[str, str, str]],
        queries: dict[str, str],
        rotate: bool,
        seed: int,
        window: tuple[int, int] | None = None,
        train_passage: str = "random",
        rotation_mode: str = "per_passage",
        qrels: dict[str, dict[str, int]] | None = None,
        tokens: tuple[QueryTokens, PassageTokens] | None = None,
    ):
        self.docs, self.triples, self.queries = ds.docs, triples, queries
        # cached content tokens instead of texts (`RankingDataModule.train_tokens`): the cut is per passage then
        self.tokens = tokens
        # per judged query, not per triple's query: a pass over 39.8M triples (MS MARCO) would take minutes
        self.judged = {
            q: tuple(doc_key(d) for d, grade in judged.items() if grade > 0) for q, judged in (qrels or {}).items()
        }
        self.rotate, self.seed = rotate, seed
        self.window, self.train_passage = window, train_passage
        rotation_draw(rotation_mode, 0, "")  # a bad mode fails here, not in a dataloader worker
        self.rotation_mode = rotation_mode

    def __len__(self) -> int:
        return len(self.triples)

    def _text(self, doc_id: str, epoch: int, i: int) -> str:
        cut_epoch, cut_key = rotation_draw(self.rotation_mode, epoch, doc_id, i)
        text = passage_text(self.docs[doc_id], self.rotate, self.seed, cut_epoch, cut_key)
        if self.window is None:
            return text
        return training_passage(text, *self.window, self.train_passage, self.seed, epoch, train_rotation_key(i, doc_id))

    def __getitem__(self, item: tuple[int, int]) -> tuple[str, str, str, TripletKeys]:
        epoch, i = item
        qid, pos, neg = self.triples[i]
        keys = TripletKeys(doc_key(pos), doc_key(neg), self.judged.get(qid, ()))
        if self.tokens is not None:
            queries, passages = self.tokens
            if passages.holds_rows_of(self.triples):  # memory-mapped triples name store rows: no id is looked up
                return (*queries.of([qid]), *passages.at_rows(self.triples.rows_at(i)[1:]), keys)
            return (*queries.of([qid]), *passages.of([pos, neg]), keys)
        # Positive and negative are both rotated, each at its own passage's cut (Eq. 7 applies to every passage).
        return (
            self.queries[qid],
            self._text(pos, epoch, i),
            self._text(neg, epoch, i),
            keys,
        )


@dataclass
class TripletCollate:
    """Collate TripletDataset items into a tokenised training batch with the doc keys for in-batch negatives.

    Besides the tokenizer's `triplets` output, the batch holds `pos_doc`, `neg_doc` and `relevant_docs` (each query's
    judged documents, padded with -1), so the module can mask an in-batch negative judged relevant to the query, and
    `HOST_LENGTHS`, the token counts of its rows, for the ranker to decide on padding without reading the device, and
    `HOST_RANK_ROWS` (`rank_rows`: the most triplets a DDP rank's batch holds; None in one process).
    """

    tokenizer: PairTokenizer
    rank_rows: int | None = None

    def __call__(self, items: list[tuple[str, str, str, TripletKeys]]) -> dict[str, torch.Tensor]:
        """Tokenise the batch's triplets and add the doc-key tensors."""
        q, p, n, keys = map(list, zip(*items))
        # texts, or cached content tokens (TripletDataset.tokens): the same batch either way
        batch = (
            self.tokenizer.triplets(q, p, n) if isinstance(q[0], str) else self.tokenizer.triplets_from_content(q, p, n)
        )
        # doc keys of the batch's passages and, per query, of its judged documents (-1 pads): the module masks an
        # in-batch "negative" that is judged relevant to the query (optim.in_batch_mask_relevant)
        batch["pos_doc"] = torch.tensor([k.pos for k in keys], dtype=torch.long)
        batch["neg_doc"] = torch.tensor([k.neg for k in keys], dtype=torch.long)
        width = max(1, max(len(k.relevant) for k in keys))
        batch["relevant_docs"] = torch.tensor(
            [list(k.relevant) + [-1] * (width - len(k.relevant)) for k in keys], dtype=torch.long
        )
        batch[HOST_LENGTHS] = host_lengths(batch)  # numpy: they stay on the host when the batch moves
        if self.rank_rows is not None:
            batch[HOST_RANK_ROWS] = self.rank_rows  # an int: it stays on the host too
        return batch


class PairDataset(Dataset):
    """Evaluation dataset of (query, candidate) pairs of one split, one rank's contiguous shard.

    Cross-encoders: a batch is pairs. With passages, a pair names a passage (a unit of `dtexts`) and `unit_doc` maps it
    to its document's index.
    """

    def __init__(
        self,
        pairs: np.ndarray,
        qtexts: list[str],
        dtexts: list[str],
        unit_doc: np.ndarray | None = None,
        tokens: SplitTokens | None = None,
    ):
        self.pairs, self.qtexts, self.dtexts, self.unit_doc, self.tokens = pairs, qtexts, dtexts, unit_doc, tokens

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[int, int, str, str]:
        qi, ui = self.pairs[i]
        di = ui if self.unit_doc is None else self.unit_doc[ui]
        if self.tokens is not None:  # cached content tokens instead of texts
            return int(qi), int(di), *self.tokens.queries.at([qi]), *self.tokens.docs_at([ui])
        return int(qi), int(di), self.qtexts[qi], self.dtexts[ui]


@dataclass
class PairCollate:
    """Collate PairDataset items into a tokenised batch of pairs with their `qidx` and `didx` (cross-encoders)."""

    tokenizer: PairTokenizer

    def __call__(self, items) -> dict[str, torch.Tensor]:
        """Tokenise the batch's (query, passage) pairs and add their query and document indices."""
        qi, di, q, d = map(list, zip(*items))
        batch = self.tokenizer.pairs(q, d) if isinstance(q[0], str) else self.tokenizer.pairs_from_content(q, d)
        batch["qidx"] = torch.tensor(qi)
        batch["didx"] = torch.tensor(di)
        return batch


def doc_chunks(pairs: np.ndarray, max_docs: int, doc_len: np.ndarray | None = None) -> list[np.ndarray]:
    """Cut (qidx, didx) pairs into chunks of at most `max_docs` distinct passages, grouped by passage.

    With `doc_len` (a length per passage index), passages of similar length share a chunk, longest first, so dynamic
    padding pads little; scores do not depend on the grouping.
    """
    if len(pairs) == 0:
        return []
    keys = (pairs[:, 0], pairs[:, 1]) if doc_len is None else (pairs[:, 0], pairs[:, 1], -doc_len[pairs[:, 1]])
    pairs = pairs[np.lexsort(keys)]
    new_doc = np.r_[True, pairs[1:, 1] != pairs[:-1, 1]]
    chunk_id = (np.cumsum(new_doc) - 1) // max_docs
    return np.split(pairs, np.flatnonzero(np.diff(chunk_id)) + 1)


class DocChunkDataset(Dataset):
    """Bi-encoder evaluation dataset: one item is a chunk of distinct passages with the pairs that need them.

    The passages are tokenised (and so encoded) once, with every (query, passage) pair that needs them. The split's
    queries are encoded once per evaluation by the module (`RankingModule.encode_query_texts`) and scored against each
    chunk by index.
    """

    def __init__(
        self,
        chunks: list[np.ndarray],
        dtexts: list[str],
        tokenizer: PairTokenizer,
        unit_doc: np.ndarray | None = None,
        tokens: SplitTokens | None = None,
    ):
        self.chunks, self.dtexts, self.tokenizer, self.unit_doc = chunks, dtexts, tokenizer, unit_doc
        self.tokens = tokens  # cached content tokens instead of texts

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        pairs = self.chunks[i]
        ud, pair_d = np.unique(pairs[:, 1], return_inverse=True)
        if self.tokens is not None:
            batch = self.tokenizer.side_from_content(self.tokens.docs_at(ud), "doc")
        else:
            batch = self.tokenizer.docs([self.dtexts[j] for j in ud])
        didx = pairs[:, 1] if self.unit_doc is None else self.unit_doc[pairs[:, 1]]
        batch.update(
            dpos=torch.from_numpy(
                ud
            ),  # each encoded passage's index in the split's dtexts (RankingModule.keep_vectors)
            pair_d=torch.from_numpy(pair_d.reshape(-1)),
            qidx=torch.from_numpy(pairs[:, 0].copy()),
            didx=torch.from_numpy(np.array(didx, dtype=np.int64)),
        )
        return batch


class EmptyShard(Dataset):
    """Dataset for a DDP rank whose evaluation shard is empty: one batch with no pairs.

    Used when there are fewer chunks or pairs than ranks (e.g. a 1-query split); `RankingModule` skips the batch.
    Lightning's alternative, `allow_zero_length_dataloader_with_multiple_devices`, skips the whole evaluation loop on
    that rank, epoch-end hooks included, so the others would wait forever in the collectives there (the run gather, the
    isotropy and ATS callbacks) and in the DDP wrapper's buffer sync on the first step: every rank must run the loop,
    and the same collectives, once each.
    """

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"qidx": torch.zeros(0, dtype=torch.long), "didx": torch.zeros(0, dtype=torch.long)}


class PassageTexts(Sequence[str]):
    """The evaluation texts of `doc_ids`, each read from the collection when asked.

    Via `passage_text`, cut once per passage: a split re-ranking MS MARCO's top 1,000 names millions of passages, which
    a list would hold in every rank. Compares equal to the list of the same texts.
    """

    def __init__(self, docs, doc_ids: list[str], rotate: bool, seed: int, rotation_mode: str):
        self.docs, self.doc_ids, self.rotate, self.seed, self.rotation_mode = docs, doc_ids, rotate, seed, rotation_mode

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        d = self.doc_ids[i]
        return passage_text(self.docs[d], self.rotate, self.seed, *rotation_draw(self.rotation_mode, 0, d))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None


@dataclass
class EvalSplit:
    """Index space of one evaluation split: results are (qidx, didx, score) and map back through these lists."""

    qids: list[str]
    doc_ids: list[str]
    pairs: np.ndarray  # [N, 2] (qidx, unit index), queries in order, candidates in their given order
    qrels: dict[str, dict[str, int]]
    qtexts: list[str]
    dtexts: Sequence[str]  # the scored units: documents, or their passages (data.passage_words)
    unit_doc: np.ndarray | None = None  # passages: unit -> index in doc_ids; None: the units are the documents
    tokens: SplitTokens | None = (
        None  # the texts as cached content tokens (data.pretokenize), None: tokenised per batch
    )


class RankingDataModule(pl.LightningDataModule):
    """Serve training triplets and evaluation candidates of the configured source to a ranker.

    Loads the dataset (`load_dataset`), draws the training triplets (`train_triples`) and builds the val and test
    `EvalSplit`s; its loaders shard them over DDP ranks without padding, rotation-debiased as `data.rotate_train` /
    `data.rotate_eval` say (module docstring). It also gives the isotropy callback its probe texts and test batches.

    Parameters
    ----------
    cfg
        The run's `data` config (a `DataConfig` of the source).
    tokenizer : PairTokenizer
        Tokenises batches in the loaders (and their workers).
    seed : int
        Run seed: triplet sampling, rotation cuts, the training order and the probe set.
    probe_queries, probe_docs : int
        Size of the isotropy probe set (`probe_texts`).
    """

    def __init__(self, cfg, tokenizer: PairTokenizer, seed: int, probe_queries: int = 32, probe_docs: int = 64):
        super().__init__()
        self.cfg, self.tokenizer, self.seed = cfg, tokenizer, seed
        self.probe_queries, self.probe_docs = probe_queries, probe_docs
        self.dataset: IRDataset | None = None
        self.triples: list[tuple[str, str, str]] = []
        self.eval_splits: dict[str, EvalSplit] = {}
        # the splits the job uses (None: all; an evaluation: ("test",)): a source reads only those (load_dataset),
        # and no training triple is drawn when "train" is not among them
        self.splits: tuple[str, ...] | None = None
        self.train_tokens: tuple[QueryTokens, PassageTokens] | None = None
        self._tokens_for: PairTokenizer | None = None  # the tokenizer `train_tokens` and the splits' tokens are for

    # ---- loading -------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Load the dataset, unless loaded already (rank 0 only, so the BM25 caches are filled once)."""
        # Rank 0 only: fills the BM25 caches so the other ranks read instead of recompute. The entry points
        # have usually loaded the data already (to validate it before writing anything).
        if self.dataset is None:
            self._load()

    def setup(self, stage: str | None = None) -> None:
        """Load the dataset on this rank, unless loaded already."""
        if self.dataset is None:
            self._load()

    def _candidates(self, ds: IRDataset, split_name: str, qids: list[str] | None = None) -> dict[str, list[str]]:
        """Return the split's candidate lists, or the BM25 top-k of its queries.

        `qids`: of these only (e.g. the sampled evaluation queries; ranking 6,980 MS MARCO dev queries to test 8 of
        them would waste minutes).
        """
        split = ds.split(split_name)
        if split.candidates is not None:
            return split.candidates
        queries = split.queries if qids is None else {q: split.queries[q] for q in qids}
        return bm25_candidates(
            ds.docs, queries, self.cfg.candidate_depth, self.cfg.cache_dir, f"{ds.name}-{split_name}"
        )

    def train_triples(self, ds: IRDataset) -> list[tuple[str, str, str]]:
        """Return the training triplets of `ds` in training order.

        The source's, or sampled from its qrels (BM25 or random negatives), then cut to `max_train_triples`. Index i of
        this list is the i of `train_rotation_key` (the `per_epoch` rotation key).
        """
        cfg = self.cfg
        train = ds.split("train")
        triples = train.triples
        if triples is None:
            if cfg.negatives == "given":
                raise InputError(
                    "data.negatives",
                    f"'given' but source '{cfg.source}' has no training triples; use 'bm25' or 'random'",
                )
            cands = self._candidates(ds, "train") if cfg.negatives == "bm25" else None
            triples = sample_triples(train, ds.docs, cands, cfg.negatives, self.seed)
        if cfg.max_train_triples is not None and len(triples) > cfg.max_train_triples:
            rank_zero_warn(
                f"data.max_train_triples={cfg.max_train_triples}: training on {cfg.max_train_triples} of "
                f"the {len(triples)} training triples (a seeded sample)"
            )
            keep = np.sort(np.random.default_rng([self.seed, 1]).permutation(len(triples))[: cfg.max_train_triples])
            triples = triples.take(keep) if hasattr(triples, "take") else [triples[i] for i in keep]
        # a memory-mapped TripleArray stays one: copying MS MARCO's triples into a list would cost GBs a rank
        return triples if hasattr(triples, "take") else list(triples)

    def _load(self) -> None:
        ds = load_dataset(self.cfg, self.seed, self.splits)
        self.triples = self.train_triples(ds) if self.splits is None or "train" in self.splits else []
        for name in ("val", "test"):
            self.eval_splits[name] = self._eval_split(ds, name)
        self.dataset = ds

    def pretokenize(self) -> None:
        """Tokenise the run's passages and queries once (`data.pretokenize`), as training and evaluation cut them.

        Evaluation splits get `tokens`, training `train_tokens`, for the current `tokenizer` (the loaders call this:
        the data is read and checked before the model, and so the tokenizer, exists). Left as text (tokenised per
        batch, in the loaders): passage windows (`data.passage_words`, cut per epoch), training passages cut per
        epoch (`data.rotation=per_epoch`), and a tokenizer whose output is not content plus fixed special tokens.
        """
        pt = self.tokenizer
        if self.dataset is None or pt is None or self._tokens_for is pt:
            return
        self._tokens_for = pt
        self.train_tokens = None
        for es in self.eval_splits.values():
            es.tokens = None
        cfg, ds = self.cfg, self.dataset
        if not cfg.pretokenize or passage_window(cfg) is not None or pt.template is None:
            return
        docs = ds.docs
        wanted: dict[bool, list[np.ndarray]] = {}  # rotated or not -> the collection rows to tokenise so
        eval_rows = {name: store_rows(docs, es.doc_ids) for name, es in self.eval_splits.items()}
        if eval_rows:
            wanted[cfg.rotate_eval] = list(eval_rows.values())
        train = bool(len(self.triples)) and (not cfg.rotate_train or cfg.rotation == "per_passage")
        if train:
            triples = self.triples
            if hasattr(triples, "distinct") and getattr(triples.docs, "fingerprint", None) == getattr(
                docs, "fingerprint", None
            ):
                rows = triples.distinct()[1]  # block-wise array passes: MS MARCO's 39.8M triples stay on disk
            else:
                rows = store_rows(docs, list(dict.fromkeys(d for _, p, n in triples for d in (p, n))))
            wanted.setdefault(cfg.rotate_train, []).append(rows)
        seed = self.seed
        tables = {
            rotate: PassageTokens.build(
                docs,
                np.concatenate(parts),
                lambda d, text, rotate=rotate: passage_text(text, rotate, seed, *rotation_draw("per_passage", 0, d)),
                {"normalized": True, "rotate": rotate, "seed": seed if rotate else None, "cut": "per_passage"},
                pt,
                cfg.cache_dir,
            )
            for rotate, parts in wanted.items()
        }
        for name, es in self.eval_splits.items():
            es.tokens = SplitTokens(QueryTokens.in_memory(es.qtexts, pt), tables[cfg.rotate_eval], eval_rows[name])
        if train:
            queries = QueryTokens.cached(ds.split("train").queries, pt, cfg.cache_dir)
            self.train_tokens = (queries, tables[cfg.rotate_train])

    def _eval_split(self, ds: IRDataset, name: str) -> EvalSplit:
        split = ds.split(name)
        # Every judged query with a text is scored, also one that a given run leaves out: it has no candidate and
        # scores 0 (trec_eval -c), as a query without BM25 candidates. Unjudged queries: trec_eval ignores them anyway.
        qids = split.scored_queries(self.cfg.max_eval_queries, self.seed, self.cfg.eval_sample_seed)
        cands = self._candidates(ds, name, qids)
        doc_ids = sorted({d for q in qids for d in cands.get(q, ())})
        didx = {d: i for i, d in enumerate(doc_ids)}
        pairs = np.array(
            [(qi, didx[d]) for qi, q in enumerate(qids) for d in cands.get(q, ())], dtype=np.int64
        ).reshape(-1, 2)
        dtexts = PassageTexts(ds.docs, doc_ids, self.cfg.rotate_eval, self.seed, self.cfg.rotation)
        unit_doc = None
        window = passage_window(self.cfg)
        if window is not None:
            pairs, dtexts, unit_doc = expand_pairs(pairs, dtexts, *window, self.cfg.doc_score)
        return EvalSplit(
            qids, doc_ids, pairs, {q: split.qrels[q] for q in qids}, [split.queries[q] for q in qids], dtexts, unit_doc
        )

    # ---- loaders -------------------------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _consumed(self) -> int:
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def _loader_options(self) -> dict:
        """DataLoader settings of every loader: workers (`loader_workers`), pinned memory, persistent workers, prefetch.

        Pinned memory and non-blocking copies only where a GPU is used; workers kept across epochs and evaluations, so
        each validation does not start processes again.
        """
        trainer = self.trainer
        cuda = torch.cuda.is_available() and (
            trainer is None or getattr(trainer.strategy.root_device, "type", "cuda") == "cuda"
        )
        workers = loader_workers(self.cfg.num_workers, cuda, trainer.num_devices if trainer is not None else 1)
        extra = dict(persistent_workers=True, prefetch_factor=4) if workers else {}
        return dict(num_workers=workers, pin_memory=cuda, **extra)

    def _generator(self) -> torch.Generator:
        # Each loader iterator draws a worker base seed; from its own generator it leaves the global RNG (dropout)
        # untouched, which keeps a resumed run on the uninterrupted run's random stream.
        return torch.Generator().manual_seed(self.seed)

    def train_dataloader(self) -> DataLoader:
        """Return the resumable training loader: triplets in the seeded per-epoch order, sharded over DDP ranks."""
        rank, world = self._rank_world()
        self.pretokenize()
        train = self.dataset.split("train")
        ds = TripletDataset(
            self.dataset,
            self.triples,
            train.queries,
            self.cfg.rotate_train,
            self.seed,
            passage_window(self.cfg),
            self.cfg.train_passage,
            self.cfg.rotation,
            qrels=train.qrels,
            tokens=self.train_tokens,
        )
        sampler = DistributedTrainBatchSampler(len(ds), self.cfg.batch_size, self.seed, rank, world)
        return ResumableLoader(
            ds,
            batch_sampler=sampler,
            collate_fn=TripletCollate(self.tokenizer, sampler.max_shard if world > 1 else None),
            **self._loader_options(),
            consumed=self._consumed,
            generator=self._generator(),
            what="training example",
        )

    def eval_dataloader(self, name: str) -> DataLoader:
        """Return this rank's loader of the evaluation split `name` ("val" or "test").

        Bi-encoders: chunks of distinct passages (each encoded once), strided over the ranks. Cross-encoders: a
        contiguous shard of the (query, passage) pairs in batches of `eval_batch_size`. A rank with an empty share
        gets one empty batch (`EmptyShard`).
        """
        rank, world = self._rank_world()
        self.pretokenize()
        split = self.eval_splits[name]
        common = dict(
            **self._loader_options(),
            generator=self._generator(),
            what=f"{name} example",
        )
        if self.tokenizer.kind == "bi":
            # Ranks split the passages (each encoded by one rank, once); pairs follow their passage.
            # Characters stand in for tokens (tokenising happens in the workers); strided shards give every rank
            # a similar mix of long and short chunks.
            chunks = doc_chunks(split.pairs, self.cfg.eval_batch_size, np.array([len(t) for t in split.dtexts]))
            if len(split.pairs) and not chunks[rank::world]:
                return GuardedLoader(EmptyShard(), batch_size=None, shuffle=False, **common)
            ds = DocChunkDataset(chunks[rank::world], split.dtexts, self.tokenizer, split.unit_doc, split.tokens)
            return GuardedLoader(ds, batch_size=None, shuffle=False, **common)
        shard = shard_range(len(split.pairs), rank, world)
        if len(split.pairs) and not len(shard):
            return GuardedLoader(EmptyShard(), batch_size=None, shuffle=False, **common)
        ds = PairDataset(
            split.pairs[shard.start : shard.stop], split.qtexts, split.dtexts, split.unit_doc, split.tokens
        )
        return GuardedLoader(
            ds, batch_size=self.cfg.eval_batch_size, shuffle=False, collate_fn=PairCollate(self.tokenizer), **common
        )

    def val_dataloader(self) -> DataLoader:
        """Return this rank's loader of the validation split."""
        return self.eval_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        """Return this rank's loader of the test split."""
        return self.eval_dataloader("test")

    # ---- isotropy probe ------------------------------------------------------------------------------------
    def pair_batches(
        self, split: str, batch_pairs: int, max_batches: int | None = None, sample_seed: int = 0, texts: bool = True
    ) -> list[tuple[int, list, list]]:
        """Return this rank's share of the split's pairs in batches of `batch_pairs`: [(k, queries, passages)].

        The split's (query, candidate) pairs in split order (queries in order, candidates in their order), cut into
        consecutive batches of `batch_pairs` pairs, as an evaluation loop of that batch size would see them (the
        isotropy paper's test mini-batches, Sec. 3.2): [(k, query texts, passage texts)], this rank's share (the
        j-th batch taken goes to rank j mod world size), so DDP ranks split the batches without overlap and k names
        each one. `max_batches`: a uniform sample of that many batches (seeded by `sample_seed` alone, so every
        model, run seed and world size measures the same ones), in split order; None: all of them. `texts=False`:
        the pairs' rows instead of their texts (query indices into `qtexts`, passage indices into `dtexts`), for a
        consumer that holds the split's encodings by row.
        """
        es = self.eval_splits[split]
        rank, world = self._rank_world()
        n = -(-len(es.pairs) // batch_pairs)
        taken = np.arange(n)
        if max_batches is not None and max_batches < n:
            taken = np.sort(np.random.default_rng([sample_seed, 4]).choice(n, size=max_batches, replace=False))
        out = []
        for k in taken[rank::world].tolist():
            chunk = es.pairs[k * batch_pairs : (k + 1) * batch_pairs]
            if texts:
                out.append((k, [es.qtexts[q] for q in chunk[:, 0]], [es.dtexts[u] for u in chunk[:, 1]]))
            else:
                out.append((k, chunk[:, 0].copy(), chunk[:, 1].copy()))
        return out

    def probe_texts(self, split: str = "val") -> tuple[list[str], list[str]]:
        """Return this rank's shard of a fixed, seeded probe set: (query texts, passage texts) of `split`.

        The queries and candidate passages of `split` ("val" at every validation, "test" at test), this rank's shard:
        I(W) and avgcos are measured on the same texts at every validation, and DDP ranks split it without overlap. A
        split the source does not have falls back to the validation split.
        """
        split = self.eval_splits[split if split in self.eval_splits else "val"]
        rng = np.random.default_rng([self.seed, 3])
        qi = np.sort(rng.permutation(len(split.qids))[: self.probe_queries])
        di = np.sort(rng.permutation(len(split.dtexts))[: self.probe_docs])
        rank, world = self._rank_world()
        qs, ds = shard_range(len(qi), rank, world), shard_range(len(di), rank, world)
        return [split.qtexts[i] for i in qi[qs.start : qs.stop]], [split.dtexts[i] for i in di[ds.start : ds.stop]]
