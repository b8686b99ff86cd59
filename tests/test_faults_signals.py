"""Faults at any moment (issue 48): a signal before the job's handlers exist, and any rank's death under DDP.

- SIGINT / SIGTERM 0.5 s after an entry script starts (its imports take seconds) end with the one line and exit code
  of a later signal and write nothing (core/signals.py); so does a signal between the early handler and the job's,
  and one during compose.
- A rank SIGKILLed under 2-process gloo DDP (rank 0 or rank 1; training and the split index encoding) ends the
  other within seconds with `stopped: rank R died (...); <what was kept>`, exit code 1, and no process is left
  (core/ranks.py, callbacks/rank_watch.py). The kills come from tests/rank_faults.py.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, finetune_steps, job_args, sighup_default, small_run

EARLY = {
    "train.py": "nothing was written",
    "evaluate.py": "nothing was written",
    "experiments.py": "finished cells are kept: run the same command again to resume",
}


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler of its own for `sig` (SigCgt in /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


# ---- a signal while the entry script imports ----------------------------------------------------------------------
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "experiments.py"])
def test_signal_during_the_imports_is_one_line(tmp_path, script, sig):
    """0.5 s after the start (the imports take seconds): `stopped: interrupted by SIG...; <state>`, 130 / 143 / 129
    (SIGHUP: the terminal closed; ninth fault trial S1 had no line), no traceback, nothing written (no output_dir,
    nothing in the working folder)."""
    out = tmp_path / "out"
    args = ["grid=squad_3seeds"] if script == "experiments.py" else ["data=synthetic", "logger=none"]
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / script), *args, f"output_dir={out}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sighup_default,
    )
    # SIGTERM is caught once the early handler is in (a loaded machine may take longer than 0.5 s to get there)
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() - start < 30
        time.sleep(0.01)
    time.sleep(max(0.0, 0.5 - (time.monotonic() - start)))
    proc.send_signal(signal.Signals[sig])
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stderr, stdout) == (
        128 + signal.Signals[sig],
        f"stopped: interrupted by {sig}; {EARLY[script]}\n",
        "",
    )
    assert list(tmp_path.iterdir()) == []


def test_signal_between_the_early_handler_and_the_jobs_is_one_line(tmp_path):
    """The early handler alone (nothing imported after it): one line, 143, and the process ends at once."""
    code = (
        "from core.signals import stop_early; stop_early(); import os, signal, time; "
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30); print('not stopped')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (
        143,
        "stopped: interrupted by SIGTERM; nothing was written\n",
        "",
    )


def _no_byte_written() -> None:
    """preexec_fn: a file-size limit of 0 with SIGXFSZ ignored, as `trap '' XFSZ; ulimit -f 0` (a pipe is exempt)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "experiments.py"])
def test_no_writable_temporary_folder_is_one_line(tmp_path, script):
    """No byte can be written (third fault trial O1; a full disk is the same): importing Lightning asks for a
    temporary folder (torchmetrics), and its FileNotFoundError was a 40-line traceback. Now one line naming the
    folders Python tries (TMPDIR, /tmp, /var/tmp, /usr/tmp, the working folder) and the OS's reason, exit 1,
    nothing written, before the imports."""
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    args = ["grid=squad_3seeds"] if script == "experiments.py" else ["analysis=random_rerank", "logger=none"]
    proc = subprocess.run(
        [sys.executable, str(REPO / script), *args, f"output_dir={tmp_path / 'out'}"],
        cwd=tmp_path,
        env={**env, "TMPDIR": str(tmp_path / "tmp")},
        preexec_fn=_no_byte_written,
        capture_output=True,
        text=True,
        timeout=60,
    )
    tried = [str(tmp_path / "tmp"), "/tmp", "/var/tmp", "/usr/tmp", str(tmp_path)]
    assert (proc.returncode, proc.stderr, proc.stdout) == (
        1,
        f"error: cannot write a temporary file in any of {tried} ({tmp_path / 'tmp'}: File too large); "
        "free space or set TMPDIR to a writable folder; nothing was written\n",
        "",
    )
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"] and list((tmp_path / "tmp").iterdir()) == []


