"""Rankers on a tiny random BERT, checked against independent float64 NumPy references written as explicit loops.

References take each text's token vectors from `ranker.encoder(...)` run on that text alone (no padding at
all), so agreement with a padded batch also shows that padding neither enters the score nor changes it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from core.errors import InputError
from datamodules.tokenization import PairTokenizer
from models.rankers import build_ranker
from models.rankers.base import Encoded
from models.rankers.bert_cat import BertCatConfig
from models.rankers.bert_dot import BertDotConfig
from models.rankers.colbert import ColBERTConfig
from models.rankers.repbert import RepBERTConfig
from models.rankers.tk import TKConfig

ATOL = 1e-5

# Different lengths, so every batch below carries padding on both sides.
QUERIES = [
    "what is dense retrieval",
    "isotropy",
    "how do late interaction models like colbert score a query against a long passage",
]
DOCS = [
    "dense retrieval encodes queries and passages into vectors and compares them",
    "representation isotropy means the vectors spread evenly over all directions of the space",
    "colbert",
]
LONG_DOC = (
    "a much longer passage about neural ranking that adds many tokens of padding to every shorter passage "
    "in the same batch so that the padded length clearly differs from the length of any single passage"
)


# ---------------------------------------------------------------------------------------------- helpers


def make(cfg, seed: int = 0):
    torch.manual_seed(seed)  # compress / classifier layers are randomly initialised
    return build_ranker(cfg).eval()


def bi_batch(ranker, queries, docs):
    return PairTokenizer(ranker.tokenizer, "bi", ranker.cfg.query_max_len, ranker.cfg.doc_max_len).pairs(queries, docs)


def ids_alone(ranker, text: str, max_len: int) -> list[int]:
    return ranker.tokenizer(text, truncation=True, max_length=max_len)["input_ids"]


@torch.no_grad()
def hidden_alone(ranker, ids: list[int], token_type_ids: list[int] | None = None) -> np.ndarray:
    """last_hidden_state of one unpadded sequence, straight from the backbone: [L, H] float64."""
    kw = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    if token_type_ids is not None:
        kw["token_type_ids"] = torch.tensor([token_type_ids])
    return ranker.encoder(**kw).last_hidden_state[0].double().numpy()


def np_linear(layer: nn.Linear | None, vectors: list[np.ndarray]) -> list[np.ndarray]:
    """Apply a Linear to each vector with explicit float64 maths (identity when layer is None)."""
    if layer is None:
        return [np.asarray(v, dtype=np.float64) for v in vectors]
    w = layer.weight.detach().double().numpy()
    b = layer.bias.detach().double().numpy() if layer.bias is not None else np.zeros(w.shape[0])
    return [w @ v + b for v in vectors]


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.sqrt(a @ a) * np.sqrt(b @ b)))


def ref_colbert(q_tokens: list[np.ndarray], d_tokens: list[np.ndarray]) -> float:
    """Isotropy paper Eq. 1: sum over query tokens of the max cosine over document tokens."""
    total = 0.0
    for x_q in q_tokens:
        best = -np.inf
        for x_d in d_tokens:
            best = max(best, cos(x_q, x_d))
        total += best
    return total


def mean(vectors: list[np.ndarray]) -> np.ndarray:
    acc = np.zeros_like(vectors[0])
    for v in vectors:
        acc = acc + v
    return acc / len(vectors)


def ref_repbert(q_tokens: list[np.ndarray], d_tokens: list[np.ndarray]) -> float:
    """Isotropy paper Eq. 2: cosine of the mean token vectors (real tokens only)."""
    return cos(mean(q_tokens), mean(d_tokens))


def colbert_tokens(ranker, text: str, max_len: int, token_head: nn.Linear | None = None) -> list[np.ndarray]:
    rows = list(hidden_alone(ranker, ids_alone(ranker, text, max_len)))
    rows = np_linear(ranker.compress, rows)  # ColBERT's compression comes before the cosine
    return np_linear(token_head, rows)


def plain_tokens(ranker, text: str, max_len: int, token_head: nn.Linear | None = None) -> list[np.ndarray]:
    return np_linear(token_head, list(hidden_alone(ranker, ids_alone(ranker, text, max_len))))


def scores_np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def select(enc: Encoded, i: int) -> Encoded:
    seq = None if enc.sequence is None else enc.sequence[i : i + 1]
    return Encoded(tokens=enc.tokens[i : i + 1], mask=enc.mask[i : i + 1], sequence=seq)


def check_score_all_vs_pairs(ranker, queries, docs):
    """score_all[i, j] == score_pairs(q_i, d_j), every (i, j), from one padded batch of each side."""
    with torch.no_grad():
        b = bi_batch(ranker, queries, docs)
        q, d = ranker.encode_queries(b), ranker.encode_docs(b)
        full = ranker.score_all(q, d)
        assert full.shape == (len(queries), len(docs))
        for i in range(len(queries)):
            for j in range(len(docs)):
                pair = ranker.score_pairs(select(q, i), select(d, j))
                assert pair.shape == (1,)
                assert abs(float(full[i, j]) - float(pair[0])) <= ATOL, (i, j)
    return scores_np(full)


@pytest.fixture(scope="module")
def colbert(tiny_bert):
    return make(ColBERTConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24))


@pytest.fixture(scope="module")
def colbert_c(tiny_bert):
    return make(ColBERTConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24, compress_dim=8), seed=1)


@pytest.fixture(scope="module")
def repbert(tiny_bert):
    return make(RepBERTConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24))


# ------------------------------------------------------------------------------------------------ ColBERT


def test_batches_really_contain_padding(colbert):
    b = bi_batch(colbert, QUERIES, DOCS)
    assert not bool(b["q_attention_mask"].all()) and not bool(b["d_attention_mask"].all())
    # the long passage is truncated to doc_max_len, so references must truncate the same way
    assert len(colbert.tokenizer(LONG_DOC)["input_ids"]) > colbert.cfg.doc_max_len
    assert bi_batch(colbert, QUERIES, [LONG_DOC] * 3)["d_input_ids"].shape[1] == colbert.cfg.doc_max_len


@pytest.mark.parametrize("which", ["colbert", "colbert_c"])
def test_colbert_score_pairs_matches_eq1(which, request):
    ranker = request.getfixturevalue(which)
    qm, dm = ranker.cfg.query_max_len, ranker.cfg.doc_max_len
    with torch.no_grad():
        got = scores_np(ranker.score(bi_batch(ranker, QUERIES, DOCS)))
    want = [ref_colbert(colbert_tokens(ranker, q, qm), colbert_tokens(ranker, d, dm)) for q, d in zip(QUERIES, DOCS)]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_colbert_compression_precedes_cosine(colbert_c):
    """The compressed width is what the ranker scores, and the score is not the uncompressed Eq. 1."""
    b = bi_batch(colbert_c, QUERIES[:1], DOCS[:1])
    with torch.no_grad():
        q = colbert_c.encode_queries(b)
        got = float(colbert_c.score(b)[0])
    assert q.tokens.shape[-1] == 8
    qm, dm = colbert_c.cfg.query_max_len, colbert_c.cfg.doc_max_len
    uncompressed = ref_colbert(plain_tokens(colbert_c, QUERIES[0], qm), plain_tokens(colbert_c, DOCS[0], dm))
    assert abs(got - uncompressed) > 1e-3
    # Compression applied after the cosine-normalisation would give yet another number.
    qn = [v / np.linalg.norm(v) for v in plain_tokens(colbert_c, QUERIES[0], qm)]
    dn = [v / np.linalg.norm(v) for v in plain_tokens(colbert_c, DOCS[0], dm)]
    w = colbert_c.compress.weight.detach().double().numpy()
    after = sum(max(float((w @ a) @ (w @ c)) for c in dn) for a in qn)
    assert abs(got - after) > 1e-3


@pytest.mark.parametrize("which", ["colbert", "colbert_c"])
def test_colbert_padding_amount_does_not_change_score(which, request):
    ranker = request.getfixturevalue(which)
    with torch.no_grad():
        alone = float(ranker.score(bi_batch(ranker, [QUERIES[1]], [DOCS[2]]))[0])
        b = bi_batch(ranker, [QUERIES[1], QUERIES[2]], [DOCS[2], LONG_DOC])
        assert int(b["d_attention_mask"][0].sum()) < b["d_attention_mask"].shape[1]  # DOCS[2] padded here
        assert int(b["q_attention_mask"][0].sum()) < b["q_attention_mask"].shape[1]  # QUERIES[1] padded here
        batched = float(ranker.score(b)[0])
    assert abs(alone - batched) <= ATOL


@pytest.mark.parametrize("which", ["colbert", "colbert_c"])
def test_colbert_score_all_consistent_and_eq1(which, request):
    ranker = request.getfixturevalue(which)
    docs = DOCS + [LONG_DOC]
    full = check_score_all_vs_pairs(ranker, QUERIES, docs)
    qm, dm = ranker.cfg.query_max_len, ranker.cfg.doc_max_len
    qt = [colbert_tokens(ranker, q, qm) for q in QUERIES]
    dt = [colbert_tokens(ranker, d, dm) for d in docs]
    for i in range(len(QUERIES)):
        for j in range(len(docs)):
            assert abs(full[i, j] - ref_colbert(qt[i], dt[j])) <= ATOL, (i, j)


def test_colbert_token_representations_are_backbone_vectors(colbert):
    b = bi_batch(colbert, QUERIES, DOCS)
    with torch.no_grad():
        enc = colbert.token_representations(b["q_input_ids"], b["q_attention_mask"])
        direct = colbert.encoder(input_ids=b["q_input_ids"], attention_mask=b["q_attention_mask"]).last_hidden_state
    assert torch.equal(enc.mask, b["q_attention_mask"].bool())
    m = enc.mask
    torch.testing.assert_close(enc.tokens[m], direct[m], rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------------------------ RepBERT


def test_repbert_score_pairs_matches_eq2(repbert):
    qm, dm = repbert.cfg.query_max_len, repbert.cfg.doc_max_len
    with torch.no_grad():
        got = scores_np(repbert.score(bi_batch(repbert, QUERIES, DOCS)))
    want = [ref_repbert(plain_tokens(repbert, q, qm), plain_tokens(repbert, d, dm)) for q, d in zip(QUERIES, DOCS)]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_repbert_mean_excludes_padding(repbert):
    b = bi_batch(repbert, QUERIES, DOCS + [LONG_DOC])  # 3 queries, 4 docs: only the doc side is used here
    with torch.no_grad():
        d = repbert.encode_docs(b)
    for i, text in enumerate(DOCS + [LONG_DOC]):
        want = mean(plain_tokens(repbert, text, repbert.cfg.doc_max_len))
        np.testing.assert_allclose(scores_np(d.sequence[i]), want, rtol=0, atol=ATOL)
    with torch.no_grad():
        alone = float(repbert.score(bi_batch(repbert, [QUERIES[1]], [DOCS[2]]))[0])
        batched = float(repbert.score(bi_batch(repbert, [QUERIES[1], QUERIES[2]], [DOCS[2], LONG_DOC]))[0])
    assert abs(alone - batched) <= ATOL


def test_repbert_score_all_consistent_and_eq2(repbert):
    docs = DOCS + [LONG_DOC]
    full = check_score_all_vs_pairs(repbert, QUERIES, docs)
    qm, dm = repbert.cfg.query_max_len, repbert.cfg.doc_max_len
    for i, q in enumerate(QUERIES):
        for j, d in enumerate(docs):
            assert abs(full[i, j] - ref_repbert(plain_tokens(repbert, q, qm), plain_tokens(repbert, d, dm))) <= ATOL


# ------------------------------------------------------------------------------------------------ BERT_DOT


@pytest.mark.parametrize("compress_dim", [None, 8])
def test_bert_dot_is_dot_of_cls(tiny_bert, compress_dim):
    ranker = make(BertDotConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24, compress_dim=compress_dim))
    qm, dm = ranker.cfg.query_max_len, ranker.cfg.doc_max_len
    docs = DOCS + [LONG_DOC]

    def cls(text, max_len):
        (v,) = np_linear(ranker.compress, [hidden_alone(ranker, ids_alone(ranker, text, max_len))[0]])
        return v

    qv = [cls(q, qm) for q in QUERIES]
    dv = [cls(d, dm) for d in docs]

    def dot(a, b):
        return sum(float(x) * float(y) for x, y in zip(a, b))

    with torch.no_grad():
        got = scores_np(ranker.score(bi_batch(ranker, QUERIES, DOCS)))
        assert ranker.encode_queries(bi_batch(ranker, QUERIES, DOCS)).sequence.shape[-1] == (
            compress_dim or ranker.hidden_size
        )
    np.testing.assert_allclose(got, [dot(qv[i], dv[i]) for i in range(len(QUERIES))], rtol=0, atol=ATOL)

    full = check_score_all_vs_pairs(ranker, QUERIES, docs)
    for i in range(len(QUERIES)):
        for j in range(len(docs)):
            assert abs(full[i, j] - dot(qv[i], dv[j])) <= ATOL


# ------------------------------------------------------------------------------------------------ BERT_CAT


def test_bert_cat_is_linear_on_cls_of_concatenation(tiny_bert):
    qm, dm = 4, 6
    ranker = make(BertCatConfig(backbone=tiny_bert, query_max_len=qm, doc_max_len=dm))
    tok = ranker.tokenizer
    pt = PairTokenizer(tok, "cross", qm, dm)
    queries = ["a rather long query with more than four word pieces", "short q", "isotropy"]
    docs = ["p", LONG_DOC, "a passage of middling length here"]
    batch = pt.pairs(queries, docs)
    with torch.no_grad():
        got = scores_np(ranker.score(batch))
    assert got.shape == (3,)

    w = ranker.classifier.weight.detach().double().numpy()[0]
    bias = float(ranker.classifier.bias.detach().double().numpy()[0])
    for i, (q, p) in enumerate(zip(queries, docs)):
        q_ids = tok(q, add_special_tokens=False)["input_ids"][:qm]
        budget = qm + dm + 3 - len(q_ids) - 3
        p_ids = tok(p, add_special_tokens=False)["input_ids"][:budget]
        ids = [tok.cls_token_id] + q_ids + [tok.sep_token_id] + p_ids + [tok.sep_token_id]
        types = [0] * (len(q_ids) + 2) + [1] * (len(p_ids) + 1)
        # The batch row is exactly that layout, then padding.
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :n].tolist() == ids
        assert batch["token_type_ids"][i, :n].tolist() == types
        h_cls = hidden_alone(ranker, ids, types)[0]
        want = sum(float(a) * float(b) for a, b in zip(w, h_cls)) + bias
        assert abs(got[i] - want) <= ATOL, i


# -------------------------------------------------------------------------------------- isotropy head hooks

# Heads are set on the instance in BiEncoder.__init__ (a class-level None would shadow modules kept in
# nn.Module._modules, so an assigned head would be registered but never applied): these tests pin that down.


def test_assigned_head_is_registered_as_submodule(tiny_bert):
    ranker = make(RepBERTConfig(backbone=tiny_bert))
    head = nn.Linear(ranker.hidden_size, ranker.hidden_size)
    ranker.token_head = head
    assert any(p is head.weight for p in ranker.parameters())


def test_colbert_token_head_hook(tiny_bert):
    ranker = make(ColBERTConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24, compress_dim=8))
    torch.manual_seed(5)
    head = nn.Linear(8, 6)
    ranker.token_head = head
    qm, dm = ranker.cfg.query_max_len, ranker.cfg.doc_max_len
    with torch.no_grad():
        got = scores_np(ranker.score(bi_batch(ranker, QUERIES, DOCS)))
    # token_head acts on token_representations (after compression), before the cosine
    want = [
        ref_colbert(colbert_tokens(ranker, q, qm, head), colbert_tokens(ranker, d, dm, head))
        for q, d in zip(QUERIES, DOCS)
    ]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_repbert_token_head_hook(tiny_bert):
    ranker = make(RepBERTConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24))
    torch.manual_seed(6)
    head = nn.Linear(ranker.hidden_size, 12)
    ranker.token_head = head
    qm, dm = ranker.cfg.query_max_len, ranker.cfg.doc_max_len
    with torch.no_grad():
        got = scores_np(ranker.score(bi_batch(ranker, QUERIES, DOCS)))
    want = [
        ref_repbert(plain_tokens(ranker, q, qm, head), plain_tokens(ranker, d, dm, head)) for q, d in zip(QUERIES, DOCS)
    ]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_repbert_sequence_head_hook(tiny_bert):
    ranker = make(RepBERTConfig(backbone=tiny_bert, query_max_len=16, doc_max_len=24))
    torch.manual_seed(7)
    head = nn.Linear(ranker.hidden_size, 12)
    ranker.sequence_head = head
    qm, dm = ranker.cfg.query_max_len, ranker.cfg.doc_max_len
    with torch.no_grad():
        got = scores_np(ranker.score(bi_batch(ranker, QUERIES, DOCS)))
    want = []
    for q, d in zip(QUERIES, DOCS):
        # the head maps the pooled (masked-mean) vector, not the tokens
        (qs,) = np_linear(head, [mean(plain_tokens(ranker, q, qm))])
        (ds,) = np_linear(head, [mean(plain_tokens(ranker, d, dm))])
        want.append(cos(qs, ds))
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------------------------ gradients


@pytest.mark.parametrize(
    "cfg_cls,kw",
    [
        (ColBERTConfig, {}),
        (ColBERTConfig, {"compress_dim": 8}),
        (RepBERTConfig, {}),
        (BertDotConfig, {}),
        (BertDotConfig, {"compress_dim": 8}),
        (BertCatConfig, {}),
        (TKConfig, {}),
    ],
    ids=["colbert", "colbert_compress", "repbert", "bert_dot", "bert_dot_compress", "bert_cat", "tk"],
)
def test_gradients_reach_every_trainable_parameter(tiny_bert, cfg_cls, kw):
    ranker = make(cfg_cls(backbone=tiny_bert, query_max_len=8, doc_max_len=12, **kw))
    pt = PairTokenizer(ranker.tokenizer, ranker.kind, 8, 12)
    batch = pt.pairs(QUERIES, DOCS)
    ranker.zero_grad(set_to_none=True)
    ranker.score(batch).sum().backward()
    # BERT's pooler is not loaded (no ranker reads it, and DDP would wait for its gradients): every parameter
    # that exists must receive a finite, non-zero gradient.
    assert not any("pooler" in n for n, _ in ranker.named_parameters())
    without = {
        n for n, p in ranker.named_parameters() if p.requires_grad and (p.grad is None or not bool(p.grad.any()))
    }
    assert without == set()
    for n, p in ranker.named_parameters():
        assert torch.isfinite(p.grad).all(), n


def test_bi_encoder_score_all_gradients_flow(colbert_c):
    """score_all (in-batch negatives) backpropagates into the compression and the encoder."""
    b = bi_batch(colbert_c, QUERIES, DOCS + [LONG_DOC])
    colbert_c.zero_grad(set_to_none=True)
    try:
        colbert_c.score_all(colbert_c.encode_queries(b), colbert_c.encode_docs(b)).sum().backward()
        assert colbert_c.compress.weight.grad is not None and bool(colbert_c.compress.weight.grad.any())
        assert bool(colbert_c.encoder.embeddings.word_embeddings.weight.grad.any())
    finally:
        colbert_c.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------------------------ errors


def test_unknown_ranker_name_is_input_error(tiny_bert):
    with pytest.raises(InputError, match="model.name") as ei:
        build_ranker(ColBERTConfig(name="no_such_ranker", backbone=tiny_bert))
    assert ei.value.where == "model.name"
    assert "no_such_ranker" in str(ei.value)


@pytest.mark.parametrize("path", ["/definitely/not/a/model_dir", "./no_such_model_dir"])
def test_missing_backbone_path_is_input_error(path):
    with pytest.raises(InputError, match="model.backbone") as ei:
        build_ranker(RepBERTConfig(backbone=path))
    assert ei.value.where == "model.backbone"
    assert path in str(ei.value)


def test_backbone_dir_without_model_is_input_error(tmp_path):
    with pytest.raises(InputError, match="model.backbone"):
        build_ranker(RepBERTConfig(backbone=str(tmp_path)))


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_encode_collection_keeps_each_texts_real_tokens_in_order(name, tiny_bert_nodropout):
    """EncodedTexts from length-sorted batches equals each text encoded alone (float32, 1e-5): real tokens only, in
    the given order, ids kept; `padded` gives them back as the ranker's Encoded batch."""
    from lightning_modules.module import RankingModule
    from models.encoding import encode_collection

    r = RankingModule({"name": name, "backbone": tiny_bert_nodropout}, {}).eval().ranker
    tok = r.tokenizer
    texts = ["a short one", "a much longer passage about cats and the mats they sit on", "mid length text here"]
    ids = tok(texts)["input_ids"]
    enc = encode_collection(r, ids, "doc", batch_size=2, pad_id=tok.pad_token_id, keep_ids=True)
    assert len(enc) == 3 and enc.vecs.shape[0] == sum(len(x) for x in ids)
    for k, x in enumerate(ids):
        with torch.no_grad():
            alone = r.encode(torch.tensor([x]), torch.ones(1, len(x), dtype=torch.long), side="doc")
        assert torch.allclose(enc.tokens(k), r.scoring_vectors(alone.tokens[0]).float(), atol=1e-5)
        assert enc.token_ids(k).tolist() == x
        if alone.sequence is not None:
            assert torch.allclose(enc.sequence[k], r.scoring_vectors(alone.sequence[0]).float(), atol=1e-5)
    batch = enc.padded([2, 0])
    assert batch.tokens.shape[:2] == batch.mask.shape == (2, len(ids[2]))
    assert batch.mask.sum(1).tolist() == [len(ids[2]), len(ids[0])] and not batch.tokens[1, len(ids[0]) :].any()
    assert enc.padded_ids([2, 0])[1].tolist() == ids[0] + [0] * (len(ids[2]) - len(ids[0]))
    pooled = encode_collection(r, ids, "doc", batch_size=2, pad_id=tok.pad_token_id, keep_tokens=False)
    assert pooled.vecs.shape[0] == 0 and (pooled.sequence is None) == (name == "colbert")
