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


@pytest.mark.parametrize("argv,key", [(["trainer.max_steps=abc"], "trainer.max_steps"), (["data.rotate_train=maybe"], "data.rotate_train"), (["seed=1.5"], "seed")])
def test_wrong_types_are_errors(argv, key):
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        compose(argv)


def test_argument_without_equals():
    with pytest.raises(InputError, match="expected key=value"):
        compose(["--fast"])


@pytest.mark.parametrize(
    "argv,key",
    [(["optim.loss=hing"], "optim.loss"), (["optim.schedule=cosine"], "optim.schedule"),
     (["data.negatives=hard"], "data.negatives"), (["logger.mode=ofline"], "logger.mode"), (["logger.name=tensorboard"], "logger.name")],
)
def test_misspelt_choices_are_errors_not_defaults(argv, key):
    with pytest.raises(InputError, match=rf"config key '{key}'.*expected one of"):
        compose(argv)


def test_tk_composes_with_the_papers_settings():
    m = compose(["model=tk"]).model
    assert (m.name, m.layers, m.heads, m.head_dim, m.ff_dim) == ("tk", 2, 16, 32, 100)
    assert (m.kernels, m.sigma, m.passage_position_offset, m.embeddings) == (11, 0.1, 500, "backbone")
    assert (m.contextualization_lr, m.kernel_lr) == (1e-4, 1e-3)
    assert compose(["model=tk", "model.embeddings=/data/glove.42B.300d.txt", "model.kernel_lr=null"]).model.kernel_lr is None


@pytest.mark.parametrize("argv,key", [(["model.kernels=1"], "model.kernels"), (["model.sigma=0"], "model.sigma"),
                                      (["model.dropout=1.5"], "model.dropout"), (["model.kernel_lr=-1"], "model.kernel_lr")])
def test_tk_bad_values_are_errors(argv, key):
    with pytest.raises(InputError, match=rf"config key '{key}'"):
        compose(["model=tk", *argv])


@pytest.mark.parametrize("argv,key", [(["model.length_buckets=0"], "model.length_buckets"),
                                      (["model=repbert", "model.doc_max_len=0"], "model.doc_max_len"),
                                      (["model=tk", "model.query_max_len=-3"], "model.query_max_len")])
def test_ranker_lengths_and_buckets_must_be_positive(argv, key):
    with pytest.raises(InputError, match=rf"config key '{key}'.*expected a positive integer"):
        compose(argv)
    assert compose(["model.length_buckets=1"]).model.length_buckets == 1
