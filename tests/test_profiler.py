"""trainer.profiler: Lightning's profilers as a config key, their reports written into the run's folder, and the
condensed form bench_gpu_speed prints of them (`profile=`)."""

from __future__ import annotations

import pytest
from conftest import module_and_data, small_run

from bench.bench_gpu_speed import profile_report
from core.errors import InputError
from pipeline.config import compose


def test_a_profiler_that_lightning_lacks_is_a_one_line_error():
    with pytest.raises(InputError) as e:
        compose(["trainer.profiler=nvtx"])
    msg = str(e.value)
    assert msg.startswith("config key 'trainer.profiler'") and "simple" in msg and "\n" not in msg


def test_profiler_is_off_by_default_and_each_kind_builds_lightnings_own(tmp_path):
    from pytorch_lightning.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler

    from pipeline.stages import build_profiler, build_trainer

    assert compose([]).trainer.profiler is None and compose(["trainer=ddp"]).trainer.profiler is None
    for kind, cls in [("simple", SimpleProfiler), ("advanced", AdvancedProfiler), ("pytorch", PyTorchProfiler)]:
        profiler = build_profiler(kind, tmp_path)
        assert type(profiler) is cls and profiler.dirpath == tmp_path and profiler.filename == "profile"
    cfg = compose(small_run(f"output_dir={tmp_path / 'run'}"))
    assert type(build_trainer(cfg, None, checkpoints=False).profiler).__name__ == "PassThroughProfiler"


@pytest.mark.slow  # a 3-step fit (~10 s)
def test_simple_profile_of_a_fit_is_written_to_the_run_and_condensed_with_lightnings_figures(tmp_path, tiny_bert):
    """The fit writes <output_dir>/profile/fit-profile.txt; profile_report gives each action's calls, total and mean
    as the profiler recorded them (its durations, summed here), largest total first."""
    from pipeline.stages import build_trainer

    steps = 3
    cfg = compose(
        small_run(
            f"model.backbone={tiny_bert}",
            "data.batch_size=4",
            f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}",
            "trainer.limit_val_batches=0",
            "trainer.profiler=simple",
            "eval.ats_passages=0",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"output_dir={tmp_path / 'run'}",
        )
    )
    module, dm = module_and_data(cfg)
    trainer = build_trainer(cfg, None, checkpoints=False)
    trainer.fit(module, datamodule=dm)
    recorded = dict(trainer.profiler.recorded_durations)
    assert (tmp_path / "run" / "profile" / "fit-profile.txt").is_file()

    report = profile_report(tmp_path / "run").splitlines()
    assert report[0] == "-- fit-profile.txt" and report[1].split() == ["total", "s", "calls", "mean", "ms", "action"]
    rows = {parts[3]: parts[:3] for parts in (line.split(None, 3) for line in report[2:])}
    assert int(rows["run_training_batch"][1]) == steps == len(recorded["run_training_batch"])
    for action in ("run_training_batch", "[Strategy]SingleDeviceStrategy.training_step"):
        total, calls, mean = rows[action]
        durations = recorded[action]
        assert int(calls) == len(durations)
        assert float(total) == pytest.approx(sum(durations), abs=1e-3)
        assert float(mean) == pytest.approx(1000 * sum(durations) / len(durations), rel=1e-3, abs=0.01)
    totals = [float(v[0]) for v in rows.values()]
    assert totals == sorted(totals, reverse=True)
    # a callback's state dict is not part of its action's name
    assert not any("{" in name for name in rows)


def test_profile_report_of_a_run_without_profile_is_none(tmp_path):
    assert profile_report(tmp_path) is None


