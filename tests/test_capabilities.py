"""Code decides by what rankers and heads declare they can do, never by their names (issue 36).

(a) Every registered ranker's and head's declared capabilities, as a table, checked against what the built objects
really do (a multi-vector ranker's `encode` gives token vectors, an index family's score function is the ranker's
own, a trainable ranker has parameters that train, a closed-form head fits without parameters); BM25 is a
first-stage retriever in a registry of its own; no library module compares a ranker's, head's or source's name.

(b) A multi-vector ranker defined and registered in this file alone (no other file touched) works with a token-wise
head (the head stage), the white-box analysis, `retrieval=dense` (which serves it end to end) and ColBERTIndex,
and is refused, by capability, where it does not fit (sequence-wise heads, lexical enrichment, DenseIndex).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import REPO, TINY_RUN, fake_checkpoint, project_sources
from torch import nn

from core.errors import InputError
from datamodules.sources import SOURCES
from datamodules.tokenization import PairTokenizer
from models.heads import HEADS, build_head, head_capabilities, head_config
from models.rankers import RANKERS, build_ranker, ranker_capabilities, rankers_with
from models.rankers.base import BiEncoder, Encoded, RankerConfig, cosine_normalize
from models.rankers.capabilities import RankerCapabilities, capabilities_of
from models.rankers.maxsim import maxsim_all, maxsim_pairs
from retrieval.first_stage import FIRST_STAGE, first_stage, model_capabilities

TOY = "toy_multi"  # the multi-vector ranker of part (b), registered by its fixture only
QUERIES = ["where is the cat sitting", "symptoms of shingles"]
DOCS = ["the cat sat on the mat near the door", "shingles is a viral infection with a rash", "dogs and cats"]


# ---- (a) the declarations ------------------------------------------------------------------------------------
def caps(vectors, index=None, token=False, sequence=False, trainable=True) -> RankerCapabilities:
    return RankerCapabilities(vectors, index, token, sequence, trainable)


RANKER_TABLE = {
    "colbert": caps("multi", "colbert", token=True),
    "repbert": caps("single", "dense", token=True, sequence=True),
    "bert_dot": caps("single", "dense", token=True, sequence=True),
    "tk": caps("multi", None, token=True),  # kernel pooling: no index family reproduces its score
    "bert_cat": caps("none"),
    "dgre": caps("none"),
}
HEAD_TABLE = {"whitening": "closed_form", "nice": "gradient", "glow": "gradient"}


def test_the_declared_tables():
    assert {n: ranker_capabilities(n) for n in RANKERS.names() if n != TOY} == RANKER_TABLE
    assert {n: head_capabilities(n).fit for n in HEADS.names() if n != "none"} == HEAD_TABLE
    assert rankers_with(lambda c: c.index == "dense") == ["bert_dot", "repbert"]
    with pytest.raises(InputError, match="head.name: 'none' is no isotropy head"):
        head_capabilities("none")
    with pytest.raises(ValueError, match="index 'colbert' needs vectors='multi'"):
        RankerCapabilities("single", "colbert")


class Shift(nn.Module):
    """A head that moves every vector off its direction, so that any place it acts changes the output."""

    def forward(self, x):
        return x + torch.linspace(0.5, 1.5, x.shape[-1])


@pytest.fixture(scope="module")
def built(tiny_bert):
    torch.manual_seed(0)
    out = {}
    for name in RANKER_TABLE:
        cfg = RANKERS.get(name).schema(name=name, backbone=tiny_bert, query_max_len=8, doc_max_len=16)
        out[name] = build_ranker(cfg).eval()
    return out


@pytest.mark.parametrize("name", sorted(RANKER_TABLE))
@torch.no_grad()
def test_rankers_do_what_they_declare(built, name):
    ranker = built[name]
    c = capabilities_of(ranker)
    assert c is RANKERS.get(name).capabilities  # one declaration, on the class, registered as it is
    assert any(p.requires_grad for p in ranker.parameters()) == c.trainable
    check_declaration(ranker)


def check_declaration(ranker) -> None:
    """Encode, attach heads and score as the declared capabilities say a caller may."""
    c = capabilities_of(ranker)
    pt = PairTokenizer(ranker.tokenizer, ranker.kind, 8, 16)
    assert c.encodes_texts == (c.vectors != "none") == hasattr(ranker, "encode_queries")
    if c.vectors == "none":  # one score per pair, nothing encoded apart
        assert ranker.kind == "cross" and not hasattr(ranker, "encode_queries")
        assert ranker.score(pt.pairs(QUERIES, DOCS[:2])).shape == (2,)
        return
    qb, db = pt.queries(QUERIES), pt.docs(DOCS)
    q, d = ranker.encode_queries(qb), ranker.encode_docs(db)
    assert q.tokens.ndim == 3 and q.mask.shape == q.tokens.shape[:2]
    assert (q.sequence is not None) == (c.vectors == "single") == c.sequence_vectors
    for slot, declared in (("token_head", c.token_vectors), ("sequence_head", c.sequence_vectors)):
        setattr(ranker, slot, Shift())
        try:
            q2 = ranker.encode_queries(qb)
        finally:
            setattr(ranker, slot, None)
        out, out2 = (q.sequence, q2.sequence) if c.vectors == "single" else (q.tokens, q2.tokens)
        assert (not torch.allclose(out, out2)) == declared, slot
    s = ranker.score_all(q, d)
    eq1 = maxsim_all(cosine_normalize(q.tokens), q.mask, cosine_normalize(d.tokens), d.mask)
    if c.index == "colbert":
        torch.testing.assert_close(s, eq1)
    elif c.index == "dense":
        torch.testing.assert_close(s, ranker.scoring_vectors(q.sequence) @ ranker.scoring_vectors(d.sequence).T)
        assert isinstance(ranker.cosine, bool)  # DenseIndex reads whether scores are cosines
    else:
        assert not torch.allclose(s, eq1)  # a multi-vector ranker that no index family serves (TK)


def test_heads_are_fitted_as_they_declare():
    x = torch.randn(300, 6, generator=torch.Generator().manual_seed(0)) @ torch.randn(6, 6) + 3
    for name, fit in HEAD_TABLE.items():
        head = build_head(head_config({"name": name}), 6)
        assert type(head).capabilities is HEADS.get(name).capabilities
        if fit == "closed_form":
            assert not any(p.requires_grad for p in head.parameters())  # nothing for an optimiser
            z = head.fit_vectors(x.numpy())(x.double())
            torch.testing.assert_close(z.mean(0), torch.zeros(6, dtype=z.dtype), atol=1e-6, rtol=0)
            torch.testing.assert_close(torch.cov(z.T), torch.eye(6, dtype=z.dtype), atol=1e-6, rtol=0)
        else:
            assert any(p.requires_grad for p in head.parameters())
            with pytest.raises(NotImplementedError, match="trained by gradient"):
                head.fit_vectors(x.numpy())


def test_bm25_is_a_first_stage_retriever(tmp_path):
    import pipeline.run
    from pipeline.config import compose

    assert "bm25" not in RANKERS and first_stage("bm25") is FIRST_STAGE.get("bm25")
    assert first_stage("colbert") is None
    assert model_capabilities("bm25") == caps("none", trainable=False)
    models = [*RANKERS.names(), *FIRST_STAGE.names()]
    assert {n for n in models if not model_capabilities(n).trainable} == {"bm25"}
    cfg = compose(["model=bm25", "model.depth=20", "data=synthetic", "logger=none", f"output_dir={tmp_path / 'o'}"])
    assert cfg.model.depth == 20
    with pytest.raises(InputError, match="model: 'bm25' has nothing to train"):
        pipeline.run.train(cfg)
    with pytest.raises(InputError, match="model.name: unknown model 'splade'.*'bm25'"):
        compose(["model.name=splade"])


# Comparisons of a model, ranker, head or data source with a registered name, `name in SOME_LIST`, and isinstance
# against a ranker or head class: what capabilities replaced. Membership in a registry is the registry's business.
LIBRARY = (
    "analyses",
    "callbacks",
    "core",
    "datamodules",
    "lightning_modules",
    "models",
    "metrics",
    "pipeline",
    "retrieval",
    "grid",
)
REGISTRIES = {"RANKERS", "HEADS", "FIRST_STAGE"}
CLASSES = r"ColBERT|RepBERT|BertDot|BertCat|TK|DGRe|SingleVectorEncoder|BiEncoder|CrossEncoder|Whitening|FlowHead"


def name_decisions() -> list[str]:
    names = [n for r in (RANKERS, HEADS, FIRST_STAGE, SOURCES) for n in r.names() if n != "none"]
    literal = "[\"'](" + "|".join(map(re.escape, names)) + ")[\"']"
    compared = re.compile(r"""\bname\b["'\]]*\s*(?:==|!=|\bnot in\b|\bin\b)\s*(?:[\(\[\{][^\)\]\}]*)?""" + literal)
    listed = re.compile(
        r"""(?:model|ranker|head)\w*(?:\.cfg)?(?:\.name|\[["']name["']\])\s*(?:not in|in)\s*([A-Z]\w+)"""
    )
    classed = re.compile(rf"isinstance\([^)]*\b({CLASSES})\b")
    found = []
    for path in project_sources(*LIBRARY):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            m = listed.search(line)
            if compared.search(line) or classed.search(line) or (m and m[1] not in REGISTRIES):
                found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    return found


