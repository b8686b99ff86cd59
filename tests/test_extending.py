"""docs/extending.md's four recipes, run as written (issue 36, item 7).

The page's code blocks marked `<!-- recipe: NAME -->` are executed as modules, which registers the ranker, head,
analysis and data source they define; the YAML blocks (`<!-- recipe: NAME yaml GROUP/FILE -->`) are written into a
copy of configs/. Each test then runs the jobs the recipe's "Check" names, through the same entry points as the
command line, on a tiny random BERT. Nothing in the repository is touched: each registration is undone afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import types

import numpy as np
import pytest
import torch
from conftest import REPO, TINY_RUN, fake_checkpoint

from analyses.registry import ANALYSES
from core.errors import InputError
from datamodules.sources import SOURCES
from models.heads import HEADS
from models.rankers import RANKERS

PAGE = REPO / "docs" / "extending.md"
BLOCK = re.compile(r"<!-- recipe: (\w+)(?: yaml ([\w/.]+))? -->\s*```(\w+)\n(.*?)```", re.S)
REGISTRIES = {"ranker": (RANKERS, "maxpool"), "head": (HEADS, "centering"), "analysis": (ANALYSES, "vector_norms")}
REGISTRIES["source"] = (SOURCES, "json_file")

SMALL = [*TINY_RUN, "eval.ats_passages=0"]


def recipes() -> dict[str, dict]:
    """NAME -> {"code": the python block, "yaml": {GROUP/FILE: text}} as the page holds them."""
    found: dict[str, dict] = {}
    for name, yaml_path, lang, body in BLOCK.findall(PAGE.read_text()):
        entry = found.setdefault(name, {"code": None, "yaml": {}})
        if yaml_path:
            assert lang == "yaml", f"recipe {name}: {yaml_path} is in a {lang} block"
            entry["yaml"][yaml_path] = body
        else:
            assert lang == "python" and entry["code"] is None, f"recipe {name}: one python block expected"
            entry["code"] = body
    return found


def test_the_page_has_the_four_recipes_each_with_code_and_yaml():
    found = recipes()
    assert sorted(found) == ["analysis", "head", "ranker", "source"]
    for name, entry in found.items():
        assert entry["code"] and len(entry["yaml"]) == 1, name
    # "at most 3 files": the module, the registry's import list, the YAML
    table = [ln for ln in PAGE.read_text().splitlines() if ln.startswith(("| a ", "| an "))]
    assert len(table) == 4 and all(ln.split("|")[2].count("`") == 6 for ln in table)


@pytest.fixture(scope="module")
def recipe_modules():
    """Execute every recipe's code as a module of its own, then undo its registration."""
    modules = {}
    for name, entry in recipes().items():
        registry, entry_name = REGISTRIES[name]
        assert entry_name not in registry, f"{entry_name} is already registered: the recipe must add it"
        mod = types.ModuleType(f"recipe_{name}")
        sys.modules[mod.__name__] = mod  # dataclasses resolve their module while the class is built
        exec(compile(entry["code"], f"{PAGE}:recipe {name}", "exec"), mod.__dict__)
        assert entry_name in registry, f"recipe {name} registers no '{entry_name}'"
        modules[name] = mod
    yield modules
    for name in modules:
        registry, entry_name = REGISTRIES[name]
        registry._entries.pop(entry_name)
        sys.modules.pop(f"recipe_{name}")


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """A copy of configs/ with every recipe's YAML written in, used by compose() for this test."""
    import pipeline.config

    root = tmp_path / "configs"
    shutil.copytree(pipeline.config.CONFIG_DIR, root)
    for entry in recipes().values():
        for rel, text in entry["yaml"].items():
            assert not (root / rel).exists(), f"{rel} exists already"
            (root / rel).write_text(text)
    monkeypatch.setattr(pipeline.config, "CONFIG_DIR", root)
    return root


