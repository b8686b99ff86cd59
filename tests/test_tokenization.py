"""PairTokenizer: batch layout of bi-encoder and cross-encoder inputs, truncation budgets, dynamic padding."""

from __future__ import annotations

import pickle

import pytest

from datamodules.tokenization import PairTokenizer

QM, DM = 6, 10
QUERIES = ["what is dense retrieval", "isotropy", "a long query about late interaction and cosine similarity of tokens"]
POS = ["dense retrieval encodes text into vectors", "the isotropy of representations", "colbert"]
NEG = [
    "an unrelated passage about cooking pasta with tomatoes garlic basil olive oil and a pinch of salt",
    "bm25",
    "something else entirely",
]


@pytest.fixture(scope="module")
def tok(tiny_bert):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert)


def real_ids(batch, prefix: str, i: int) -> list[int]:
    n = int(batch[f"{prefix}attention_mask"][i].sum())
    assert batch[f"{prefix}attention_mask"][i, :n].all() and not batch[f"{prefix}attention_mask"][i, n:].any()
    return batch[f"{prefix}input_ids"][i, :n].tolist()


def alone(tok, text: str, max_len: int) -> list[int]:
    return tok(text, truncation=True, max_length=max_len)["input_ids"]


def cross_layout(tok, q: str, p: str, qm: int, dm: int) -> tuple[list[int], list[int]]:
    """[CLS] q[:qm] [SEP] p [SEP] with the passage truncated so the total is at most qm + dm + 3."""
    q_ids = tok(q, add_special_tokens=False)["input_ids"][:qm]
    p_ids = tok(p, add_special_tokens=False)["input_ids"][: qm + dm - len(q_ids)]
    ids = [tok.cls_token_id] + q_ids + [tok.sep_token_id] + p_ids + [tok.sep_token_id]
    types = [0] * (len(q_ids) + 2) + [1] * (len(p_ids) + 1)
    return ids, types


def test_kind_is_validated(tok):
    with pytest.raises(ValueError, match="kind"):
        PairTokenizer(tok, "poly", QM, DM)


def test_picklable(tok):
    pt = PairTokenizer(tok, "cross", QM, DM)
    again = pickle.loads(pickle.dumps(pt))
    assert again.pairs(QUERIES, POS)["input_ids"].tolist() == pt.pairs(QUERIES, POS)["input_ids"].tolist()


# --------------------------------------------------------------------------------------------- bi-encoder


def test_bi_triplets_layout(tok):
    pt = PairTokenizer(tok, "bi", QM, DM)
    b = pt.triplets(QUERIES, POS, NEG)
    assert set(b) == {"q_input_ids", "q_attention_mask", "d_input_ids", "d_attention_mask"}
    assert b["q_input_ids"].shape[0] == 3 and b["q_attention_mask"].shape == b["q_input_ids"].shape
    assert b["d_input_ids"].shape[0] == 6 and b["d_attention_mask"].shape == b["d_input_ids"].shape
    for i, q in enumerate(QUERIES):
        assert real_ids(b, "q_", i) == alone(tok, q, QM)
    for i, d in enumerate(POS + NEG):  # positives first, then negatives, index-aligned with the queries
        assert real_ids(b, "d_", i) == alone(tok, d, DM)


def test_bi_truncation_keeps_special_tokens(tok):
    b = PairTokenizer(tok, "bi", QM, DM).triplets(QUERIES, POS, NEG)
    assert b["q_input_ids"].shape[1] == QM  # the long query hits the budget
    assert b["d_input_ids"].shape[1] == DM  # so does the long negative
    long_q = real_ids(b, "q_", 2)
    assert long_q[0] == tok.cls_token_id and long_q[-1] == tok.sep_token_id
    assert long_q[1:-1] == tok(QUERIES[2], add_special_tokens=False)["input_ids"][: QM - 2]


def test_bi_padding_is_dynamic(tok):
    pt = PairTokenizer(tok, "bi", 64, 128)
    b = pt.triplets(QUERIES, POS, NEG)
    q_lens = [len(alone(tok, q, 64)) for q in QUERIES]
    d_lens = [len(alone(tok, d, 128)) for d in POS + NEG]
    assert b["q_input_ids"].shape[1] == max(q_lens) < 64
    assert b["d_input_ids"].shape[1] == max(d_lens) < 128
    assert b["q_attention_mask"].sum(1).tolist() == q_lens
    assert b["d_attention_mask"].sum(1).tolist() == d_lens
    assert (b["d_input_ids"][b["d_attention_mask"] == 0] == tok.pad_token_id).all()


