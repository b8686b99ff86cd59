"""model.fast_dropout: the mask's law, the attention formula against a float64 reference, gradients, and an
unchanged evaluation path."""

import math

import pytest
import torch
from torch import nn

from models.rankers.dropout import (
    FastDropout,
    attention,
    drop_mask,
    fast_dropout,
    use_fast_dropout,
)


def test_drop_mask_rate_and_exact_probability():
    torch.manual_seed(0)
    drop, q = drop_mask((400, 1000), 0.1)
    keep = ~drop
    assert keep.dtype == torch.bool and keep.shape == (400, 1000)
    assert q == 1 - round(0.1 * 65536) / 65536
    n = keep.numel()
    assert abs(keep.float().mean().item() - q) < 5 * math.sqrt(q * (1 - q) / n)  # 5 sigma
    # neighbours (4 lanes of one 64-bit draw, and consecutive draws) are independent: P(both kept) = q^2
    pair = (keep.view(-1)[0::2] & keep.view(-1)[1::2]).float().mean().item()
    assert abs(pair - q * q) < 5 * math.sqrt(q * q * (1 - q * q) / (n / 2))


def test_drop_mask_is_reproducible_from_the_seed():
    torch.manual_seed(3)
    a, _ = drop_mask((7, 13), 0.3)
    torch.manual_seed(3)
    b, _ = drop_mask((7, 13), 0.3)
    assert torch.equal(a, b)


def test_fast_dropout_is_unbiased_and_its_gradient_is_mask_times_scale():
    torch.manual_seed(1)
    x = torch.randn(64, 300, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(2)
    y = fast_dropout(x, 0.25)
    torch.manual_seed(2)
    drop, q = drop_mask(x.shape, 0.25)
    keep = ~drop
    torch.testing.assert_close(y, x.detach() * keep / q)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, keep.double() / q)
    ones = torch.ones(200_000)
    assert fast_dropout(ones, 0.25).mean().item() == pytest.approx(1.0, abs=0.01)


def test_eval_and_zero_p_are_the_identity():
    x = torch.randn(5, 6)
    assert torch.equal(fast_dropout(x, 0.5, training=False), x)
    assert torch.equal(fast_dropout(x, 0.0), x)
    m = FastDropout(0.5).eval()
    assert torch.equal(m(x), x)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_attention_with_dropout_matches_float64_formula(mask_kind):
    g = torch.Generator().manual_seed(0)
    b, h, lq, lk, d = 2, 3, 5, 7, 4
    q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (lq, lk, lk))
    real = torch.ones(b, 1, 1, lk, dtype=torch.bool)
    real[1, ..., 4:] = False  # second sequence: 3 padding keys
    mask = real if mask_kind == "bool" else torch.zeros(b, 1, 1, lk).masked_fill(~real, torch.finfo(torch.float32).min)
    module = nn.Module()
    torch.manual_seed(5)
    out, _ = attention(module, q, k, v, mask, dropout=0.2)
    torch.manual_seed(5)
    drop, p_keep = drop_mask((b, h, lq, lk), 0.2)
    keep = ~drop
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~real, float("-inf"))
    want = ((torch.softmax(s, -1) * keep / p_keep) @ v.double()).transpose(1, 2)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_encoder_in_eval_gives_the_plain_sdpa_output(tiny_bert):
    from models.rankers.backbone import load_backbone

    plain, tok = load_backbone(tiny_bert)
    fast, _ = load_backbone(tiny_bert)
    use_fast_dropout(fast)
    assert fast.config._attn_implementation == "isorank_sdpa"
    assert not any(type(m) is nn.Dropout for m in fast.modules())
    batch = tok(
        ["a short one", "a much longer passage about heat transfer in slabs"], padding=True, return_tensors="pt"
    )
    plain.eval(), fast.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(**batch).last_hidden_state, plain(**batch).last_hidden_state, atol=0, rtol=0)


def test_training_forward_without_dropout_equals_plain(tiny_bert_nodropout):
    """p = 0 in the config: the fast path must be SDPA exactly, in train mode too (gradients included)."""
    from models.rankers.backbone import load_backbone

    plain, tok = load_backbone(tiny_bert_nodropout)
    fast, _ = load_backbone(tiny_bert_nodropout)
    use_fast_dropout(fast)
    batch = tok(
        ["a short one", "a much longer passage about heat transfer in slabs"], padding=True, return_tensors="pt"
    )
    outs = []
    for m in (plain, fast):
        m.train()
        y = m(**batch).last_hidden_state
        y.pow(2).mean().backward()
        outs.append((y.detach(), m.embeddings.word_embeddings.weight.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=0, rtol=0)
    torch.testing.assert_close(outs[1][1], outs[0][1], atol=0, rtol=0)


def test_ranker_config_switch(tiny_bert):
    from lightning_modules.module import RankingModule

    on = RankingModule({"name": "colbert", "backbone": tiny_bert}, {}).ranker.encoder
    off = RankingModule({"name": "colbert", "backbone": tiny_bert, "fast_dropout": False}, {}).ranker.encoder
    assert any(isinstance(m, FastDropout) for m in on.modules())
    assert not any(isinstance(m, FastDropout) for m in off.modules()) and off.config._attn_implementation == "sdpa"


def test_attention_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (4, 5, 5))
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    mask[..., 3:] = False

    def f(q, k, v):
        torch.manual_seed(7)  # the same dropout mask at every evaluation
        return attention(nn.Module(), q, k, v, mask, dropout=0.3)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))
