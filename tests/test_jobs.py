"""The job table (pipeline/jobs.py): which job train.py and evaluate.py run for a config, the keys each job takes,
the one-line error for a key that belongs to another job (at `--dry-run` too), and compose()'s typed config.

Nothing here loads a model or reads data: selection and checks read the composed config only."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

import pipeline.run  # noqa: F401 - registers the job functions
from core.errors import InputError
from datamodules.config import TRAINING_ONLY
from pipeline.config import FIT_LOOP_KEYS, REPORTING_KEYS, RunConfig, compose
from pipeline.jobs import HEAD_SCHEDULE, JOBS, KEYS, TABLE, When, check, check_overrides, jobs_of, select
from pipeline.run import EVALUATE, TRAIN

# The command shapes of README.md (paths need not exist: selection and checks read no file)
README_SHAPES = [
    ("train.py", [], "finetune"),
    ("train.py", ["model=repbert", "optim.lr=1e-4", "trainer.precision=bf16-mixed"], "finetune"),
    (
        "train.py",
        ["data=squad", "model=repbert", "trainer.max_steps=100", "output_dir=outputs/squad-repbert"],
        "finetune",
    ),
    (
        "train.py",
        [
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "data.batch_size=8",
            "trainer.max_steps=20",
            "trainer.val_check_interval=10",
        ],
        "finetune",
    ),
    ("train.py", ["ckpt_path=outputs/default/checkpoints/last.ckpt"], "finetune"),
    ("train.py", ["init_ckpt=outputs/squad-repbert/checkpoints/last.ckpt", "model=repbert"], "finetune"),
    (
        "train.py",
        ["stage=head", "ckpt=outputs/default/checkpoints/last.ckpt", "head=whitening", "output_dir=o"],
        "head",
    ),
    ("train.py", ["stage=export", "ckpt=outputs/default/checkpoints/last.ckpt", "output_dir=exported/c"], "export"),
    ("train.py", ["stage=export", "head_ckpt=outputs/w/checkpoints/last.ckpt", "output_dir=exported/w"], "export"),
    ("evaluate.py", [], "evaluate"),
    ("evaluate.py", ["ckpt=outputs/squad-repbert/checkpoints/last.ckpt", "data=cranfield"], "evaluate"),
    ("evaluate.py", ["ckpt=exported/colbert-default"], "evaluate"),
    ("evaluate.py", ["head_ckpt=outputs/w/checkpoints/last.ckpt", "data=cranfield"], "evaluate_head"),
    ("evaluate.py", ["head_ckpt=h.ckpt", "ckpt=base.ckpt", "head=whitening"], "evaluate_head"),
    ("evaluate.py", ["model=bm25", "data=cranfield", "output_dir=outputs/bm25-cranfield"], "first_stage"),
    ("evaluate.py", ["retrieval=dense", "ckpt=x.ckpt", "data=vaswani", "retrieval.k=1000"], "retrieve"),
    ("evaluate.py", ["analysis=ats", "ckpt=x.ckpt"], "analysis"),
    ("evaluate.py", ["analysis=whitebox"], "analysis"),
    ("evaluate.py", ["analysis=answer_positions", "data=squad"], "analysis"),
    ("evaluate.py", ["analysis=random_rerank", "analysis.run=x.trec"], "analysis"),
    # the precedence: a group that selects a job wins over a first-stage model or a head checkpoint
    ("evaluate.py", ["analysis=ats", "model=bm25"], "analysis"),
]


@pytest.mark.parametrize("script, argv, expected", README_SHAPES, ids=[" ".join([s, *a]) for s, a, _ in README_SHAPES])
def test_the_table_selects_the_job_of_each_command_shape(script, argv, expected):
    cfg = compose(argv)
    assert select(cfg, script) == expected
    check(cfg, expected)  # and the command's keys fit it
    assert TRAIN.check(cfg) == expected if script == "train.py" else EVALUATE.check(cfg) == expected


def test_every_declared_job_is_registered_with_its_function_and_keys():
    assert set(JOBS.names()) == set(TABLE)
    run_keys = {f.name for f in fields(RunConfig)}
    for name, spec in TABLE.items():
        entry = JOBS.get(name)
        assert callable(entry.build) and entry.schema is spec.keys and entry.capabilities is spec
        assert {f.name for f in fields(spec.keys)} <= set(KEYS) <= run_keys
    # each script has jobs, and its last job in the table's order is its fallback (it always selects one)
    assert jobs_of("train.py") == ["export", "head", "finetune"]
    assert jobs_of("evaluate.py") == ["retrieve", "analysis", "first_stage", "evaluate_head", "evaluate"]
    assert TABLE["evaluate"].when == When()


def test_the_job_table_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert "## Jobs" in doc and all(f"| `{name}` | `{spec.script}` |" in doc for name, spec in TABLE.items())


# (script, argv, the error's start): at least one key foreign to each job, and the cross-script shapes
FOREIGN = [
    (
        "train.py",
        ["head_ckpt=h.ckpt"],
        "config key 'head_ckpt': job 'finetune' (train.py) takes no head_ckpt; head_ckpt is for job 'export' "
        "(train.py stage=export) or job 'evaluate_head'",
    ),
    ("train.py", ["ckpt=a.ckpt"], "config key 'ckpt': job 'finetune' (train.py) takes no ckpt; to start from"),
    (
        "train.py",
        ["retrieval=dense"],
        "config key 'retrieval': job 'finetune' (train.py) takes no retrieval=dense; 'dense' runs from evaluate.py: "
        "`python evaluate.py retrieval=dense ckpt=...`",
    ),
    (
        "train.py",
        ["analysis=ats"],
        "config key 'analysis': job 'finetune' (train.py) takes no analysis=ats; 'ats' runs from evaluate.py: "
        "`python evaluate.py analysis=ats ...`",
    ),
    (
        "train.py",
        ["head=whitening"],
        "config key 'head': job 'finetune' (train.py) takes no head=whitening; 'whitening' is trained after "
        "fine-tuning, on the frozen ranker: `python train.py stage=head ckpt=<fine-tuned checkpoint> head=whitening`",
    ),
    (
        "train.py",
        ["stage=head", "ckpt=a.ckpt", "head=nice", "init_ckpt=b.ckpt"],
        "config key 'init_ckpt': job 'head' (train.py stage=head) takes no init_ckpt; it initialises fine-tuning",
    ),
    (
        "train.py",
        ["stage=export", "ckpt=a.ckpt", "ckpt_path=b.ckpt"],
        "config key 'ckpt_path': job 'export' (train.py stage=export) takes no ckpt_path; it is for fine-tuning",
    ),
    (
        "train.py",
        ["stage=export", "ckpt=a.ckpt", "retrieval=dense"],
        "config key 'retrieval': job 'export' (train.py stage=export) takes no retrieval=dense; 'dense' runs from "
        "evaluate.py",
    ),
    (
        "evaluate.py",
        ["init_ckpt=a.ckpt"],
        "config key 'init_ckpt': job 'evaluate' (evaluate.py) takes no init_ckpt; init_ckpt is for job 'finetune' "
        "(train.py)",
    ),
    (
        "evaluate.py",
        ["stage=export", "ckpt=a.ckpt"],
        "config key 'stage': job 'evaluate' (evaluate.py) takes no stage=export; export is a train.py stage: "
        "`python train.py stage=export ckpt=... output_dir=DIR`",
    ),
    (
        "evaluate.py",
        ["head=whitening", "ckpt=a.ckpt"],
        "config key 'head': job 'evaluate' (evaluate.py) takes no head=whitening; a head is trained by",
    ),
    (
        "evaluate.py",
        ["head_ckpt=h.ckpt", "ckpt_path=a.ckpt"],
        "config key 'ckpt_path': job 'evaluate_head' (evaluate.py head_ckpt=...) takes no ckpt_path; ckpt_path is "
        "for job 'head' (train.py stage=head) or job 'finetune' (train.py)",
    ),
    (
        "evaluate.py",
        ["model=bm25", "ckpt=a.ckpt"],
        "config key 'ckpt': job 'first_stage' (evaluate.py model=bm25) takes no ckpt; model 'bm25' ranks the "
        "collection by itself and takes no checkpoint",
    ),
    (
        "evaluate.py",
        ["retrieval=dense", "head_ckpt=h.ckpt"],
        "config key 'head_ckpt': job 'retrieve' (evaluate.py retrieval=dense) takes no head_ckpt; it indexes a "
        "ranker checkpoint (ckpt=), not a head",
    ),
    (
        "evaluate.py",
        ["retrieval=dense", "analysis=ats"],
        "config key 'analysis': job 'retrieve' (evaluate.py retrieval=dense) takes no analysis=ats; analysis=ats is "
        "job 'analysis' (evaluate.py analysis=ats): two jobs; run them one at a time",
    ),
    (
        "evaluate.py",
        ["analysis=whitebox", "stage=head"],
        "config key 'stage': job 'analysis' (evaluate.py analysis=whitebox) takes no stage=head; head is a train.py "
        "stage",
    ),
    # what a job needs: unchanged messages, now before anything is read (and at --dry-run)
    ("train.py", ["model=bm25"], "model: 'bm25' has nothing to train; evaluate it with `python evaluate.py"),
    ("train.py", ["stage=head", "ckpt=a.ckpt"], "head: stage=head needs head=whitening, head=nice or head=glow"),
    ("train.py", ["stage=head", "head=glow"], "ckpt: stage=head needs ckpt=<checkpoint of the fine-tuned ranker>"),
    ("train.py", ["stage=export"], "ckpt: export needs ckpt=<ranker checkpoint> (or head_ckpt=<head checkpoint>)"),
]


@pytest.mark.parametrize("script, argv, expected", FOREIGN, ids=[" ".join([s, *a]) for s, a, _ in FOREIGN])
def test_a_key_of_another_job_is_one_error_naming_the_key_and_the_job(script, argv, expected):
    cfg = compose(argv)
    with pytest.raises(InputError) as e:
        check(cfg, select(cfg, script))
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


def test_every_job_refuses_a_foreign_key():
    """Each job of the table has a top-level key it does not take, and setting it is an error naming that job."""
    for name, spec in TABLE.items():
        taken = {f.name for f in fields(spec.keys)}
        key = next(k for k in ("init_ckpt", "ckpt_path", "head_ckpt", "ckpt") if k not in taken)
        argv = {
            "export": ["stage=export", "ckpt=a.ckpt"],
            "head": ["stage=head", "ckpt=a.ckpt", "head=whitening"],
            "finetune": [],
            "retrieve": ["retrieval=dense"],
            "analysis": ["analysis=ats"],
            "first_stage": ["model=bm25"],
            "evaluate_head": ["head_ckpt=h.ckpt"],
            "evaluate": [],
        }[name]
        cfg = compose([*argv, f"{key}=x.ckpt"])
        assert select(cfg, spec.script) == name
        with pytest.raises(InputError, match=rf"^config key '{key}': job '{name}' \(.*\) takes no {key}; "):
            check(cfg, name)


def test_the_scripts_check_the_job_at_dry_run_and_run_nothing(capsys, tmp_path):
    from pipeline.cli import main

    out = tmp_path / "out"
    # the job's check comes before the checkpoint headers are read: the missing checkpoint is not what is reported
    assert main(["stage=export", f"ckpt={tmp_path / 'missing.ckpt'}", f"output_dir={out}", "--dry-run"], EVALUATE) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config key 'stage': job 'evaluate' (evaluate.py) takes no stage=export; export is")
    assert err.count("\n") == 1
    assert main(["retrieval=dense", f"output_dir={out}", "--dry-run"], TRAIN) == 2
    assert "'dense' runs from evaluate.py" in capsys.readouterr().err
    assert main(["retrieval=dense", f"output_dir={out}", "--dry-run"], EVALUATE) == 0
    assert "name: dense" in capsys.readouterr().out
    assert not out.exists()


def test_a_script_refuses_before_taking_the_output_folder(tmp_path):
    """The job's check runs before the lock and the output probe: a refused command leaves nothing behind."""
    cfg = compose(["logger=none", "model=bm25", f"output_dir={tmp_path / 'out'}", "init_ckpt=a.ckpt"])
    with pytest.raises(InputError, match="job 'first_stage'"):
        EVALUATE(cfg, False)
    with pytest.raises(InputError, match="model: 'bm25' has nothing to train"):
        pipeline.run.train(compose(["logger=none", "model=bm25", f"output_dir={tmp_path / 'out'}"]))
    assert list(tmp_path.iterdir()) == []


