"""One run per output directory (core/lock.py): a second run into a directory in use stops with one line naming it
and the holder's pid (exit 2, nothing written); the lock of a killed run does not block the next one; a run stopped
by bad input leaves no lock file or folder behind; DDP children do not lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO, run_script

from core.errors import InputError
from core.lock import lock_files, output_dir_lock
from pipeline.cli import main
from pipeline.run import evaluate

BM25 = ["model=bm25", "data=synthetic", "logger=none"]

# evaluate.py whose BM25 job waits, holding the lock and having written nothing, until the file $GO exists
PAUSED = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
import pipeline.run
import retrieval.first_stage
from pipeline.cli import main

bm25 = retrieval.first_stage.run_bm25  # what the FIRST_STAGE entry `bm25` runs

def paused(*args, **kwargs):
    while not Path(os.environ["GO"]).exists():
        time.sleep(0.05)
    return bm25(*args, **kwargs)

retrieval.first_stage.run_bm25 = paused
sys.exit(main(sys.argv[1:], pipeline.run.evaluate))
"""


def start_paused(tmp_path, out, go) -> subprocess.Popen:
    script = tmp_path / "paused_evaluate.py"
    script.write_text(PAUSED.format(repo=str(REPO)))
    env = {**os.environ, "WANDB_MODE": "disabled", "GO": str(go)}
    return subprocess.Popen(
        [sys.executable, str(script), *BM25, f"output_dir={out}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_locked(proc: subprocess.Popen, out, timeout: float = 120) -> None:
    pid_file = lock_files(out)[1]
    deadline = time.monotonic() + timeout
    while not pid_file.is_file():
        assert proc.poll() is None, (
            f"the first run ended ({proc.returncode}) before taking the lock: {proc.communicate()}"
        )
        assert time.monotonic() < deadline, "the first run did not take the lock"
        time.sleep(0.1)


@pytest.mark.slow
def test_second_run_into_a_directory_in_use_stops(tmp_path):
    out, go = tmp_path / "bm25", tmp_path / "go"
    first = start_paused(tmp_path, out, go)
    try:
        wait_until_locked(first, out)
        second = run_script("evaluate.py", *BM25, f"output_dir={out}", check=False)
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"error: output_dir: '{out}' is in use by another run (pid {first.pid} on "
            f"{socket.gethostname()}); wait for it to end or choose another output_dir"
        ]
        assert "Traceback" not in second.stdout + second.stderr
        assert not out.exists()  # the second wrote nothing (and the first has not written yet)
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {
        "config.yaml",
        "metrics.json",
        "per_query.json",
        "run.trec",
        "versions.json",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25", "go", "paused_evaluate.py"]  # lock files gone


@pytest.mark.slow
def test_lock_of_a_killed_run_does_not_block(tmp_path):
    out = tmp_path / "bm25"
    first = start_paused(tmp_path, out, tmp_path / "never")
    wait_until_locked(first, out)
    first.kill()  # SIGKILL: no clean-up runs, the kernel drops the flock
    first.wait(timeout=60)
    assert all(p.exists() for p in lock_files(out))  # left behind, and taken over below
    run_script("evaluate.py", *BM25, f"output_dir={out}")
    assert (out / "metrics.json").is_file()
    assert not any(p.exists() for p in lock_files(out))


def test_run_stopped_by_bad_input_leaves_no_lock_or_folder(tmp_path, capsys):
    before = sorted(tmp_path.iterdir())
    out = tmp_path / "new" / "deeper" / "run"  # the lock's parent folders are created, then removed again
    rc = main(
        ["model=bm25", "data=squad", f"data.path={tmp_path / 'no.json'}", "logger=none", f"output_dir={out}"], evaluate
    )
    assert rc == 2 and "no.json" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == before


def test_lock_names_the_holder_and_ddp_children_do_not_lock(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with output_dir_lock(out):
        assert lock_files(out)[1].read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
        with pytest.raises(InputError, match=rf"'{out}' is in use by another run \(pid {os.getpid()} on "):
            with output_dir_lock(out):
                pass
        # Lightning's DDP children re-run the entry script while their parent (global rank 0) holds the lock
        for var in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID"):
            with monkeypatch.context() as m:
                m.setenv(var, "1")
                with output_dir_lock(out):
                    pass
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stop", ["error", "signal"])
def test_a_stopped_job_leaves_no_empty_output_dir_it_made(tmp_path, stop):
    """A job stopped by an error or a signal after its first write made output_dir, and before any file was kept there
    (third fault trial R1): the folder is removed with the lock files. One that existed before stays, empty or
    not, and so does one that keeps a file."""
    from callbacks.preemption import Signalled, raise_on_signals, restore_signals

    def job(out, keep):
        with output_dir_lock(out):
            (out / ".results.tmp-1").mkdir(parents=True)  # a staged set, as result_set makes it: makes out too
            if keep:
                (out / "metrics.json").write_text("{}")
            (out / ".results.tmp-1").rmdir()  # removed on the way out, as result_set does
            if stop == "error":
                raise InputError("data.path", "'x' does not exist")
            os.kill(os.getpid(), signal.SIGTERM)  # raise_on_signals: Signalled here
            time.sleep(5)

    for name, existed, keep in (("new", False, False), ("old", True, False), ("kept", False, True)):
        out = tmp_path / name
        if existed:
            out.mkdir()
        handlers = raise_on_signals()  # as pipeline/cli.py, once per job
        try:
            with pytest.raises(Signalled if stop == "signal" else InputError):
                job(out, keep)
        finally:
            restore_signals(handlers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "old"]  # "new" is gone, and every lock file
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["metrics.json"]


def test_a_rank_that_outlives_rank_0_removes_the_empty_output_dir_rank_0_made(tmp_path, monkeypatch):
    """Rank 0 (the lock's holder) SIGKILLed under DDP cannot remove the folder it made: a surviving rank does, told
    by the variable rank 0 set for the ranks it starts. Another rank's death (rank 0 lives on and removes it),
    another error, or a folder rank 0 did not make: it stays."""
    from core.lock import CREATED_VARIABLE
    from core.ranks import RankDied

    out = tmp_path / "out"
    with output_dir_lock(out):  # rank 0: says so while it holds the lock, not after
        made = os.environ[CREATED_VARIABLE]
    assert made == str(out.resolve()) and CREATED_VARIABLE not in os.environ
    monkeypatch.setenv("LOCAL_RANK", "1")

    def survive(error, variable):
        out.mkdir(exist_ok=True)
        with monkeypatch.context() as m:
            if variable:
                m.setenv(CREATED_VARIABLE, variable)
            with pytest.raises(type(error)):
                with output_dir_lock(out):
                    raise error
        return out.exists()

    assert survive(RankDied(2, "killed by SIGKILL"), made)
    assert survive(InputError("data.path", "'x' does not exist"), made)
    assert survive(RankDied(0, "its process ended"), str(tmp_path / "elsewhere"))
    assert not survive(RankDied(0, "its process ended"), made)
    assert sorted(tmp_path.iterdir()) == []