def test_an_oserror_while_importing_is_one_line(tmp_path):
    """Any other OSError raised while the entry script imports (the early handlers in): one line, exit 1. Once the
    job's handlers have taken over, an error keeps Python's report (pipeline/cli.py says what it knows)."""
    (tmp_path / "heavy.py").write_text("raise OSError(28, 'No space left on device', '/cache/x.bin')\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    early = "from core.signals import stop_early; stop_early(); import heavy"
    proc = subprocess.run([sys.executable, "-c", early], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (
        1,
        "error: cannot start: OSError: [Errno 28] No space left on device: '/cache/x.bin' (while importing the "
        "libraries); nothing was written\n",
    )
    later = early.replace("import heavy", "import signal; signal.signal(signal.SIGTERM, signal.SIG_DFL); import heavy")
    proc = subprocess.run([sys.executable, "-c", later], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.startswith("Traceback"), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before", "after"])
def test_signal_at_the_handover_to_the_jobs_handler(tmp_path, where):
    """train.py with the pipeline imported: SIGINT just before `raise_on_signals` takes over from the early handler
    (the early handler's line), or just after it (the job's, before the config is composed): the same line, 130,
    nothing written."""
    out = tmp_path / "out"
    code = f"""
import os, runpy, signal, sys
sys.path.insert(0, {str(REPO)!r})
import callbacks.preemption, pipeline.cli
real = callbacks.preemption.raise_on_signals
def handover():
    if {where!r} == "before":
        os.kill(os.getpid(), signal.SIGINT)
    old = real()
    if {where!r} == "after":
        os.kill(os.getpid(), signal.SIGINT)
    return old
pipeline.cli.raise_on_signals = handover
sys.argv = [{str(REPO / "train.py")!r}, "data=synthetic", "logger=none", "output_dir={out}"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stderr) == (130, "stopped: interrupted by SIGINT; nothing was written\n")
    assert list(tmp_path.iterdir()) == []


def test_signal_during_compose_is_one_line(monkeypatch, capsys):
    """SIGTERM while the config is composed (the job's handler is in): one line, 143, Python's handlers back after."""
    import pipeline.cli
    import pipeline.run

    real = pipeline.cli.compose

    def compose(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(argv)

    monkeypatch.setattr(pipeline.cli, "compose", compose)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert pipeline.cli.main(["data=synthetic", "logger=none"], pipeline.run.TRAIN) == 143
    assert capsys.readouterr().err == "stopped: interrupted by SIGTERM; nothing was written\n"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_early_handler_is_not_restored_after_the_job(monkeypatch):
    """restore_signals gives back Python's handler where it would reinstate the early one, whose line ("nothing was
    written") is false once the job has run."""
    from callbacks.preemption import raise_on_signals, restore_signals
    from core import signals

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signals.stop_early()
        assert signal.getsignal(signal.SIGINT) is signals._stop_now
        restore_signals(raise_on_signals())
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    finally:
        restore_signals(dict(zip((signal.SIGINT, signal.SIGTERM), before)))


# ---- a rank's death under 2-process gloo DDP ----------------------------------------------------------------------
def _run_ranks(tmp_path: Path, fault: str, script: str, *args: str, timeout: int = 400) -> dict:
    """`script` as 2 DDP ranks under tests/rank_faults.py with `fault`; returns stderr, rank 0's exit code, when the
    victim died, how long the last rank lived after that, and the surviving rank's exit code."""
    marks = tmp_path / "marks"
    marks.mkdir()
    err = tmp_path / "stderr.txt"
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "RANK_FAULT": fault}
    env.update(SCRIPT=script, RANK_FAULT_DIR=str(marks))
    with open(err, "w") as e, open(tmp_path / "stdout.txt", "w") as o:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "rank_faults.py"), *args],
            cwd=REPO,
            env=env,
            stdout=o,
            stderr=e,
            start_new_session=True,  # its own process group: rank 1 is in it, so the test can see it end
        )
        try:
            proc.wait(timeout=timeout)
            deadline = time.monotonic() + timeout
            while _group_alive(proc.pid):  # every rank gone (rank 1 outlives rank 0 when rank 0 is the one killed)
                assert time.monotonic() < deadline, "a rank outlived the job"
                time.sleep(0.1)
            ended = time.time()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    killed = float((marks / "killed").read_text())
    exits = {p.name: int(p.read_text()) for p in marks.glob("exit-*")}
    return {"stderr": err.read_text(), "rc0": proc.returncode, "lived": ended - killed, "exits": exits}


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies, which only wait to be reaped, do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _assert_one_line(got: dict, victim: int, kept: str) -> None:
    """The surviving rank said `stopped: rank <victim> died (<how>); <kept>` (a regex), once, without a traceback,
    and ended with exit code 1 within 30 s of the death (rank 0 too when it survived)."""
    # rank 0 sees its child's exit status; rank 1 sees its parent gone; either may add the failed collective's reason
    how = r"its process ended" if victim == 0 else r"killed by SIGKILL"
    expected = rf"stopped: rank {victim} died \({how}(; Connection (reset|closed) by peer)?\); {kept}"
    lines = [line for line in got["stderr"].splitlines() if line.startswith("stopped:")]
    assert len(lines) == 1 and re.fullmatch(expected, lines[0]), got["stderr"][-3000:]
    assert "Traceback" not in got["stderr"]
    assert got["exits"] == {f"exit-{1 - victim}": 1}
    if victim == 1:
        assert got["rc0"] == 1
    assert got["lived"] < 30, got["lived"]