# ---- compose() returns the typed config -----------------------------------------------------------------------------
def test_compose_returns_typed_group_nodes():
    from analyses.registry import load_all
    from datamodules.sources import SOURCES
    from lightning_modules.module import OptimConfig
    from models.heads import HEADS
    from models.rankers import RANKERS
    from pipeline.config import EvalConfig, LoggerConfig, TrainerConfig
    from retrieval.config import schema as retrieval_schema

    cfg = compose(["model=repbert", "head=whitening", "analysis=ats", "retrieval=dense", "data=cranfield"])
    assert OmegaConf.get_type(cfg) is RunConfig
    assert OmegaConf.get_type(cfg.trainer) is TrainerConfig and OmegaConf.get_type(cfg.logger) is LoggerConfig
    assert OmegaConf.get_type(cfg.eval) is EvalConfig and OmegaConf.get_type(cfg.optim) is OptimConfig
    assert OmegaConf.get_type(cfg.model) is RANKERS.get("repbert").schema
    assert OmegaConf.get_type(cfg.data) is SOURCES.get("cranfield").schema
    assert OmegaConf.get_type(cfg.head) is HEADS.get("whitening").schema
    assert OmegaConf.get_type(cfg.analysis) is load_all().get("ats").schema
    assert OmegaConf.get_type(cfg.retrieval) is retrieval_schema("dense")
    with pytest.raises(ValidationError):
        cfg.trainer.max_steps = "many"
    with pytest.raises(ValidationError):
        cfg.optim.lr = "fast"
    with pytest.raises(ConfigAttributeError):
        cfg.trainer.max_stepz = 5
    cfg.trainer.max_steps = 7  # a right-typed value is taken
    assert cfg.trainer.max_steps == 7


