"""models/rankers/backbone.py: the seeded random BERT that tests and benchmarks build, loaded back the way
every ranker loads its backbone."""

import pytest
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


@pytest.mark.parametrize("attn", ["sdpa", "eager", "fast-dropout"])
def test_backbone_mask_decided_on_the_host_equals_transformers_own(tmp_path, attn):
    """`backbone_mask`: with the padding known on the host, the encoder's output is the same as when transformers
    reads the mask itself (no mask for an unpadded batch, its own 4-D mask for a padded one), for SDPA, eager and the
    CPU's fast-dropout attention; where transformers builds SDPA's boolean mask, the broadcast view holds its values.
    Training mode too (dropout drawn from the same seed): outputs and gradients."""
    from transformers.masking_utils import create_bidirectional_mask

    from models.rankers.backbone import backbone_mask
    from models.rankers.dropout import use_fast_dropout

    path = save_random_bert(tmp_path / "bert", seed=2, **SHAPE)
    encoder, tok = load_backbone(path, "eager" if attn == "eager" else "sdpa")
    if attn == "fast-dropout":
        use_fast_dropout(encoder)
    for padded, texts in ((False, ["same words", "same words"]), (True, ["short", "a longer padded text here", "x"])):
        t = tok(texts, padding=True, return_tensors="pt")
        ids, mask = t["input_ids"], t["attention_mask"]
        assert bool((mask == 0).any()) is padded
        arg = backbone_mask(encoder, mask, padded)
        assert (arg is None) is (not padded)
        if padded:
            embeds = mask.new_empty((*mask.shape, 0), dtype=encoder.dtype)
            own = create_bidirectional_mask(
                config=encoder.config, inputs_embeds=embeds, attention_mask=mask, allow_is_bidirectional_skip=False
            )
            assert arg.shape == own.shape and arg.dtype == own.dtype and torch.equal(arg, own)
        for training in (False, True):
            encoder.train(training)
            runs = []
            for given in (mask, arg):
                encoder.zero_grad(set_to_none=True)
                torch.manual_seed(3)
                out = encoder(input_ids=ids, attention_mask=given).last_hidden_state
                out.sum().backward()
                runs.append((out.detach(), [p.grad.clone() for p in encoder.parameters() if p.grad is not None]))
            (want, want_g), (got, got_g) = runs
            assert torch.equal(want, got), (attn, texts, training)
            assert len(want_g) == len(got_g) and all(torch.equal(a, b) for a, b in zip(want_g, got_g))
    assert backbone_mask(encoder, mask, None) is mask  # not known: transformers decides