TRAIN_DDP = [
    *small_run(),
    *finetune_steps(40),
    "data.batch_size=4",
    "trainer.devices=2",
    "trainer.strategy=ddp",
]
ENCODE_DDP = [
    "retrieval=dense",
    "model=repbert",
    "data=synthetic",
    "data.num_docs=400",
    "data.num_train_queries=4",
    "data.num_val_queries=2",
    "data.num_test_queries=6",
    "logger=none",
    "retrieval.batch_size=4",
    "retrieval.devices=2",
]


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("stage", ["training", "split encoding"])
def test_a_rank_killed_ends_the_other_with_one_line(tmp_path, tiny_bert, stage, victim):
    """2 gloo ranks; rank `victim` is SIGKILLed: in training at the end of step 3 (last.ckpt of step 2 on disk), then
    the other rank in the head stage on that checkpoint (at its step 2), or
    at its 2nd batch of `evaluate.py retrieval=dense retrieval.devices=2`'s split encoding. The other rank ends
    within seconds with one line naming the dead rank and what was kept (the checkpoint; no results), exit code 1,
    no traceback, no process left, no metrics.json; a surviving rank removes the shares when rank 0 (their owner)
    died, and no empty output_dir made by the run is left."""
    out = tmp_path / "out"
    common = (f"model.backbone={tiny_bert}", f"output_dir={out}")
    if stage == "training":
        got = _run_ranks(tmp_path, f"train:{victim}:3", "train.py", *TRAIN_DDP, *common)
        last = out / "checkpoints" / "last.ckpt"
        _assert_one_line(got, victim, rf"last\.ckpt at step 2 is kept: resume with ckpt_path={re.escape(str(last))}")
        assert last.is_file()
        # the head stage on that checkpoint under DDP, the other rank killed at its step 2 (before any head
        # checkpoint): the same one line, saying nothing was kept
        head, marks = tmp_path / "head", tmp_path / "head-run"
        marks.mkdir()
        got = _run_ranks(
            marks,
            f"train:{1 - victim}:2",
            "train.py",
            *small_run(),
            "stage=head",
            f"ckpt={last}",
            "head=glow",
            "head.epochs=3",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"output_dir={head}",
        )
        _assert_one_line(got, 1 - victim, r"no resumable checkpoint \(last\.ckpt\) was written by this run")
        assert not (head / "metrics.json").exists()
    else:
        cache = f"data.cache_dir={tmp_path / 'cache'}"
        got = _run_ranks(tmp_path, f"encode:{victim}:2", "evaluate.py", *ENCODE_DDP, *common, cache)
        _assert_one_line(got, victim, rf"no result was written to '{re.escape(str(out))}'")
        # nor the folder this run made for it, left empty (third fault trial R1): rank 0 removes it, or, when rank 0
        # is the one killed, the surviving rank
        assert not out.exists(), sorted(out.rglob("*"))
    assert not (out / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault,line,code",
    [
        ("encodeterm:1:2", "stopped: rank 1 was stopped by SIGTERM; no result was written to '{out}'", 143),
        ("encodeint:1:2", "stopped: interrupted by SIGINT; no result was written to '{out}'", 130),
    ],
    ids=["sigterm-to-rank-1", "ctrl-c-to-the-job"],
)
def test_a_signal_in_the_split_encoding_says_one_line(tmp_path, tiny_bert, fault, line, code):
    """Ninth fault trial R1, S4: SIGTERM to rank 1 alone in `retrieval.devices=2`'s split encoding made rank 0 say
    "another rank failed ...; see its message above" with nothing above it (only rank 0 speaks of signals); a Ctrl-C
    to the job printed rank 0's line and then rank 1's "rank 0 died", after the command had returned. Now rank 0
    names the rank a signal stopped, a rank interrupted itself says nothing of a peer's death, and the command
    returns after its ranks: one line, the signal's exit code on both ranks, no process left."""
    out = tmp_path / "out"
    common = (f"model.backbone={tiny_bert}", f"output_dir={out}", f"data.cache_dir={tmp_path / 'cache'}")
    got = _run_ranks(tmp_path, fault, "evaluate.py", *ENCODE_DDP, *common)
    lines = [ln for ln in got["stderr"].splitlines() if ln.startswith(("stopped:", "error:"))]
    assert lines == [line.format(out=out)], got["stderr"][-3000:]
    assert "Traceback" not in got["stderr"] and got["rc0"] == code
    assert got["exits"] == {"exit-0": code, "exit-1": code}
    assert not out.exists()