def test_typed_config_still_takes_a_checkpoints_model_and_head():
    """Jobs replace `model` and `head` with a checkpoint's dicts (any ranker's keys) and set `experiment`."""
    cfg = compose([])
    cfg.model = {"name": "repbert", "backbone": "x", "some_older_key": 1}
    cfg.head = {"name": "whitening", "granularity": "token"}
    cfg.experiment = "e"
    assert OmegaConf.to_container(cfg.model)["some_older_key"] == 1 and cfg.head.name == "whitening"
    assert OmegaConf.merge(cfg, {"trainer": {"max_epochs": 3}}).trainer.max_epochs == 3


def test_a_data_key_a_job_does_not_apply_is_refused_not_ignored(capsys, tmp_path):
    """`ignores` (second fault trial C4): BM25 scored whole documents with `data.passage_words=50` set, and dense
    retrieval indexed the collection unrotated with `data.rotate_eval=true`, silently. Each declared key, set away from
    its default, is one line naming it and the job, at --dry-run too; at its default the job runs as before."""
    argv_of = {"first_stage": ["model=bm25"], "retrieve": ["retrieval=dense", "model=repbert", "ckpt=a.ckpt"]}
    declared = {name: spec.ignores for name, spec in TABLE.items() if spec.ignores}
    assert set(declared) == set(argv_of) and "data.passage_words" in declared["first_stage"]
    for name, keys in declared.items():
        assert check(compose(argv_of[name]), name) is None
        for key in keys:
            value = "true" if key == "data.rotate_eval" else "50"
            cfg = compose([*argv_of[name], f"{key}={value}"])
            assert select(cfg, "evaluate.py") == name
            with pytest.raises(InputError) as e:
                check(cfg, name)
            line = str(e.value)
            assert line.startswith(f"config key '{key}': is {value}, but job '{name}' (evaluate.py ")
            assert "\n" not in line
            assert line.endswith("leave it at " + ("false" if value == "true" else "null")), line
    # re-ranking applies both: no error
    for key in ("data.passage_words=50", "data.rotate_eval=true"):
        cfg = compose(["ckpt=a.ckpt", key])
        assert check(cfg, select(cfg, "evaluate.py")) is None

    from pipeline.cli import main

    out = tmp_path / "out"
    assert main(["model=bm25", "data.passage_words=50", f"output_dir={out}", "--dry-run"], EVALUATE) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: config key 'data.passage_words': is 50, but job 'first_stage' (evaluate.py model=bm25) does not apply"
    )
    assert err.count("\n") == 1 and not out.exists()


