"""RankingModule pieces outside a Trainer: chunked bi-encoder evaluation equals scoring each pair directly, and
the training losses equal their formulas computed pair by pair."""

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from datamodules.datamodule import DocChunkDataset, doc_chunks
from lightning_modules.module import RankingModule

QUERIES = ["what is heat transfer", "slab conduction", "boundary layer flow at high speed"]
DOCS = ["heat transfer in slabs", "a study of boundary layers", "flow of air over wings at speed", "conduction"]


def module(tiny_bert, name, **optim):
    m = RankingModule({"name": name, "backbone": tiny_bert, "query_max_len": 8, "doc_max_len": 16}, optim)
    return m.eval()


@pytest.mark.parametrize("name", ["colbert", "repbert", "bert_dot"])
def test_chunked_eval_equals_pairwise_scores(tiny_bert, name):
    m = module(tiny_bert, name)
    pairs = np.array([(q, d) for q in range(3) for d in range(4) if (q + d) % 3 != 1], dtype=np.int64)
    tok = m.pair_tokenizer
    got = {}
    queries = m.encode_query_texts(QUERIES, batch_size=2)  # two batches of different padded lengths
    for chunk in DocChunkDataset(doc_chunks(pairs, max_docs=2), DOCS, tok):
        with torch.no_grad():
            s = m.score_chunk(queries, chunk, pairs_per_pass=3)
        got.update({(int(a), int(b)): float(v) for a, b, v in zip(chunk["qidx"], chunk["didx"], s)})
    assert set(got) == {tuple(p) for p in pairs.tolist()}
    with torch.no_grad():
        want = m.ranker.score(tok.pairs([QUERIES[q] for q, _ in pairs], [DOCS[d] for _, d in pairs]))
    for (q, d), w in zip(pairs.tolist(), want.tolist()):
        assert got[(q, d)] == pytest.approx(w, abs=1e-5)


def test_doc_chunks_cover_pairs_once_with_bounded_docs():
    rng = np.random.default_rng(0)
    pairs = np.unique(rng.integers(0, 20, size=(200, 2)), axis=0)
    chunks = doc_chunks(pairs, 7)
    assert sorted(map(tuple, np.concatenate(chunks).tolist())) == sorted(map(tuple, pairs.tolist()))
    assert all(len(np.unique(c[:, 1])) <= 7 for c in chunks)
    docs_per_chunk = [set(c[:, 1].tolist()) for c in chunks]
    assert all(a.isdisjoint(b) for i, a in enumerate(docs_per_chunk) for b in docs_per_chunk[i + 1 :])


def reference_scores(m, q_texts, d_texts):
    """s[i][j] = score(q_i, d_j) computed one pair at a time."""
    tok = m.pair_tokenizer
    return torch.stack([torch.stack([m.ranker.score(tok.pairs([q], [d]))[0] for d in d_texts]) for q in q_texts])


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_in_batch_ce_loss_matches_formula(tiny_bert, name):
    m = module(tiny_bert, name, loss="ce", in_batch_negatives=True)
    q, pos, neg = QUERIES[:2], DOCS[:2], DOCS[2:4]
    scores, target, s_pos, s_neg = m.triplet_scores(m.pair_tokenizer.triplets(q, pos, neg))
    ref = reference_scores(m, q, pos + neg).detach()  # columns: positives then negatives of the whole batch
    torch.testing.assert_close(scores, ref, atol=1e-5, rtol=0)
    assert target.tolist() == [0, 1]
    want = np.mean([-np.log(np.exp(ref[i, i].item()) / np.exp(ref[i].double().numpy()).sum()) for i in range(2)])
    assert F.cross_entropy(scores, target).item() == pytest.approx(want, abs=1e-5)
    torch.testing.assert_close(s_neg, torch.stack([ref[0, 2], ref[1, 3]]), atol=1e-5, rtol=0)


