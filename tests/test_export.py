"""`python train.py stage=export`: a trained ranker (and its head) as a Hugging Face folder with a model card, which
evaluate.py scores exactly as it scores the checkpoints it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import small_run

from pipeline.cli import main

SMALL = small_run("eval.before_training=false", "data.batch_size=8", triples=24, eval_queries=10, depth=15)


def _train(args: list[str]) -> None:
    from pipeline.run import train

    assert main(args, lambda cfg, _: train(cfg)) == 0


def _evaluate(args: list[str]) -> Path:
    from pipeline.run import evaluate

    assert main(args, evaluate) == 0
    return Path(next(a.split("=", 1)[1] for a in args if a.startswith("output_dir=")))


def _export(args: list[str]) -> int:
    """`python train.py stage=export ...` (the folder is `output_dir=`)."""
    from pipeline.run import train

    return main(["stage=export", *args], lambda cfg, _: train(cfg))


@pytest.mark.parametrize("model", [["model=colbert", "model.compress_dim=16"], ["model=bert_cat"]])
@pytest.mark.slow
def test_export_ranker_scores_identically(tmp_path, tiny_bert, model):
    run = tmp_path / "run"
    _train(
        [
            *SMALL,
            *model,
            f"model.backbone={tiny_bert}",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            f"output_dir={run}",
        ]
    )
    ckpt = run / "checkpoints" / "last.ckpt"
    out = tmp_path / "exported"
    assert _export([f"ckpt={ckpt}", f"output_dir={out}"]) == 0
    assert main(["--dry-run", *SMALL, f"ckpt={out}"], lambda cfg, _: pytest.fail("ran")) == 0  # an export is a ckpt=
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "ranker.safetensors",
        "isorank.json",
        "README.md",
    } <= names

    # the backbone loads with plain transformers, with the fine-tuned weights
    from transformers import AutoModel

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    hf = AutoModel.from_pretrained(out).state_dict()
    enc = {k[len("ranker.encoder.") :]: v for k, v in state.items() if k.startswith("ranker.encoder.")}
    assert enc and all(torch.equal(hf[k], v) for k, v in enc.items())

    card = (out / "README.md").read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    assert "library_name: transformers" in card and f"| ndcg_cut_10 | {metrics['ndcg_cut_10']:.4f} |" in card
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.iterdir())  # readable by others, as results are
    assert (run / "config.yaml").read_text().strip() in card

    a = _evaluate([*SMALL, f"ckpt={ckpt}", f"output_dir={tmp_path / 'ev_ckpt'}"])
    b = _evaluate([*SMALL, f"ckpt={out}", f"output_dir={tmp_path / 'ev_export'}"])
    assert (a / "run.trec").read_text() == (b / "run.trec").read_text()  # every score, to the printed digit
    ma, mb = json.loads((a / "metrics.json").read_text()), json.loads((b / "metrics.json").read_text())
    assert ma == mb


@pytest.mark.slow
def test_export_with_head_scores_identically_and_refuses_to_overwrite(tmp_path, tiny_bert, capsys):
    run, head = tmp_path / "run", tmp_path / "head"
    _train(
        [
            *SMALL,
            f"model.backbone={tiny_bert}",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            f"output_dir={run}",
        ]
    )
    _train(
        [
            *SMALL,
            "stage=head",
            f"ckpt={run / 'checkpoints' / 'last.ckpt'}",
            "head=whitening",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"output_dir={head}",
        ]
    )
    head_ckpt = head / "checkpoints" / "head.ckpt"
    out = tmp_path / "exported"
    assert _export([f"head_ckpt={head_ckpt}", f"output_dir={out}"]) == 0
    assert (out / "isotropy_head.safetensors").is_file()
    info = json.loads((out / "isorank.json").read_text())
    assert (
        info["head"]["name"] == "whitening"
        and "| metric | before head | this model |" in (out / "README.md").read_text()
    )

    a = _evaluate([*SMALL, f"head_ckpt={head_ckpt}", f"output_dir={tmp_path / 'ev_ckpt'}"])
    b = _evaluate([*SMALL, f"ckpt={out}", f"output_dir={tmp_path / 'ev_export'}"])
    assert (a / "run.trec").read_text() == (b / "run.trec").read_text()
    ma, mb = json.loads((a / "metrics.json").read_text()), json.loads((b / "metrics.json").read_text())
    assert ma == mb and mb["before_head"]["ndcg_cut_10"] == ma["before_head"]["ndcg_cut_10"]

    capsys.readouterr()
    assert _export([f"ckpt={run / 'checkpoints' / 'last.ckpt'}", f"output_dir={out}"]) == 2
    assert capsys.readouterr().err == f"error: output_dir: '{out}' exists and is not empty; export into a new folder\n"
    assert (
        _export(
            [
                f"ckpt={run / 'checkpoints' / 'last.ckpt'}",
                f"init_ckpt={run / 'checkpoints' / 'last.ckpt'}",
                f"output_dir={tmp_path / 'other'}",
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err.startswith(
            "error: config key 'init_ckpt': job 'export' (train.py stage=export) takes no init_ckpt; "
            "it is for fine-tuning"
        )
        and not (tmp_path / "other").exists()
    )