@pytest.mark.slow
def test_ranker_recipe(recipe_modules, configs, tiny_bert, tmp_path):
    """Trains; takes a sequence-wise head and the dense index, as its capabilities declare; load_ranker reads it."""
    import pipeline.run
    from models.loading import load_ranker
    from pipeline.config import compose

    model = ["model=maxpool", f"model.backbone={tiny_bert}", "model.query_max_len=8", "model.doc_max_len=24"]
    run = tmp_path / "run"
    steps = ["trainer.max_steps=2", "trainer.val_check_interval=2", "eval.before_training=false"]
    pipeline.run.train(compose([*SMALL, *model, *steps, f"output_dir={run}"]))
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))[-1]
    loaded = load_ranker(best)
    assert type(loaded.ranker).__name__ == "MaxPool" and loaded.head is None

    # the pooled vector is the masked maximum of the token vectors, as the recipe says (brute force per text)
    texts = ["a short passage", "a somewhat longer passage about kernels"]
    batch = loaded.tokenizer.docs(texts)
    with torch.no_grad():
        enc = loaded.ranker.encode(batch["d_input_ids"], batch["d_attention_mask"], side="doc")
        raw = loaded.ranker.token_representations(batch["d_input_ids"], batch["d_attention_mask"], "doc")
    for i in range(len(texts)):
        real = raw.tokens[i][batch["d_attention_mask"][i].bool()]
        np.testing.assert_allclose(enc.sequence[i].numpy(), real.max(0).values.numpy(), rtol=1e-6)

    head = tmp_path / "head"
    args = ["stage=head", f"ckpt={best}", "head=whitening", "head.granularity=sequence", f"data.cache_dir={tmp_path}"]
    pipeline.run.train(compose([*SMALL, *args, f"output_dir={head}"]))
    assert "ndcg_cut_10" in json.loads((head / "metrics.json").read_text())["before_head"]

    dense = tmp_path / "dense"
    pipeline.run.evaluate(
        compose([*SMALL, "retrieval=dense", f"ckpt={best}", "retrieval.k=5", f"output_dir={dense}"]), False
    )
    assert json.loads((dense / "index" / "manifest.json").read_text())["ranker"] == "maxpool"


