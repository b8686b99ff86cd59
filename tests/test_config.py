"""Config composition: defaults, group choice, overrides, and one-line errors for bad keys, groups and types."""

import pytest

from core.errors import InputError
from pipeline.config import compose


def test_defaults_compose_to_colbert_on_synthetic():
    cfg = compose([])
    assert cfg.model.name == "colbert" and cfg.data.source == "synthetic"
    assert cfg.optim.in_batch_negatives is True
    assert cfg.logger.name == "wandb"


def test_group_choice_and_overrides_apply_in_order():
    cfg = compose(["model=repbert", "trainer.max_steps=7", "optim.lr=1e-4", "data.rotate_train=true", "seed=3"])
    assert cfg.model.name == "repbert"
    assert cfg.trainer.max_steps == 7 and cfg.optim.lr == pytest.approx(1e-4) and cfg.seed == 3
    assert cfg.data.rotate_train is True


@pytest.mark.parametrize(
    "argv,where",
    [
        (["model.compress_dimm=8"], "model.compress_dimm"),  # misspelt ranker key
        (["model=bert_cat", "model.compress_dim=8"], "model.compress_dim"),  # key of another ranker
        (["model=tk", "model.compress_dim=8"], "model.compress_dim"),
        (["model=tk", "model.kernel=5"], "model.kernel"),  # misspelt TK key (kernels)
        (["trainer.max_stepz=3"], "trainer.max_stepz"),
        (["optim.lrr=1"], "optim.lrr"),
        (["sed=1"], "sed"),
    ],
)
def test_unknown_keys_are_errors(argv, where):
    with pytest.raises(InputError) as e:
        compose(argv)
    assert where in str(e.value) and "unknown key" in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_group_option_lists_choices():
    with pytest.raises(InputError, match=r"config group 'model'.*no option 'colbertt'.*colbert"):
        compose(["model=colbertt"])


def test_unknown_ranker_name():
    with pytest.raises(InputError, match="model.name"):
        compose(["model.name=splade"])


@pytest.mark.parametrize(
    "argv,key",
    [
        (["trainer.max_steps=abc"], "trainer.max_steps"),
        (["data.rotate_train=maybe"], "data.rotate_train"),
        (["seed=1.5"], "seed"),
    ],
)
def test_wrong_types_are_errors(argv, key):
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        compose(argv)


def test_argument_without_equals():
    with pytest.raises(InputError, match="expected key=value"):
        compose(["--fast"])


@pytest.mark.parametrize(
    "argv,key",
    [
        (["optim.loss=hing"], "optim.loss"),
        (["optim.schedule=cosine"], "optim.schedule"),
        (["data.negatives=hard"], "data.negatives"),
        (["logger.mode=ofline"], "logger.mode"),
        (["logger.name=tensorboard"], "logger.name"),
    ],
)
def test_misspelt_choices_are_errors_not_defaults(argv, key):
    with pytest.raises(InputError, match=rf"config key '{key}'.*expected one of"):
        compose(argv)


def test_tk_composes_with_the_papers_settings():
    m = compose(["model=tk"]).model
    assert (m.name, m.layers, m.heads, m.head_dim, m.ff_dim) == ("tk", 2, 16, 32, 100)
    assert (m.kernels, m.sigma, m.passage_position_offset, m.embeddings) == (11, 0.1, 500, "backbone")
    assert (m.contextualization_lr, m.kernel_lr) == (1e-4, 1e-3)
    assert (
        compose(["model=tk", "model.embeddings=/data/glove.42B.300d.txt", "model.kernel_lr=null"]).model.kernel_lr
        is None
    )


@pytest.mark.parametrize(
    "argv,key",
    [
        (["model.kernels=1"], "model.kernels"),
        (["model.sigma=0"], "model.sigma"),
        (["model.dropout=1.5"], "model.dropout"),
        (["model.kernel_lr=-1"], "model.kernel_lr"),
    ],
)
def test_tk_bad_values_are_errors(argv, key):
    with pytest.raises(InputError, match=rf"config key '{key}'"):
        compose(["model=tk", *argv])


