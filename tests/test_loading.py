"""`models.loading.load_ranker`: one loader for every kind of source, returning (ranker, tokenizer, head) (issue 36).

Each kind (fine-tuning checkpoint, head checkpoint, export folder with and without a head, Hugging Face folder with a
model config, untrained config) is loaded and compared with an independent reading of the same weights: the
checkpoint's tensors, the head applied by hand, the backbone read by transformers itself. Mismatches stop before any
weights are built; no analysis or retrieval module reads checkpoint internals itself.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import REPO, fake_checkpoint, project_sources

from core.errors import InputError
from models.heads import build_head, head_config, head_input_dim
from models.loading import LoadedRanker, load_ranker, recorded_model

TEXTS = ["the cat sat on the mat", "kernel pooling for ranking", "whitening token vectors"]


@pytest.fixture(scope="module")
def colbert_ckpt(tmp_path_factory, tiny_bert_nodropout):
    torch.manual_seed(0)
    return fake_checkpoint(tmp_path_factory.mktemp("ck") / "colbert.ckpt", tiny_bert_nodropout, name="colbert")


@pytest.fixture(scope="module")
def head_ckpt(colbert_ckpt, tmp_path_factory):
    """A token-wise whitening head checkpoint as the head stage writes it: the head's weights, its base recorded."""
    ck = torch.load(colbert_ckpt, weights_only=False)
    hp = ck["hyper_parameters"]
    head_cfg = {"name": "whitening", "granularity": "token"}
    loaded = load_ranker(colbert_ckpt)
    head = build_head(head_config(head_cfg), head_input_dim(loaded.ranker))
    head.fit_vectors(torch.randn(500, head.dim, generator=torch.Generator().manual_seed(1)).numpy() * 3 + 1)
    state = {f"ranker.token_head.{k}": v for k, v in head.state_dict().items()}
    path = tmp_path_factory.mktemp("head") / "head.ckpt"
    torch.save(
        {
            "state_dict": state,
            "hyper_parameters": {**hp, "head": head_cfg, "base_ckpt": str(colbert_ckpt)},
            "base_ckpt": str(colbert_ckpt),
        },
        path,
    )
    return path, head


def _scores(loaded: LoadedRanker) -> torch.Tensor:
    ranker, tok, _ = loaded
    with torch.no_grad():
        q = ranker.encode_queries(tok.queries(TEXTS))
        d = ranker.encode_docs(tok.docs(TEXTS))
        return ranker.score_all(q, d)


def test_a_checkpoint(colbert_ckpt):
    loaded = load_ranker(colbert_ckpt)
    ranker, tok, head = loaded
    assert head is None and loaded.source == "checkpoint" and not ranker.training
    assert (tok.query_max_len, tok.doc_max_len) == (ranker.cfg.query_max_len, ranker.cfg.doc_max_len)
    state = torch.load(colbert_ckpt, weights_only=False)["state_dict"]
    own = ranker.state_dict()
    assert {f"ranker.{k}" for k in own} == {k for k in state if k.startswith("ranker.")}
    for k, v in own.items():
        assert torch.equal(v, state[f"ranker.{k}"]), k
    assert recorded_model(colbert_ckpt) == loaded.hparams["model"]


def test_a_head_checkpoint(colbert_ckpt, head_ckpt):
    path, fitted = head_ckpt
    loaded = load_ranker(path)
    ranker, tok, head = loaded
    assert loaded.source == "head checkpoint" and loaded.base_path == str(colbert_ckpt)
    assert ranker.token_head is head and loaded.hparams["head"]["name"] == "whitening"
    for k, v in fitted.state_dict().items():
        assert torch.equal(head.state_dict()[k], v), k
    # with the head: the ranker's token vectors are the head applied by hand to the raw ones (real tokens)
    plain, _, _ = load_ranker(colbert_ckpt)
    batch = tok.docs(TEXTS)
    mask = batch["d_attention_mask"].bool()
    with torch.no_grad():
        raw = plain.encode(batch["d_input_ids"], batch["d_attention_mask"], side="doc").tokens
        got = ranker.encode(batch["d_input_ids"], batch["d_attention_mask"], side="doc").tokens
        by_hand = fitted(raw)
    assert torch.allclose(got[mask], by_hand[mask], atol=1e-5)
    assert not torch.allclose(got[mask], raw[mask], atol=1e-2)


def test_an_export_folder_with_and_without_a_head(colbert_ckpt, head_ckpt, tmp_path):
    import pipeline.run
    from pipeline.config import compose

    path, _ = head_ckpt
    for name, args in (("plain", [f"ckpt={colbert_ckpt}"]), ("head", [f"head_ckpt={path}"])):
        out = tmp_path / name
        pipeline.run.train(compose(["stage=export", *args, "logger=none", f"output_dir={out}"]))
        exported = load_ranker(out)
        original = load_ranker(colbert_ckpt if name == "plain" else path)
        assert exported.source == "export" and (exported.head is None) == (name == "plain")
        assert torch.allclose(_scores(exported), _scores(original), atol=1e-5)
        assert recorded_model(out)["name"] == "colbert"


def test_a_hugging_face_folder_and_an_untrained_config(tiny_bert):
    from transformers import AutoModel

    hub = load_ranker(tiny_bert, model={"name": "repbert"})
    assert hub.source == "hub" and hub.config.backbone == tiny_bert
    reference = AutoModel.from_pretrained(tiny_bert).state_dict()
    for k, v in hub.ranker.encoder.state_dict().items():
        assert torch.equal(v, reference[k]), k
    untrained = load_ranker(model={"name": "repbert", "backbone": tiny_bert})
    assert untrained.source == "config" and torch.allclose(_scores(untrained), _scores(hub))


def test_mismatches_stop_before_any_weights_are_built(colbert_ckpt, head_ckpt, tmp_path, monkeypatch, tiny_bert):
    import models.loading

    def built(*_a, **_k):
        raise AssertionError("weights were built before the error")

    monkeypatch.setattr(models.loading, "build_ranker", built)
    with pytest.raises(
        InputError, match=r"ckpt: checkpoint '.*colbert.ckpt' holds ranker 'colbert' but model.name is 'repbert'"
    ):
        load_ranker(colbert_ckpt, expect="repbert")
    other = fake_checkpoint(tmp_path / "repbert.ckpt", tiny_bert, name="repbert")
    with pytest.raises(
        InputError, match=r"ckpt: '.*repbert.ckpt' holds ranker repbert with other settings than the head's base"
    ):
        load_ranker(head_ckpt[0], key="head_ckpt", base=other)
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError, match="is a folder but not an isorank export"):
        load_ranker(tmp_path / "folder")
    with pytest.raises(InputError, match="ckpt: checkpoint 'no/such/model' does not exist"):
        load_ranker("no/such/model")
    with pytest.raises(InputError, match="needs a path"):
        load_ranker()


def test_no_analysis_or_retrieval_module_reads_checkpoint_internals():
    pattern = re.compile(r"read_checkpoint|read_header|\[\"(state_dict|hyper_parameters)\"\]|module_from_checkpoint")
    found = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in project_sources("analyses", "retrieval")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
