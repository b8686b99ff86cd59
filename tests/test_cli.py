"""The shared command-line wrappers (pipeline/cli.py) that train.py, evaluate.py and the `python -m` tools
(retrieval.bm25, retrieval.dense, analyses.answer_positions) run under: exit codes, one-line input errors, options
kept apart from config keys."""
from __future__ import annotations

import argparse

import pytest

from core.errors import InputError
from pipeline.cli import main, run_tool, tool_args


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tool")
    ap.add_argument("--k", type=int, default=3)
    return ap


def test_options_and_config_args_are_split_and_unknown_options_are_argparse_errors(capsys):
    opts, rest = tool_args(_parser(), ["logger=none", "--k", "7", "seed=1"])
    assert opts.k == 7 and rest == ["logger=none", "seed=1"]
    with pytest.raises(SystemExit) as e:
        tool_args(_parser(), ["logger=none", "--kk", "7"])
    assert e.value.code == 2 and "unrecognised option --kk" in capsys.readouterr().err


def test_run_tool_gives_the_job_the_composed_config_and_its_options():
    seen = []
    assert run_tool(_parser(), ["logger=none", "seed=5", "--k", "9"], lambda cfg, opts: seen.append((cfg.seed, opts.k))) == 0
    assert seen == [(5, 9)]


def test_input_errors_are_one_line_and_exit_code_2(capsys):
    def job(cfg, opts):
        raise InputError("--k", "is 0; expected a positive number")

    assert run_tool(_parser(), ["logger=none", "--k", "0"], job) == 2
    assert capsys.readouterr().err == "error: --k: is 0; expected a positive number\n"
    assert run_tool(_parser(), ["logger=none", "data.no_such_key=1"], lambda cfg, opts: None) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "data.no_such_key" in err


@pytest.mark.parametrize("argv, expected", [
    (["logger=none"], False),
    (["model=repbert"], True),
    (["model.compress_dim=8"], True),
    (["data.num_docs=50"], False),
])
def test_main_says_whether_the_command_line_picks_the_model(argv, expected):
    seen = []
    assert main(argv, lambda cfg, model_from_cli: seen.append(model_from_cli)) == 0
    assert seen == [expected]


def test_dry_run_validates_and_prints_the_resolved_config_without_loading_models(capsys, tmp_path, monkeypatch):
    """train.py / evaluate.py --dry-run: exit 0 with the composed config as YAML (what the run would save as
    config.yaml), no model built (a backbone path that does not exist is not touched), nothing written."""
    from omegaconf import OmegaConf

    import lightning_modules.rankers
    from pipeline.config import compose

    def no_model(*a, **k):
        raise AssertionError("--dry-run built a ranker")

    monkeypatch.setattr(lightning_modules.rankers, "build_ranker", no_model)
    args = ["model=repbert", "model.backbone=/no/such/model", "optim.lr=1e-4", f"output_dir={tmp_path / 'out'}"]
    assert main(["--dry-run", *args], lambda cfg, _: no_model()) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed == compose(args) and printed.optim.lr == 1e-4 and printed.model.name == "repbert"
    assert not (tmp_path / "out").exists()
    # invalid configs and missing checkpoints fail as a real run would, before anything is loaded
    assert main(["--print-config", "optim.lrr=1"], no_model) == 2
    assert "config key 'optim.lrr': unknown key" in capsys.readouterr().err
    assert main(["--dry-run", f"ckpt={tmp_path / 'missing.ckpt'}"], no_model) == 2
    assert capsys.readouterr().err == f"error: ckpt: checkpoint '{tmp_path / 'missing.ckpt'}' does not exist\n"
