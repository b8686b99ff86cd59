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