def test_in_batch_negatives_judged_relevant_are_masked(tiny_bert):
    """Query 0's judged documents are its positive d0, query 1's positive d1 and query 2's negative d5; d0 is also
    query 2's negative, and query 2 judges d0 relevant too. So query 0 loses the columns of d1, d5 and the second
    copy of d0, query 2 loses query 0's positive d0 but keeps its own negative d0 (a triple's own columns stay: a
    bad triple is the data's to fix); nothing else is masked. The loss equals the float64 formula over the rest."""
    from datamodules.datamodule import TripletCollate, TripletKeys, doc_key

    m = module(tiny_bert, "colbert", loss="ce", in_batch_negatives=True)
    q, pos, neg = QUERIES, DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    ids_pos, ids_neg = ["d0", "d1", "d2"], ["d3", "d5", "d0"]
    relevant = [["d0", "d1", "d5"], ["d1"], ["d2", "d0"]]
    keys = [
        TripletKeys(doc_key(p), doc_key(n), tuple(doc_key(d) for d in r)) for p, n, r in zip(ids_pos, ids_neg, relevant)
    ]
    batch = TripletCollate(m.pair_tokenizer)(list(zip(q, pos, neg, keys)))
    scores, target, s_pos, s_neg = m.triplet_scores(batch)
    columns = ids_pos + ids_neg
    masked = {(i, c) for i in range(3) for c in range(6) if columns[c] in relevant[i] and c not in (i, 3 + i)}
    assert masked == {(0, 1), (0, 4), (0, 5), (2, 0)}
    assert {(i, c) for i in range(3) for c in range(6) if scores[i, c] == float("-inf")} == masked
    ref = reference_scores(m, q, pos + neg).detach().double().numpy()
    want = np.mean(
        [-ref[i, i] + np.log(sum(np.exp(ref[i, c]) for c in range(6) if (i, c) not in masked)) for i in range(3)]
    )
    assert F.cross_entropy(scores, target).item() == pytest.approx(want, abs=1e-5)
    torch.testing.assert_close(
        s_neg, torch.tensor([ref[0, 3], ref[1, 4], ref[2, 5]], dtype=s_neg.dtype), atol=1e-5, rtol=0
    )
    # switched off: every column stays
    m.optim_cfg.in_batch_mask_relevant = False
    assert torch.isfinite(m.triplet_scores(batch)[0]).all()


