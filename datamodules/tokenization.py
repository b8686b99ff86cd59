"""Text -> tensors for a ranker. Picklable, so DataLoader workers tokenise while the model computes.

Padding is dynamic (to the longest sequence in the batch, never to the maximum length): on CPU and GPU alike
the cost of a transformer grows with the padded length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# The key under which a training batch carries its rows' token counts as the host tokenised them: {attention-mask key:
# int64 array [rows]} (`TripletCollate`). With them a ranker decides padding questions on the host (length groups,
# whether a mask is needed) instead of reading the mask back from the device, a sync per forward pass on a GPU.
HOST_LENGTHS = "host_lengths"
# the most triplets any DDP rank's share of a global training batch holds (DistributedTrainBatchSampler.max_shard): the
# ranks pad their in-batch negatives to it, a shape every rank knows without asking the others (a host sync)
HOST_RANK_ROWS = "host_rank_rows"


def host_lengths(batch: dict[str, Tensor]) -> dict[str, np.ndarray]:
    """Return {key: tokens per row} of the batch's [rows, length] attention masks (on the CPU, as tokenised)."""
    return {k: v.sum(1).numpy() for k, v in batch.items() if k.endswith("attention_mask") and v.ndim == 2}


@dataclass(frozen=True)
class Template:
    """Where a tokenizer puts its special tokens around one text's and a pair's content tokens.

    `tokenizer(a)` is `single[0] + a + single[1]`; `tokenizer(a, b)` is `pair[0] + a + pair[1] + b + pair[2]`, with
    token type 0 up to and including `pair[1]` and 1 after it (`pair_types`). Found by probing (`template_of`), so a
    batch can be assembled from cached content tokens exactly as the tokenizer would build it from text.
    """

    single: tuple[tuple[int, ...], tuple[int, ...]]
    pair: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    pair_types: bool  # the tokenizer returns token_type_ids

    @property
    def single_specials(self) -> int:
        """Special tokens around one text."""
        return sum(map(len, self.single))

    @property
    def pair_specials(self) -> int:
        """Special tokens around and between a pair's texts."""
        return sum(map(len, self.pair))


# probes: several lengths, so a template that depends on the content (it should not) is caught
_PROBES = (("hello world", "a longer passage of text here"), ("x", "y"), ("query words go here", "p"))


def template_of(tokenizer) -> Template | None:
    """Return the special-token `Template` of `tokenizer`, or None when its output is not content plus fixed tokens.

    None also for left padding: batches are assembled right-padded. The capability decides, never the tokenizer's name:
    a tokenizer without it is fed text per batch as before.
    """
    if getattr(tokenizer, "padding_side", "right") != "right" or tokenizer.pad_token_id is None:
        return None
    found = set()
    for a, b in _PROBES:
        ca = tokenizer(a, add_special_tokens=False)["input_ids"]
        cb = tokenizer(b, add_special_tokens=False)["input_ids"]
        one = tokenizer(a)["input_ids"]
        two = tokenizer(a, b)
        ids = two["input_ids"]
        cut = _find(one, ca)
        at = _find(ids, ca)
        bt = _find(ids, cb, at + len(ca)) if at >= 0 else -1
        if cut < 0 or at < 0 or bt < 0:
            return None
        single = (tuple(one[:cut]), tuple(one[cut + len(ca) :]))
        pair = (tuple(ids[:at]), tuple(ids[at + len(ca) : bt]), tuple(ids[bt + len(cb) :]))
        types = two.get("token_type_ids")
        if types is not None and list(types) != [0] * bt + [1] * (len(ids) - bt):
            return None
        found.add(Template(single, pair, types is not None))
    return found.pop() if len(found) == 1 else None


def _find(seq: Sequence[int], sub: Sequence[int], start: int = 0) -> int:
    for i in range(start, len(seq) - len(sub) + 1):
        if list(seq[i : i + len(sub)]) == list(sub):
            return i
    return -1


