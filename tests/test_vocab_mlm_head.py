"""The MLM head of Eq. 1 (analyses/vocab/mlm_head.py) and its fitting command (fit_mlm_head.py) on tiny random BERTs:
the decoder is tied to the backbone's input embeddings and never moves, the encoder is frozen (the stored
vectors are the encoder's own outputs), masked-token accuracy equals a brute-force count, a checkpoint's own head
reproduces transformers' logits, and bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_script

from analyses.vocab.fit_mlm_head import (
    FitOptions,
    fit,
    mask_passages,
    masked_accuracy,
    train_head,
)
from analyses.vocab.mlm_head import (
    MLMHead,
    backbone_embeddings,
    load_fitted,
    load_mlm_head,
    save_head,
)
from core.errors import InputError

DOCS = {
    f"d{i}": t
    for i, t in enumerate(
        [
            "the cat sat on the mat near the door",
            "shingles is a viral infection with a painful rash",
            "a book about a cat written by a famous author",
            "dogs and cats are common pets in many homes",
            "the symptoms include pain and itching of the skin",
            "rivers flow into the sea through wide deltas",
            "the great lakes connect to the atlantic ocean",
            "soul music came out of rhythm and blues",
            "the supreme court has nine justices",
            "michael jack was born in folkestone england",
        ]
    )
}


def test_mask_passages_picks_non_special_tokens():
    rng = np.random.default_rng(0)
    ids = [[101] + list(range(1000, 1040)) + [102], [101, 102]]
    ex = mask_passages(ids, {101, 102}, 103, 30522, 0.15, rng, "mask")
    assert len(ex) == 1  # a passage of special tokens only has nothing to mask
    e = ex[0]
    assert len(e.positions) == 6 and 0 not in e.positions and 41 not in e.positions
    assert all(e.input_ids[p] == 103 for p in e.positions) and e.targets == [ids[0][p] for p in e.positions]
    unmasked = [i for i in range(len(ids[0])) if i not in e.positions]
    assert [e.input_ids[i] for i in unmasked] == [ids[0][i] for i in unmasked]
    bert = mask_passages([list(range(1000, 3000))], set(), 103, 30522, 0.5, np.random.default_rng(1), "bert")[0]
    share = np.mean([bert.input_ids[p] == 103 for p in bert.positions])
    assert 0.75 < share < 0.85  # BERT's 80 % [MASK]


def test_fit_ties_decoder_freezes_encoder_and_counts_accuracy(tiny_bert_nodropout):
    from transformers import AutoModel

    emb, _ = backbone_embeddings(tiny_bert_nodropout)
    opts = FitOptions(out="", heldout=0.3, epochs=2, batch_size=16, masks=2, seed=3, bf16=False)
    head, report, held = fit(tiny_bert_nodropout, DOCS, opts, log=lambda m: None)
    # tied and frozen decoder: the backbone's own vectors, not a parameter, not saved
    assert torch.equal(head.embeddings, emb)
    assert "embeddings" not in head.state_dict() and all(
        p.data_ptr() != head.embeddings.data_ptr() for p in head.parameters()
    )
    # the stored vectors are the frozen encoder's outputs: each held-out passage encoded alone, brute force
    enc = AutoModel.from_pretrained(tiny_bert_nodropout).eval()
    correct, total, row = 0, 0, 0
    with torch.no_grad():
        for e in held["examples"]:
            h = enc(input_ids=torch.tensor([e.input_ids])).last_hidden_state[0]
            for p, t in zip(e.positions, e.targets):
                assert torch.allclose(held["hidden"][row], h[p], atol=1e-5)
                logits = head(h[p])
                correct += int(int(logits.argmax()) == t)
                total += 1
                row += 1
    got = report["heldout"]["fitted_head"]
    assert (got["correct"], got["total"]) == (correct, total) and total == report["masked_tokens"]["heldout"]
    assert got["accuracy"] == pytest.approx(correct / total)
    assert report["passages"] == {"fitted": 7, "heldout": 3}
    assert report["heldout"]["random_head"]["total"] == total


@pytest.mark.slow
def test_train_head_learns_a_decodable_signal_through_the_tied_decoder(tiny_bert):
    """Vectors that point at their token's embedding (plus noise): fitting g and b must decode them, and the
    random head must not."""
    emb, _ = backbone_embeddings(tiny_bert)
    gen = torch.Generator().manual_seed(0)
    targets = torch.randint(1000, 1200, (3000,), generator=gen)
    hidden = emb[targets] * 20 + 0.05 * torch.randn(3000, emb.shape[1], generator=gen)
    head = MLMHead(emb)
    head.init_identity()
    before = emb.clone()
    losses = train_head(
        head, hidden[:2500], targets[:2500], epochs=15, lr=1e-2, batch_size=100, seed=0, log=lambda m: None
    )
    assert losses[-1] < losses[0] and torch.equal(head.embeddings, before)
    correct, total, _ = masked_accuracy(head, hidden[2500:], targets[2500:])
    assert total == 500 and correct / total > 0.9
    from analyses.vocab.fit_mlm_head import random_head

    rc, _, _ = masked_accuracy(random_head(emb, "gelu", 1e-12, 0), hidden[2500:], targets[2500:])
    assert rc / total < 0.05


def test_save_load_and_the_checkpoints_own_head(tmp_path, tiny_bert):
    from transformers import AutoTokenizer, BertForMaskedLM

    emb, _ = backbone_embeddings(tiny_bert)
    head = MLMHead(emb)
    torch.nn.init.normal_(head.dense.weight, std=0.1)
    torch.nn.init.normal_(head.bias)
    path = save_head(head, tmp_path / "h.pt", tiny_bert, {"x": 1})
    back = load_fitted(path, tiny_bert)
    h = torch.randn(4, emb.shape[1])
    assert torch.allclose(back(h), head(h), atol=1e-6)
    # a backbone without MLM weights: one line naming the fitting command
    with pytest.raises(InputError, match="fit_mlm_head"):
        load_mlm_head(tiny_bert)
    with pytest.raises(InputError, match="does not exist"):
        load_mlm_head(tiny_bert, str(tmp_path / "missing.pt"))
    # a checkpoint with an MLM head: its logits are transformers' own
    torch.manual_seed(1)
    mlm = BertForMaskedLM.from_pretrained(tiny_bert)  # head initialised at random here, then saved as the checkpoint's
    torch.nn.init.normal_(mlm.cls.predictions.bias)
    mlm.save_pretrained(tmp_path / "mlm")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "mlm")
    own, source = load_mlm_head(str(tmp_path / "mlm"))
    assert "pre-trained" in source
    with torch.no_grad():
        assert torch.allclose(own(h), mlm.eval().cls(h), atol=1e-5)
    small = tmp_path / "small"
    from conftest import make_tiny_bert

    make_tiny_bert(small, hidden=16)
    with pytest.raises(InputError, match="was fitted for backbone"):
        load_fitted(path, str(small))


@pytest.mark.slow
def test_command_line(tmp_path, tiny_bert):
    out = tmp_path / "head.pt"
    """`python evaluate.py analysis=fit_mlm_head` (configs/analysis/fit_mlm_head.yaml)."""
    proc = run_script(
        "evaluate.py",
        "analysis=fit_mlm_head",
        f"model.backbone={tiny_bert}",
        "data=synthetic",
        "analysis.max_passages=40",
        "logger=none",
        "analysis.epochs=1",
        "analysis.bf16=false",  # fp32: bf16 is emulated (~10x slower) on CPUs without bf16 kernels
        f"analysis.out={out}",
        f"output_dir={tmp_path / 'o'}",
    )
    report = json.loads(out.with_name("head.pt.json").read_text())
    assert "held-out masked-token accuracy" in proc.stdout and report["passages"]["heldout"] == 4
    assert report["settings"]["epochs"] == 1 and report["settings"]["max_passages"] == 40
    assert load_fitted(out, tiny_bert).vocab_size == 30522
    bad = run_script(
        "evaluate.py",
        "analysis=fit_mlm_head",
        f"model.backbone={tiny_bert}",
        "analysis.heldout=1.5",
        f"analysis.out={tmp_path / 'x.pt'}",
        check=False,
    )
    assert bad.returncode == 2 and "analysis.heldout" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()
    # no analysis.out: the head goes into output_dir
    run_script(
        "evaluate.py",
        "analysis=fit_mlm_head",
        f"model.backbone={tiny_bert}",
        "data=synthetic",
        "analysis.max_passages=10",
        "logger=none",
        "analysis.epochs=1",
        "analysis.bf16=false",
        f"output_dir={tmp_path / 'default'}",
    )
    assert load_fitted(tmp_path / "default" / "mlm_head.pt", tiny_bert).vocab_size == 30522