# ---- keys a job does not read, set on the command line -------------------------------------------------------------
# a command that selects each job (paths need not exist: the checks read no file)
JOB_ARGV = {
    "export": ["stage=export", "ckpt=a.ckpt"],
    "head": ["stage=head", "ckpt=a.ckpt", "head=nice"],
    "finetune": [],
    "retrieve": ["retrieval=dense", "ckpt=a.ckpt"],
    "analysis": ["analysis=ats", "ckpt=a.ckpt"],
    "first_stage": ["model=bm25"],
    "evaluate_head": ["head_ckpt=h.ckpt"],
    "evaluate": ["ckpt=a.ckpt"],
}


def _composed_keys(cfg) -> list[str]:
    from pipeline.jobs import COMPOSED

    return [f"{g}.{k}" for g in COMPOSED for k in cfg[g]]


def test_a_command_line_key_a_job_does_not_read_is_refused():
    """Second fault trial's leftover: `evaluate.py ckpt=... optim.lr=1e-5 trainer.max_steps=50` ran, applying
    neither. Every key of the composed groups, set on the command line to its own value, is refused by exactly the
    jobs that declare they do not read it (one line naming the key, the job and why) and taken by the others."""
    from pipeline.jobs import unread

    refused: dict[str, set[str]] = {}
    for name, argv in JOB_ARGV.items():
        base = compose(argv)
        assert select(base, TABLE[name].script) == name
        for key in _composed_keys(base):
            group, sub = key.split(".")
            node = base[group][sub]
            value = json.dumps(OmegaConf.to_container(node) if OmegaConf.is_config(node) else node)  # YAML reads it
            line = [*argv, f"{key}={value}"]
            if unread(name, key, base) is None:
                check(base, name, line)  # (the check reads the keys of the line; the config holds the same values)
                continue
            refused.setdefault(name, set()).add(key)
            check(base, name)  # the same value from an experiment, not the command line, is taken
            with pytest.raises(InputError) as e:
                check(base, name, line)
            msg = str(e.value)
            assert msg.startswith(f"config key '{key}': job '{name}' (") and "does not read it (" in msg, msg
            assert msg.endswith("); drop it from the command line") and "\n" not in msg and "{" not in msg, msg
    # what each job reads, as pipeline/jobs.py's docstring and docs/configuration.md say; how a run reports (the
    # logger, the progress bar, the cache folder...) every job takes
    assert refused["finetune"] == {"data.rotation"}  # without data.rotate_train (the default) it cuts nothing
    reporting = {k for keys in refused.values() for k in keys if k.startswith(REPORTING_KEYS)}
    assert reporting == set() and not {f"trainer.{k}" for k in FIT_LOOP_KEYS} & set(REPORTING_KEYS)
    trainer = {f"trainer.{k}" for k in compose([]).trainer}
    optim = {f"optim.{k}" for k in compose([]).optim}
    fit_loop = {f"trainer.{k}" for k in FIT_LOOP_KEYS}
    trainer -= {"trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.log_every_n_steps"}
    train_data = {f"data.{k}" for k in TRAINING_ONLY}
    fit_eval = {"eval.before_training", "eval.start_candidate"}
    for name in ("evaluate", "evaluate_head"):
        assert refused[name] == optim | fit_loop | train_data | fit_eval
    ranking_eval = {f"eval.{k}" for k in compose([]).eval if k != "measures"}
    full_ranking = {"data.candidate_depth", "data.eval_batch_size"}  # re-ranking's depth and step size
    assert refused["retrieve"] == trainer | optim | train_data | ranking_eval | full_ranking
    # analysis=ats: it reads eval.mats alone, no candidate list, and encodes and tokenises in its own batches
    analysis_data = {"data.eval_batch_size", "data.pretokenize", "data.candidate_depth"}
    ats_eval = {f"eval.{k}" for k in compose([]).eval if k != "mats"}
    assert refused["analysis"] == optim | (trainer - {"trainer.accelerator"}) | ats_eval | train_data | analysis_data
    assert refused["first_stage"] == trainer | optim | train_data | ranking_eval | full_ranking | {"data.pretokenize"}
    head_data = {"data.batch_size", "data.rotate_train", "data.rotation", "data.train_passage"}  # cached, uncut texts
    assert (
        refused["head"]
        == {f"trainer.{k}" for k in HEAD_SCHEDULE} | (optim - {"optim.nonfinite"}) | fit_eval | head_data
    )
    everything = set(_composed_keys(compose(JOB_ARGV["export"])))
    assert refused["export"] == {k for k in everything if not k.startswith(REPORTING_KEYS)}


