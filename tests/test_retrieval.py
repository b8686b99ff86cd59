"""Full ranking (retrieval/): faiss dense indexes for RepBERT / BERT_DOT and ColBERT end-to-end, on a tiny random BERT.

References are brute force in torch on the same ranker: `ranker.score_all` of every query against every passage,
all encoded in one batch, so agreement also shows that streaming, length-sorted batching and padding change nothing.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from core.errors import InputError
from datamodules.textfiles import read_trec_run
from metrics.trec import write_trec_run
from models.loading import pair_tokenizer_for
from models.rankers import build_ranker
from models.rankers.bert_dot import BertDotConfig
from models.rankers.colbert import ColBERTConfig
from models.rankers.repbert import RepBERTConfig
from pipeline.cli import main
from pipeline.run import evaluate
from retrieval.colbert_e2e import (
    ColBERTIndex,
    candidates_from_hits,
    colbert_index_from_checkpoint,
)
from retrieval.dense import DenseIndex, index_from_checkpoint
from retrieval.encode import encode_docs

ATOL = 1e-5
WORDS = (
    "dense retrieval vectors passage query token colbert isotropy ranking neural bert index search faiss "
    "cosine product late interaction score model training collection document answer position bias"
).split()


def _texts(n: int, seed: int, lo: int, hi: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


DOCS = {f"d{i}": t for i, t in enumerate(_texts(40, 1, 3, 30))}
QUERIES = {f"q{i}": t for i, t in enumerate(_texts(5, 2, 1, 6))}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and on a shared CPU avoids OpenMP spin-waiting (30x here)."""
    import faiss

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(before[0])
    faiss.omp_set_num_threads(before[1])


def make(cfg, seed: int = 0):
    torch.manual_seed(seed)  # BERT_DOT / ColBERT compression layers are random
    return build_ranker(cfg).eval()


@pytest.fixture(scope="module")
def rankers(tiny_bert):
    return {
        "repbert": make(RepBERTConfig(backbone=tiny_bert)),
        "bert_dot": make(BertDotConfig(backbone=tiny_bert, compress_dim=16)),
        "colbert": make(ColBERTConfig(backbone=tiny_bert, doc_max_len=24)),
    }


@torch.no_grad()
def brute_force(ranker, queries=QUERIES, docs=DOCS) -> tuple[list[str], list[str], torch.Tensor]:
    """(qids, doc ids, score matrix [Q, N]) from one batch of everything."""
    pt = pair_tokenizer_for(ranker)
    qids, dids = list(queries), list(docs)
    q = ranker.encode_queries(pt.queries([queries[i] for i in qids]))
    d = ranker.encode_docs(pt.docs([docs[i] for i in dids]))
    return qids, dids, ranker.score_all(q, d)


def assert_exact_top_k(run, ranker, k, queries=QUERIES, docs=DOCS):
    qids, dids, s = brute_force(ranker, queries, docs)
    assert sorted(run) == sorted(qids)
    for qi, qid in enumerate(qids):
        row = s[qi].double()
        top = torch.sort(row, descending=True).values[:k]
        got = run[qid]
        assert len(got) == min(k, len(dids))
        # scores: the k best of the brute force, in order
        np.testing.assert_allclose(sorted(got.values(), reverse=True), top.numpy(), atol=ATOL, rtol=0)
        # ids: each returned doc has that score and is not beaten by an unreturned doc (ties may pick either)
        kth = float(top[-1])
        for doc, score in got.items():
            assert abs(score - float(row[dids.index(doc)])) <= ATOL
        for j, doc in enumerate(dids):
            if doc not in got:
                assert float(row[j]) <= kth + ATOL


def assert_same_run(a, b, atol=0.0):
    assert sorted(a) == sorted(b)
    for q in a:
        assert set(a[q]) == set(b[q]), q
        for d in a[q]:
            assert abs(a[q][d] - b[q][d]) <= atol


# ---------------------------------------------------------------------------------------------- dense


