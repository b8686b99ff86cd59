"""models/rankers/backbone.py: the seeded random BERT that tests and benchmarks build, loaded back the way
every ranker loads its backbone."""

import torch

from models.rankers.backbone import load_backbone, save_random_bert

SHAPE = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)


def _weights(path) -> dict[str, torch.Tensor]:
    encoder, _ = load_backbone(str(path))
    return {k: v.clone() for k, v in encoder.state_dict().items()}


def test_random_bert_is_a_function_of_its_seed_and_loads_with_the_asked_shape(tmp_path):
    a = _weights(save_random_bert(tmp_path / "a", seed=3, **SHAPE))
    b = _weights(save_random_bert(tmp_path / "b", seed=3, **SHAPE))
    c = _weights(save_random_bert(tmp_path / "c", seed=4, **SHAPE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embeddings.word_embeddings.weight"], c["embeddings.word_embeddings.weight"])
    assert a["embeddings.word_embeddings.weight"].shape == (30522, 16)  # MiniLM's uncased WordPiece vocabulary
    encoder, tokenizer = load_backbone(str(tmp_path / "a"))
    assert encoder.config.num_hidden_layers == 1 and len(tokenizer) == 30522


def test_attention_implementation_reaches_the_encoder_and_eager_matches_sdpa(tmp_path):
    """model.attn_implementation is what the loaded encoder computes with; transformers' eager attention (the
    reference softmax(QK^T / sqrt(d)) V) and SDPA give the same token vectors on padded batches."""
    from models.rankers import build_ranker, ranker_config

    path = save_random_bert(tmp_path / "bert", seed=1, **SHAPE)
    rankers = {}
    for attn in ("sdpa", "eager"):
        torch.manual_seed(0)
        cfg = ranker_config({"name": "colbert", "backbone": path, "attn_implementation": attn, "fast_dropout": False})
        rankers[attn] = build_ranker(cfg).eval()
        assert rankers[attn].encoder.config._attn_implementation == attn
    tok = rankers["sdpa"].tokenizer(["a short one", "a much longer text with more words in it"], padding=True)
    ids, mask = torch.tensor(tok["input_ids"]), torch.tensor(tok["attention_mask"])
    with torch.no_grad():
        a, b = (rankers[k].token_representations(ids, mask).tokens for k in ("sdpa", "eager"))
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)


def test_backbone_mask_decided_on_the_host_equals_transformers_own(tmp_path):
    """`backbone_mask`: with the padding known on the host, the encoder's output is the same as when transformers
    reads the mask itself (no mask for an unpadded batch, its own 4-D mask for a padded one), for SDPA and eager."""
    from models.rankers.backbone import backbone_mask

    path = save_random_bert(tmp_path / "bert", seed=2, **SHAPE)
    for attn in ("sdpa", "eager"):
        encoder, tok = load_backbone(path, attn)
        for padded, texts in ((False, ["same words", "same words"]), (True, ["short", "a longer padded text here"])):
            t = tok(texts, padding=True, return_tensors="pt")
            ids, mask = t["input_ids"], t["attention_mask"]
            assert bool((mask == 0).any()) is padded
            arg = backbone_mask(encoder, mask, padded)
            assert (arg is None) is (not padded)
            with torch.no_grad():
                want = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
                got = encoder(input_ids=ids, attention_mask=arg).last_hidden_state
            assert torch.equal(want, got), (attn, texts)
        assert backbone_mask(encoder, mask, None) is mask  # not known: transformers decides