@pytest.mark.slow
def test_head_recipe(recipe_modules, configs, tiny_bert_nodropout, tmp_path):
    """Fitted in closed form by the head stage (one head.ckpt); load_ranker puts it back on its ranker."""
    import pipeline.run
    from models.loading import load_ranker
    from pipeline.config import compose

    base = fake_checkpoint(tmp_path / "repbert.ckpt", tiny_bert_nodropout, name="repbert")
    out = tmp_path / "centered"
    args = ["stage=head", f"ckpt={base}", "head=centering", f"data.cache_dir={tmp_path / 'c'}"]
    after = pipeline.run.train(compose([*SMALL, *args, f"output_dir={out}"]))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ndcg_cut_10"] == pytest.approx(after["ndcg_cut_10"]) and "before_head" in metrics
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["head.ckpt"]
    ranker, _, head = load_ranker(out / "checkpoints" / "head.ckpt")
    assert type(head).__name__ == "Centering" and ranker.token_head is head
    assert float(head.mean.abs().sum()) > 0  # fitted: the mean of the cached token vectors
    # centring is a translation: on the cached token vectors it was fitted on, the head's output has mean 0
    from models.heads.cache import RepresentationCache

    (cache,) = (tmp_path / "c" / "representations").iterdir()
    vectors = np.asarray(RepresentationCache(cache).vectors(), dtype=np.float64)
    np.testing.assert_allclose(head.mean.double().numpy(), vectors.mean(0), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        z = head(torch.from_numpy(vectors).float())
    assert float(z.double().mean(0).abs().max()) < 1e-4


@pytest.mark.slow
def test_analysis_recipe(recipe_modules, configs, tiny_bert, tmp_path):
    """`analysis=vector_norms` runs from evaluate's job, writes its JSON, refuses by capability and unknown keys."""
    import pipeline.run
    from models.loading import load_ranker
    from pipeline.config import compose

    out = tmp_path / "norms"
    model = ["model=repbert", f"model.backbone={tiny_bert}"]
    doc = pipeline.run.evaluate(compose([*SMALL, *model, "analysis=vector_norms", f"output_dir={out}"]), True)
    assert json.loads((out / "vector_norms.json").read_text()) == doc
    # an independent reading: the same passages' RepBERT vectors, encoded one at a time, their norms averaged
    from datamodules.sources import data_config, load_dataset

    cfg = compose([*SMALL, *model])
    ds = load_dataset(data_config(cfg), int(cfg.seed))
    ids = sorted({d for judged in ds.split("test").qrels.values() for d in judged})[:32]
    ranker, tok, _ = load_ranker(model={"name": "repbert", "backbone": tiny_bert})
    with torch.no_grad():
        norms = [float(ranker.encode_docs(tok.docs([ds.docs[d]])).sequence.norm()) for d in ids]
    assert doc["passages"] == len(ids) and doc["mean_norm"] == pytest.approx(np.mean(norms), rel=1e-5)

    with pytest.raises(InputError, match="vector_norms reads one vector per passage"):
        pipeline.run.evaluate(
            compose(
                [
                    *SMALL,
                    "model=colbert",
                    f"model.backbone={tiny_bert}",
                    "analysis=vector_norms",
                    f"output_dir={tmp_path / 'x'}",
                ]
            ),
            True,
        )
    with pytest.raises(InputError, match="config key .analysis.passage.: unknown key"):
        compose([*SMALL, *model, "analysis=vector_norms", "analysis.passage=3"])


def test_source_recipe(recipe_modules, configs, tmp_path):
    """`data=json_file`: reads only the used splits, validated like every source; BM25 runs on it from evaluate.py."""
    import pipeline.run
    from datamodules.sources import data_config, load_dataset
    from pipeline.config import compose

    words = ["cats", "dogs", "kernels", "flows", "whitening"]
    docs = {f"d{i}": f"passage {i} about {w}" for i, w in enumerate(words)}

    def split(queries: dict[str, str]) -> dict:  # each query's one relevant passage is the one holding its word
        return {"queries": queries, "qrels": {q: {f"d{words.index(w)}": 1} for q, w in queries.items()}}

    path = tmp_path / "tiny.json"
    parts = {
        "train": split({"q1": "cats"}),
        "val": split({"q2": "dogs"}),
        "test": split({"q3": "kernels", "q4": "whitening"}),
    }
    path.write_text(json.dumps({"docs": docs, **parts}))
    cfg = compose(["data=json_file", f"data.path={path}", "logger=none"])
    ds = load_dataset(data_config(cfg), 0, ("test",))
    assert ds.split("train").queries == {} and sorted(ds.split("test").queries) == ["q3", "q4"]

    out = tmp_path / "bm25"
    after = pipeline.run.evaluate(
        compose(
            [
                "model=bm25",
                "data=json_file",
                f"data.path={path}",
                "logger=none",
                f"data.cache_dir={tmp_path / 'c'}",
                f"output_dir={out}",
            ]
        ),
        True,
    )
    assert after["ndcg_cut_10"] == pytest.approx(1.0)  # each test query's only relevant passage holds its word
    run = (out / "run.trec").read_text().split("\n")
    assert run[0].split()[:3] == ["q3", "Q0", "d2"]

    path.write_text('{"docs": {"d0": "x"},\n "test": {"queries": {"q": "x"}, "qrels": {"q": {"d9": 1}}}}')
    with pytest.raises(InputError, match="d9"):  # a qrel naming an unknown passage: IRDataset.validate
        load_dataset(data_config(cfg), 0)
    path.write_text('{"docs": {"d0": "x"},\n "test": }')
    with pytest.raises(InputError, match=rf"{re.escape(str(path))}:2: is not valid JSON"):
        load_dataset(data_config(cfg), 0)


def test_the_page_commands_compose_with_the_recipes(recipe_modules, configs, tmp_path):
    """Every command the page documents composes and validates (as `--dry-run` would) once the recipes are in."""
    import shlex

    from test_docs_commands import documented_commands

    from pipeline.config import compose
    from pipeline.jobs import check_files

    commands = documented_commands(PAGE)
    # one "Check:" command per recipe, each naming what its recipe adds
    names = ["maxpool", "centering", "vector_norms", "json_file"]
    assert len(commands) == 4 and all(name in c for (_, c), name in zip(commands, names)), commands
    for _, command in commands:
        args = shlex.split(command)[2:]
        cfg = compose(args)  # an unknown group option or key would raise here
        if not any(a.startswith(("ckpt=", "data.path=")) for a in args):  # files a previous step would make
            check_files(cfg)
