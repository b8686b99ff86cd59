"""TK (position-bias paper Eq. 4-6) on a tiny random BERT's WordPiece tokenizer and embeddings.

Kernel pooling is checked against a float64 NumPy loop written from Eq. 5-6; the scoring paths (score_all,
score_indexed, chunked) against score_pairs; contextualisation against Eq. 4 and the paper's position offset; the
GloVe reader against small files; the learning-rate groups in the optimiser; and train.py end to end.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import job_args, run_script

from core.errors import InputError
from datamodules.tokenization import PairTokenizer
from models.rankers import build_ranker
from models.rankers.base import Encoded
from models.rankers.kernel_pooling import MIN_SOFT_TF
from models.rankers.tk import TKConfig

QUERIES = ["what is dense retrieval", "isotropy", "how do kernel pooling models score a query against a passage"]
DOCS = [
    "dense retrieval encodes queries and passages into vectors and compares them",
    "representation isotropy means the vectors spread evenly over all directions",
    "kernels",
    "a much longer passage about neural ranking that adds many tokens of padding to every shorter passage here",
]


def make(tiny_bert, seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = {"backbone": tiny_bert, "query_max_len": 16, "doc_max_len": 24, "heads": 2, "head_dim": 8, "ff_dim": 24, **kw}
    return build_ranker(TKConfig(**cfg)).eval()


@pytest.fixture(scope="module")
def tk(tiny_bert):
    ranker = make(tiny_bert)
    with torch.no_grad():  # W_s away from its tiny initialisation, so score differences are not hidden by it
        ranker.scoring.weight.copy_(torch.linspace(-0.5, 0.7, ranker.cfg.kernels)[None])
    return ranker


def batch(ranker, queries, docs):
    return PairTokenizer(ranker.tokenizer, "bi", ranker.cfg.query_max_len, ranker.cfg.doc_max_len).pairs(queries, docs)


def encoded(ranker, queries, docs) -> tuple[Encoded, Encoded]:
    b = batch(ranker, queries, docs)
    return ranker.encode_queries(b), ranker.encode_docs(b)


# ------------------------------------------------------------------------------------------- Eq. 5-6 reference


def ref_features(q_vecs, d_vecs, mu, sigma, floor: float | None = MIN_SOFT_TF) -> tuple[np.ndarray, float]:
    """Eq. 5-6 before W_s, one term pair at a time in float64, for one query's and one passage's real terms.
    `floor`: the documented lower bound on the inner sum (None: Eq. 6 exactly as printed). Also returns the
    smallest inner sum, to show whether the floor was needed."""
    out, smallest = np.zeros(len(mu)), math.inf
    for k, m in enumerate(mu):
        for qi in q_vecs:
            inner = 0.0
            for pj in d_vecs:
                c = float(qi @ pj) / (math.sqrt(float(qi @ qi)) * math.sqrt(float(pj @ pj)))
                inner += math.exp(-((c - m) ** 2) / (2 * sigma**2))  # Eq. 5
            smallest = min(smallest, inner)
            out[k] += math.log(max(inner, floor) if floor is not None else inner)  # Eq. 6
    return out, smallest


def padded(vectors: list[np.ndarray], length: int, rng) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded to `length` with large garbage (not zeros): masking, not zero vectors, must keep it out."""
    dim = vectors[0].shape[0]
    tokens = rng.normal(scale=50.0, size=(length, dim))
    tokens[: len(vectors)] = np.stack(vectors)
    mask = np.arange(length) < len(vectors)
    return torch.tensor(tokens, dtype=torch.float32), torch.tensor(mask)


def test_kernel_means_and_width_are_the_papers(tk):
    np.testing.assert_allclose(tk.mu.numpy(), [-1.0, -0.8, -0.6, -0.4, -0.2, 0.0, 0.2, 0.4, 0.6, 0.8, 1.0], atol=1e-7)
    assert tk.cfg.kernels == 11 and tk.cfg.sigma == 0.1 and tk.cfg.layers == 2