def test_bi_pairs(tok):
    b = PairTokenizer(tok, "bi", QM, DM).pairs(QUERIES, POS)
    assert b["q_input_ids"].shape[0] == b["d_input_ids"].shape[0] == 3
    for i, (q, d) in enumerate(zip(QUERIES, POS)):
        assert real_ids(b, "q_", i) == alone(tok, q, QM)
        assert real_ids(b, "d_", i) == alone(tok, d, DM)


# ------------------------------------------------------------------------------------------ cross-encoder


def test_cross_triplets_order_and_layout(tok):
    pt = PairTokenizer(tok, "cross", QM, DM)
    b = pt.triplets(QUERIES, POS, NEG)
    assert set(b) == {"input_ids", "attention_mask", "token_type_ids"}
    assert b["input_ids"].shape[0] == 6
    expected = [(q, p) for q, p in zip(QUERIES, POS)] + [(q, n) for q, n in zip(QUERIES, NEG)]
    for i, (q, p) in enumerate(expected):
        ids, types = cross_layout(tok, q, p, QM, DM)
        assert real_ids(b, "", i) == ids, i
        n = len(ids)
        assert b["token_type_ids"][i, :n].tolist() == types, i
        assert not b["token_type_ids"][i, n:].any()  # padding is segment 0 and masked out


def test_cross_token_types_split_query_and_passage(tok):
    b = PairTokenizer(tok, "cross", QM, DM).pairs(QUERIES, POS)
    for i in range(3):
        ids = real_ids(b, "", i)
        types = b["token_type_ids"][i, : len(ids)].tolist()
        first_sep = ids.index(tok.sep_token_id)
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        assert types[: first_sep + 1] == [0] * (first_sep + 1)  # [CLS] q [SEP]
        assert types[first_sep + 1 :] == [1] * (len(ids) - first_sep - 1)  # p [SEP]


def test_cross_truncation_budgets(tok):
    long_q = "a query " * 20
    long_p = "the passage goes on " * 30
    pt = PairTokenizer(tok, "cross", QM, DM)
    b = pt.pairs([long_q, "short", long_q], [long_p, long_p, "tiny"])
    budget = QM + DM + 3
    assert b["input_ids"].shape[1] <= budget
    full_q = tok(long_q, add_special_tokens=False)["input_ids"]
    full_p = tok(long_p, add_special_tokens=False)["input_ids"]
    # Long query and long passage: query cut to QM, passage takes exactly the rest of the budget.
    ids = real_ids(b, "", 0)
    assert len(ids) == budget
    assert ids[1 : 1 + QM] == full_q[:QM] and ids[1 + QM] == tok.sep_token_id
    assert ids[2 + QM : -1] == full_p[:DM]
    # A short query leaves its unused budget to the passage, never exceeding the total.
    ids = real_ids(b, "", 1)
    assert len(ids) == budget
    sep = ids.index(tok.sep_token_id)
    assert ids[1:sep] == tok("short", add_special_tokens=False)["input_ids"]
    assert ids[sep + 1 : -1] == full_p[: QM + DM - (sep - 1)]
    # A long query cannot eat a short passage: it is still cut to QM and the passage is intact.
    ids = real_ids(b, "", 2)
    assert ids == [tok.cls_token_id] + full_q[:QM] + [tok.sep_token_id] + tok("tiny", add_special_tokens=False)[
        "input_ids"
    ] + [tok.sep_token_id]


def test_cross_query_cut_inside_a_word(tok):
    """Cutting the query between word pieces, then decoding and re-tokenising, keeps exactly QM pieces."""
    q = "antidisestablishmentarianism pseudopseudohypoparathyroidism"
    pieces = tok(q, add_special_tokens=False)["input_ids"]
    assert len(pieces) > QM
    b = PairTokenizer(tok, "cross", QM, DM).pairs([q], ["passage"])
    ids, types = cross_layout(tok, q, "passage", QM, DM)
    assert real_ids(b, "", 0) == ids
    assert b["token_type_ids"][0].tolist() == types


def test_cross_padding_is_dynamic(tok):
    pt = PairTokenizer(tok, "cross", 64, 128)
    b = pt.triplets(QUERIES, POS, NEG)
    lens = [len(cross_layout(tok, q, p, 64, 128)[0]) for q, p in zip(QUERIES + QUERIES, POS + NEG)]
    assert b["input_ids"].shape[1] == max(lens) < 64 + 128 + 3
    assert b["attention_mask"].sum(1).tolist() == lens
