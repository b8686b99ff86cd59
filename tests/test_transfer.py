"""Transfer learning (position-bias paper Table 5): `init_ckpt=PATH` starts fine-tuning from another run's ranker
weights, with a fresh optimiser and step; grid rows refer to another row's checkpoint with `init_ckpt=@row/train`."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import small_run

SMALL = small_run(
    "eval.ats_passages=8", "data.batch_size=8", triples=16, eval_queries=8, depth=10, probe_queries=4, probe_docs=8
)


def save_checkpoint(path, model: dict, seed: int):
    from lightning_modules.module import RankingModule

    torch.manual_seed(seed)
    module = RankingModule(model, {})
    with torch.no_grad():  # weights far from any fresh initialisation
        for p in module.ranker.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.save(
        {"state_dict": module.state_dict(), "hyper_parameters": {"model": model, "optim": {}}, "global_step": 99}, path
    )
    return module


def test_init_weights_loads_every_ranker_tensor(tmp_path, tiny_bert):
    from lightning_modules.module import RankingModule
    from pipeline.config import compose
    from pipeline.run import init_weights

    model = {"name": "bert_dot", "backbone": tiny_bert}
    source = save_checkpoint(tmp_path / "a.ckpt", model, seed=1)
    cfg = compose(["model=bert_dot", f"model.backbone={tiny_bert}", f"init_ckpt={tmp_path / 'a.ckpt'}"])
    torch.manual_seed(2)
    target = RankingModule(dict(cfg.model), dict(cfg.optim))
    assert not torch.equal(
        target.ranker.encoder.embeddings.word_embeddings.weight, source.ranker.encoder.embeddings.word_embeddings.weight
    )
    init_weights(target, cfg)
    a, b = source.ranker.state_dict(), target.ranker.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "case,needles",
    [
        ("other_ranker", ["init_ckpt", "holds ranker 'bert_dot'", "model.name is 'colbert'"]),
        ("shape", ["init_ckpt", "does not fit", "size mismatch"]),
        ("extra", ["init_ckpt", "does not fit", "unexpected ['ranker.compress.weight'"]),
        ("unreadable", ["init_ckpt", "cannot read checkpoint"]),
        ("missing", ["init_ckpt", "does not exist"]),
    ],
)
def test_bad_init_checkpoint_is_one_line_error(tmp_path, tiny_bert, case, needles):
    ckpt = tmp_path / "x.ckpt"
    model = ["model=colbert" if case == "other_ranker" else "model=bert_dot", f"model.backbone={tiny_bert}"]
    if case == "shape":
        model.append("model.compress_dim=16")
    if case in ("other_ranker", "shape", "extra"):
        save_checkpoint(
            ckpt, {"name": "bert_dot", "backbone": tiny_bert, "compress_dim": None if case == "other_ranker" else 8}, 0
        )
    elif case == "unreadable":
        ckpt.write_bytes(b"not a checkpoint")
    from core.errors import InputError
    from pipeline.config import compose
    from pipeline.run import train

    with pytest.raises(InputError) as e:
        train(compose([*SMALL, *model, f"init_ckpt={ckpt}", f"output_dir={tmp_path / 'out'}"]))
    err = str(e.value)
    assert "\n" not in err
    for n in needles:
        assert n in err, err
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.slow
def test_fine_tuning_starts_from_the_weights_with_a_fresh_step(tmp_path, tiny_bert):
    """Before training the test metrics are the init checkpoint's (evaluate.py on it); the run counts its own steps."""
    from pipeline.config import compose
    from pipeline.run import evaluate, train

    model = {"name": "bert_dot", "backbone": tiny_bert}
    save_checkpoint(tmp_path / "pre.ckpt", model, seed=3)
    ev = evaluate(
        compose([*SMALL, f"ckpt={tmp_path / 'pre.ckpt'}", f"output_dir={tmp_path / 'ev'}"]), model_from_cli=False
    )
    out = tmp_path / "ft"
    train(
        compose(
            [
                *SMALL,
                "model=bert_dot",
                f"model.backbone={tiny_bert}",
                f"init_ckpt={tmp_path / 'pre.ckpt'}",
                "trainer.max_steps=2",
                "trainer.val_check_interval=2",
                f"output_dir={out}",
            ]
        )
    )
    before = json.loads((out / "metrics.json").read_text())["before_training"]
    for k in ("ndcg_cut_10", "mrr_10", "recall_100"):
        assert before[k] == pytest.approx(ev[k], abs=1e-9)
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 2