def test_no_library_decision_compares_names():
    assert name_decisions() == []


# ---- (b) a multi-vector ranker added from this file alone ----------------------------------------------------
@dataclass
class ToyMultiConfig(RankerConfig):
    """`model.name: toy_multi`: only the keys every ranker shares."""

    name: str = "toy_multi"


class ToyMulti(BiEncoder):
    """Eq. 1 over the backbone's token vectors through a learned square map: multi-vector, yet no ColBERT subclass."""

    capabilities = RankerCapabilities(vectors="multi", index="colbert", token_vectors=True)

    def __init__(self, cfg: ToyMultiConfig):
        super().__init__(cfg)
        self.mix = nn.Linear(self.hidden_size, self.hidden_size)

    def token_representations(self, input_ids, attention_mask, side=None) -> Encoded:
        """Return the backbone's token vectors through the square map."""
        enc = super().token_representations(input_ids, attention_mask, side)
        enc.tokens = self.mix(enc.tokens)
        return enc

    def scoring_vectors(self, x):
        """Return unit vectors: Eq. 1 compares cosines."""
        return cosine_normalize(x)

    def score_pairs(self, q: Encoded, d: Encoded):
        """Score query i against passage i by Eq. 1."""
        return maxsim_pairs(cosine_normalize(q.tokens), q.mask, cosine_normalize(d.tokens), d.mask)

    def score_all(self, q: Encoded, d: Encoded):
        """Score every query against every passage by Eq. 1."""
        return maxsim_all(cosine_normalize(q.tokens), q.mask, cosine_normalize(d.tokens), d.mask)


