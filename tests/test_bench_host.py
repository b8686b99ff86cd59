"""bench/bench_host.py (`python -m bench.bench_host key=value ...`): which data.pretokenize settings it measures,
its per-batch reading, the before / after table, and a small run end to end that writes a well-formed record."""

from __future__ import annotations

import pytest
from conftest import read_dated_record

from bench import bench_host


def test_settings_follow_the_config_key():
    assert bench_host.settings("both", exists=False) == [None]  # today's path only
    assert bench_host.settings("off", exists=False) == [None]
    with pytest.raises(SystemExit) as e:
        bench_host.settings("on", exists=False)
    assert e.value.code == 2
    assert bench_host.settings("both", exists=True) == [False, True]
    assert bench_host.settings("on", exists=True) == [True]


def test_per_batch_is_the_mean_after_warmup():
    ends = [0.0, 5.0, 6.0, 7.5, 8.5, 20.0]  # batch ends: 5 s for the second batch, then 1, 1.5, 1, 11.5 s
    assert bench_host.per_batch(ends, warmup=2) == pytest.approx(15 / 4)
    assert bench_host.per_batch(ends, warmup=1) == pytest.approx(4.0)
    assert bench_host.per_batch([1.0], warmup=1) is None


def test_ratio_rows():
    rows = [
        {"path": "train loader", "batch": 32, "pretokenize": "off", "host_ms": 12.0},
        {"path": "train loader", "batch": 32, "pretokenize": "on", "host_ms": 3.0},
        {"path": "encode", "batch": 32, "pretokenize": "n/a", "host_ms": 1.0},
    ]
    assert bench_host.ratio_rows(rows) == [{"path": "train loader", "batch": 32, "off": 12.0, "on": 3.0, "ratio": 4.0}]


def test_small_run_writes_a_record(tmp_path):
    """Data, a 1-layer BERT, a Lightning fit and test in this process: 5 s on the shared 2-core machine (not `slow`)."""
    result = bench_host.main(
        [
            "batches=4",
            "n=2",
            "warmup=1",
            "passages=500",
            "test_queries=5",
            f"work_dir={tmp_path / 'work'}",
            f"record_dir={tmp_path / 'records'}",
        ]
    )
    paths = {r["path"] for r in result["rows"]}
    assert paths == set(bench_host.PATHS)
    settings = {r["pretokenize"] for r in result["rows"]}
    assert settings == ({"off", "on"} if result["pretokenize_exists"] else {"absent"})
    for r in result["rows"]:
        assert r["batch_ms"] > 0 and r["examples_per_batch"] == 4, r
        # no model in a loader row or in the stubbed encoder's row: their time is all host
        assert (r["model_ms"] is None) == r["path"].endswith(("loader", "host")), r
    text, tsv_rows = read_dated_record(
        *result["record"], tmp_path / "records", "python -m bench.bench_host batches=4", bench_host.COLUMNS
    )
    assert len(tsv_rows) == len(result["rows"])
    if not result["pretokenize_exists"]:
        assert "data.pretokenize: absent from this code" in text
