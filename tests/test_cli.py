"""The shared command-line wrapper (pipeline/cli.py) that train.py and evaluate.py run under, for every job
(fine-tuning, stage=head, stage=export, evaluation, model=bm25, retrieval=dense, analysis=NAME): `key=value`
arguments only, exit codes, one-line input errors, `--dry-run` through the same compose path."""

from __future__ import annotations

import pytest

from core.errors import InputError
from pipeline.cli import main


def test_job_gets_the_composed_config():
    seen = []
    assert (
        main(
            ["logger=none", "seed=5", "retrieval=dense", "retrieval.k=9"],
            lambda cfg, _: seen.append((cfg.seed, cfg.retrieval.k)),
        )
        == 0
    )
    assert seen == [(5, 9)]


def test_input_errors_are_one_line_and_exit_code_2(capsys):
    def job(cfg, _):
        raise InputError("retrieval.k", "is 0; expected a positive number")

    assert main(["logger=none"], job) == 2
    assert capsys.readouterr().err == "error: retrieval.k: is 0; expected a positive number\n"
    assert main(["logger=none", "data.no_such_key=1"], lambda cfg, _: None) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "data.no_such_key" in err
    # the old `--option` grammar is gone: an argument without `=` is an input error, not an option
    assert main(["logger=none", "--k", "7"], lambda cfg, _: None) == 2
    assert "argument '--k': expected key=value" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, key",
    [
        (["retrieval=dense", "retrieval.k=0"], "retrieval.k"),
        (["retrieval=dense", "retrieval.index_type=annoy"], "retrieval.index_type"),
        (["retrieval=dense", "retrieval.precision=fp8"], "retrieval.precision"),
        (["retrieval=dense", "retrieval.pq_nbits=17"], "retrieval.pq_nbits"),
        (["retrieval=dense", "retrieval.store_dtype=int8"], "retrieval.store_dtype"),
        (["retrieval=dense", "retrieval.split=dev"], "retrieval.split"),
        (["retrieval=dense", "retrieval.gpu_index=maybe"], "retrieval.gpu_index"),
        (["retrieval=dense", "retrieval.no_gpu_index=true"], "retrieval.no_gpu_index"),
        (["retrieval.k=5"], "retrieval.k"),  # retrieval=none has no keys
        (["model=bm25", "model.split=dev"], "model.split"),
        (["stage=publish"], "stage"),
        (["analysis=random_rerank"], "analysis.run"),
        (["analysis=random_rerank", "analysis.run=x.trec", "analysis.permutations=0"], "analysis.permutations"),
        (["analysis=fit_mlm_head", "analysis.heldout=1.5"], "analysis.heldout"),
        (["analysis=fit_mlm_head", "analysis.mask_rate=0"], "analysis.mask_rate"),
    ],
)
def test_dry_run_checks_every_job_key(capsys, argv, key):
    """The jobs that were `python -m` tools with `--options` are config keys now, each checked when the config is
    composed: `--dry-run` rejects what the run would, in one line naming the key."""
    assert main(["--dry-run", *argv], lambda cfg, _: pytest.fail("ran")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and key in err, err


def test_dry_run_prints_the_new_job_keys(capsys):
    from omegaconf import OmegaConf

    assert (
        main(
            [
                "--dry-run",
                "retrieval=dense",
                "retrieval.k=1000",
                "retrieval.precision=bf16",
                "retrieval.gpu_index=false",
            ],
            lambda cfg, _: pytest.fail("ran"),
        )
        == 0
    )
    printed = OmegaConf.create(capsys.readouterr().out)
    assert (
        printed.retrieval.k == 1000 and printed.retrieval.precision == "bf16" and printed.retrieval.gpu_index is False
    )
    assert printed.retrieval.index_type == "flat" and printed.retrieval.depth == 1000
    assert main(["--dry-run", "model=bm25", "model.split=all", "stage=export"], lambda cfg, _: None) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.model.split == "all" and printed.stage == "export" and printed.retrieval.name == "none"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["logger=none"], False),
        (["model=repbert"], True),
        (["model.compress_dim=8"], True),
        (["data.num_docs=50"], False),
    ],
)
def test_main_says_whether_the_command_line_picks_the_model(argv, expected):
    seen = []
    assert main(argv, lambda cfg, model_from_cli: seen.append(model_from_cli)) == 0
    assert seen == [expected]


def test_dry_run_validates_and_prints_the_resolved_config_without_loading_models(capsys, tmp_path, monkeypatch):
    """train.py / evaluate.py --dry-run: exit 0 with the composed config as YAML (what the run would save as
    config.yaml), no model built (a backbone path that does not exist is not touched), nothing written."""
    from omegaconf import OmegaConf

    import models.rankers
    from pipeline.config import compose

    def no_model(*a, **k):
        raise AssertionError("--dry-run built a ranker")

    monkeypatch.setattr(models.rankers, "build_ranker", no_model)
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


def test_our_warnings_print_as_one_line_library_warnings_keep_their_source():
    import warnings

    from pipeline import cli

    ours = cli._format_warning(UserWarning("nothing will be trained"), UserWarning, cli.__file__, 10)
    assert ours == "warning: nothing will be trained\n"
    library = cli._format_warning(UserWarning("x"), UserWarning, warnings.__file__, 5)
    assert library.startswith(f"{warnings.__file__}:5: UserWarning: x")
    deprecation = cli._format_warning(DeprecationWarning("old"), DeprecationWarning, cli.__file__, 10)
    assert "DeprecationWarning: old" in deprecation