SMALL = TINY_RUN


@pytest.fixture(scope="module")
def toy():
    """Register the toy ranker for this module only (the registry is process-wide)."""
    RANKERS.register(TOY, schema=ToyMultiConfig, capabilities=ToyMulti.capabilities)(ToyMulti)
    yield
    RANKERS._entries.pop(TOY)


@pytest.fixture(scope="module")
def toy_ckpt(toy, tmp_path_factory, tiny_bert_nodropout):
    torch.manual_seed(0)
    return fake_checkpoint(tmp_path_factory.mktemp("toy") / "toy.ckpt", tiny_bert_nodropout, name=TOY)


@torch.no_grad()
def test_toy_is_known_by_its_capabilities(toy, tiny_bert):
    from pipeline.config import compose

    assert ranker_capabilities(TOY).index == "colbert" and TOY in rankers_with(lambda c: c.index == "colbert")
    # from the command line: repbert.yaml holds only the keys every ranker shares, so it composes the toy's config
    cfg = compose(["model=repbert", f"model.name={TOY}", f"model.backbone={tiny_bert}", "retrieval=dense"])
    assert cfg.model.name == TOY and model_capabilities(cfg.model.name).trainable
    ranker = build_ranker(ToyMultiConfig(backbone=tiny_bert, query_max_len=8, doc_max_len=16)).eval()
    check_declaration(ranker)