def test_the_training_data_keys_are_refused_for_an_analysis_that_does_not_read_the_triples():
    """An analysis declares whether it reads the training triples (analyses/registry.py `reads_training_triples`):
    answer_positions cuts their positives as data.rotate_train does, so the training-only data keys apply there; ATS
    reads no triple, so `data.negatives=random` beside it is refused; so is it beside answer_positions of another
    split than train (its default), whose triples it does not build."""
    from analyses.registry import load_all

    readers = [n for n in load_all().names() if load_all().get(n).schema.reads_training_triples]
    assert readers == ["answer_positions"]
    for analysis, refused in (
        ("answer_positions", False),
        ("answer_positions analysis.split=test", True),
        ("ats", True),
        ("whitebox", True),
    ):
        argv = [f"analysis={analysis.split()[0]}", *analysis.split()[1:], "data=squad", "data.negatives=random"]
        argv.append("data.rotate_train=true")
        cfg = compose(argv)
        if refused:
            with pytest.raises(InputError, match=r"^config key 'data.negatives': job 'analysis' .*only what a run"):
                check(cfg, "analysis", argv)
        else:
            check(cfg, "analysis", argv)


@pytest.mark.parametrize(
    "argv, refused",
    [
        # the candidate lists' depth: read by the analyses that cut candidate lists, unless their own depth is set
        (["analysis=whitebox"], set()),
        (["analysis=whitebox", "analysis.candidate_depth=10"], {"data.candidate_depth"}),
        (["analysis=vocab_projections"], set()),
        (["analysis=vocab_projections", "analysis.candidate_depth=10"], {"data.candidate_depth"}),
        (["analysis=lexical_enrichment"], set()),
        (["analysis=lexical_enrichment", "analysis.candidate_depth=10"], {"data.candidate_depth"}),
        # ... and by the training triples' BM25 negatives (answer_positions of the training split)
        (["analysis=answer_positions", "data=squad"], set()),
        (["analysis=answer_positions", "data=squad", "data.negatives=random"], {"data.candidate_depth"}),
        (["analysis=answer_positions", "data=squad", "analysis.split=test"], {"data.candidate_depth"}),
        (["analysis=fit_mlm_head"], {"data.candidate_depth"}),
        (["analysis=random_rerank", "analysis.run=r.trec"], {"data.candidate_depth"}),
    ],
)
def test_an_analysis_reads_the_candidate_depth_and_eval_keys_it_declares(argv, refused):
    """`data.candidate_depth` and the eval keys beside an analysis were taken and unused (`evaluate.py analysis=ats
    eval.probe_queries=3`). Each analysis declares the eval keys it reads (`reads_eval`: ATS eval.mats, the random
    floor eval.measures) and whether it cuts candidate lists at data.candidate_depth (`candidate_depth_unread`); the
    training batch, the re-ranking test's step size and the token cache no analysis reads."""
    from analyses.registry import analysis_options
    from pipeline.jobs import unread

    cfg = compose(argv)
    name = cfg.analysis.name
    reads_eval = {"ats": {"eval.mats"}, "random_rerank": {"eval.measures"}}.get(name, set())
    never = {"data.batch_size", "data.eval_batch_size", "data.pretokenize"}
    assert {f"eval.{k}" for k in type(analysis_options(cfg)).reads_eval} == reads_eval
    for key in ["data.candidate_depth", *never, *(f"eval.{k}" for k in cfg.eval)]:
        expected = key in refused or key in never or (key.startswith("eval.") and key not in reads_eval)
        assert (unread("analysis", key, cfg) is not None) == expected, key
        line = [*argv, f"{key}={json.dumps(OmegaConf.to_container(cfg)[key.split('.')[0]][key.split('.')[1]])}"]
        if expected:
            with pytest.raises(InputError, match=rf"^config key '{key}': job 'analysis' .*drop it from the command"):
                check(cfg, "analysis", line)
        elif key == "data.candidate_depth":
            check(cfg, "analysis", line)


