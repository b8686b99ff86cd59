"""What reaches the W&B dashboard besides the scalars (issue 8): the isotropy before/after figure of a head (head
stage and evaluate.py head_ckpt=) and the test results table of every run, checked in the offline run folder and in
the run's record file (`run-*.wandb`: summary, name, group, job type), against the run's own metrics.json and PNGs."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from conftest import GRID_SYN, finetune_steps, glow_head, job_args, run_script, small_run

SMALL = small_run("trainer.log_every_n_steps=1", logger=True)
GLOW = glow_head(batch_size=256)
PNG = b"\x89PNG\r\n\x1a\n"


def offline_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    return env


def wandb_records(path: Path):
    """The protobuf records of a W&B run file, read independently of wandb's own reader: a 7-byte file header
    (':W&B', magic, version), then LevelDB-log framing in 32 KiB blocks (7-byte record headers: crc32, length,
    type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4; a block tail under 7 bytes is padding)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts + chunk if kind == 4 else chunk)
            parts = b""
            yield rec
        else:
            parts = chunk if kind == 2 else parts + chunk


def offline_run(out: Path) -> tuple[Path, dict, dict]:
    """(the offline run folder, its final summary as a nested dict, its run record's name/group/job_type)."""
    (run,) = (out / "wandb").glob("offline-run-*")
    (records,) = run.glob("run-*.wandb")
    summary, meta = {}, {}
    for rec in wandb_records(records):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            meta = {"name": rec.run.display_name, "group": rec.run.run_group, "job_type": rec.run.job_type}
        elif kind == "summary":
            for item in rec.summary.update:
                path = list(item.nested_key) or [item.key]
                node = summary
                for k in path[:-1]:
                    node = node.setdefault(k, {})
                node[path[-1]] = json.loads(item.value_json)
    return run, summary, meta


def table(run: Path, key: str) -> dict[str, dict]:
    """The last W&B table logged under `key`, as {first column: {column: value}}."""
    files = sorted(
        (run / "files" / "media" / "table").glob(f"{key}_*.table.json"), key=lambda p: int(p.name.split("_")[-2])
    )
    t = json.loads(files[-1].read_text())
    return {row[0]: dict(zip(t["columns"][1:], row[1:])) for row in t["data"]}


def images(run: Path, key: str) -> list[Path]:
    return sorted((run / "files" / "media" / "images").glob(f"{key}_*.png"), key=lambda p: int(p.name.split("_")[-2]))


def assert_row(row: dict, metrics: dict) -> None:
    numbers = {
        k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "best_step"
    }  # a step, not a measure
    assert {k: v for k, v in row.items() if v is not None} == pytest.approx(numbers, rel=1e-12)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_bert) -> Path:
    out = tmp_path_factory.mktemp("ft")
    run_script(
        "train.py",
        *SMALL,
        "logger=none",
        f"model.backbone={tiny_bert}",
        *finetune_steps(4),
        f"output_dir={out}",
    )
    return out / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_train_run_logs_its_results_table(tmp_path, tiny_bert):
    out = tmp_path / "ft"
    run_script(
        "train.py",
        *SMALL,
        "logger=wandb",
        f"model.backbone={tiny_bert}",
        *finetune_steps(2, before_training=True),
        f"output_dir={out}",
        f"data.cache_dir={tmp_path / 'c'}",
        env=offline_env(tmp_path),
    )
    metrics = json.loads((out / "metrics.json").read_text())
    run, summary, meta = offline_run(out)
    rows = table(run, "test/results")
    assert list(rows) == ["before training", "after training"]
    assert_row(rows["after training"], metrics)
    assert_row(rows["before training"], metrics["before_training"])
    assert summary["results"]["after training"]["ndcg_cut_10"] == pytest.approx(metrics["ndcg_cut_10"], rel=1e-12)
    assert summary["test/results"]["_type"] == "table-file" and summary["test/results"]["nrows"] == 2
    steps = [v["step"] for v in json.loads((out / "validation.json").read_text())["validations"]]
    assert steps == [0, 2] and summary["best_step"] == metrics["best_step"] in steps  # the tested checkpoint's step
    assert summary["test/ndcg_cut_10"] == pytest.approx(
        metrics["ndcg_cut_10"], abs=1e-6
    )  # Lightning's scalar, as logged
    assert {"val/ndcg_cut_10", "val/iw", "val/avgcos", "train/loss", "test/mats"} <= set(summary)
    assert meta == {"name": "ft", "group": "colbert-synthetic", "job_type": "train"}
    # ATS curves (callbacks/ats.py) before training, at the validation and at the final test
    assert len(list((run / "files/media/table/test").glob("ats_curve_table_*.table.json"))) == 2
    assert summary["val/ats_curve_table"]["_type"] == "table-file"
    # no head, no before/after figure
    assert not list(out.glob("isotropy_*.png")) and not list((run / "files").rglob("isotropy_cosines_*"))