def assemble(
    parts: Sequence[Sequence[Sequence[int] | np.ndarray]], pad_id: int, types_from: int | None = None
) -> dict[str, Tensor]:
    """Right-padded `input_ids` and `attention_mask` of rows that are each the concatenation of their parts.

    `types_from`: also `token_type_ids`, 1 from each row's part `types_from` on (a pair's second text), else 0.
    """
    lens = np.array([[len(p) for p in row] for row in parts], dtype=np.int64).reshape(len(parts), -1)
    total = lens.sum(1)
    starts = np.cumsum(lens, 1) - lens
    width = int(total.max(initial=0))
    ids = np.full((len(parts), width), pad_id, dtype=np.int64)
    # one slice assignment per part: a row is never concatenated first (that was most of a batch's gathering)
    for r, row in enumerate(parts):
        for j, p in enumerate(row):
            if len(p):
                ids[r, starts[r, j] : starts[r, j] + len(p)] = p
    positions = np.arange(width)[None, :]
    out = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy((positions < total[:, None]).astype(np.int64)),
    }
    if types_from is not None:
        second = (positions >= starts[:, types_from, None]) & (positions < total[:, None])
        out["token_type_ids"] = torch.from_numpy(second.astype(np.int64))
    return out


class PairTokenizer:
    """Tokenise queries, passages, evaluation pairs and training triplets for a bi- or cross-encoder.

    Bi-encoders (`kind="bi"`) get separate `q_*` and `d_*` inputs; cross-encoders (`kind="cross"`) get one input per
    (query, passage) pair in the tokenizer's pair format, the query truncated to its own budget first. Each side is
    truncated to `query_max_len` / `doc_max_len` tokens and a batch is padded to its longest input.

    Parameters
    ----------
    tokenizer
        A Hugging Face tokenizer.
    kind : str
        "bi" or "cross" (ValueError otherwise).
    query_max_len, doc_max_len : int
        Token budgets of a query and a passage.
    """

    def __init__(self, tokenizer, kind: str, query_max_len: int, doc_max_len: int):
        if kind not in ("bi", "cross"):
            raise ValueError(f"kind must be 'bi' or 'cross', got {kind!r}")
        self.tokenizer = tokenizer
        self.kind = kind
        self.query_max_len = query_max_len
        self.doc_max_len = doc_max_len
        self._template: Template | None | bool = False  # probed on first use

    def __getstate__(self):
        return {**self.__dict__, "_template": False}  # workers probe again (cheap) rather than trust a stale probe

    @property
    def template(self) -> Template | None:
        """The tokenizer's special-token `Template`, None when batches cannot be assembled from cached tokens."""
        if self._template is False:
            self._template = template_of(self.tokenizer)
        return self._template

    def _side(self, texts: list[str], max_len: int, prefix: str) -> dict[str, Tensor]:
        t = self.tokenizer(texts, padding="longest", truncation=True, max_length=max_len, return_tensors="pt")
        return {f"{prefix}input_ids": t["input_ids"], f"{prefix}attention_mask": t["attention_mask"]}

    def _cross(self, queries: list[str], docs: list[str]) -> dict[str, Tensor]:
        # Truncate the query to its own budget first, so a long query cannot eat the passage's tokens.
        q_ids = self.tokenizer(queries, add_special_tokens=False, truncation=True, max_length=self.query_max_len)[
            "input_ids"
        ]
        q_trunc = self.tokenizer.batch_decode(q_ids)
        t = self.tokenizer(
            q_trunc,
            docs,
            padding="longest",
            truncation="only_second",
            max_length=self.query_max_len + self.doc_max_len + 3,
            return_tensors="pt",
        )
        out = {"input_ids": t["input_ids"], "attention_mask": t["attention_mask"]}
        if "token_type_ids" in t:
            out["token_type_ids"] = t["token_type_ids"]
        return out

    def ids(self, texts: list[str], side: str) -> list[list[int]]:
        """Return the token ids of each text (special tokens added, truncated to the side's budget), unpadded.

        Tokenise once, then `pad` any grouping of them (e.g. batches of similar length).
        """
        if not texts:  # a DDP rank's share can be empty; Hugging Face tokenizers raise IndexError on []
            return []
        max_len = self.query_max_len if side == "query" else self.doc_max_len
        return self.tokenizer(texts, truncation=True, max_length=max_len)["input_ids"]

    def pad(self, ids: list[list[int]], side: str) -> dict[str, Tensor]:
        """`ids` padded to the longest of them, keyed as `queries` / `docs` key their output."""
        t = self.tokenizer.pad({"input_ids": ids}, padding="longest", return_tensors="pt")
        prefix = "q_" if side == "query" else "d_"
        return {f"{prefix}input_ids": t["input_ids"], f"{prefix}attention_mask": t["attention_mask"]}

    # ---- from cached content tokens (datamodules/token_cache.py) -------------------------------------------------
    @property
    def doc_cap(self) -> int:
        """Content tokens of a passage that any batch can use: a bi-encoder's budget, or a cross-encoder's most.

        A cross-encoder pair is cut to query_max_len + doc_max_len + 3 tokens, the passage taking what the query
        leaves (`_cross`), so up to that minus the pair's special tokens.
        """
        t = self.template
        if self.kind == "bi":
            return self.doc_max_len - t.single_specials
        return self.query_max_len + self.doc_max_len + 3 - t.pair_specials

    def query_content(self, texts: list[str]) -> list[list[int]]:
        """Content tokens (no special tokens) of queries, as the batches of text would cut them.

        Bi-encoders: the first query_max_len minus the special tokens. Cross-encoders: the query's first query_max_len
        tokens decoded and tokenised again, as `_cross` does.
        """
        if not texts:
            return []
        if self.kind == "bi":
            cap = self.query_max_len - self.template.single_specials
            return self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=cap)["input_ids"]
        q_ids = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.query_max_len)[
            "input_ids"
        ]
        return self.tokenizer(self.tokenizer.batch_decode(q_ids), add_special_tokens=False)["input_ids"]

    def doc_content(self, texts: list[str]) -> list[list[int]]:
        """Content tokens (no special tokens) of passages, cut at `doc_cap`."""
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.doc_cap)["input_ids"]

    def side_from_content(self, contents: Sequence[np.ndarray], side: str) -> dict[str, Tensor]:
        """Return what `queries` / `docs` give for the texts whose cached content tokens are `contents`."""
        head, tail = self.template.single
        cap = (self.query_max_len if side == "query" else self.doc_max_len) - self.template.single_specials
        t = assemble([(head, c[:cap], tail) for c in contents], self.tokenizer.pad_token_id)
        prefix = "q_" if side == "query" else "d_"
        return {f"{prefix}input_ids": t["input_ids"], f"{prefix}attention_mask": t["attention_mask"]}

    def pairs_from_content(self, queries: Sequence[np.ndarray], docs: Sequence[np.ndarray]) -> dict[str, Tensor]:
        """Return what `pairs` gives for cached content tokens (a cross-encoder's passage cut to what is left)."""
        if self.kind == "bi":
            return {**self.side_from_content(queries, "query"), **self.side_from_content(docs, "doc")}
        a, mid, b = self.template.pair
        total = self.query_max_len + self.doc_max_len + 3 - self.template.pair_specials
        rows = [(a, q, mid, d[: max(0, total - len(q))], b) for q, d in zip(queries, docs)]
        t = assemble(rows, self.tokenizer.pad_token_id, types_from=3 if self.template.pair_types else None)
        return t

    def triplets_from_content(
        self, queries: Sequence[np.ndarray], pos: Sequence[np.ndarray], neg: Sequence[np.ndarray]
    ) -> dict[str, Tensor]:
        """Return what `triplets` gives for cached content tokens."""
        if self.kind == "cross":
            return self.pairs_from_content(list(queries) + list(queries), list(pos) + list(neg))
        return {**self.side_from_content(queries, "query"), **self.side_from_content(list(pos) + list(neg), "doc")}

    def queries(self, texts: list[str]) -> dict[str, Tensor]:
        """Tokenise queries for a bi-encoder: `q_input_ids` and `q_attention_mask`, padded to the longest."""
        return self._side(texts, self.query_max_len, "q_")

    def docs(self, texts: list[str]) -> dict[str, Tensor]:
        """Tokenise passages for a bi-encoder: `d_input_ids` and `d_attention_mask`, padded to the longest."""
        return self._side(texts, self.doc_max_len, "d_")

    def pairs(self, queries: list[str], docs: list[str]) -> dict[str, Tensor]:
        """Query i with passage i (evaluation)."""
        if self.kind == "cross":
            return self._cross(queries, docs)
        return {**self.queries(queries), **self.docs(docs)}

    def triplets(self, queries: list[str], pos: list[str], neg: list[str]) -> dict[str, Tensor]:
        """Tokenise a training batch of B (query, positive, negative) triplets.

        Bi-encoders: B queries and 2B passages (positives, then negatives), so each query is encoded once.
        Cross-encoders: 2B pairs, (q_i, pos_i) for i < B then (q_i, neg_i).
        """
        if self.kind == "cross":
            return self._cross(queries + queries, pos + neg)
        return {**self.queries(queries), **self.docs(pos + neg)}


def length_order(lengths) -> np.ndarray:
    """Return the text indices longest first, equal lengths in input order.

    Batches of similar length pad little (SQuAD paragraphs at 180 tokens: real/padded tokens 0.76 in arbitrary batches
    of 32, ~0.98 sorted). Every encoder of already tokenised texts batches in this order (evaluation, the analyses).
    """
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