@pytest.mark.slow
def test_a_signal_to_one_ddp_rank_stops_every_rank_at_one_batch(tmp_path, tiny_bert):
    """2 gloo ranks; only rank 1 gets SIGTERM, at the end of step 3 (a scheduler's kill of one process). Lightning
    broadcast the flag inside its signal handler, a collective while rank 0 was inside a training step: both hung
    for good. Now both stop at the next batch start with a resumable last.ckpt of step 3, one line (rank 0's), exit
    code 143 on both, no process left."""
    out = tmp_path / "out"
    got = _run_ranks(
        tmp_path, "sigterm:1:3", "train.py", *TRAIN_DDP, f"model.backbone={tiny_bert}", f"output_dir={out}"
    )
    last = out / "checkpoints" / "last.ckpt"
    lines = [line for line in got["stderr"].splitlines() if line.startswith(("stopped:", "error:"))]
    assert lines == [f"stopped: interrupted by SIGTERM at step 3; resume with ckpt_path={last}"], got["stderr"][-3000:]
    assert "Traceback" not in got["stderr"]
    assert got["rc0"] == 143 and got["exits"] == {"exit-0": 143, "exit-1": 143}
    import torch

    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 3
    assert not (out / "metrics.json").exists()


@pytest.mark.slow
def test_a_signal_to_one_ddp_rank_in_the_last_batch_still_stops_every_rank(tmp_path, tiny_bert):
    """2 gloo ranks training 6 steps; rank 1 gets SIGTERM at the end of step 6, after which no batch starts to agree
    on it (the batch-start agreement is read a batch late on CUDA, which widens that window): the run went on to its
    test as if no signal had come. Now every rank stops at the train end with a resumable last.ckpt of step 6."""
    out = tmp_path / "out"
    args = [*TRAIN_DDP, "trainer.max_steps=6", f"model.backbone={tiny_bert}", f"output_dir={out}"]
    got = _run_ranks(tmp_path, "sigterm:1:6", "train.py", *args)
    last = out / "checkpoints" / "last.ckpt"
    lines = [line for line in got["stderr"].splitlines() if line.startswith(("stopped:", "error:"))]
    assert lines == [f"stopped: interrupted by SIGTERM at step 6; resume with ckpt_path={last}"], got["stderr"][-3000:]
    assert got["rc0"] == 143 and got["exits"] == {"exit-0": 143, "exit-1": 143}
    import torch

    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 6
    assert not (out / "metrics.json").exists()