def test_kernel_pooling_equals_direct_eq5_6_with_padding(tk):
    """Two pairs of different lengths in one padded batch; float32 features and score vs the float64 loop."""
    rng = np.random.default_rng(0)
    dim = 6
    # nearby directions, so several kernels fire; lengths differ so both sides carry padding
    base = rng.normal(size=dim)
    q_lists = [[base + rng.normal(scale=0.8, size=dim) for _ in range(n)] for n in (3, 1)]
    d_lists = [[base + rng.normal(scale=0.8, size=dim) for _ in range(n)] for n in (2, 5)]
    q_rows = [padded(v, 4, rng) for v in q_lists]
    d_rows = [padded(v, 6, rng) for v in d_lists]
    q = Encoded(torch.stack([t for t, _ in q_rows]), torch.stack([m for _, m in q_rows]))
    d = Encoded(torch.stack([t for t, _ in d_rows]), torch.stack([m for _, m in d_rows]))
    mu, sigma = tk.mu.double().numpy(), tk.cfg.sigma
    w = tk.scoring.weight.detach().double().numpy()[0]
    with torch.no_grad():
        got = tk.kernel_features(q, d).double().numpy()
        scores = tk.score_pairs(q, d).double().numpy()
    for b in range(2):
        want, _ = ref_features(q_lists[b], d_lists[b], mu, sigma)
        np.testing.assert_allclose(got[b], want, rtol=1e-5, atol=1e-4)
        assert scores[b] == pytest.approx(float(sum(wk * fk for wk, fk in zip(w, want))), rel=1e-5, abs=1e-4)


def test_kernel_pooling_is_eq6_as_printed_when_every_kernel_fires(tk):
    """Passage terms every 5 degrees round a circle: each query term has similarities near every kernel mean, so
    no inner sum comes near the floor and the features equal Eq. 6 with no floor at all."""
    angles = np.deg2rad(np.arange(0, 360, 5))
    d_vecs = [np.array([math.cos(a), math.sin(a)]) for a in angles]
    q_vecs = [np.array([1.0, 0.0]), np.array([math.cos(1.0), math.sin(1.0)]), np.array([-0.3, 0.9])]
    q = Encoded(torch.tensor(np.stack(q_vecs), dtype=torch.float32)[None], torch.ones(1, 3, dtype=torch.bool))
    d = Encoded(torch.tensor(np.stack(d_vecs), dtype=torch.float32)[None], torch.ones(1, len(d_vecs), dtype=torch.bool))
    want, smallest = ref_features(q_vecs, d_vecs, tk.mu.double().numpy(), tk.cfg.sigma, floor=None)
    assert smallest > 0.1 > MIN_SOFT_TF
    with torch.no_grad():
        np.testing.assert_allclose(tk.kernel_features(q, d)[0].double().numpy(), want, rtol=1e-5, atol=1e-4)


def test_empty_passage_and_query_stay_finite(tk):
    q = Encoded(torch.randn(2, 3, 8), torch.tensor([[True, True, False], [False, False, False]]))
    d = Encoded(torch.randn(2, 4, 8), torch.tensor([[False] * 4, [True] * 4]))
    with torch.no_grad():
        f = tk.kernel_features(q, d)
    # no passage term: every inner sum floors; no query term: nothing is summed
    torch.testing.assert_close(f[0], torch.full((11,), 2 * math.log(MIN_SOFT_TF)))
    torch.testing.assert_close(f[1], torch.zeros(11))


# ----------------------------------------------------------------------------------------- scoring paths


