"""Speed paths give the plain path's numbers: tokenise-once + length-sorted encoding, re-ranking one query's
candidates, length-grouped evaluation chunks."""

import numpy as np
import pytest
import torch

from datamodules.datamodule import doc_chunks
from lightning_modules.module import RankingModule

QUERIES = ["what is heat transfer", "slab conduction in thin plates of metal", "flow"]
DOCS = [
    "heat transfer in slabs",
    "a study of boundary layers on thin wings in supersonic flow at high speed",
    "flow of air over wings at speed",
    "conduction",
    "the boundary layer thickens along the plate as flow slows",
]


def module(backbone, name):
    return RankingModule({"name": name, "backbone": backbone, "query_max_len": 8, "doc_max_len": 16}, {}).eval()


def test_ids_then_pad_equals_batch_tokenisation(tiny_bert):
    tok = module(tiny_bert, "colbert").pair_tokenizer
    for side, plain in (("query", tok.queries(QUERIES)), ("doc", tok.docs(DOCS))):
        got = tok.pad(tok.ids(QUERIES if side == "query" else DOCS, side), side)
        assert got.keys() == plain.keys()
        for k in got:
            assert torch.equal(got[k], plain[k]), k


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_encode_texts_sorted_batches_equal_one_text_at_a_time(tiny_bert_nodropout, name):
    m = module(tiny_bert_nodropout, name)
    tok = m.pair_tokenizer
    got = m.encode_texts(DOCS, side="doc", batch_size=2)  # 3 batches, sorted by length, returned in given order
    for i, text in enumerate(DOCS):
        with torch.no_grad():
            one = m.ranker.encode_docs(tok.docs([text]))  # alone: no padding at all
        n = one.tokens.shape[1]
        assert int(got.mask[i].sum()) == n and bool(got.mask[i, :n].all())
        torch.testing.assert_close(got.tokens[i, :n], one.tokens[0], atol=1e-5, rtol=1e-5)
        if name == "repbert":
            torch.testing.assert_close(got.sequence[i], one.sequence[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_rerank_texts_equals_pairwise_scores(tiny_bert_nodropout, name):
    m = module(tiny_bert_nodropout, name)
    got = m.rerank_texts(QUERIES[1], DOCS, batch_size=2)
    with torch.no_grad():
        want = torch.stack([m.ranker.score(m.pair_tokenizer.pairs([QUERIES[1]], [d]))[0] for d in DOCS])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rerank_texts_rejects_cross_encoders(tiny_bert):
    with pytest.raises(ValueError, match="bi-encoder"):
        module(tiny_bert, "bert_cat").rerank_texts("q", ["d"])


def test_doc_chunks_by_length_group_similar_lengths_and_cover_pairs_once():
    rng = np.random.default_rng(1)
    pairs = np.unique(rng.integers(0, 30, size=(300, 2)), axis=0)
    doc_len = rng.integers(1, 1000, size=30)
    chunks = doc_chunks(pairs, 5, doc_len)
    assert sorted(map(tuple, np.concatenate(chunks).tolist())) == sorted(map(tuple, pairs.tolist()))
    docs = [np.unique(c[:, 1]) for c in chunks]
    assert all(len(d) <= 5 for d in docs)
    assert all(set(a).isdisjoint(b) for i, a in enumerate(docs) for b in docs[i + 1 :])
    # longest first: every passage of a chunk is at least as long as every passage of the next chunk
    for a, b in zip(docs, docs[1:]):
        assert doc_len[a].min() >= doc_len[b].max()


def test_fused_adamw_steps_equal_the_foreach_steps(tiny_bert):
    from types import SimpleNamespace

    m = RankingModule(
        {"name": "colbert", "backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16}, {"warmup_steps": 0}
    )
    m._trainer = SimpleNamespace(estimated_stepping_batches=10)
    opt = m.configure_optimizers()["optimizer"]
    m._trainer = None
    assert opt.defaults["fused"] is True
    ref_params = [p.detach().clone().requires_grad_(True) for g in opt.param_groups for p in g["params"]]
    ref = torch.optim.AdamW(
        [
            {**g, "params": ref_params[i : i + len(g["params"])]}
            for i, g in zip(np.cumsum([0] + [len(g["params"]) for g in opt.param_groups])[:-1], opt.param_groups)
        ],
        foreach=True,
        fused=False,
    )
    torch.manual_seed(0)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ref_params]
        for p, r, gr in zip([p for g in opt.param_groups for p in g["params"]], ref_params, grads):
            p.grad, r.grad = gr.clone(), gr.clone()
        opt.step()
        ref.step()
    for p, r in zip([p for g in opt.param_groups for p in g["params"]], ref_params):
        torch.testing.assert_close(p.detach(), r.detach(), atol=1e-6, rtol=1e-5)


LONG_DOCS = DOCS + ["a", "boundary layer flow over a flat plate at zero incidence in a viscous fluid", "heat"]


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_length_buckets_give_the_one_block_loss_and_gradients(tiny_bert_nodropout, name):
    """Training in train mode: the loss and every gradient with passages encoded in 3 length groups equal those of
    one padded block."""
    results = []
    for buckets in (1, 3):
        torch.manual_seed(0)
        m = RankingModule(
            {
                "name": name,
                "backbone": tiny_bert_nodropout,
                "query_max_len": 8,
                "doc_max_len": 16,
                "length_buckets": buckets,
            },
            {"loss": "ce", "in_batch_negatives": True},
        ).train()
        batch = m.pair_tokenizer.triplets(QUERIES + QUERIES[:1], LONG_DOCS[:4], LONG_DOCS[4:])
        loss = m.training_step(batch, 0)
        loss.backward()
        results.append((loss.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}))
    (l1, g1), (l3, g3) = results
    torch.testing.assert_close(l3, l1, atol=1e-5, rtol=1e-5)
    assert g1.keys() == g3.keys() and g1
    for k in g1:
        torch.testing.assert_close(g3[k], g1[k], atol=1e-5, rtol=1e-4, msg=k)


def test_length_buckets_encode_equals_one_block_on_real_tokens(tiny_bert_nodropout):
    m = module(tiny_bert_nodropout, "repbert")
    batch = m.pair_tokenizer.docs(LONG_DOCS)
    with torch.no_grad():
        one = m.ranker.encode(batch["d_input_ids"], batch["d_attention_mask"], side="doc")
        m.ranker.cfg.length_buckets = 3
        got = m.ranker.encode_docs(batch)
    assert torch.equal(got.mask, one.mask)
    torch.testing.assert_close(got.tokens[got.mask], one.tokens[one.mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.sequence, one.sequence, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["colbert", "repbert", "bert_cat"])
def test_host_lengths_give_the_same_training_outputs(tiny_bert, name):
    """A training batch carrying its token counts (HOST_LENGTHS, as TripletCollate adds them) gets the same length
    groups, masks and so scores, bit for bit, in train mode (same dropout masks) and eval mode, as one whose padding
    the device reads; and the counts are the masks' own."""
    from datamodules.tokenization import HOST_LENGTHS, host_lengths

    m = module(tiny_bert, name)
    m.ranker.cfg.length_buckets = 3
    plain = m.pair_tokenizer.triplets(QUERIES + QUERIES[:1], LONG_DOCS[:4], LONG_DOCS[4:])
    known = {**plain, HOST_LENGTHS: host_lengths(plain)}
    for key, lengths in known[HOST_LENGTHS].items():
        assert lengths.tolist() == [int(sum(row)) for row in plain[key].tolist()]
    for train in (True, False):
        m.train(train)
        scores = []
        for batch in (plain, known):
            torch.manual_seed(0)
            with torch.set_grad_enabled(train):
                scores.append(m.training_outputs(batch)[0])
        assert torch.equal(scores[0], scores[1]), (name, train)


def test_length_buckets_auto_groups_on_the_cpu_only(tiny_bert_nodropout, monkeypatch):
    """`model.length_buckets=auto` (the default): 4 length groups on the CPU; one padded block on any other device
    (here PyTorch's shape-only "meta" device stands in for a GPU: the same code path, no values); a number applies on
    every device."""
    from datamodules.tokenization import HOST_LENGTHS, host_lengths

    m = module(tiny_bert_nodropout, "repbert")
    assert m.ranker.cfg.length_buckets == "auto"
    batch = m.pair_tokenizer.docs(LONG_DOCS)
    lengths = host_lengths(batch)  # as the collate adds them: a meta tensor has no values to read padding from
    widths = []
    real = type(m.ranker).encode

    def counted(self, input_ids, *args, **kwargs):
        widths.append(input_ids.shape[0])
        return real(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(type(m.ranker), "encode", counted)

    def groups(device: str, setting) -> list[int]:
        widths.clear()
        m.ranker.cfg.length_buckets = setting
        m.ranker.to(device)
        with torch.no_grad():
            got = m.ranker.encode_docs({**{k: v.to(device) for k, v in batch.items()}, HOST_LENGTHS: lengths})
        assert got.tokens.device.type == device and got.tokens.shape[0] == len(LONG_DOCS)
        return list(widths)

    n = len(LONG_DOCS)
    assert groups("cpu", "auto") == [len(p) for p in np.array_split(np.arange(n), 4)]
    assert groups("meta", "auto") == [n]
    assert groups("meta", 3) == [len(p) for p in np.array_split(np.arange(n), 3)]
