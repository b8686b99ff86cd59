"""Answer-position analysis (analyses/): relative starts against hand-computed examples, rotated positions against
the text training actually sees, the summary statistics by hand, atomic outputs, the CLI (synthetic data, W&B
offline, one-line errors), and on real SQuAD (skipped when absent) the paper's Figure 1 claims: rotation flattens
the distribution, and the biased split has all its answers in the first k."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from conftest import run_script, synthetic_data

from analyses.answer_positions import (
    JSON_NAME,
    PNG_NAME,
    Options,
    analyse,
    write_outputs,
)
from analyses.position_stats import summarize
from analyses.positions import Unit, eval_units, relative_starts, train_units
from core.errors import InputError
from datamodules.corpus import IRDataset, Split
from datamodules.datamodule import TripletDataset, passage_text
from datamodules.rotation import passage_rotation_index, rotate, rotation_index
from pipeline.config import compose

DOC = "The quick  brown fox\njumps"  # 5 words; "quick" is word 1, "fox" word 3


def _toy() -> IRDataset:
    split = Split(queries={"q": "which fox"}, qrels={"q": {"d": 1, "other": 0}})
    return IRDataset(
        name="toy",
        docs={"d": DOC, "other": "nothing here"},
        splits={"train": split, "val": split, "test": Split()},
        answers={("q", "d"): [(4, 9), (17, 20)]},
    )  # "quick", "fox"


def _seed_with_cut(key: str, r: int, n: int) -> int:
    return next(s for s in range(1000) if rotation_index(s, 0, key, n) == r)


def test_relative_starts_hand_computed():
    ds = _toy()
    units = [Unit("q", "d", "0:d")]
    assert relative_starts(ds, units).tolist() == [0.2, 0.6]
    assert relative_starts(ds, units, spans="first").tolist() == [0.2]
    # a span starting mid-word counts the word holding it; one starting on whitespace its next word
    mid = IRDataset(name="m", docs={"d": DOC}, splits={}, answers={("q", "d"): [(6, 9), (9, 14)]})
    assert relative_starts(mid, units).tolist() == [0.2, 0.4]
    assert eval_units(ds, "val") == [Unit("q", "d", "d")]  # judged non-relevant "other" is not a unit
    # per_passage (default): keyed by the doc id, one cut for every epoch; per_epoch: by triple and doc id, per epoch
    assert train_units(ds, [("q", "d", "other"), ("q", "other", "d")]) == [Unit("q", "d", "d")]
    assert train_units(ds, [("q", "d", "other"), ("q", "other", "d")], "per_epoch") == [Unit("q", "d", "0:d", True)]


def test_rotation_moves_positions_as_computed_by_hand():
    ds = _toy()
    seed = _seed_with_cut("0:d", 2, 5)  # cut before word 2 ("brown")
    # Eq. 7: "brown fox jumps The quick": "quick" is now word 4, "fox" word 1
    assert passage_text(DOC, True, seed, 0, "0:d") == "brown fox jumps The quick"
    assert relative_starts(ds, [Unit("q", "d", "0:d")], rotate=True, seed=seed).tolist() == [0.8, 0.2]
    # epochs pool: epoch-major; a per_epoch unit has each epoch's own cut, any other unit its epoch-0 cut every epoch
    two = relative_starts(ds, [Unit("q", "d", "0:d", per_epoch=True)], rotate=True, seed=seed, epochs=2)
    r1 = rotation_index(seed, 1, "0:d", 5)
    assert two.tolist() == [0.8, 0.2, ((1 - r1) % 5) / 5, ((3 - r1) % 5) / 5]
    assert relative_starts(ds, [Unit("q", "d", "0:d")], rotate=True, seed=seed, epochs=2).tolist() == [
        0.8,
        0.2,
        0.8,
        0.2,
    ]


@pytest.mark.parametrize("rotation", ["per_passage", "per_epoch"])
def test_rotated_positions_are_where_the_training_text_has_the_answer(tmp_path, rotation):
    """Synthetic data through the data module with rotate_train: the analysis's rotated position of every answer is
    the word of the rotated training passage (TripletDataset) where rotation.rotate maps the answer span, under
    either `data.rotation`: per_passage cuts a passage at passage_rotation_index(seed, doc id) every epoch,
    per_epoch at rotation_index(seed, epoch, "triple:doc id")."""
    dm = synthetic_data(tmp_path, 9, rotate_train=True, rotation=rotation)
    ds = dm.dataset
    tds = TripletDataset(ds, dm.triples, ds.split("train").queries, True, 9, rotation_mode=rotation)
    units = train_units(ds, dm.triples, rotation)
    assert len(units) == 60  # one positive with an answer per question (grade-1 positives have none)
    got = relative_starts(ds, units, rotate=True, seed=9, epochs=2).reshape(2, -1)
    assert (got[0] == got[1]).all() == (rotation == "per_passage")  # per_passage: every epoch is the same data set
    for epoch in range(2):
        expected = []
        for i, (qid, pos, _) in enumerate(dm.triples):
            if (qid, pos) not in ds.answers:
                continue
            text = tds[(epoch, i)][1]
            ((s, e),) = ds.answers[(qid, pos)]
            n = len(text.split())
            r = (
                passage_rotation_index(9, pos, n)
                if rotation == "per_passage"
                else rotation_index(9, epoch, f"{i}:{pos}", n)
            )
            rotated, spans = rotate(ds.docs[pos], r, [(s, e)])
            assert rotated == text
            start = spans[-1][0]  # a span split by the cut keeps its first word at the end
            assert text[start:].startswith(ds.docs[pos][s:e].split()[0])
            expected.append(text[:start].count(" ") / len(text.split()))
        assert got[epoch].tolist() == expected


def test_summary_statistics_by_hand():
    s = summarize([0.05, 0.15, 0.3, 0.9], bins=4, keep_first=0.2)
    assert s["count"] == 4 and s["mean"] == pytest.approx(0.35) and s["median"] == pytest.approx(0.225)
    assert (s["share_first_10"], s["share_first_25"], s["share_first_k"]) == (0.25, 0.5, 0.5)
    assert s["histogram"]["counts"] == [2, 1, 0, 1] and s["histogram"]["edges"] == [0, 0.25, 0.5, 0.75, 1]
    assert s["chi2_uniform"]["statistic"] == pytest.approx(2.0) and s["chi2_uniform"]["dof"] == 3
    assert s["kl_uniform_nats"] == pytest.approx(0.5 * math.log(2))
    # KS D = max over sorted x_i of i/n - x_i and x_i - (i-1)/n: 0.75 - 0.3
    assert s["ks_uniform"]["statistic"] == pytest.approx(0.45)
    assert s["quantiles"]["0.5"] == pytest.approx(0.225)
    flat = summarize((np.arange(1000) + 0.5) / 1000, bins=10)
    assert flat["kl_uniform_nats"] == pytest.approx(0) and flat["chi2_uniform"]["statistic"] == pytest.approx(0)
    assert summarize([]) == {"count": 0}


def _synthetic_result(tmp_path, *extra: str) -> tuple[object, dict]:
    cfg = compose(
        [
            "logger=none",
            f"output_dir={tmp_path / 'out'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.num_docs=200",
            "data.num_train_queries=80",
            "data.num_val_queries=10",
            "data.num_test_queries=10",
            "data.num_topics=4",
            *extra,
        ]
    )
    return cfg, analyse(cfg, Options(bins=10))


def test_outputs_are_written_atomically_with_the_expected_keys(tmp_path, monkeypatch):
    cfg, result = _synthetic_result(tmp_path, "data.answer_bias_keep_first=0.3")
    out = tmp_path / "out"
    png, js = write_outputs(result, out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(js.read_text())
    assert set(saved) == {"definition", "settings", "answer_bias", "series", "figure"}
    assert set(saved["series"]) == {"original", "rotated", "biased", "biased_rotated"}
    for s in saved["series"].values():
        assert {
            "count",
            "mean",
            "median",
            "quantiles",
            "share_first_10",
            "share_first_25",
            "share_first_k",
            "ks_uniform",
            "chi2_uniform",
            "kl_uniform_nats",
            "histogram",
            "units",
            "questions",
        } <= set(s)
        assert len(s["histogram"]["counts"]) == 10
    assert saved["series"]["biased"]["share_first_k"] == 1.0
    assert saved["answer_bias"]["kept"] == saved["series"]["biased"]["questions"]
    assert sorted(p.name for p in out.iterdir()) == [JSON_NAME, PNG_NAME]

    # a failure while writing leaves the previous files whole and no temp file behind
    before = js.read_bytes(), png.read_bytes()
    import core.io

    def broken_dump(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(core.io.json, "dump", broken_dump)
    result["series"]["original"]["mean"] = 0.0
    with pytest.raises(RuntimeError, match="disk full"):
        write_outputs(result, out)
    assert js.read_bytes() == before[0]
    assert sorted(p.name for p in out.iterdir()) == [JSON_NAME, PNG_NAME]


def test_val_split_uses_the_evaluation_rotation_and_has_no_biased_series(tmp_path):
    cfg = compose(["logger=none", f"data.cache_dir={tmp_path}", "data.answer_bias_keep_first=0.3"])
    result = analyse(cfg, Options(split="test", bins=10))
    assert set(result["series"]) == {"original", "rotated"} and result["answer_bias"] is None
    assert result["series"]["original"]["count"] == 60  # one answer per test question
    with pytest.raises(InputError, match="analysis.split"):
        analyse(cfg, Options(split="dev"))


@pytest.mark.slow
def test_cli_on_synthetic_writes_outputs_and_logs_to_wandb_offline(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    proc = run_script(
        "evaluate.py",
        "analysis=answer_positions",
        "logger=wandb",
        f"output_dir={out}",
        f"data.cache_dir={tmp_path / 'c'}",
        "data.answer_bias_keep_first=0.25",
        "analysis.epochs=2",
        env=env,
    )
    assert "biased_rotated" in proc.stdout and "of 400 training questions kept" in proc.stdout
    saved = json.loads((out / JSON_NAME).read_text())
    assert saved["settings"]["epochs"] == 2
    assert saved["series"]["rotated"]["count"] == 2 * saved["series"]["original"]["count"] == 800
    assert (out / PNG_NAME).read_bytes()[:4] == b"\x89PNG"
    (run,) = (out / "wandb").glob("offline-run-*")
    assert list(run.glob("files/media/images/answer_positions/histogram_*.png"))


@pytest.mark.parametrize(
    "args, key",
    [
        (["data.answer_bias_keep_first=1.5"], "data.answer_bias_keep_first"),
        (["data.answer_bias_keep_first=0"], "data.answer_bias_keep_first"),
        (["analysis.bins=0"], "analysis.bins"),
        (["analysis.spans=last"], "analysis.spans"),
        (["analysis.epochs=0"], "analysis.epochs"),
        (["data.no_such_key=1"], "data.no_such_key"),
    ],
)
@pytest.mark.slow
def test_cli_bad_values_are_one_line_errors(tmp_path, args, key):
    out = tmp_path / "out"
    proc = run_script(
        "evaluate.py", "analysis=answer_positions", "logger=none", f"output_dir={out}", *args, check=False
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], proc.stderr
    assert not out.exists()  # nothing written before the input is valid


@pytest.mark.data("squad_v1.1_dev/dev-v1.1.json.gz")
@pytest.mark.slow
def test_real_squad_rotation_flattens_and_the_biased_split_is_early(tmp_path):
    cfg = compose(["data=squad_biased", "logger=none", f"data.cache_dir={tmp_path}"])
    s = analyse(cfg, Options())["series"]
    orig, rot, biased, debiased = s["original"], s["rotated"], s["biased"], s["biased_rotated"]
    assert orig["questions"] == 6880 and biased["questions"] == 2220
    assert biased["share_first_k"] == 1.0 and biased["share_first_25"] == 1.0
    assert orig["share_first_k"] < 0.4  # far from all: 0.34 of the spans
    # rotation (Eq. 7) flattens: closer to uniform by KS distance, chi-square and KL, mean near 1/2
    for before, after in ((orig, rot), (biased, debiased)):
        assert after["ks_uniform"]["statistic"] < before["ks_uniform"]["statistic"] / 3
        assert after["kl_uniform_nats"] < before["kl_uniform_nats"] / 3
        assert abs(after["mean"] - 0.5) < 0.03
    assert rot["ks_uniform"]["statistic"] < 0.03 and 0.2 < rot["share_first_25"] < 0.3


@pytest.mark.slow
def test_evaluate_analysis_entry_matches_the_library_call(tmp_path):
    """`python evaluate.py analysis=answer_positions` (the analysis config group; the only command line) writes what
    `analyse` returns for the same options; its keys are validated like any group's."""
    out = tmp_path / "evaluate"
    args = ["logger=none", f"output_dir={out}", f"data.cache_dir={tmp_path / 'c'}"]
    run_script("evaluate.py", "analysis=answer_positions", "analysis.epochs=2", "analysis.bins=10", *args)
    a = json.loads((out / JSON_NAME).read_text())
    b = json.loads(json.dumps(analyse(compose(args), Options(epochs=2, bins=10))))
    assert a == b and a["settings"]["bins"] == 10
    bad = run_script(
        "evaluate.py", "analysis=answer_positions", "analysis.bin=3", f"output_dir={tmp_path / 'x'}", check=False
    )
    assert bad.returncode == 2 and "analysis.bin" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_registry_refuses_two_definitions_under_one_name():
    from core.registry import Registry

    reg = Registry("thing")

    def make():
        def build():
            return 1

        return build

    first = make()
    reg.register("a")(first)
    reg.register("a")(first)  # the same definition again (python -m imports a module twice): accepted
    with pytest.raises(RuntimeError, match="registered twice"):
        reg.register("a")(lambda: 2)