def test_mats_is_refused_where_the_ats_protocol_is_off():
    """`eval.mats` chooses the MATS reading of the ATS protocol a ranker's test runs (`eval.ats_passages` > 0):
    with it off, train.py and evaluate.py refuse it on the command line; `analysis=ats` reads it either way."""
    from pipeline.jobs import unread

    for name in ("finetune", "head", "evaluate", "evaluate_head", "analysis"):
        for passages, refused in ((0, name != "analysis"), (128, False)):
            cfg = compose([*JOB_ARGV[name], f"eval.ats_passages={passages}"])
            assert (unread(name, "eval.mats", cfg) is not None) == refused, (name, passages)


def test_a_ranker_without_vectors_refuses_the_keys_of_vectors(tmp_path, tiny_bert):
    """By the ranker's declared capability (`vectors` "none": BERT_CAT, DGRe), train.py refuses on the command line the
    isotropy protocols' eval keys and the in-batch negatives' optim keys, and evaluate.py the eval keys, the ranker
    taken from ckpt='s header; a ranker that encodes vectors reads them. Every trainable `model` option is tried."""
    from conftest import fake_checkpoint

    from pipeline.jobs import IN_BATCH_OPTIM, ISOTROPY_EVAL, unread
    from retrieval.first_stage import model_capabilities

    keys = [f"eval.{k}" for k in ISOTROPY_EVAL] + [f"optim.{k}" for k in IN_BATCH_OPTIM]
    seen = set()
    for option in sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "model").glob("*.yaml")):
        cfg = compose([f"model={option}"])
        caps = model_capabilities(str(cfg.model.name))
        if not caps.trainable:
            continue
        none = caps.vectors == "none"
        seen.add(none)
        for key in keys:
            assert (unread("finetune", key, cfg) is not None) == none, (option, key)
            if key.startswith("eval."):
                assert (unread("evaluate", key, compose([f"model={option}", "ckpt=a.ckpt"])) is not None) == none
    assert seen == {True, False}
    for name, none in (("bert_cat", True), ("colbert", False)):
        ckpt = fake_checkpoint(tmp_path / f"{name}.ckpt", tiny_bert, name=name)
        cfg = compose([f"ckpt={ckpt}"])  # no model= : the header's ranker decides
        for key in keys[: len(ISOTROPY_EVAL)]:  # (evaluate.py reads no optim key at all)
            assert (unread("evaluate", key, cfg) is not None) == none, (name, key)
    with pytest.raises(InputError, match=r"'eval.probe_queries': job 'evaluate' .*ranker 'bert_cat' encodes no"):
        check_overrides(
            compose([f"ckpt={tmp_path / 'bert_cat.ckpt'}", "eval.probe_queries=8"]),
            "evaluate",
            [f"ckpt={tmp_path / 'bert_cat.ckpt'}", "eval.probe_queries=8"],
        )