def test_cprofile_report_names_the_main_threads_costliest_functions(tmp_path):
    """bench_gpu_speed profile=cprofile: pstats' own tables of the run's file, own time first."""
    import cProfile

    from bench.bench_gpu_speed import cprofile_report

    def costly_host_work():
        return sum(i * i for i in range(200_000))

    profiler = cProfile.Profile()
    profiler.runcall(costly_host_work)
    profiler.dump_stats(tmp_path / "run.out")
    report = cprofile_report(tmp_path / "run.out", rows=5)
    assert "Ordered by: internal time" in report and "Ordered by: cumulative time" in report
    assert report.count("costly_host_work") == 3  # once per table: this file is the project's too
    own = report.split("-- the project's functions", 1)[1].splitlines()
    assert any(line.endswith("(costly_host_work)") and "tests/test_profiler.py:" in line for line in own)
    assert not any("sum" in line.split()[-1] for line in own[2:])  # builtins are not the project's


def test_cprofile_is_no_trainer_profiler():
    """profile=cprofile wraps the subprocess; only Lightning's kinds become trainer.profiler."""
    from pathlib import Path

    import bench.bench_gpu_speed as bgs

    names = ["collection", "queries.train", "qrels.train", "triples", "queries.dev", "qrels.dev"]
    data = {
        "files": {n: Path(n) for n in [*names, "queries.test", "qrels.test"]},
        "val_run": Path("val.run"),
        "test_run": Path("test.run"),
        "passages": 10,
    }
    for kind, want in [("cprofile", []), ("simple", ["trainer.profiler=simple"])]:
        opts = bgs.parse_args(["tiny=true", f"profile={kind}"])
        cmd = bgs.ours_command("colbert-train", "bb", 4, opts, data, Path("cache"), Path("out"))["cmd"]
        assert [a for a in cmd if a.startswith("trainer.profiler")] == want


def test_pyspy_report_splits_the_main_threads_step_from_other_threads_and_workers(tmp_path):
    """bench_gpu_speed profile=pyspy: py-spy's raw lines (`process;thread;frames count`) condensed. The main thread is
    the one whose id is its process' (named or not); its samples under the training loop's step are counted apart from
    the rest of the run, innermost frames and the branches below the shared trunk; other threads by name, the
    DataLoader workers (child processes) together."""
    from bench.bench_gpu_speed import PYSPY_INSIDE, pyspy_report

    run, step = (
        'process 100:"python train.py"',
        "_TrainingEpochLoop.advance (pytorch_lightning/loops/training_epoch_loop.py:352)",
    )
    lines = [
        f"{run};thread (100): MainThread;main (pipeline/cli.py:62);{step};backward (torch/autograd/graph.py:979) 6",
        f"{run};thread (100);main (pipeline/cli.py:62);{step};Connection._recv (multiprocessing/connection.py:395) 3",
        f"{run};thread (100): MainThread;main (pipeline/cli.py:62);{step} 1",
        f"{run};thread (100): MainThread;main (pipeline/cli.py:62);load (datamodules/docstore.py:10) 40",
        f"{run};thread (107): Thread-2 (_pin_memory_loop);_pin_memory_loop (pin_memory.py:52) 9",
        f'{run};process 101:"python train.py";thread (101): MainThread;_worker_loop (worker.py:300) 5',
        f'{run};process 102:"python train.py";thread (102);Queue.get (queues.py:100) 2',
        "garbage without a count",
    ]
    (tmp_path / "raw.txt").write_text("\n".join(lines) + "\n")
    report = pyspy_report(tmp_path / "raw.txt", PYSPY_INSIDE["steps"])
    head, rest = report.split("\n", 1)
    assert "10 samples (0.1 s; 0.2 s outside it)" in head  # 6 + 3 + 1 under the step at 200 Hz; 40 outside it
    assert "      6  60.0 %  backward (torch/autograd/graph.py:979)" in rest
    assert "      3  30.0 %  Connection._recv (multiprocessing/connection.py:395)" in rest
    branches = rest.split("but the trunk", 1)[1].split("-- other threads", 1)[0]
    assert "main (pipeline/cli.py:62)" not in branches and "backward" in branches  # the trunk is left out
    others = rest.split("-- other threads", 1)[1]
    assert "      9  Thread-2 (_pin_memory_loop): _pin_memory_loop" in others
    assert "      7  child processes (DataLoader workers): _worker_loop (worker.py:300) 5, Queue.get" in others