@pytest.mark.parametrize(
    "argv,key",
    [
        (["model.length_buckets=0"], "model.length_buckets"),
        (["model=repbert", "model.doc_max_len=0"], "model.doc_max_len"),
        (["model=tk", "model.query_max_len=-3"], "model.query_max_len"),
    ],
)
def test_ranker_lengths_and_buckets_must_be_positive(argv, key):
    with pytest.raises(InputError, match=rf"config key '{key}'.*expected (an integer )?>= 1"):
        compose(argv)
    assert compose(["model.length_buckets=1"]).model.length_buckets == 1


@pytest.mark.parametrize("value", ["four", "1.5", "-2"])
def test_length_buckets_takes_auto_or_a_count(value):
    with pytest.raises(InputError, match=r"config key 'model.length_buckets'"):
        compose([f"model.length_buckets={value}"])
    assert compose(["model.length_buckets=auto"]).model.length_buckets == "auto"


# Every numeric and choice key has a declared range or set (core/ranges.py), checked by compose, which --dry-run
# and every real run go through: (arguments, the key named, what the message says after "config key '<key>': ").
OUT_OF_RANGE = [
    (
        ["trainer.devices=0"],
        "trainer.devices",
        "is 0; expected an integer >= 1, or -1, or 'auto' (or a non-empty list of device indices",
    ),
    (["trainer.devices=[]"], "trainer.devices", "is []; expected an integer >= 1"),
    (["trainer.max_steps=-5"], "trainer.max_steps", "is -5; expected >= 0, or -1 (-1: no limit)"),
    (["trainer.max_epochs=0"], "trainer.max_epochs", "is 0; expected >= 1, or -1"),
    (
        ["trainer.val_check_interval=0"],
        "trainer.val_check_interval",
        "is 0; expected an integer >= 1 (steps), or a number in (0, 1]",
    ),
    (["trainer.val_check_interval=1.5"], "trainer.val_check_interval", "is 1.5; expected an integer >= 1 (steps)"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches", "is 0; expected >= 1"),
    (["trainer.num_nodes=0"], "trainer.num_nodes", "is 0; expected >= 1"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val", "is -1.0; expected >= 0"),
    (["trainer.precision=8"], "trainer.precision", "got '8'; expected one of"),
    (["trainer.strategy=dpp"], "trainer.strategy", "got 'dpp'; expected one of"),
    (["trainer.accelerator=gpus"], "trainer.accelerator", "got 'gpus'; expected one of"),
    (["optim.lr=-1"], "optim.lr", "is -1.0; expected > 0"),
    (["optim.lr=0"], "optim.lr", "is 0.0; expected > 0"),
    (["optim.lr=nan"], "optim.lr", "is nan; expected > 0"),
    (["optim.warmup_steps=-1"], "optim.warmup_steps", "is -1; expected >= 0"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay", "is -0.1; expected >= 0"),
    (["optim.temperature=0"], "optim.temperature", "is 0.0; expected > 0"),
    (["seed=-1"], "seed", "is -1; expected an integer in [0, 4294967295]"),
    (["data.batch_size=0"], "data.batch_size", "is 0; expected >= 1"),
    (["data.eval_batch_size=0"], "data.eval_batch_size", "is 0; expected >= 1"),
    (["data.candidate_depth=0"], "data.candidate_depth", "is 0; expected >= 1"),
    (["data.num_workers=-1"], "data.num_workers", "is -1; expected >= 0"),
    (["data.max_eval_queries=0"], "data.max_eval_queries", "is 0; expected >= 1"),
    (["data.num_val_queries=-1"], "data.num_val_queries", "is -1; expected >= 0"),
    (["data.partial_relevance=1.5"], "data.partial_relevance", "is 1.5; expected a number in [0, 1]"),
    (["data=cranfield", "data.val_fraction=1.0"], "data.val_fraction", "is 1.0; expected a number in [0, 1)"),
    (["data=squad", "data.test_articles=-1"], "data.test_articles", "is -1.0; expected >= 0 (< 1: a fraction"),
    (["data=beir", "data.val_fraction=-0.5"], "data.val_fraction", "is -0.5; expected >= 0"),
    (["eval.isotropy_batch_pairs=0"], "eval.isotropy_batch_pairs", "is 0; expected >= 1 (the isotropy paper's is 16)"),
    (["eval.probe_queries=0"], "eval.probe_queries", "is 0; expected >= 1"),
    # a protocol's setting while the protocol is off: silently unused by every job
    (
        ["eval.isotropy_paper=false", "eval.isotropy_batch_pairs=8"],
        "eval.isotropy_batch_pairs",
        "is 8 but eval.isotropy_paper is false, which turns the `paper` protocol off; leave it at 16",
    ),
    (["eval.isotropy_paper=false", "eval.isotropy_max_batches=3"], "eval.isotropy_max_batches", "is 3 but eval.iso"),
    (["eval.isotropy_paper=false", "eval.isotropy_sample_seed=3"], "eval.isotropy_sample_seed", "is 3 but eval.iso"),
    (["eval.ats_passages=0", "eval.ats_max_occurrences=5"], "eval.ats_max_occurrences", "is 5 but eval.ats_passages"),
    (["model.query_max_len=0"], "model.query_max_len", "is 0; expected >= 1"),
    (["model.compress_dim=0"], "model.compress_dim", "is 0; expected >= 1"),
    (["model=tk", "model.layers=0"], "model.layers", "is 0; expected >= 1"),
    (["model=tk", "model.dropout=1.0"], "model.dropout", "is 1.0; expected a number in [0, 1)"),
    (["model=tk", "model.embedding_scale=-2"], "model.embedding_scale", "is -2; expected > 0, or 'auto'"),
    (["model=dgre", "model.dropout=-0.1"], "model.dropout", "is -0.1; expected a number in [0, 1)"),
    (["model=dgre", "model.mi_hidden=0"], "model.mi_hidden", "is 0; expected >= 1"),
    (["model=bm25", "model.b=1.5"], "model.b", "is 1.5; expected a number in [0, 1]"),
    (["model=bm25", "model.depth=0"], "model.depth", "is 0; expected >= 1"),
    (["head=glow", "head.depth=0"], "head.depth", "is 0; expected >= 1"),
    (["head=nice", "head.hidden_units=0"], "head.hidden_units", "is 0; expected >= 1"),
    (["head=whitening", "head.eps=0"], "head.eps", "is 0.0; expected > 0"),
    (["head=glow", "head.lr=-1e-4"], "head.lr", "is -0.0001; expected > 0"),
    (["head=glow", "head.batch_size=0"], "head.batch_size", "is 0; expected >= 1"),
    (["retrieval=dense", "retrieval.pq_nbits=17"], "retrieval.pq_nbits", "is 17; expected a number in [1, 16]"),
    (
        ["retrieval=dense", "retrieval.batch_size=0"],
        "retrieval.batch_size",
        "is 0; expected an integer >= 1, or 'auto'",
    ),
    (["retrieval=dense", "retrieval.batch_size=big"], "retrieval.batch_size", "is 'big'; expected an integer >= 1"),
    (["retrieval=dense", "retrieval.batch_size=2.5"], "retrieval.batch_size", "Value '2.5' of type 'float'"),
]


@pytest.mark.parametrize("argv,key,expect", OUT_OF_RANGE, ids=[" ".join(a) for a, _, _ in OUT_OF_RANGE])
def test_out_of_range_values_are_one_line_errors(argv, key, expect):
    with pytest.raises(InputError) as e:
        compose(argv)
    msg = str(e.value)
    assert msg.startswith(f"config key '{key}': {expect}"), msg
    assert "\n" not in msg


def test_retrieval_batch_size_is_auto_by_default_or_a_count():
    assert compose(["retrieval=dense"]).retrieval.batch_size == "auto"
    assert compose(["retrieval=dense", "retrieval.batch_size=256"]).retrieval.batch_size == 256


def test_range_bounds_and_special_values_are_accepted():
    cfg = compose(
        [
            "trainer.devices=-1",
            "trainer.max_steps=-1",
            "trainer.val_check_interval=0.5",
            "optim.warmup_steps=0",
            "optim.weight_decay=0",
            "trainer.gradient_clip_val=null",
            "data.max_eval_queries=null",
            "seed=0",
        ]
    )
    assert (cfg.trainer.devices, cfg.trainer.max_steps, cfg.trainer.val_check_interval) == (-1, -1, 0.5)
    assert compose(["trainer.devices=auto"]).trainer.devices == "auto"
    assert list(compose(["trainer.devices=[0,1]"]).trainer.devices) == [0, 1]
    assert (
        compose(["trainer.devices=0,1"]).trainer.devices == "0,1"
    )  # Lightning's own form for device indices, passed on as it is
    with pytest.raises(InputError, match="trainer.devices"):
        compose(["trainer.devices=0,x"])
    assert compose(["trainer.max_steps=0"]).trainer.max_steps == 0  # tests the starting model only
    assert compose(["model=tk", "model.embedding_scale=auto", "model.dropout=0.0"]).model.dropout == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize(
    "arg,key",
    [
        ("trainer.devices=0", "trainer.devices"),
        ("trainer.max_steps=-5", "trainer.max_steps"),
        ("optim.lr=-1", "optim.lr"),
        ("data.batch_size=0", "data.batch_size"),
    ],
)
def test_out_of_range_stops_train_py_before_anything(tmp_path, arg, key, dry):
    """The same check with --dry-run and in a real run: exit 2, one line, no output folder, no model loaded."""
    from conftest import run_script

    out = tmp_path / "out"
    proc = run_script("train.py", arg, "logger=none", f"output_dir={out}", *(["--dry-run"] if dry else []), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(
        f"error: config key '{key}': is "
    )
    assert proc.stdout == "" and not out.exists()


# ---- GPU settings: model.attn_implementation, model.compile, trainer.float32_matmul_precision ----------------------
@pytest.mark.parametrize(
    "argv,key",
    [
        (["model.attn_implementation=flash"], "model.attn_implementation"),
        (["model=bert_cat", "model.attn_implementation=SDPA"], "model.attn_implementation"),
        (["model.compile=maybe"], "model.compile"),
        (["trainer.float32_matmul_precision=low"], "trainer.float32_matmul_precision"),
        (["trainer=ddp", "trainer.float32_matmul_precision=tf32"], "trainer.float32_matmul_precision"),
    ],
)
def test_gpu_settings_bad_values_are_one_line_errors(argv, key):
    with pytest.raises(InputError) as e:
        compose(argv)
    assert f"config key '{key}'" in str(e.value) and "\n" not in str(e.value)


def test_flash_attention_needs_its_package(monkeypatch):
    """flash_attention_2 is refused at load, naming the key, where the flash_attn package cannot be imported."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(InputError) as e:
        compose(["model.attn_implementation=flash_attention_2"])
    msg = str(e.value)
    assert msg.startswith("config key 'model.attn_implementation'") and "flash_attn" in msg and "\n" not in msg


def test_gpu_settings_defaults_keep_todays_behaviour():
    """sdpa attention, no compilation, and the matmul precision left alone off CUDA: the default run unchanged."""
    cfg = compose([])
    assert cfg.model.attn_implementation == "sdpa" and cfg.model.compile is False
    assert cfg.trainer.float32_matmul_precision == "auto"
    assert compose(["trainer=ddp"]).trainer.float32_matmul_precision == "auto"