def test_score_all_equals_score_pairs(tk):
    with torch.no_grad():
        q, d = encoded(tk, QUERIES, DOCS[:3])
        full = tk.score_all(q, d)
        assert full.shape == (3, 3)
        torch.testing.assert_close(torch.diagonal(full), tk.score_pairs(q, d), rtol=1e-5, atol=1e-6)
        q, d = encoded(tk, QUERIES, DOCS)  # 3 queries x 4 passages: every cell is its pair's score
        full = tk.score_all(q, d)
        for i in range(3):
            for j in range(4):
                pair = tk.score_pairs(
                    Encoded(q.tokens[i : i + 1], q.mask[i : i + 1]), Encoded(d.tokens[j : j + 1], d.mask[j : j + 1])
                )
                assert float(full[i, j]) == pytest.approx(float(pair[0]), rel=1e-5, abs=1e-6), (i, j)


def test_score_indexed_equals_score_pairs(tk):
    iq, id_ = torch.tensor([0, 2, 1, 2, 0]), torch.tensor([3, 0, 1, 2, 1])
    with torch.no_grad():
        q, d = encoded(tk, QUERIES, DOCS)
        got = tk.score_indexed(q, d, iq, id_)
        b = batch(tk, [QUERIES[i] for i in iq], [DOCS[j] for j in id_])
        want = tk.score_pairs(tk.encode_queries(b), tk.encode_docs(b))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_chunked_scoring_equals_one_pass_with_gradients(tiny_bert):
    """max_kernel_elements forces one passage (or pair) per chunk: scores and gradients equal the single pass."""
    whole, chunked = make(tiny_bert, seed=3), make(tiny_bert, seed=3)
    chunked.max_kernel_elements = 1
    b = batch(whole, QUERIES, DOCS[:3])
    out = {}
    for name, r in (("whole", whole), ("chunked", chunked)):
        r.zero_grad(set_to_none=True)
        q, d = r.encode_queries(b), r.encode_docs(b)
        s_all, s_pairs = r.score_all(q, d), r.score_pairs(q, d)
        (s_all.sum() + s_pairs.sum()).backward()
        out[name] = (s_all.detach(), s_pairs.detach(), {n: p.grad.clone() for n, p in r.named_parameters()})
    torch.testing.assert_close(out["chunked"][0], out["whole"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["chunked"][1], out["whole"][1], rtol=1e-5, atol=1e-6)
    for n, g in out["whole"][2].items():
        torch.testing.assert_close(out["chunked"][2][n], g, rtol=1e-4, atol=1e-6, msg=n)


# ------------------------------------------------------------------------------------- Eq. 4, terms, positions


def test_special_tokens_are_not_terms(tk):
    b = batch(tk, QUERIES, DOCS)
    tok = tk.tokenizer
    with torch.no_grad():
        d = tk.encode_docs(b)
    for i, text in enumerate(DOCS):
        ids = tok(text, add_special_tokens=False, truncation=True, max_length=tk.cfg.doc_max_len - 2)["input_ids"]
        assert b["d_input_ids"][i, 0] == tok.cls_token_id  # PairTokenizer still adds them ...
        assert b["d_input_ids"][i][d.mask[i]].tolist() == ids  # ... TK's terms are the words only
        assert not d.tokens[i][~d.mask[i]].any()  # zero off the mask


def test_passage_positions_start_at_500_queries_at_0(tk):
    """Paper, section 3: "for the document encodings we shift the start position by 500". The Transformer's input
    is the embedding plus Vaswani's sinusoid at 500, 501, ... for passage terms and 0, 1, ... for query terms."""
    b = batch(tk, QUERIES, DOCS[:3])
    seen = []
    hook = tk.contextualizer.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            for side, prefix in (("query", "q_"), ("doc", "d_")):
                ids, am = b[f"{prefix}input_ids"], b[f"{prefix}attention_mask"]
                mask = tk.term_mask(ids, am)
                pos = tk.position_ids(mask, side)
                start = 0 if side == "query" else 500
                for i in range(len(ids)):
                    assert pos[i][mask[i]].tolist() == list(range(start, start + int(mask[i].sum())))
                tk.token_representations(ids, am, side=side)
                added = (seen[-1] - tk.embeddings(ids) * mask[..., None]).double().numpy()
                dim = tk.hidden_size
                for i in range(len(ids)):
                    for j in np.flatnonzero(mask[i].numpy()):
                        p = int(pos[i, j])
                        want = [
                            math.sin(p / 10000 ** (2 * (k // 2) / dim))
                            if k % 2 == 0
                            else math.cos(p / 10000 ** (2 * (k // 2) / dim))
                            for k in range(dim)
                        ]
                        np.testing.assert_allclose(added[i, j], want, atol=2e-4)
    finally:
        hook.remove()


def test_side_must_be_given(tk):
    b = batch(tk, QUERIES[:1], DOCS[:1])
    with pytest.raises(ValueError, match="side"):
        tk.token_representations(b["d_input_ids"], b["d_attention_mask"])


@pytest.mark.parametrize("alpha", [0.3, 1.0, 0.0])
def test_gate_mixes_as_eq4(tiny_bert, alpha):
    """p^_i = p_i * alpha + TF(p_1:n)_i * (1 - alpha): alpha = 1 gives the word embeddings, 0 the Transformer."""
    r = make(tiny_bert, seed=1)
    with torch.no_grad():
        r.gate.fill_(alpha)
        b = batch(r, QUERIES, DOCS[:3])
        ids, am = b["d_input_ids"], b["d_attention_mask"]
        got = r.token_representations(ids, am, side="doc")
        m = got.mask
        x = r.embeddings(ids) * m[..., None]
        tf = r.contextualizer(x, m, r.position_ids(m, "doc"))
    torch.testing.assert_close(got.tokens[m], (alpha * x + (1 - alpha) * tf)[m], rtol=0, atol=1e-6)
    if alpha == 1.0:
        torch.testing.assert_close(got.tokens[m], r.embeddings(ids)[m], rtol=0, atol=0)


def test_passage_vectors_independent_of_query_and_padding(tk):
    """Independent contextualisation: a passage's p^ is the same alone and in a padded batch beside longer ones."""
    with torch.no_grad():
        alone = tk.encode_docs(batch(tk, QUERIES[:1], DOCS[2:3]))
        many = tk.encode_docs(batch(tk, QUERIES[1:2] * 2, [DOCS[3], DOCS[2]]))
    assert many.tokens.shape[1] > alone.tokens.shape[1]
    torch.testing.assert_close(many.tokens[1][many.mask[1]], alone.tokens[0][alone.mask[0]], rtol=0, atol=1e-5)


def test_embeddings_copy_the_backbone_and_drop_its_transformer(tk, tiny_bert):
    """embedding_scale=auto: the backbone's rows times one factor that makes their mean norm sqrt(d); 1.0: as they
    are."""
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(tiny_bert).get_input_embeddings().weight.detach().double().numpy()
    d = bert.shape[1]
    factor = np.sqrt(d) / np.mean(np.sqrt((bert**2).sum(axis=1)))
    got = tk.embeddings.weight.detach().double().numpy()
    np.testing.assert_allclose(got, bert * factor, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.mean(np.linalg.norm(got, axis=1)), np.sqrt(d), rtol=1e-6)
    assert not hasattr(tk, "encoder") and not any(n.startswith("encoder.") for n, _ in tk.named_parameters())
    assert tk.embedding_source == {
        "source": "backbone",
        "found": 30522,
        "missing": 0,
        "scale": pytest.approx(factor, rel=1e-6),
    }
    raw = make(tiny_bert, embedding_scale=1.0)
    np.testing.assert_array_equal(raw.embeddings.weight.detach().double().numpy(), bert)


def test_embedding_scale_must_be_auto_or_positive(tiny_bert):
    for bad in (0.0, -2, "large"):
        with pytest.raises(InputError, match="model.embedding_scale"):
            make(tiny_bert, embedding_scale=bad)


def test_representation_cache_holds_tks_query_and_passage_vectors(tk, tmp_path):
    """The isotropy heads' cache encodes queries as queries and passages as passages (positions from 500)."""
    from models.heads.cache import RepresentationCache

    pt = PairTokenizer(tk.tokenizer, "bi", tk.cfg.query_max_len, tk.cfg.doc_max_len)
    cache = RepresentationCache.build(tmp_path / "c", tk, pt, QUERIES[:2], DOCS[:2], dtype="float32", batch_size=2)
    want = []
    with torch.no_grad():
        for texts, tokenize, side in ((QUERIES[:2], pt.queries, "query"), (DOCS[:2], pt.docs, "doc")):
            for t in texts:
                enc = tk.token_representations(*tokenize([t]).values(), side=side)
                want.append(enc.tokens[enc.mask])
    np.testing.assert_allclose(np.asarray(cache.vectors()), torch.cat(want).numpy(), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------ GloVe


def write_glove(path, lines: list[str]):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_glove_file_maps_tokenizer_vocabulary(tiny_bert, tmp_path, capsys):
    f = write_glove(
        tmp_path / "g.txt",
        [
            "the 0.1 0.2 0.3 0.4",
            "notawordpiecetoken 9 9 9 9",  # not in the vocabulary: skipped, numbers never read
            "cat -1 0.5 2 1e-1",
            "the 7 7 7 7",  # a repeated token: the first line wins
            ". . . 1 2 3 4",  # a token with spaces (as in glove.840B): the last d fields are the vector
        ],
    )
    r = make(tiny_bert, embeddings=f, heads=2, head_dim=2)
    vocab = r.tokenizer.get_vocab()
    w = r.embeddings.weight.detach()
    assert r.hidden_size == 4 and w.shape == (len(r.tokenizer), 4)
    torch.testing.assert_close(w[vocab["the"]], torch.tensor([0.1, 0.2, 0.3, 0.4]))
    torch.testing.assert_close(w[vocab["cat"]], torch.tensor([-1.0, 0.5, 2.0, 0.1]))
    assert r.embedding_source == {"source": f, "found": 2, "missing": len(r.tokenizer) - 2, "scale": 1.0}
    assert "2 of 30,522 tokenizer tokens found" in capsys.readouterr().err
    with torch.no_grad():  # and it scores
        assert torch.isfinite(r.score(batch(r, ["the cat"], ["a cat sat on the mat"]))).all()


def test_glove_word2vec_header_is_skipped(tiny_bert, tmp_path):
    f = write_glove(tmp_path / "g.txt", ["2 3", "the 1 2 3", "cat 4 5 6"])
    r = make(tiny_bert, embeddings=f, heads=1, head_dim=3)
    assert r.hidden_size == 3 and r.embedding_source["found"] == 2


@pytest.mark.parametrize(
    "lines,line_no,needle",
    [
        (["the 0.1 0.2 0.3", "cat 0.1 0.2"], 2, "got 3 fields"),
        (["the 0.1 0.2 0.3", "dog 1 2 3", "cat 0.1 zero 0.3"], 3, "expected 3 numbers after the token 'cat'"),
    ],
    ids=["too_few_fields", "not_a_number"],
)
def test_malformed_glove_line_is_one_line_error(tiny_bert, tmp_path, lines, line_no, needle):
    f = write_glove(tmp_path / "bad.txt", lines)
    with pytest.raises(InputError) as e:
        make(tiny_bert, embeddings=f)
    assert e.value.where == f"{f}:{line_no}"
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_glove_errors_name_the_key(tiny_bert, tmp_path):
    with pytest.raises(InputError, match="model.embeddings.*neither 'backbone' nor an existing"):
        make(tiny_bert, embeddings=str(tmp_path / "missing.txt"))
    f = write_glove(tmp_path / "cased.txt", ["The 1 2", "Cat 3 4"])
    with pytest.raises(InputError, match="model.embeddings: no token of the tokenizer's vocabulary"):
        make(tiny_bert, embeddings=f)


# ---------------------------------------------------------------------------------- learning-rate groups


class _StubTrainer:
    estimated_stepping_batches = 20


def optimizer(tiny_bert, model: dict, **optim):
    from lightning_modules.module import RankingModule

    m = RankingModule(
        {"backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16, **model}, {"warmup_steps": 0, **optim}
    )
    m._trainer = _StubTrainer()
    return m, m.configure_optimizers()["optimizer"]


def group_lrs(opt) -> dict[str, float]:
    return {g.get("name", "default"): g["lr"] for g in opt.param_groups}


def test_optimizer_groups_carry_tks_learning_rates(tiny_bert):
    m, opt = optimizer(tiny_bert, {"name": "tk"}, lr=5e-5, weight_decay=0.01)
    assert group_lrs(opt) == {
        "contextualization/decay": 1e-4,
        "contextualization/no_decay": 1e-4,
        "kernel_scoring/decay": 1e-3,
    }
    r = m.ranker
    by_id = {id(p): g for g in opt.param_groups for p in g["params"]}
    assert by_id[id(r.scoring.weight)]["lr"] == 1e-3 and by_id[id(r.scoring.weight)]["weight_decay"] == 0.01
    assert by_id[id(r.embeddings.weight)]["lr"] == 1e-4
    assert by_id[id(r.gate)]["lr"] == 1e-4 and by_id[id(r.gate)]["weight_decay"] == 0.0  # a scalar: not decayed
    # every trainable parameter exactly once
    assert sorted(by_id) == sorted(id(p) for p in m.parameters() if p.requires_grad)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(by_id)


def test_optimizer_groups_from_multipliers_and_frozen_embeddings(tiny_bert):
    m, opt = optimizer(
        tiny_bert,
        {
            "name": "tk",
            "contextualization_lr": None,
            "kernel_lr": None,
            "kernel_lr_scale": 4.0,
            "train_embeddings": False,
        },
        lr=2e-4,
    )
    lrs = group_lrs(opt)
    assert lrs["contextualization/decay"] == 2e-4 and lrs["kernel_scoring/decay"] == pytest.approx(8e-4)
    assert all(p is not m.ranker.embeddings.weight for g in opt.param_groups for p in g["params"])


def test_rankers_without_groups_keep_two_unnamed_groups(tiny_bert):
    _, opt = optimizer(tiny_bert, {"name": "colbert"}, lr=3e-5, weight_decay=0.02)
    assert [(g["lr"], g["weight_decay"], "name" in g) for g in opt.param_groups] == [
        (3e-5, 0.02, False),
        (3e-5, 0.0, False),
    ]


# ------------------------------------------------------------------------------------------------ train.py

RUN = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "data=synthetic",
    "data.num_docs=120",
    "data.num_train_queries=30",
    "data.num_val_queries=8",
    "data.num_test_queries=8",
    "data.candidate_depth=10",
    "data.batch_size=4",
    "eval.probe_queries=4",
    "eval.probe_docs=8",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
]


@pytest.mark.slow
def test_train_then_evaluate_tk_writes_metrics(tmp_path, tiny_bert):
    out, ev = tmp_path / "run", tmp_path / "eval"
    run_script(
        "train.py",
        "model=tk",
        f"model.backbone={tiny_bert}",
        "model.heads=2",
        "model.head_dim=8",
        "model.ff_dim=24",
        *RUN,
        f"output_dir={out}",
    )
    m = json.loads((out / "metrics.json").read_text())
    assert 0 <= m["ndcg_cut_10"] <= 1 and 0 < m["iw"] <= 1 and "before_training" in m
    # the checkpoint (no backbone Transformer in it) loads back into TK (model config from the checkpoint) and
    # evaluates to the same numbers
    run_script(
        "evaluate.py", *job_args("evaluate.py", [*RUN, f"ckpt={out / 'checkpoints' / 'last.ckpt'}"]), f"output_dir={ev}"
    )
    me = json.loads((ev / "metrics.json").read_text())
    for k in ("ndcg_cut_10", "mrr_10", "recall_100"):
        assert me[k] == pytest.approx(m[k], abs=1e-9), k
