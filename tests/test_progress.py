"""Progress of the long phases (core/progress.py): the lines a log gets, their times, rank 0 only, and a real job's."""

from __future__ import annotations

import re
import time

import pytest
from conftest import run_script

from core import progress
from core.errors import InputError

# the two shapes of every phase's lines (docs/logging.md)
DONE = re.compile(r"^(?P<name>.+) \.\.\. done in (?P<s>\d+\.\d) s$")
SO_FAR = re.compile(
    r"^(?P<name>.+) \.\.\. (?P<s>\d+) s so far(, (?P<stage>[^,]+))?(, (?P<count>[\d,/]+) \w+ \(.+/s\))?$"
)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_slow_phase_prints_progress_and_its_time_quick_phase_nothing(monkeypatch, capsys):
    monkeypatch.setenv(progress.QUIET_ENV, "0.3")
    monkeypatch.setenv(progress.EVERY_ENV, "0.2")
    with progress.phase("quick phase (3 items)", total=3, unit="items") as p:
        p.advance(3)
    t0 = time.monotonic()
    with progress.phase("slow phase (4 items)", total=4, unit="items") as p:
        for _ in range(4):
            time.sleep(0.25)
            p.advance()
    wall = time.monotonic() - t0
    out = capsys.readouterr()
    assert out.out == ""  # progress goes to stderr, stdout keeps the job's results
    lines = _lines(out.err)
    assert not any("quick phase" in ln for ln in lines), lines
    done = [m for m in map(DONE.match, lines) if m]
    assert [m["name"] for m in done] == ["slow phase (4 items)"]
    assert abs(float(done[0]["s"]) - wall) <= 0.15  # its own clock, against the one around the block
    assert lines[-1] == done[0].string  # the done line comes last
    so_far = [SO_FAR.match(ln) for ln in lines[:-1]]
    assert so_far and all(m and m["name"] == "slow phase (4 items)" for m in so_far), lines
    counts = [int(m["count"].split("/")[0]) for m in so_far if m["count"]]
    assert counts == sorted(counts) and all(m["count"].endswith("/4") for m in so_far if m["count"])
    assert progress.times()["slow phase"] >= float(done[0]["s"]) - 0.05
    assert "quick phase" not in progress.times()


def test_stage_restarts_the_count(monkeypatch, capsys):
    monkeypatch.setenv(progress.QUIET_ENV, "0")
    monkeypatch.setenv(progress.EVERY_ENV, "0.1")
    with progress.phase("two passes (5 docs)", unit="docs") as p:
        p.stage("tokenising", total=5)
        p.advance(5)
        time.sleep(0.35)
        p.stage("scoring", total=5)
        p.advance(2)
        time.sleep(0.35)
    lines = _lines(capsys.readouterr().err)
    stages = {m["stage"]: m["count"] for m in map(SO_FAR.match, lines) if m}
    assert stages.get("tokenising") == "5/5" and stages.get("scoring") == "2/5", lines
    assert DONE.match(lines[-1])


def test_only_rank_zero_prints(monkeypatch, capsys):
    monkeypatch.setenv(progress.QUIET_ENV, "0")
    monkeypatch.setenv("LOCAL_RANK", "1")  # a DDP child of Lightning's launcher
    with progress.phase("rank one's phase"):
        time.sleep(0.05)
    assert capsys.readouterr().err == ""


def test_failed_phase_prints_no_done_line(monkeypatch, capsys):
    monkeypatch.setenv(progress.QUIET_ENV, "0")
    with pytest.raises(ValueError), progress.phase("failing phase"):
        raise ValueError("bad line")
    assert "failing phase" not in capsys.readouterr().err


def test_bad_threshold_names_the_variable(monkeypatch):
    monkeypatch.setenv(progress.QUIET_ENV, "soon")
    with pytest.raises(InputError, match=progress.QUIET_ENV), progress.phase("any"):
        pass


@pytest.mark.slow
def test_bm25_evaluation_prints_its_phases(tmp_path):
    """A tiny BM25 evaluation of MS MARCO-style files with the threshold at 0: each phase says its time, one line."""
    docs = {f"d{i}": f"passage {i} about {w} and {w}s" for i, w in enumerate(["cats", "dogs", "fish", "birds"] * 3)}
    (tmp_path / "collection.tsv").write_text("".join(f"{d}\t{t}\n" for d, t in docs.items()))
    (tmp_path / "queries.tsv").write_text("q1\tcats\nq2\tfish birds\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d0 1\nq2 0 d2 1\n")
    # the collection and the test split: what BM25 of model.split=test reads (it refuses the other splits' files)
    args = [f"data.collection={tmp_path / 'collection.tsv'}"]
    args += [f"data.test_queries={tmp_path / 'queries.tsv'}", f"data.test_qrels={tmp_path / 'qrels.txt'}"]
    proc = run_script(
        "evaluate.py",
        "model=bm25",
        "data=tsv",
        *args,
        f"data.cache_dir={tmp_path / 'cache'}",
        "logger=none",
        f"output_dir={tmp_path / 'out'}",
        extra_env={progress.QUIET_ENV: "0"},
    )
    done = [m["name"] for m in map(DONE.match, _lines(proc.stderr)) if m]
    assert f"building the document store of {tmp_path / 'collection.tsv'}" in done, proc.stderr
    assert "building the BM25 index (12 passages)" in done and "BM25 search (2 queries)" in done, proc.stderr
    assert len(done) == len(set(done))  # one line per phase
    assert not any(DONE.match(ln) or SO_FAR.match(ln) for ln in _lines(proc.stdout))  # stdout: the results only


def test_phase_times_go_to_the_wandb_summary(monkeypatch):
    """log_results_table puts `phase_s` (the phases that printed) into the run summary beside `results`."""
    from types import SimpleNamespace

    from callbacks.loggers import log_results_table

    monkeypatch.setenv(progress.QUIET_ENV, "0")
    with progress.phase("summarised phase (2 items)"):
        time.sleep(0.05)
    summary: dict = {}
    logger = SimpleNamespace(log_table=lambda **kw: None, experiment=SimpleNamespace(summary=summary))
    assert log_results_table(logger, {"test": {"ndcg_cut_10": 0.5}}, extra={"best_step": 3})
    assert summary["results"] == {"test": {"ndcg_cut_10": 0.5}} and summary["best_step"] == 3
    assert summary["phase_s"]["summarised phase"] >= 0.05