@pytest.mark.parametrize("name", ["repbert", "bert_dot"])
def test_flat_is_exact_top_k(rankers, name):
    r = rankers[name]
    index = DenseIndex.build(r, DOCS, batch_size=7, sort_window=16)  # streamed, length-sorted windows
    assert (
        index.index_type == "flat"
        and len(index) == len(DOCS)
        and index.manifest["score"] == ("cosine" if name == "repbert" else "dot")
    )
    assert_exact_top_k(index.search(QUERIES, k=10, batch_size=2), r, 10)
    assert_exact_top_k(index.search(QUERIES, k=1000), r, len(DOCS))  # k > collection: everything, ranked


def test_ivf_with_all_lists_probed_equals_flat(rankers):
    r = rankers["repbert"]
    flat = DenseIndex.build(r, DOCS, batch_size=7).search(QUERIES, k=8)
    # train_size < collection: trained on the first 16 streamed vectors, the rest added after training
    ivf = DenseIndex.build(r, DOCS, batch_size=7, index_type="ivf", nlist=4, nprobe=4, train_size=16)
    assert ivf.params["nlist"] == 4 and ivf.params["nprobe"] == 4 and ivf.params["n_train"] == 16
    assert_same_run(ivf.search(QUERIES, k=8), flat, atol=ATOL)
    ivf.set_search_params(nprobe=1)  # approximate now: still real scores of real pairs
    qids, dids, s = brute_force(r)
    for qi, qid in enumerate(qids):
        for doc, score in ivf.search({qid: QUERIES[qid]}, k=8)[qid].items():
            assert abs(score - float(s[qi, dids.index(doc)])) <= ATOL


@pytest.mark.parametrize("index_type", ["hnsw", "pq", "ivfpq"])
def test_approximate_types_build_and_search(rankers, index_type):
    r = rankers["bert_dot"]
    index = DenseIndex.build(r, DOCS, batch_size=16, index_type=index_type, nlist=2, ef_search=64)
    run = index.search(QUERIES, k=5)
    assert all(0 < len(docs) <= 5 and set(docs) <= set(DOCS) for docs in run.values())
    if index_type == "hnsw":  # HNSW stores the vectors: scores are exact for the pairs it returns
        qids, dids, s = brute_force(r)
        for qi, qid in enumerate(qids):
            for doc, score in run[qid].items():
                assert abs(score - float(s[qi, dids.index(doc)])) <= 1e-4
    else:
        assert index.params["pq_m"] == 2 and 2 ** index.params["pq_nbits"] <= len(DOCS)  # dim 16 / 8; small sample