@pytest.mark.parametrize("name", ["bert_cat", "bert_dot"])
def test_pairwise_scores_without_in_batch(tiny_bert, name):
    m = module(tiny_bert, name, loss="hinge", margin=0.5, in_batch_negatives=False)
    q, pos, neg = QUERIES[:2], DOCS[:2], DOCS[2:4]
    scores, target, s_pos, s_neg = m.triplet_scores(m.pair_tokenizer.triplets(q, pos, neg))
    ref = reference_scores(m, q, pos + neg).detach()
    torch.testing.assert_close(s_pos, torch.stack([ref[0, 0], ref[1, 1]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(s_neg, torch.stack([ref[0, 2], ref[1, 3]]), atol=1e-5, rtol=0)
    assert scores.shape == (2, 2) and target.tolist() == [0, 0]


def test_hinge_loss_matches_formula(tiny_bert):
    """optim.loss=hinge: mean over triplets of max(0, margin - s(q, p+) + s(q, p-)), each on its own negative."""
    m = module(tiny_bert, "repbert", loss="hinge", margin=0.3, in_batch_negatives=False)
    q, pos, neg = QUERIES[:3], DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    batch = m.pair_tokenizer.triplets(q, pos, neg)
    ref = reference_scores(m, q, pos + neg).detach().double().numpy()
    want = np.mean([max(0.0, 0.3 - ref[i, i] + ref[i, 3 + i]) for i in range(3)])
    m.log = lambda *a, **k: None  # no trainer to log to
    assert m.training_step(batch, 0).item() == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(
    "name,temperature,want_t", [("repbert", None, 0.05), ("colbert", None, 1.0), ("repbert", 0.5, 0.5)]
)
def test_ce_loss_divides_scores_by_temperature(tiny_bert, name, temperature, want_t):
    """optim.loss=ce: softmax cross-entropy over score / temperature; null takes the ranker's own (RepBERT's
    cosines 0.05, others 1), a number overrides it. Reference: float64 log-softmax computed row by row."""
    m = module(tiny_bert, name, loss="ce", in_batch_negatives=True, temperature=temperature)
    q, pos, neg = QUERIES[:3], DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    ref = reference_scores(m, q, pos + neg).detach().double().numpy() / want_t
    want = np.mean([np.log(np.exp(ref[i]).sum()) - ref[i, i] for i in range(3)])
    m.log = lambda *a, **k: None
    assert m.temperature == want_t
    assert m.training_step(m.pair_tokenizer.triplets(q, pos, neg), 0).item() == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize(
    "loss, key, values",
    [
        ("ce", "margin", (1.0, 0.2)),
        ("hinge", "temperature", (None, 0.5)),
        ("ce", "in_batch_mask_relevant", (True, False)),
        ("hinge", "in_batch_mask_relevant", (True, False)),
    ],
)
def test_a_key_of_the_loss_not_chosen_changes_nothing_and_is_refused(tiny_bert, loss, key, values):
    """The margin is the hinge loss's, the temperature the ce loss's, the relevance mask in-batch negatives': where
    they are not used, no value changes the training loss, so composition refuses them away from their defaults
    (`check_loss_keys`), rather than take a setting that is silently unused. Under hinge the mask is unused even with
    in-batch negatives on: the hinge reads each triplet's own negative."""
    from core.errors import InputError
    from pipeline.config import compose

    in_batch = key != "in_batch_mask_relevant" or loss == "hinge"
    q, pos, neg = QUERIES[:3], DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    losses = []
    for value in values:
        m = module(tiny_bert, "repbert", loss=loss, in_batch_negatives=in_batch, **{key: value})
        m.log = lambda *a, **k: None
        torch.manual_seed(0)
        losses.append(m.training_step(m.pair_tokenizer.triplets(q, pos, neg), 0).item())
    assert losses[0] == losses[1]
    argv = [f"optim.loss={loss}", f"optim.in_batch_negatives={str(in_batch).lower()}"]
    compose([*argv, f"optim.{key}={'null' if values[0] is None else str(values[0]).lower()}"])
    with pytest.raises(InputError, match=rf"^config key 'optim.{key}': is .* but .*; leave it at "):
        compose([*argv, f"optim.{key}={str(values[1]).lower()}"])


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_the_hinge_loss_builds_no_in_batch_scores(tiny_bert, name, monkeypatch):
    """optim.loss=hinge reads s(q, p+) and s(q, own p-) alone, so `optim.in_batch_negatives` (on by default, for ce)
    neither scores every query against the batch's passages nor changes the loss or any gradient."""
    q, pos, neg = QUERIES[:3], DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    runs = []
    for in_batch in (False, True):
        torch.manual_seed(0)
        m = module(tiny_bert, name, loss="hinge", margin=0.5, in_batch_negatives=in_batch)
        m.log = lambda *a, **k: None
        calls = []
        score_all = m.ranker.score_all
        monkeypatch.setattr(m.ranker, "score_all", lambda *a, _f=score_all, _c=calls, **k: _c.append(1) or _f(*a, **k))
        loss = m.training_step(m.pair_tokenizer.triplets(q, pos, neg), 0)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        runs.append((loss.item(), grads, calls))
    (loss_off, grads_off, _), (loss_on, grads_on, calls_on) = runs
    assert calls_on == [] and loss_on == loss_off and grads_on.keys() == grads_off.keys() and grads_on
    for n, g in grads_off.items():
        assert torch.equal(grads_on[n], g), n


@pytest.mark.parametrize("name", ["bert_cat", "dgre"])
def test_a_ranker_without_vectors_trains_alike_whatever_the_in_batch_keys(tiny_bert, name):
    """A ranker that declares no vectors of its own (a cross-encoder) scores each triplet's own pairs: the in-batch keys
    change neither the loss nor a gradient (so train.py refuses them beside it: pipeline/jobs.py), and the isotropy
    protocols measure nothing of it (so its jobs refuse their eval keys)."""
    from callbacks.isotropy import IsotropyCallback
    from models.rankers.capabilities import capabilities_of

    q, pos, neg = QUERIES[:3], DOCS[:3], [DOCS[3], DOCS[0], DOCS[1]]
    runs = []
    for in_batch, mask in ((True, True), (True, False), (False, True)):
        torch.manual_seed(0)  # the scoring layers' initial weights
        m = module(tiny_bert, name, in_batch_negatives=in_batch, in_batch_mask_relevant=mask)
        assert capabilities_of(m.ranker).vectors == "none"
        m.log = lambda *a, **k: None
        loss = m.training_step(m.pair_tokenizer.triplets(q, pos, neg), 0)
        loss.backward()
        runs.append((loss.item(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    for loss, grads in runs[1:]:
        assert loss == runs[0][0] and grads.keys() == runs[0][1].keys()
        assert all(torch.equal(g, runs[0][1][n]) for n, g in grads.items())
    assert IsotropyCallback().measure(None, m) == {} and IsotropyCallback().measure_paper(None, m) == {}


def test_temperature_must_be_positive(tiny_bert):
    from core.errors import InputError

    with pytest.raises(InputError, match="optim.temperature"):
        module(tiny_bert, "repbert", temperature=0.0)


class _StubTrainer:
    estimated_stepping_batches = 20


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_warmup_then_schedule(tiny_bert, schedule):
    """LR factor: (step+1)/(warm+1) during warm-up, then linear decay to 0 at the last step (or constant)."""
    m = module(tiny_bert, "colbert", lr=1e-3, warmup_steps=4, schedule=schedule)
    m._trainer = _StubTrainer()
    conf = m.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    warm = [1e-3 * (s + 1) / 5 for s in range(4)]
    after = [1e-3 * (20 - s) / 16 if schedule == "linear" else 1e-3 for s in range(4, 20)]
    np.testing.assert_allclose(lrs, warm + after, rtol=1e-12)
    assert opt.param_groups[1]["weight_decay"] == 0.0  # biases and LayerNorm weights are not decayed


def test_bf16_autocast_training_step_close_to_fp32(tiny_bert):
    """trainer.precision=bf16-mixed runs the forward under CPU bf16 autocast: the loss stays finite and close to
    fp32, gradients reach the backbone, and the weights stay fp32."""
    m = module(tiny_bert, "colbert", loss="ce", in_batch_negatives=True)
    m.log = lambda *a, **k: None
    batch = m.pair_tokenizer.triplets(QUERIES[:2], DOCS[:2], DOCS[2:4])
    loss32 = m.training_step(batch, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss16 = m.training_step(batch, 0)
    loss16.backward()
    assert torch.isfinite(loss16) and loss16.item() == pytest.approx(loss32.item(), abs=0.05)
    grads = [p.grad for p in m.ranker.encoder.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["colbert", "repbert"])
def test_a_mixed_precision_step_casts_each_weight_once_with_the_same_loss_and_gradients(tiny_bert, name, monkeypatch):
    """Under Lightning's uncached autocast (bf16-mixed: cache_enabled=False) the step casts each weight once
    (`core.precision.cast_once`), not once per forward pass (queries, then passages): fewer casts, the loss
    bit-identical and every gradient equal to bf16 rounding."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import lightning_modules.module as module_mod

    class CountCasts(TorchDispatchMode):
        casts = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
                type(self).casts += 1
            return func(*args, **(kwargs or {}))

    def step(m):
        m.zero_grad(set_to_none=True)
        CountCasts.casts = 0
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), CountCasts():
            loss = m.training_step(batch, 0)
        loss.backward()
        return CountCasts.casts, loss.detach().clone(), [p.grad.clone() for p in m.parameters() if p.grad is not None]

    m = module(tiny_bert, name, loss="ce", in_batch_negatives=True)
    m.log = lambda *a, **k: None
    batch = m.pair_tokenizer.triplets(QUERIES[:2], DOCS[:2], DOCS[2:4])
    once, loss, grads = step(m)
    monkeypatch.setattr(module_mod, "cast_once", lambda device_type: contextlib.nullcontext())
    per_pass, loss_pp, grads_pp = step(m)
    weights = sum(1 for p in m.ranker.encoder.parameters() if p.dim() == 2)  # the matrices autocast casts for linear
    assert per_pass - once >= weights - 3  # each linear weight cast once, not twice (embeddings are not cast)
    assert torch.equal(loss, loss_pp) and len(grads) == len(grads_pp)
    # a weight used by both passes sums its two bf16 gradients before the one cast back to fp32 (as torch.autocast's
    # default and the bare loop do), not after two: one more bf16 rounding (relative 2^-8), which cancellation between
    # the passes' contributions can enlarge for a small gradient (1.3 % of a bias's norm here); a pass's contribution
    # lost would be off by about half
    for a, b in zip(grads, grads_pp):
        assert float((a - b).norm()) <= 2**-5 * float(b.norm()) + 1e-12


def test_cast_once_is_off_where_the_cache_would_keep_a_no_grad_cast(monkeypatch):
    import core.precision as precision

    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        with precision.cast_once("cpu"):
            assert torch.is_autocast_cache_enabled()
        monkeypatch.setattr(precision, "autocast_cache_keeps_gradients", lambda: False)
        with precision.cast_once("cpu"):
            assert not torch.is_autocast_cache_enabled()
    with precision.cast_once("cpu"):  # no autocast: nothing to cache
        assert not torch.is_autocast_enabled("cpu")


def test_the_first_mixed_precision_step_of_a_process_draws_what_a_later_one_draws(tiny_bert):
    """Work done once a process on the first training step (cast_once's probe of the autocast cache) takes nothing of
    the global random stream: after the same seed the first bf16 step (a resumed run's, say) and a later one draw the
    same dropout masks, so the same loss and gradients. The probe once built an nn.Linear, whose initialisation drew
    from the stream, so a resumed bf16 run's first step trained on other masks than the uninterrupted run's."""
    import core.precision as precision

    m = module(tiny_bert, "colbert").train()
    m.log = lambda *a, **k: None
    batch = m.pair_tokenizer.triplets(QUERIES[:2], DOCS[:2], DOCS[2:4])
    runs = []
    for first in (True, False):
        if first:
            precision.autocast_cache_keeps_gradients.cache_clear()  # as in a fresh process
        torch.manual_seed(0)
        state = torch.random.get_rng_state()
        assert first or torch.equal(state, runs[0][2])
        m.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            loss = m.training_step(batch, 0)
        loss.backward()
        runs.append((loss.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None], state))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1])) and runs[0][1]
    state = torch.random.get_rng_state()
    precision.autocast_cache_keeps_gradients.cache_clear()
    assert precision.autocast_cache_keeps_gradients() and torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("checked", [False, True], ids=["clip-alone", "after-the-nonfinite-check"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_without_a_scaler_equals_torch_clipping(tiny_bert, algorithm, checked, monkeypatch):
    """With no GradScaler (fp32, bf16-mixed) the module clips the gradients itself, as torch's clip_grad_norm_ /
    clip_grad_value_ over the optimizer's parameters do; the optimizer is fused then. After the non-finite check
    (`on_before_optimizer_step`, as in a fit) clipping by norm reuses that check's total norm: the same gradients,
    exactly, from one norm pass instead of two."""
    m = module(tiny_bert, "colbert")
    groups = m.optimizer_groups()
    assert m.fused_optimizer([p for g in groups for p in g["params"]]) is True  # no trainer, so no GradScaler
    opt = torch.optim.AdamW(groups, fused=True)
    params = [p for g in opt.param_groups for p in g["params"]]
    gen = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = 10 * torch.randn(p.shape, generator=gen)
    ref = [p.grad.clone() for p in params]
    clip = torch.nn.utils.clip_grad_norm_ if algorithm == "norm" else torch.nn.utils.clip_grad_value_
    clip(_with_grads(ref), 0.5)
    passes = []
    foreach_norm = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda *a, **k: passes.append(1) or foreach_norm(*a, **k))
    if checked:
        m.on_before_optimizer_step(opt)
    m.configure_gradient_clipping(opt, 0.5, algorithm)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.grad, r, rtol=0, atol=0 if checked else 1e-7)
    assert len(passes) == (1 if checked or algorithm == "norm" else 0)
    if algorithm == "norm":
        assert float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) == pytest.approx(
            0.5, rel=1e-5
        )
    else:
        assert max(float(p.grad.abs().max()) for p in params) <= 0.5


def _with_grads(grads: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    """Stand-in parameters holding `grads` (clipped in place, so `grads` becomes the reference)."""
    out = []
    for g in grads:
        q = torch.nn.Parameter(torch.zeros_like(g))
        q.grad = g
        out.append(q)
    return out


@pytest.mark.slow
def test_compiled_backbone_trains_as_eager_and_keeps_its_state_dict(tiny_bert_nodropout, tmp_path, monkeypatch):
    """model.compile: the backbone's forward is compiled at fit start, in place, so the state-dict keys (and so the
    checkpoints) are the uncompiled module's; two training steps give the eager losses and gradients. The backend is
    AOTAutograd without code generation: torch.compile's default (inductor) generates C++ for the CPU, minutes for
    even this tiny BERT (1.2e-7 from eager on the loss, measured by hand), too long for a test."""
    import functools

    from conftest import compile_skip_reason

    if reason := compile_skip_reason():
        pytest.skip(reason)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        m = RankingModule(
            {
                "name": "colbert",
                "backbone": tiny_bert_nodropout,
                "query_max_len": 8,
                "doc_max_len": 16,
                "length_buckets": 1,
                "compile": compiled,
            },
            {"lr": 1e-3},
        ).train()
        m.on_fit_start()
        assert (getattr(m.ranker.encoder, "_compiled_call_impl", None) is not None) is compiled
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses, grads = [], {}
        for q, pos, neg in ((QUERIES[:2], DOCS[:2], DOCS[2:4]), (QUERIES[1:], DOCS[1:3], DOCS[:2])):
            loss = m.training_step(m.pair_tokenizer.triplets(q, pos, neg), 0)
            loss.backward()
            grads = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs[compiled] = losses, grads, m.state_dict()
    (l0, g0, s0), (l1, g1, s1) = runs[False], runs[True]
    assert l1 == pytest.approx(l0, abs=1e-5)
    assert g0.keys() == g1.keys() and all(torch.allclose(g0[k], g1[k], atol=1e-5) for k in g0)
    assert list(s1) == list(s0)
    fresh = RankingModule(
        {"name": "colbert", "backbone": tiny_bert_nodropout, "query_max_len": 8, "doc_max_len": 16}, {}
    )
    fresh.load_state_dict(s1)  # a compiled run's weights load into an uncompiled module, strictly