@pytest.mark.slow
def test_a_sigterm_during_a_ddp_test_stops_both_ranks_with_one_line(tmp_path, tiny_bert):
    """2 gloo ranks evaluating; rank 0 gets SIGTERM at its first test batch. Lightning broadcast inside its handler
    (in test and validation too), while rank 1 was in another collective: both hung for good. Now rank 0 passes the
    signal on and each rank stops where it is: one line (rank 0's), exit code 143, no process left, no result."""
    out = tmp_path / "out"
    got = _run_ranks(
        tmp_path,
        "testterm:0:1",
        "evaluate.py",
        *job_args(
            "evaluate.py",
            [
                "model=colbert",
                f"model.backbone={tiny_bert}",
                *small_run("trainer.devices=2", "trainer.strategy=ddp"),
                f"data.cache_dir={tmp_path / 'cache'}",
                f"output_dir={out}",
            ],
        ),
        timeout=240,
    )
    lines = [line for line in got["stderr"].splitlines() if line.startswith(("stopped:", "error:"))]
    assert lines == [f"stopped: interrupted by SIGTERM; no result was written to '{out}'"], got["stderr"][-3000:]
    assert "Traceback" not in got["stderr"] and got["rc0"] == 143
    assert not (out / "metrics.json").exists()


# ---- the pieces, in-process ---------------------------------------------------------------------------------------
def test_gloo_connection_errors_read_as_a_peers_death(monkeypatch):
    """gloo's words for a closed peer, anywhere in the chain, are a death (with 2 ranks, of the other rank); any
    other error is not."""
    from core.ranks import RankDied, as_rank_death, peer_failure

    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:5283: Connection reset by "
        "peer. This is typically caused by a remote worker hanging or bugs in the application."
    )
    assert peer_failure(gloo) == "Connection reset by peer"
    try:
        try:
            raise gloo
        except RuntimeError as e:
            raise ValueError("wrapped") from e
    except ValueError as wrapped:
        assert peer_failure(wrapped) == "Connection reset by peer"
    assert peer_failure(RuntimeError("injected failure on rank 1 at step 2")) is None
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert as_rank_death(gloo) is None  # one process: a refused or reset connection is some server's, not a rank's
    monkeypatch.setenv("WORLD_SIZE", "2")
    dead = as_rank_death(gloo)
    assert isinstance(dead, RankDied) and dead.how == "Connection reset by peer"
    assert str(dead.keeping("no result was written to 'out'")).endswith("); no result was written to 'out'")


@pytest.mark.parametrize("handling", [False, True])
def test_the_watchdog_interrupts_the_main_thread_when_a_child_dies(handling):
    """A RankWatch on rank 0 with one child: the child's SIGKILL reaches the main thread as RankDied naming rank 1
    and its status within seconds, even while the main thread waits; not inside an `except` block (the job is then
    stopping on its own error), but as soon as it is left. Stopped, the watch leaves SIGUSR2 as it was."""
    from core.ranks import POLL_S, RankDied, RankWatch

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    before = signal.getsignal(signal.SIGUSR2)
    watch = RankWatch(0, 0, 2, children=[child]).start()
    start, handled = time.monotonic(), None
    try:
        with pytest.raises(RankDied) as raised:
            try:
                child.kill()
                if handling:
                    raise ValueError("an error of this rank's own")
            except ValueError:
                time.sleep(4 * POLL_S)  # the death is seen meanwhile, and not raised in here
                handled = time.monotonic()
            time.sleep(20)
    finally:
        watch.stop()
        child.kill()
        child.wait()
    assert time.monotonic() - start < 5
    assert handled is not None if handling else handled is None
    assert str(raised.value) == "rank 1 died (killed by SIGKILL)"
    assert signal.getsignal(signal.SIGUSR2) == before