def test_save_load_round_trip(rankers, tmp_path):
    r = rankers["repbert"]
    index = DenseIndex.build(r, DOCS, batch_size=8, index_type="ivf", nlist=3, nprobe=2)
    run = index.search(QUERIES, k=6)
    path = index.save(tmp_path / "idx")
    assert sorted(p.name for p in path.iterdir()) == ["doc_ids.json", "index.faiss", "manifest.json"]
    m = json.loads((path / "manifest.json").read_text())
    assert (m["ranker"], m["index_type"], m["dim"], m["count"], m["checkpoint"]) == ("repbert", "ivf", 32, 40, None)
    loaded = DenseIndex.load(path, r)
    assert loaded.doc_ids == index.doc_ids and loaded.params == index.params
    assert loaded.search(QUERIES, k=6) == run  # bit-identical
    # search_vectors needs no ranker; an existing index directory is replaced atomically, nothing left behind
    qv = np.concatenate([v for _, v in index.encode_queries(QUERIES)])
    no_ranker = DenseIndex.load(path)
    for a, b in zip(index.search_vectors(qv, 6), no_ranker.search_vectors(qv, 6)):
        np.testing.assert_array_equal(a, b)
    DenseIndex.build(r, dict(list(DOCS.items())[:10])).save(path)
    assert len(DenseIndex.load(path, r)) == 10 and sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    with pytest.raises(InputError, match="no ranker|records no checkpoint"):
        DenseIndex.load(path).search(QUERIES, k=3)
    with pytest.raises(InputError, match="built with ranker 'repbert'"):
        DenseIndex.load(path, rankers["bert_dot"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("x")
    with pytest.raises(InputError, match="not an index directory"):
        index.save(tmp_path / "other")
    with pytest.raises(InputError, match="no manifest.json"):
        DenseIndex.load(tmp_path / "other")


def test_checkpoint_index_and_trec_run(tiny_bert, tmp_path):
    from lightning_modules.module import RankingModule

    torch.manual_seed(0)
    module = RankingModule({"name": "bert_dot", "backbone": tiny_bert, "compress_dim": 8}, {})
    with torch.no_grad():  # make the checkpoint differ from a fresh build
        module.ranker.compress.weight.mul_(3.0)
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, ckpt)
    index = index_from_checkpoint(ckpt, DOCS, batch_size=16)
    assert index.manifest["checkpoint"] == str(ckpt.resolve()) and index.dim == 8
    run = index.search(QUERIES, k=5)
    assert_exact_top_k(run, module.ranker.eval(), 5)
    index.save(tmp_path / "idx")
    assert DenseIndex.load(tmp_path / "idx").search(QUERIES, k=5) == run  # ranker rebuilt from the checkpoint
    write_trec_run(tmp_path / "run.trec", run, tag="bert_dot-flat")
    back = read_trec_run(tmp_path / "run.trec")
    assert {q: set(d) for q, d in back.items()} == {q: set(d) for q, d in run.items()}
    with pytest.raises(InputError, match="ckpt: checkpoint .* does not exist"):
        index_from_checkpoint(tmp_path / "missing.ckpt", DOCS)


def test_bad_input_is_one_line(rankers):
    with pytest.raises(InputError, match="not a single-vector ranker.*colbert_e2e"):
        DenseIndex.build(rankers["colbert"], DOCS)
    with pytest.raises(InputError, match="^index_type: unknown index type 'annoy'"):
        DenseIndex.build(rankers["repbert"], DOCS, index_type="annoy")
    with pytest.raises(InputError, match="^nlist: is 50 but only 40 vectors"):
        DenseIndex.build(rankers["repbert"], DOCS, index_type="ivf", nlist=50)
    with pytest.raises(InputError, match="^docs: duplicate doc id 'a'"):
        DenseIndex.build(rankers["repbert"], [("a", "x y"), ("a", "z")])
    with pytest.raises(InputError, match="^docs: no documents"):
        DenseIndex.build(rankers["repbert"], {})
    with pytest.raises(InputError, match="^nprobes: unknown index option"):
        DenseIndex.build(rankers["repbert"], DOCS, nprobes=3)
    with pytest.raises(InputError, match="not a ColBERT ranker"):
        ColBERTIndex.build(rankers["repbert"], DOCS)


# ---------------------------------------------------------------------------------------------- streaming encoder


class SpyTokenizer:
    def __init__(self, pt):
        self.pt, self.sizes, self.tokenizer = pt, [], pt.tokenizer

    def ids(self, texts, side):
        self.sizes.append(len(texts))
        return self.pt.ids(texts, side)


def test_streaming_encoder_matches_one_batch(rankers):
    for name in ("repbert", "colbert"):
        r = rankers[name]
        spy = SpyTokenizer(pair_tokenizer_for(r))
        pulled = []

        def gen(pulled):
            for item in DOCS.items():
                pulled.append(item[0])
                yield item

        stream = encode_docs(r, spy, gen(pulled), batch_size=3, sort_window=9)
        first_ids, _ = next(stream)
        assert len(pulled) in (9, 18)  # lazily: this window of raw texts and at most the next, read ahead
        got = {}
        for ids, v in [(first_ids, _), *stream]:
            for j, i in enumerate(ids):
                assert i not in got
                got[i] = v[j] if name == "repbert" else v.tokens[j][v.mask[j]]
        assert max(spy.sizes) <= 9 and sum(spy.sizes) == len(DOCS) and sorted(got) == sorted(DOCS)  # a window at a time
        pt = pair_tokenizer_for(r)
        with torch.no_grad():
            ref = r.encode_docs(pt.docs(list(DOCS.values())))
        for j, i in enumerate(DOCS):
            want = ref.sequence[j] if name == "repbert" else ref.tokens[j][ref.mask[j]]
            assert got[i].shape == want.shape
            torch.testing.assert_close(got[i], want, atol=ATOL, rtol=0)
    # bf16 autocast runs and stays close; plain strings get positional ids
    ids, v = next(encode_docs(rankers["repbert"], None, ["a b c", "d"], batch_size=4, precision="bf16"))
    assert ids == [0, 1] and v.dtype == torch.float32 and v.shape == (2, 32)


# ---------------------------------------------------------------------------------------------- ColBERT end-to-end


@pytest.fixture(scope="module")
def colbert_index(rankers):
    return ColBERTIndex.build(rankers["colbert"], DOCS, batch_size=8, store_dtype="float32")


def test_colbert_full_token_search_is_exact(rankers, colbert_index):
    idx = colbert_index
    assert idx.n_tokens == int(idx.offsets[-1]) == idx.index.ntotal and idx.tokens.dtype == np.float32
    run = idx.search(QUERIES, k=10, k_tokens=idx.n_tokens, depth=None)
    assert_exact_top_k(run, rankers["colbert"], 10)


def test_colbert_small_k_tokens_returns_exact_scores(rankers, colbert_index):
    qids, dids, s = brute_force(rankers["colbert"])
    run = colbert_index.search(QUERIES, k=4, k_tokens=2, depth=5)
    for qi, qid in enumerate(qids):
        assert 0 < len(run[qid]) <= 4
        for doc, score in run[qid].items():
            assert abs(score - float(s[qi, dids.index(doc)])) <= ATOL


def test_colbert_float16_store_save_load(rankers, tmp_path):
    r = rankers["colbert"]
    idx = ColBERTIndex.build(r, DOCS, batch_size=16)  # float16 store by default
    assert idx.tokens.dtype == np.float16
    qids, dids, s = brute_force(r)
    run = idx.search(QUERIES, k=5, k_tokens=idx.n_tokens, depth=None)
    for qi, qid in enumerate(qids):
        for doc, score in run[qid].items():
            assert abs(score - float(s[qi, dids.index(doc)])) <= 2e-2
    idx.save(tmp_path / "cb")
    loaded = ColBERTIndex.load(tmp_path / "cb", r)
    assert isinstance(loaded.tokens, np.memmap)
    assert loaded.search(QUERIES, k=5, k_tokens=8, depth=10) == idx.search(QUERIES, k=5, k_tokens=8, depth=10)


def test_candidates_depth_cap_uses_imputed_scores():
    offsets = np.array([0, 2, 4, 6])  # three passages of two tokens
    scores = np.array([[0.9, 0.8, 0.1], [0.7, 0.6, 0.5]])
    rows = np.array([[0, 2, 4], [5, 3, -1]])  # token 0 hits passages 0, 1, 2; token 1 hits 2, 1
    assert candidates_from_hits(scores, rows, offsets, None).tolist() == [0, 1, 2]
    # approx: p0 = 0.9 + 0.6 (imputed), p1 = 0.8 + 0.6, p2 = 0.1 + 0.7
    assert candidates_from_hits(scores, rows, offsets, 2).tolist() == [0, 1]


def test_colbert_checkpoint(tiny_bert, tmp_path):
    from lightning_modules.module import RankingModule

    module = RankingModule({"name": "colbert", "backbone": tiny_bert, "doc_max_len": 24}, {})
    ckpt = tmp_path / "c.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, ckpt)
    idx = colbert_index_from_checkpoint(ckpt, DOCS, batch_size=16, store_dtype="float32")
    assert_exact_top_k(idx.search(QUERIES, k=3, k_tokens=idx.n_tokens, depth=None), module.ranker.eval(), 3)


# ---------------------------------------------------------------------------------------------- command line


def repbert_dense(backbone: str) -> list[str]:
    """evaluate.py's dense retrieval with RepBERT on `backbone` over 60 synthetic documents: the command-line tests'
    start."""
    return ["retrieval=dense", "model=repbert", f"model.backbone={backbone}", "data=synthetic", "data.num_docs=60"]


def test_cli_writes_run_metrics_and_index(tiny_bert, tmp_path, monkeypatch):
    """`python evaluate.py retrieval=dense ...` (retrieval/retrieve.py; the keys of retrieval/config.py)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    rc = main(
        [
            *repbert_dense(tiny_bert),
            "data.num_train_queries=10",
            "data.num_val_queries=3",
            "data.num_test_queries=6",
            "logger=none",
            f"output_dir={out}",
            "retrieval.k=20",
            "retrieval.index_type=hnsw",
        ],
        evaluate,
    )
    assert rc == 0
    run = read_trec_run(out / "run.trec")
    assert len(run) == 6 and all(len(d) == 20 for d in run.values())
    metrics = json.loads((out / "metrics.json").read_text())
    assert "ndcg_cut_10" in metrics and metrics["retrieval"]["docs"] == 60
    assert DenseIndex.load(out / "index").index_type == "hnsw"
    assert (out / "config.yaml").is_file() and (out / "per_query.json").is_file()
    rc = main(
        [*repbert_dense(tiny_bert), f"output_dir={out}", "retrieval.index_type=ivf", "retrieval.nlist=5000"],
        evaluate,
    )
    assert rc == 2


def test_cli_logs_its_measures_and_refuses_keys_it_does_not_read(tiny_bert, tmp_path, monkeypatch, capsys):
    """A full ranking's measures reach the configured logger as any evaluation's (`test/<measure>`, the values of
    metrics.json); a trainer or optim key on its command line is refused before anything is written (it encodes on
    retrieval.device and trains nothing: pipeline/jobs.py `unread`)."""
    import csv

    from pipeline.run import EVALUATE

    monkeypatch.chdir(tmp_path)
    args = [*repbert_dense(tiny_bert), "data.num_train_queries=10", "data.num_val_queries=3", "data.num_test_queries=6"]
    out = tmp_path / "out"
    for bad in ("trainer.precision=bf16-mixed", "optim.lr=1e-5", "eval.isotropy_paper=false"):
        assert main([*args, "logger=csv", bad, f"output_dir={out}"], EVALUATE) == 2
        key = bad.split("=")[0]
        assert capsys.readouterr().err.startswith(
            f"error: config key '{key}': job 'retrieve' (evaluate.py retrieval=dense) does not read it ("
        )
        assert not out.exists()
    assert main([*args, "logger=csv", f"output_dir={out}"], EVALUATE) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    (logged,) = out.glob("csv/version_*/metrics.csv")
    (row,) = list(csv.DictReader(logged.open()))
    assert float(row["test/ndcg_cut_10"]) == pytest.approx(metrics["ndcg_cut_10"], abs=1e-12)
    assert {k for k in row if k.startswith("test/")} == {f"test/{k}" for k, v in metrics.items() if k != "retrieval"}


def test_cli_scores_the_rerankers_sample_of_questions(tiny_bert, tmp_path, monkeypatch, capsys):
    """`data.max_eval_queries` samples a full-ranking run's questions as it does a re-ranker's test split (the run seed,
    `np.random.default_rng([seed, 2])` over the sorted judged queries); each sampled query ranks as in the full run;
    a sample of the train split is refused before anything is written."""
    import numpy as np

    from datamodules.sources import data_config, load_dataset
    from pipeline.config import compose

    monkeypatch.chdir(tmp_path)
    args = repbert_dense(tiny_bert)
    args += ["data.num_train_queries=10", "data.num_val_queries=3", "data.num_test_queries=6", "logger=none", "seed=3"]
    assert main([*args, f"output_dir={tmp_path / 'full'}"], evaluate) == 0
    assert main([*args, "data.max_eval_queries=4", f"output_dir={tmp_path / 'four'}"], evaluate) == 0
    split = load_dataset(data_config(compose(args)), 3).split("test")
    judged = sorted(q for q in split.queries if split.qrels.get(q))
    want = sorted(judged[i] for i in np.random.default_rng([3, 2]).permutation(len(judged))[:4])
    full = json.loads((tmp_path / "full" / "per_query.json").read_text())
    four = json.loads((tmp_path / "four" / "per_query.json").read_text())
    assert len(judged) == 6 and sorted(four) == want and set(read_trec_run(tmp_path / "four" / "run.trec")) == set(want)
    for q in want:
        assert four[q] == pytest.approx(full[q], abs=1e-6), q
    capsys.readouterr()
    out = tmp_path / "train"
    assert main([*args, "data.max_eval_queries=4", "retrieval.split=train", f"output_dir={out}"], evaluate) == 2
    assert "retrieval.split=train has no such sample" in capsys.readouterr().err and not out.exists()


def test_cli_colbert_end_to_end_from_a_checkpoint(tiny_bert, tmp_path, monkeypatch):
    """`python evaluate.py retrieval=dense ckpt=<ColBERT checkpoint>`: served end to end by retrieval/colbert_e2e.py,
    with every token covered and no depth cap (`retrieval.depth=null`), so the run is exact ColBERT's top k."""
    from lightning_modules.module import RankingModule

    monkeypatch.chdir(tmp_path)
    module = RankingModule({"name": "colbert", "backbone": tiny_bert, "doc_max_len": 24}, {})
    ckpt = tmp_path / "c.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, ckpt)
    out = tmp_path / "out"
    rc = main(
        [
            "retrieval=dense",
            f"ckpt={ckpt}",
            "data=synthetic",
            "data.num_docs=40",
            "data.num_train_queries=4",
            "data.num_val_queries=2",
            "data.num_test_queries=5",
            "logger=none",
            f"output_dir={out}",
            "retrieval.k=5",
            "retrieval.k_tokens=100000",
            "retrieval.depth=null",
            "retrieval.store_dtype=float32",
            "retrieval.batch_size=16",
        ],
        evaluate,
    )
    assert rc == 0
    run = read_trec_run(out / "run.trec")
    assert len(run) == 5 and all(len(d) == 5 for d in run.values())
    assert json.loads((out / "metrics.json").read_text())["retrieval"]["docs"] == 40
    assert (out / "run.trec").read_text().split("\n")[0].endswith("colbert-flat")


@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_index_encoding_out_of_memory_retried_in_halves(rankers, name, monkeypatch):
    """Encoding for an index: every encode call on more than 3 rows raises torch.OutOfMemoryError (as CUDA would);
    the batch is retried in halves, with a warning, and the vectors equal an encoding that never ran out."""
    ranker = rankers[name]
    ref = {i: v for ids, vs in encode_docs(ranker, None, DOCS, batch_size=16) for i, v in zip(ids, _rows(vs))}
    real, calls = type(ranker).encode, []

    def limited(self, input_ids, attention_mask, side=None):
        calls.append(input_ids.shape[0])
        if calls[-1] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, input_ids, attention_mask, side=side)

    monkeypatch.setattr(type(ranker), "encode", limited)
    with pytest.warns(UserWarning, match=r"out of memory encoding doc texts on 16 rows; retrying in halves of 8 and 8"):
        got = {i: v for ids, vs in encode_docs(ranker, None, DOCS, batch_size=16) for i, v in zip(ids, _rows(vs))}
    assert max(calls) == 16 and min(calls) <= 3
    assert got.keys() == ref.keys()
    for i in ref:
        torch.testing.assert_close(got[i], ref[i], rtol=0, atol=1e-5)


def _rows(vs):
    """Per-row vectors: pooled [D], or a ColBERT passage's real token vectors [n, D] (padding dropped)."""
    if isinstance(vs, torch.Tensor):
        return list(vs)
    return [t[m] for t, m in zip(vs.tokens, vs.mask)]
