"""train.py stage=head (post-hoc isotropy heads on a frozen ranker) and evaluate.py head_ckpt=, end to end on a tiny
random BERT: results, head-only checkpoints, the shared representation cache, exact resume, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import finetune_steps, glow_head, job_args, run_script, small_run

SMALL = small_run()
GLOW = glow_head(batch_size=256)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_bert) -> Path:
    out = tmp_path_factory.mktemp("ft")
    run_script(
        "train.py",
        *SMALL,
        f"model.backbone={tiny_bert}",
        *finetune_steps(4),
        f"output_dir={out}",
    )
    return out / "checkpoints" / "last.ckpt"


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def head_state(ckpt: Path) -> dict:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow
def test_whitening_stage_and_evaluate_with_head(tmp_path, finetuned):
    out, cache = tmp_path / "white", tmp_path / "cache"
    run_script(
        "train.py",
        *SMALL,
        "stage=head",
        f"ckpt={finetuned}",
        "head=whitening",
        f"data.cache_dir={cache}",
        f"output_dir={out}",
    )
    m = metrics(out)
    before = m["before_head"]
    # whitening makes the token vectors isotropic: I(W) up, avgcos down to ~0 (isotropy paper Table 1)
    assert m["iw"] > before["iw"] + 0.2 and abs(m["avgcos"]) < 0.05 < before["avgcos"]
    assert m["iw_raw"] == pytest.approx(before["iw"], abs=1e-6)  # the callback logs the raw vectors alongside
    ck = torch.load(out / "checkpoints" / "head.ckpt", map_location="cpu", weights_only=False)
    assert ck["base_ckpt"] == str(Path(finetuned).resolve()) and set(ck["state_dict"]) == {
        "ranker.token_head.mean",
        "ranker.token_head.transform",
        "ranker.token_head.fitted",
    }
    ev = tmp_path / "ev"
    run_script(
        "evaluate.py",
        *job_args("evaluate.py", [*SMALL, f"head_ckpt={out / 'checkpoints' / 'head.ckpt'}"]),
        f"output_dir={ev}",
    )
    me = metrics(ev)
    for k in ("ndcg_cut_10", "P_20", "mrr_10", "iw", "avgcos"):
        assert me[k] == pytest.approx(m[k], abs=1e-6), k
        assert me["before_head"][k] == pytest.approx(before[k], abs=1e-6), k
    assert len(list((cache / "representations").iterdir())) == 1


@pytest.mark.slow
def test_glow_stage_best_epoch_and_exact_resume(tmp_path, finetuned):
    """3 epochs of Glow; a run that dies in epoch 3 resumes from its epoch-2 last.ckpt to the same head, bit for bit
    (all three runs processes started alike: the same arithmetic)."""
    base = [*SMALL, "stage=head", f"ckpt={finetuned}", *GLOW, "head.epochs=3", f"data.cache_dir={tmp_path / 'cache'}"]
    full = tmp_path / "full"
    run_script("train.py", *base, f"output_dir={full}")
    m = metrics(full)
    assert m["iw"] > m["before_head"]["iw"] and "iw_raw" in m
    best = next((full / "checkpoints").glob("best-*.ckpt"))
    state = head_state(best)
    assert state and all(k.startswith("ranker.token_head.") for k in state)

    part = tmp_path / "part"
    step = torch.load(full / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    crash = {"FAULT": f"raise:0:{2 * step // 3 + 1}", "SCRIPT": "train.py"}  # the first step of epoch 3
    crashed = run_script("tests/fault_driver.py", *base, f"output_dir={part}", check=False, extra_env=crash)
    assert crashed.returncode == 1 and "injected failure on rank 0" in crashed.stderr, crashed.stderr[-3000:]
    last = part / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 1  # saved after epoch 2's validation
    run_script("train.py", *base, f"output_dir={part}", f"ckpt_path={last}")
    a, b = head_state(full / "checkpoints" / "last.ckpt"), head_state(last)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for k in ("ndcg_cut_10", "P_20", "iw", "avgcos"):
        assert metrics(part)[k] == pytest.approx(m[k], abs=1e-9), k


@pytest.mark.parametrize(
    "args,needles",
    [
        (["stage=head", "head=whitening"], ["ckpt", "stage=head needs ckpt="]),
        (["head=glow"], ["head", "stage=head ckpt="]),
        (["stage=head", "head=none", "ckpt=CKPT"], ["head", "whitening"]),
        (
            ["stage=head", "head=whitening", "head.granularity=sequence", "ckpt=CKPT"],
            ["head.granularity", "'colbert'", "sequence vectors"],
        ),
    ],
)
@pytest.mark.slow
def test_bad_head_stage_input_is_one_line(tmp_path, finetuned, args, needles):
    args = [a.replace("CKPT", str(finetuned)) for a in args]
    out = tmp_path / "o"
    proc = run_script("train.py", *SMALL, *args, f"output_dir={out}", check=False)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
    for n in needles:
        assert n in err[0], err[0]
    assert not out.exists()


@pytest.mark.slow
def test_one_backbone_pass_equals_separate_passes(tmp_path, finetuned):
    """The head stage scores "Ft" and "Ft -> head" from one backbone pass, and validates from kept representations:
    the same numbers as a plain RankingModule whose ranker encodes with the head inside `encode()` (and without)."""
    import pytorch_lightning as pl

    from lightning_modules.module import RankingModule
    from pipeline.config import compose
    from pipeline.head_stage import build_module
    from pipeline.run import load_data

    out = tmp_path / "white"
    run_script(
        "train.py",
        *SMALL,
        "stage=head",
        f"ckpt={finetuned}",
        "head=whitening",
        f"data.cache_dir={tmp_path / 'c'}",
        f"output_dir={out}",
    )
    cfg = compose([*SMALL, "stage=head", f"ckpt={finetuned}", "head=whitening", f"output_dir={tmp_path / 'x'}"])
    head_module = build_module(cfg)
    head_module.load_state_dict(head_state(out / "checkpoints" / "head.ckpt"), strict=False)
    plain = RankingModule(dict(head_module.hparams.model), {}, list(cfg.eval.measures))
    plain.load_state_dict(torch.load(finetuned, map_location="cpu", weights_only=False)["state_dict"])
    trainer = lambda: pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, accelerator="cpu")  # noqa: E731

    def scores(module, key="test"):  # {(qid, docid): score} of the module's last test
        return {(q, d): v for q, docs in module.results[key]["run"].items() for d, v in docs.items()}

    dm = load_data(cfg)
    dm.tokenizer = head_module.pair_tokenizer
    t = trainer()
    t.test(head_module, datamodule=dm, verbose=False)
    ft_head, ft = scores(head_module), scores(head_module, "test_raw")
    val = [t.validate(head_module, datamodule=dm, verbose=False)[0]["val/ndcg_cut_10"] for _ in range(2)]
    assert len(head_module._val_memo) > 1  # the second validation read the kept representations
    head_module._val_memo, head_module._val_memo_bytes, head_module.head_cfg.val_memory_gib = {}, 0, 0.0
    val.append(t.validate(head_module, datamodule=dm, verbose=False)[0]["val/ndcg_cut_10"])
    assert set(head_module._val_memo) == {"q"}  # no room: every passage batch re-encoded

    trainer().test(plain, datamodule=dm, verbose=False)
    assert ft != ft_head and scores(plain) == pytest.approx(ft, abs=1e-5)
    plain.ranker.token_head = head_module.head
    trainer().test(plain, datamodule=dm, verbose=False)
    assert scores(plain) == pytest.approx(ft_head, abs=1e-5)
    plain_val = trainer().validate(plain, datamodule=dm, verbose=False)[0]["val/ndcg_cut_10"]
    assert val == pytest.approx([plain_val] * 3, abs=1e-9)


@pytest.mark.slow
def test_glow_stage_ddp_two_processes_match_one(tmp_path, finetuned):
    """Head batch 256 in one process vs 128 on each of two gloo ranks: the ranks draw disjoint halves of the same
    global batches from the shared cache (built once, by the first process), DDP averages their gradients, and the
    test runs are gathered, so the trained head and every metric match the single-process run."""
    base = [*SMALL, "stage=head", f"ckpt={finetuned}", *GLOW, "head.epochs=2", f"data.cache_dir={tmp_path / 'cache'}"]
    one, two = tmp_path / "one", tmp_path / "two"
    run_script("train.py", *base, "head.batch_size=256", f"output_dir={one}")
    run_script(
        "train.py", *base, "head.batch_size=128", "trainer.devices=2", "trainer.strategy=ddp", f"output_dir={two}"
    )
    a, b = head_state(one / "checkpoints" / "last.ckpt"), head_state(two / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k
    m1, m2 = metrics(one), metrics(two)
    for k in ("ndcg_cut_10", "P_20", "mrr_10", "iw", "avgcos", "iw_raw"):
        assert m2[k] == pytest.approx(m1[k], abs=1e-4), k
        if k != "iw_raw":
            assert m2["before_head"][k] == pytest.approx(m1["before_head"][k], abs=1e-4), k
    assert len(list((tmp_path / "cache" / "representations").iterdir())) == 1
    # the DDP run draws its isotropy figure: every rank joins the sample's all-gather (a rank left out would hang);
    # what the gathered sample holds is tested against a brute force in test_wandb_media.py
    assert (two / "isotropy_test.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_bf16_mixed_with_gradient_clipping_trains_both_stages(tmp_path, tiny_bert, finetuned):
    """trainer.precision=bf16-mixed with the default gradient clipping and the fused optimizers: fine-tuning and the
    Glow head stage both train (Lightning's mixed-precision plugin refuses to clip for any fused optimizer, even under
    bf16 where nothing is scaled; RankingModule clips itself when there is no GradScaler)."""
    ft = tmp_path / "ft-bf16"
    run_script(
        "train.py",
        *SMALL,
        f"model.backbone={tiny_bert}",
        "data.batch_size=8",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "eval.before_training=false",
        "trainer.precision=bf16-mixed",
        "trainer.gradient_clip_val=1.0",
        f"output_dir={ft}",
    )
    # two optimizer steps moved the encoder away from the backbone's weights, and nothing overflowed
    from safetensors.torch import load_file

    ck = torch.load(ft / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ck["global_step"] == 2
    backbone = load_file(Path(tiny_bert) / "model.safetensors")
    encoder = {
        k.removeprefix("ranker.encoder."): v for k, v in ck["state_dict"].items() if k.startswith("ranker.encoder.")
    }
    shared = encoder.keys() & backbone.keys()  # the ranker keeps every backbone weight but the unused pooler
    assert shared >= {k for k in backbone if not k.startswith("pooler.")}
    assert all(torch.isfinite(v).all() for v in encoder.values())
    assert any(not torch.equal(encoder[k], backbone[k]) for k in shared)
    # the test NDCG@10 is the mean of the per-query values the run wrote
    per_query = [q["ndcg_cut_10"] for q in json.loads((ft / "per_query.json").read_text()).values()]
    assert per_query and metrics(ft)["ndcg_cut_10"] == pytest.approx(sum(per_query) / len(per_query), abs=1e-12)
    head = tmp_path / "glow-bf16"
    run_script(
        "train.py",
        *SMALL,
        "stage=head",
        f"ckpt={finetuned}",
        *GLOW,
        "head.epochs=1",
        "trainer.precision=bf16-mixed",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"output_dir={head}",
    )
    assert (head / "metrics.json").exists()