def test_toy_with_a_token_wise_head(toy, toy_ckpt, tmp_path):
    """The head stage: whitening (closed form, as it declares) on the toy's token vectors; "Ft" and "Ft -> head"."""
    import pipeline.run
    from pipeline.config import compose

    out = tmp_path / "white"
    args = [*SMALL, "stage=head", f"ckpt={toy_ckpt}", "head=whitening", f"data.cache_dir={tmp_path / 'c'}"]
    after = pipeline.run.train(compose([*args, f"output_dir={out}"]))
    m = json.loads((out / "metrics.json").read_text())
    assert m["ndcg_cut_10"] == pytest.approx(after["ndcg_cut_10"]) and "ndcg_cut_10" in m["before_head"]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["head.ckpt"]  # fitted once, no epochs
    assert m["iw"] > m["before_head"]["iw"]  # the token vectors are whitened
    with pytest.raises(InputError, match="head.granularity: 'sequence' needs a ranker with one vector per text"):
        pipeline.run.train(compose([*args, "head.granularity=sequence", f"output_dir={tmp_path / 'seq'}"]))


def test_toy_in_the_whitebox_analysis(toy, toy_ckpt, tmp_path):
    from analyses.registry import run_analysis
    from pipeline.config import compose

    out = tmp_path / "wb"
    argv = [
        *SMALL,
        "analysis=whitebox",
        f"ckpt={toy_ckpt}",
        "analysis.with_backbone=true",
        "analysis.statistics=[term_importance,delta_es]",
        f"data.cache_dir={tmp_path / 'c'}",
        f"output_dir={out}",
    ]
    run_analysis(compose(argv), False)
    res = json.loads((out / "whitebox.json").read_text())
    assert sorted(res["models"]) == ["backbone", "fine-tuned"]
    assert all(res["models"][k]["correlations"]["tau_ap_a"]["n"] >= 3 for k in res["models"])


def test_toy_full_ranking(toy, toy_ckpt, tmp_path, monkeypatch):
    """`retrieval=dense` serves it end to end (its index family); the run is the exact top k of its own Eq. 1."""
    from datamodules.textfiles import read_trec_run
    from pipeline.cli import main
    from pipeline.run import evaluate

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "dense"
    argv = ["retrieval=dense", f"ckpt={toy_ckpt}", *SMALL, f"output_dir={out}", "retrieval.k=5"]
    argv += ["retrieval.k_tokens=100000", "retrieval.depth=null", "retrieval.store_dtype=float32"]
    assert main(argv, evaluate) == 0
    run = read_trec_run(out / "run.trec")
    assert len(run) == 6 and all(len(d) == 5 for d in run.values())
    assert json.loads((out / "index" / "manifest.json").read_text())["ranker"] == TOY


@torch.no_grad()
def test_toy_colbert_index_and_dense_index(toy, tiny_bert):
    from retrieval.colbert_e2e import ColBERTIndex
    from retrieval.dense import DenseIndex

    torch.manual_seed(1)
    ranker = build_ranker(ToyMultiConfig(backbone=tiny_bert, doc_max_len=24)).eval()
    docs = {f"d{i}": t for i, t in enumerate(DOCS * 3)}
    queries = {f"q{i}": t for i, t in enumerate(QUERIES)}
    index = ColBERTIndex.build(ranker, docs, batch_size=4, store_dtype="float32")
    run = index.search(queries, k=4, k_tokens=index.n_tokens, depth=None)
    pt = PairTokenizer(ranker.tokenizer, ranker.kind, ranker.cfg.query_max_len, ranker.cfg.doc_max_len)
    q = ranker.encode_queries(pt.queries(list(queries.values())))
    s = ranker.score_all(q, ranker.encode_docs(pt.docs(list(docs.values()))))  # brute force, one batch
    for qi, qid in enumerate(queries):
        np.testing.assert_allclose(
            sorted(run[qid].values(), reverse=True), s[qi].sort(descending=True).values[:4], atol=1e-5
        )
    with pytest.raises(InputError, match=f"'{TOY}' is not a single-vector ranker.*for {TOY} use .*ColBERTIndex"):
        DenseIndex.build(ranker, docs)


def test_toy_refused_where_one_vector_per_text_is_needed(toy, toy_ckpt, tmp_path):
    from analyses.registry import run_analysis
    from pipeline.config import compose

    argv = [*SMALL, "analysis=lexical_enrichment", f"ckpt={toy_ckpt}", f"output_dir={tmp_path / 'le'}"]
    with pytest.raises(InputError, match=f"model.name: is '{TOY}'; lexical enrichment .* bert_dot or repbert"):
        run_analysis(compose(argv), False)