def test_a_training_cell_of_an_in_process_grid_stopped_by_a_signal_says_one_line(monkeypatch, capsys):
    """launcher=inprocess: the training cell stops after its batch (Interrupted, a SystemExit) and the grid says so in
    its one line, exit code 130, where it used to leave with no line at all."""
    import signal

    import experiments
    from callbacks.preemption import Interrupted

    def interrupted(argv):
        raise Interrupted(signal.SIGINT, 3, "/g/row/syn/seed1/checkpoints/last.ckpt")

    monkeypatch.setattr(experiments, "main", interrupted)
    monkeypatch.setattr(experiments, "raise_on_signals", dict)  # this test process keeps its own handlers
    monkeypatch.setattr("warnings.formatwarning", __import__("warnings").formatwarning)
    assert experiments.run(["grid=g"]) == 130
    assert capsys.readouterr().err == (
        "stopped: interrupted by SIGINT at step 3; the cell's last.ckpt is kept; finished cells are kept: run the "
        "same command again to resume\n"
    )


def test_the_first_ctrl_c_warning_is_ours_wherever_the_signal_lands(monkeypatch):
    """Fourth fault trial S4: the Ctrl-C warning was attributed to the frame the signal interrupted, so a signal in
    transformers' code printed `.../transformers/activations.py:89: UserWarning: SIGINT: ...` in the library's
    format. It is attributed to callbacks/preemption.py: the entry scripts print it as `warning: ...`."""
    import types
    import warnings

    from callbacks.preemption import Preemption
    from pipeline.cli import _format_warning

    cb = Preemption()
    cb._trainer = types.SimpleNamespace(global_rank=0, validating=False, world_size=1)
    monkeypatch.setattr(cb, "_stop", lambda signum, frame: None)
    library = {"__name__": "transformers.activations"}
    exec(
        compile("def forward(cb, sig):\n    cb._on_signal(sig, None)\n", "/site-packages/transformers/x.py", "exec"),
        library,
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        library["forward"](cb, signal.SIGINT)
    (w,) = seen
    line = _format_warning(w.message, w.category, w.filename, w.lineno)
    assert (
        line
        == "warning: SIGINT: stopping after this batch with a resumable checkpoint (Ctrl-C again to stop at once)\n"
    )


def test_a_peers_death_names_the_checkpoints_a_job_without_a_training_loop_kept(tmp_path, monkeypatch, capsys):
    """Sixth fault trial R3: rank 0 killed in the whitening head stage's test under DDP: the line said no result was
    written, though checkpoints/head.ckpt (the fitted head) was kept. It names what is kept and how to start again."""
    from pipeline.cli import main

    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "head.ckpt").write_bytes(b"x")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def job(cfg, model_from_cli):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:5283: Connection reset by peer.")

    def watched(cfg, model_from_cli):  # the watchdog's way: RankDied in the main thread, nothing kept named yet
        from core.ranks import RankDied

        raise RankDied(0, "its process ended")

    assert main(["logger=none", f"output_dir={out}"], watched) == 1
    err = capsys.readouterr().err
    assert err == (
        f"stopped: rank 0 died (its process ended); no result was written to '{out}'; checkpoints/head.ckpt is kept "
        f"(delete '{out}' to start again)\n"
    ), err
    assert main(["logger=none", f"output_dir={out}"], job) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        f"Connection reset by peer); no result was written to '{out}'; checkpoints/head.ckpt is kept "
        f"(delete '{out}' to start again)\n"
    ), err
    assert err.count("\n") == 1 and err.startswith("stopped: ")


@pytest.mark.parametrize("ignored", [False, True], ids=["sighup-stops", "nohup-keeps-it-ignored"])
def test_sighup_stops_a_job_unless_it_was_started_ignoring_it(ignored):
    """SIGHUP (a closed terminal or ssh session) stops a job as SIGTERM does, with its own line and 129; a job started
    under `nohup` (SIGHUP ignored) keeps ignoring it: the project's handlers never take it over."""
    code = (
        "import signal\n"
        + f"signal.signal(signal.SIGHUP, signal.{'SIG_IGN' if ignored else 'SIG_DFL'})\n"  # not the suite's own
        + "import core.signals as s\n"
        + "from callbacks.preemption import raise_on_signals\n"
        + "raise_on_signals()\n"
        + "print(signal.SIGHUP in s.STOP_SIGNALS, signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == (["False", "True"] if ignored else ["True", "False"]), out.stderr[-2000:]