@pytest.mark.slow
def test_head_stage_and_evaluation_log_isotropy_figures_and_tables(tmp_path, finetuned):
    out = tmp_path / "glow"
    env = offline_env(tmp_path)
    run_script(
        "train.py",
        *SMALL,
        "logger=wandb",
        "stage=head",
        f"ckpt={finetuned}",
        *GLOW,
        "head.epochs=2",
        f"data.cache_dir={tmp_path / 'c'}",
        f"output_dir={out}",
        env=env,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    run, summary, meta = offline_run(out)
    assert meta == {"name": "glow", "group": "colbert-synthetic", "job_type": "head"}
    # the figure after each of the 2 epochs' validations and after the test; the PNGs in the output folder are the
    # last of each, byte for byte what W&B holds
    val, test = images(run, "val/isotropy_cosines"), images(run, "test/isotropy_cosines")
    assert len(val) == 2 and len(test) == 1
    assert (out / "isotropy_val.png").read_bytes() == val[-1].read_bytes()
    assert (out / "isotropy_test.png").read_bytes() == test[0].read_bytes() and test[0].read_bytes()[:8] == PNG
    assert val[0].read_bytes() != val[1].read_bytes()  # the head trained between the two validations
    assert summary["test/isotropy_cosines"]["_type"] == "images/separated"
    rows = table(run, "test/results")
    assert list(rows) == ["Ft", "Ft -> glow"]
    assert_row(rows["Ft"], metrics["before_head"])
    assert_row(rows["Ft -> glow"], {k: v for k, v in metrics.items() if not k.endswith("_raw")})
    assert summary["results"]["Ft -> glow"]["iw"] == pytest.approx(metrics["iw"], rel=1e-12)
    assert "mats" in summary["results"]["Ft -> glow"] and "mats" not in summary["results"]["Ft"]  # no empty values
    assert summary["test/iw_raw"] == pytest.approx(metrics["before_head"]["iw"], abs=1e-6)

    ev = tmp_path / "ev"
    run_script(
        "evaluate.py",
        *job_args("evaluate.py", [*SMALL, f"head_ckpt={next((out / 'checkpoints').glob('best-*.ckpt'))}"]),
        "logger=wandb",
        f"data.cache_dir={tmp_path / 'c'}",
        f"output_dir={ev}",
        env=env,
    )
    em = json.loads((ev / "metrics.json").read_text())
    run, summary, meta = offline_run(ev)
    assert meta == {"name": "eval-ev", "group": "colbert-synthetic", "job_type": "eval"}
    (test,) = images(run, "test/isotropy_cosines")
    assert (ev / "isotropy_test.png").read_bytes() == test.read_bytes()
    rows = table(run, "test/results")
    assert_row(rows["Ft"], em["before_head"])
    assert rows["Ft -> glow"]["ndcg_cut_10"] == pytest.approx(metrics["ndcg_cut_10"], abs=1e-6)


def test_figure_sample_is_uniform_paired_and_independent_of_batching():
    """The figure's sample: the rows with the `size` smallest of one seeded uniform key per row, whatever the batch
    sizes, and the same rows of the raw and the head stream."""
    import torch

    from callbacks.isotropy import _KeptSample

    x = torch.randn(500, 4)
    samples = []
    for cuts in ([500], [7, 93, 200, 200], [1] * 500):
        kept, start = _KeptSample(50, torch.Generator().manual_seed(3)), 0
        for n in cuts:
            kept.add({"_raw": x[start : start + n], "": 2 * x[start : start + n]})
            start += n
        samples.append(kept.rows)
    keys = torch.rand(500, generator=torch.Generator().manual_seed(3))
    expect = x[torch.argsort(keys)[:50].sort().values]
    assert torch.equal(samples[0]["_raw"], expect)
    for rows in samples[1:]:
        # a generator draws the same stream in any chunking, so the keys and the sample are the same
        assert torch.equal(rows["_raw"], expect) and torch.equal(rows[""], 2 * expect)


def _merge_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    from callbacks.isotropy import RANK_STRIDE, _KeptSample

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        x = torch.arange(300 * 3, dtype=torch.float32).view(300, 3)
        kept = _KeptSample(40, torch.Generator().manual_seed(5 + RANK_STRIDE * rank))
        shard = x[rank::world]
        for chunk in shard.split(23):
            kept.add({"": chunk, "_raw": -chunk})
        merged = kept.merged()
        if rank == 0:
            torch.save(merged, out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_figure_sample_is_drawn_over_all_ddp_ranks(tmp_path):
    """Under DDP the figure's sample comes from every rank's shard: the 40 rows whose keys (each rank's own seeded
    stream over its shard) are smallest over both ranks, raw and head rows paired; brute force over all keys."""
    import torch
    import torch.multiprocessing as mp

    from callbacks.isotropy import RANK_STRIDE

    out = tmp_path / "merged.pt"
    mp.spawn(_merge_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    merged = torch.load(out)
    x = torch.arange(300 * 3, dtype=torch.float32).view(300, 3)
    rows, keys = [], []
    for rank in range(2):
        shard = x[rank::2]
        rows.append(shard)
        keys.append(torch.rand(len(shard), generator=torch.Generator().manual_seed(5 + RANK_STRIDE * rank)))
    rows, keys = torch.cat(rows), torch.cat(keys)
    smallest = sorted(range(len(keys)), key=lambda i: keys[i].item())[:40]
    expect = rows[sorted(smallest)]
    assert torch.equal(merged[""], expect) and torch.equal(merged["_raw"], -expect)
    firsts = {int(r[0].item()) // 3 % 2 for r in merged[""]}  # row index parity = the rank it came from
    assert firsts == {0, 1}


def test_histogram_cosines_average_to_avgcos():
    """The figure histograms the pairs whose mean is avgcos (isotropy paper Eq. 4): their mean equals the metric's."""
    import torch

    from callbacks.isotropy import pairwise_cosines
    from metrics.isotropy import avg_cos

    x = torch.randn(300, 8) + 0.5
    x[7] = 0  # no direction: left out by both
    cos = pairwise_cosines(x)
    assert len(cos) == 299 * 298 // 2
    assert float(cos.mean()) == pytest.approx(float(avg_cos(x)), abs=1e-10)
    assert float(cos.min()) >= -1 - 1e-12 and float(cos.max()) <= 1 + 1e-12


@pytest.mark.slow
def test_analysis_runs_are_named_and_typed_for_the_dashboard(tmp_path):
    from callbacks.loggers import wandb_init_args
    from pipeline.config import compose

    a = wandb_init_args(compose(["output_dir=outputs/x"]), "whitebox-x", job="analysis")
    assert (a["name"], a["group"], a["job_type"]) == ("whitebox-x", "colbert-synthetic", "analysis")
    out = tmp_path / "pos"
    run_script(
        "evaluate.py",
        "analysis=answer_positions",
        "logger=wandb",
        f"output_dir={out}",
        f"data.cache_dir={tmp_path / 'c'}",
        "analysis.epochs=1",
        env=offline_env(tmp_path),
    )
    run, summary, meta = offline_run(out)
    assert meta == {"name": "answer_positions-pos", "group": "colbert-synthetic", "job_type": "analysis"}
    (png,) = images(run, "answer_positions/histogram")
    assert png.read_bytes() == (out / "answer_positions.png").read_bytes()
    assert summary["answer_positions/histogram"]["_type"] == "images/separated"


@pytest.mark.slow
def test_grid_table_is_logged_as_its_own_run(tmp_path):
    """experiments.py with cells logging to W&B: the grid's table goes into a `<grid>-table` run of the grid's group
    (job type grid-table), one line per (train, eval, method), the same means and changes as results.json."""
    grid = {
        "name": "tbl",
        "baseline": "bm25",
        "rows": {"bm25": ["model=bm25", "model.depth=20"], "bm25_k": ["model=bm25", "model.depth=20", "model.k1=0.6"]},
        "train_data": {"syn": GRID_SYN},
        "seeds": [1],  # one seed: each cell is a fresh interpreter with W&B (~15 s); means over seeds: test_grid.py
        "measures": ["ndcg_cut_10"],
        "output_root": str(tmp_path / "grids"),
        "launcher": "subprocess",
        "common": ["logger=wandb", f"data.cache_dir={tmp_path / 'c'}"],
    }
    gfile = tmp_path / "tbl.yaml"
    gfile.write_text(json.dumps(grid))
    run_script("experiments.py", f"grid={gfile}", env=offline_env(tmp_path))
    root = tmp_path / "grids" / "tbl"
    run, summary, meta = offline_run(root)
    assert meta == {"name": "tbl-table", "group": "tbl", "job_type": "grid-table"}
    (f,) = (run / "files" / "media" / "table").glob("results_table_*.table.json")
    t = json.loads(f.read_text())
    rows = {r[2]: dict(zip(t["columns"], r)) for r in t["data"]}
    cells = json.loads((root / "results.json").read_text())["cells"]
    mean = {r: next(c["metrics"]["ndcg_cut_10"] for c in cells if c["row"] == r) for r in ("bm25", "bm25_k")}
    assert set(rows) == {"bm25", "bm25_k"} and rows["bm25"]["train"] == "syn" and rows["bm25"]["eval"] == "syn"
    assert rows["bm25_k"]["ndcg_cut_10"] == pytest.approx(mean["bm25_k"], rel=1e-9)
    assert rows["bm25_k"]["ndcg_cut_10 change %"] == pytest.approx(
        100 * (mean["bm25_k"] - mean["bm25"]) / mean["bm25"], rel=1e-9
    )
    # each cell is a run of the grid's group named after its cell, BM25 evaluations included, with its results
    cell = root / "bm25_k" / "syn" / "seed1"
    crun, csummary, cell_meta = offline_run(cell)
    assert cell_meta == {"name": "bm25_k-syn-syn-seed1", "group": "tbl", "job_type": "eval"}
    metrics = json.loads((cell / "metrics.json").read_text())
    assert csummary["test/ndcg_cut_10"] == pytest.approx(metrics["ndcg_cut_10"], rel=1e-9)
    assert_row(table(crun, "test/results")["test"], metrics)