def test_the_hinge_loss_refuses_the_in_batch_keys_on_the_command_line():
    """`optim.loss=hinge` scores each triplet's own negative whatever `optim.in_batch_negatives` says (test_module:
    the same loss and gradients either way), so train.py refuses the in-batch keys beside it; under ce it reads them."""
    from pipeline.jobs import IN_BATCH_OPTIM, unread

    for loss, refused in (("hinge", True), ("ce", False)):
        cfg = compose(["model=colbert", f"optim.loss={loss}"])
        for k in IN_BATCH_OPTIM:
            assert (unread("finetune", f"optim.{k}", cfg) is not None) == refused, (loss, k)
    argv = ["optim.loss=hinge", "optim.in_batch_negatives=true"]
    with pytest.raises(InputError, match=r"'optim.in_batch_negatives': job 'finetune' .*'hinge', which scores"):
        check_overrides(compose(argv), "finetune", argv)


def test_each_analysis_reads_only_the_eval_keys_it_declares():
    """The declaration checked against the code: every `cfg.eval.<key>` an analysis's module reads is one its schema
    declares in `reads_eval` (a module that registers no analysis reads none)."""
    import ast
    import importlib
    import inspect

    from analyses.registry import MODULES, load_all

    registry = load_all()
    declared: dict[str, set[str]] = {}
    for n in registry.names():
        schema = registry.get(n).schema
        declared.setdefault(schema.__module__, set()).update(schema.reads_eval)
    seen: dict[str, set[str]] = {}
    for module in MODULES:
        tree = ast.parse(inspect.getsource(importlib.import_module(module)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "eval":
                seen.setdefault(module, set()).add(node.attr)
    assert seen == {m: keys for m, keys in declared.items() if keys}, (seen, declared)


def _source_keys(cfg) -> set[str]:
    """The data keys of the source's own schema (not DataConfig's, which every source shares)."""
    from datamodules.config import DataConfig

    shared = {f.name for f in fields(DataConfig)}
    return {f"data.{k}" for k in cfg.data if k not in shared}


# what each split's reading uses of a source's own keys, from its build (datamodules/sources/*.py), by hand
_TSV_FILES = {s: {f"data.{s}_{k}" for k in ("queries", "qrels", "run")} for s in ("train", "val", "test")}
_TSV_FILES["train"] |= {"data.train_triples", "data.triples_format"}
_BEIR_TRAIN_OR_VAL = {"data.train_split", "data.val_split", "data.val_fraction", "data.split_seed"}


@pytest.mark.parametrize(
    "job, argv, source, refused",
    [
        # evaluate.py reads the test split only: the training and validation files are not read
        ("evaluate", ["ckpt=a.ckpt"], "tsv", _TSV_FILES["train"] | _TSV_FILES["val"]),
        ("evaluate_head", ["head_ckpt=h.ckpt"], "tsv", _TSV_FILES["train"] | _TSV_FILES["val"]),
        ("evaluate", ["ckpt=a.ckpt"], "beir", _BEIR_TRAIN_OR_VAL),
        ("evaluate", ["ckpt=a.ckpt"], "ir_datasets", {"data.train_id", "data.val_id"}),
        # with text triples every job reads them and the training files (they add passages to the collection)
        ("evaluate", ["ckpt=a.ckpt", "data.train_triples=t.tsv", "data.triples_format=text"], "tsv", _TSV_FILES["val"]),
        # folds re-split the queries of every split: all are read
        ("evaluate", ["ckpt=a.ckpt", "data.num_folds=5"], "tsv", set()),
        ("evaluate", ["ckpt=a.ckpt", "data.pool_ids=[a,b]", "data.num_folds=3"], "ir_datasets", set()),
        # training reads every split
        ("finetune", [], "tsv", set()),
        ("head", ["stage=head", "ckpt=a.ckpt", "head=nice"], "beir", set()),
        # retrieval, BM25 and the analyses read the split their options name
        (
            "retrieve",
            ["retrieval=dense", "ckpt=a.ckpt", "retrieval.split=val"],
            "tsv",
            _TSV_FILES["train"] | _TSV_FILES["test"],
        ),
        ("retrieve", ["retrieval=dense", "ckpt=a.ckpt", "retrieval.split=val"], "beir", {"data.test_split"}),
        ("first_stage", ["model=bm25"], "ir_datasets", {"data.train_id", "data.val_id"}),
        ("first_stage", ["model=bm25", "model.split=all"], "tsv", set()),
        ("analysis", ["analysis=ats", "analysis.split=train"], "tsv", _TSV_FILES["val"] | _TSV_FILES["test"]),
        ("analysis", ["analysis=whitebox", "analysis.split=all"], "beir", set()),
        ("analysis", ["analysis=lexical_enrichment"], "tsv", _TSV_FILES["train"]),
        ("analysis", ["analysis=fit_mlm_head"], "ir_datasets", {"data.train_id", "data.val_id"}),
    ],
)
def test_the_data_keys_of_a_split_a_job_does_not_read_are_refused(job, argv, source, refused):
    """Session 20's leftover: `evaluate.py data=tsv data.train_triples=...` was taken, and evaluate.py never opens it
    (it reads the test split). A source declares which split reads each of its keys (`DataConfig.split_keys`), each
    job which splits it reads (`Job.splits`, from its options); a key of a split the job does not read is refused on
    the command line by exactly those jobs, and the same value from a config is taken."""
    from pipeline.jobs import unread

    argv = [f"data={source}", *argv]
    base = compose(argv)
    assert select(base, TABLE[job].script) == job
    got = set()
    for key in _source_keys(base):
        node = base.data[key.split(".", 1)[1]]
        value = json.dumps(OmegaConf.to_container(node) if OmegaConf.is_config(node) else node)
        line = [*argv, f"{key}={value}"]
        if unread(job, key, base) is None:
            check(base, job, line)
            continue
        got.add(key)
        check(base, job)
        with pytest.raises(InputError) as e:
            check(base, job, line)
        msg = str(e.value)
        assert msg.startswith(f"config key '{key}': job '{job}' (") and f"source '{source}' reads it with the " in msg
        assert msg.endswith("only); drop it from the command line") and "\n" not in msg, msg
    assert got == refused


def test_a_group_choice_a_job_does_not_read_is_refused():
    cfg = compose(["retrieval=dense", "trainer=ddp"])
    with pytest.raises(InputError, match=r"^config key 'trainer': job 'retrieve' .*\(retrieval encodes on retrieval"):
        check(cfg, "retrieve", ["retrieval=dense", "trainer=ddp"])
    check(compose(["trainer=ddp"]), "evaluate", ["trainer=ddp"])  # evaluate.py reads the trainer's strategy


def test_the_head_stage_sets_the_trainer_keys_it_refuses():
    """The head's declaration and pipeline/head_stage.py agree: the trainer keys it replaces are those it refuses."""
    from pipeline.head_stage import _trainer_for_head

    cfg = compose(
        [
            *JOB_ARGV["head"],
            "trainer.max_steps=5",
            "trainer.max_epochs=7",
            "trainer.val_check_interval=3",
            "trainer.check_val_every_n_epoch=2",
        ]
    )
    after = _trainer_for_head(cfg).trainer
    assert {k for k in cfg.trainer if cfg.trainer[k] != after[k]} == set(HEAD_SCHEDULE)


def test_the_scripts_refuse_an_unread_key_at_dry_run(capsys, tmp_path):
    from pipeline.cli import main

    out = tmp_path / "out"
    argv = ["ckpt=a.ckpt", "optim.lr=1e-5", "trainer.max_steps=50", f"output_dir={out}", "--dry-run"]
    assert main(argv, EVALUATE) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: config key 'optim.lr': job 'evaluate' (evaluate.py) does not read it (evaluate.py trains nothing: "
        "the optimiser, its schedule and the loss are train.py's); drop it from the command line\n"
    )
    assert main(["optim.lr=1e-5", "trainer.max_steps=50", f"output_dir={out}", "--dry-run"], TRAIN) == 0
    assert not out.exists()


def test_applied_keeps_the_overrides_a_job_reads_in_order():
    from pipeline.jobs import applied

    argv = ["model=colbert", "optim.lr=1e-5", "trainer.max_steps=300", "trainer.precision=bf16-mixed", "eval.mats=mean"]
    assert applied(argv, "finetune") == argv
    assert applied(argv, "evaluate") == ["model=colbert", "trainer.precision=bf16-mixed", "eval.mats=mean"]
    assert applied(argv, "retrieve") == ["model=colbert"]  # a full ranking reads eval.measures alone
    assert applied([*argv, "stage=head", "optim.nonfinite=stop"], "head") == [
        "model=colbert",
        "trainer.precision=bf16-mixed",
        "eval.mats=mean",
        "stage=head",
        "optim.nonfinite=stop",
    ]
