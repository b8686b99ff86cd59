"""Grids and resumes that meet missing pieces (issue 48, item 4; docs/reliability.md "Faults: grids and resumes that
meet missing pieces"): a cell's folder that vanishes before, while or after it runs, or is replaced by a file; a log
that vanishes while its cell runs; a last.ckpt whose best checkpoint is gone, or that is truncated; results without
per_query.json; the grid's output root deleted mid-grid. Each case asserts the one line printed, the exit code, and
that the other cells ran and finished; `action=list` shows each state.

In-process grids (`grid.engine.run`, `grid.engine.main`) of tiny random BERTs on the synthetic source, as
tests/test_grid.py builds them; the faults are injected by wrapping `grid.engine._launch` (a cell's run) from outside.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import small_run
from test_grid import BM25_ROWS, FAST, SYN, SYN_START, tiny_grid

import grid.engine as engine
from grid.engine import main, run

BERT_FAST = ["trainer.max_steps=2", "trainer.val_check_interval=1"]


# ---- a plain train.py resume whose best checkpoint is gone ----------------------------------------------------------
def run_main(argv) -> int:
    from pipeline.cli import main as cli_main
    from pipeline.run import train

    return cli_main(argv, lambda c, _: train(c))


def our_lines(err: str) -> list[str]:
    return [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith(("warning: ", "error: ", "stopped: "))]


RESUME = small_run(
    "eval.ats_passages=0",
    "eval.isotropy_paper=false",
    "data.batch_size=8",
    "eval.before_training=false",
    "trainer.val_check_interval=2",
    triples=32,
    eval_queries=4,
    depth=8,
    probe_queries=4,
    probe_docs=8,
)


@pytest.mark.slow
def test_train_resume_whose_best_checkpoint_is_gone_goes_on_with_one_warning(tmp_path, tiny_bert, recwarn):
    """`train.py ckpt_path=.../last.ckpt` whose best-N.ckpt is gone: one warning naming it, then the run goes on.

    With no validation after the resume the resumed weights are tested; with one, it becomes the best and is tested.
    """
    out = tmp_path / "run"
    common = [*RESUME, f"model.backbone={tiny_bert}", f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={out}"]
    assert run_main([*common, "trainer.max_steps=2"]) == 0
    ck = out / "checkpoints"
    (best,) = ck.glob("best-*.ckpt")
    best.unlink()
    (out / "metrics.json").unlink()
    last = ck / "last.ckpt"
    for steps in (2, 4):
        recwarn.clear()
        assert run_main([*common, f"trainer.max_steps={steps}", f"ckpt_path={last}"]) == 0
        lines = [str(w.message) for w in recwarn if "best checkpoint" in str(w.message)]
        assert lines == [
            f"ckpt_path: the best checkpoint that '{last}' records, '{best}' (val/ndcg_cut_10 "
            + lines[0].split("val/ndcg_cut_10 ")[1].split(" ")[0]
            + f" at step {best.stem.split('-')[1]}), is missing; resuming without it: the best validation after step 2 "
            "becomes the best checkpoint and is tested, or the resumed weights if no validation follows (the lost one "
            "cannot be tested)"
        ], lines
        metrics = json.loads((out / "metrics.json").read_text())
        if steps == 2:  # nothing trained: the resumed weights are tested, no best checkpoint
            assert not list(ck.glob("best-*.ckpt")) and (out / "per_query.json").is_file()
        else:  # the validation at step 4 is the new best, saved and tested
            assert [p.name for p in ck.glob("best-*.ckpt")] == ["best-4.ckpt"] and metrics["best_step"] == 4


# ---- grids: a cell's folder or log that vanishes, a folder that is a file, the output root removed ------------------
def bm25_grid(tmp_path: Path, **keys) -> Path:
    """A grid of BM25 cells (nothing to train: seconds a cell), seeds 1 and 2, run in process unless `launcher`."""
    return tiny_grid(tmp_path, "g", "bm25", BM25_ROWS, seeds=[1, 2], **keys)


def grid_main(*argv: str) -> tuple[int, str]:
    """experiments.py's `main` on `argv`, in process: (exit code, what it printed on stdout)."""
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(list(argv))
    return rc, buf.getvalue()


def warnings_of(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("warning: grid")]


def run_expecting(gfile: Path, rc: int, *lines: str) -> str:
    """Run the grid (experiments.py's main, in process); assert its exit code and its `warning: grid` lines."""
    code, out = grid_main(f"grid={gfile}")
    assert code == rc and warnings_of(out) == list(lines), out
    assert "Traceback" not in out, out
    return out


def listed(gfile: Path, *extra: str) -> dict[str, str]:
    return run([f"grid={gfile}", "action=list", *extra], out=io.StringIO()).status


def on_launch(monkeypatch, fault, times: int = 1):
    """Wrap the grid's cell launcher: `fault(log_path)` runs at the first `times` launches, before the cell runs
    (with log_path.parent the cell's folder, its cell.json written)."""
    real, count = engine._launch, []

    def launch(script, argv, launcher, log_path, *rest):
        if len(count) < times:
            count.append(1)
            fault(log_path)
        return real(script, argv, launcher, log_path, *rest)

    monkeypatch.setattr(engine, "_launch", launch)
    return count


def test_a_cell_folder_that_vanishes_while_it_runs_is_rerun_once(tmp_path, monkeypatch):
    gfile = bm25_grid(tmp_path)
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    on_launch(monkeypatch, lambda log: shutil.rmtree(log.parent))
    out = run_expecting(
        gfile, 0, "warning: grid g: cell 'bm25/syn/seed1': its folder vanished while it ran; rerunning it from scratch"
    )
    assert "[1/2] train bm25/syn/seed1: ran" in out and "[2/2] train bm25/syn/seed2: ran" in out
    assert all((root / s / "metrics.json").is_file() and (root / s / "cell.json").is_file() for s in ("seed1", "seed2"))
    assert set(listed(gfile).values()) == {"done"}


def test_a_cell_folder_that_vanishes_twice_is_skipped_and_the_grid_exits_1(tmp_path, monkeypatch):
    gfile = bm25_grid(tmp_path)
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    on_launch(monkeypatch, lambda log: shutil.rmtree(log.parent), times=2)
    out = run_expecting(
        gfile,
        1,
        "warning: grid g: cell 'bm25/syn/seed1': its folder vanished while it ran; rerunning it from scratch",
        "warning: grid g: cell 'bm25/syn/seed1': its folder vanished again while it reran; skipped: run the same "
        "command again once nothing removes it",
    )
    assert "train bm25/syn/seed1: failed in" in out and "failed: bm25/syn/seed1" in out
    assert (root / "seed2" / "metrics.json").is_file() and "[2/2] train bm25/syn/seed2: ran" in out
    assert listed(gfile) == {"bm25/syn/seed1": "todo", "bm25/syn/seed2": "done"}
    monkeypatch.undo()
    rc, out = grid_main(f"grid={gfile}")  # the same command again: the cell runs
    assert rc == 0 and not warnings_of(out) and "[1/2] train bm25/syn/seed1: ran" in out, out


def test_a_cell_folder_that_is_a_file_is_skipped_with_one_line(tmp_path):
    gfile = bm25_grid(tmp_path)
    cell = tmp_path / "grids" / "g" / "bm25" / "syn" / "seed1"
    cell.parent.mkdir(parents=True)
    cell.write_text("not a folder")
    assert listed(gfile) == {
        "bm25/syn/seed1": f"unusable ('{cell}' is a file, not a folder; will be skipped)",
        "bm25/syn/seed2": "todo",
    }
    run_expecting(
        gfile,
        1,
        f"warning: grid g: cell 'bm25/syn/seed1': '{cell}' is a file, not a folder; skipped: move it away to run "
        "the cell",
    )
    assert cell.read_text() == "not a folder" and (cell.parent / "seed2" / "metrics.json").is_file()


def test_a_cell_folder_replaced_by_a_file_while_it_runs_is_skipped(tmp_path, monkeypatch):
    gfile = bm25_grid(tmp_path)
    cell = tmp_path / "grids" / "g" / "bm25" / "syn" / "seed1"

    def replace(log):
        shutil.rmtree(log.parent)
        log.parent.write_text("not a folder")

    on_launch(monkeypatch, replace)
    out = run_expecting(
        gfile,
        1,
        f"warning: grid g: cell 'bm25/syn/seed1': its folder was replaced by a file while it ran: '{cell}' is a "
        "file, not a folder; skipped: move it away to run the cell",
    )
    assert "Traceback" not in out and (cell.parent / "seed2" / "metrics.json").is_file()


def test_the_output_root_removed_mid_grid(tmp_path, monkeypatch):
    """The grid's whole folder removed when its second cell starts: the first cell's results vanished after its run
    (reported, exit code 1), the second runs again and finishes, the tables are written; the same command again
    reruns the first only."""
    gfile = bm25_grid(tmp_path)
    grid_dir = tmp_path / "grids" / "g"
    seen = []

    def remove_root(log):
        seen.append(log.parent.name)
        if log.parent.name == "seed2" and seen.count("seed2") == 1:
            shutil.rmtree(grid_dir)

    on_launch(monkeypatch, remove_root, times=3)
    out = run_expecting(
        gfile,
        1,
        "warning: grid g: cell 'bm25/syn/seed2': its folder vanished while it ran; rerunning it from scratch",
        "warning: grid g: cell 'bm25/syn/seed1': its folder vanished after its run; skipped: run the same command "
        "again to rerun it",
    )
    assert (grid_dir / "bm25" / "syn" / "seed2" / "metrics.json").is_file()
    assert (grid_dir / "results.json").is_file() and (grid_dir / "table.md").is_file()
    assert listed(gfile) == {"bm25/syn/seed1": "todo", "bm25/syn/seed2": "done"}
    monkeypatch.undo()
    rc, out = grid_main(f"grid={gfile}")
    assert rc == 0 and "[1/2] train bm25/syn/seed1: ran" in out and "seed2: skipped" in out, out


@pytest.mark.slow
def test_subprocess_cells_whose_log_or_folder_vanishes(tmp_path, monkeypatch):
    """`launcher: subprocess`: the first cell's log removed while it runs (its results kept, one line, action=list
    marks it), the second cell's folder removed while it runs (rerun once): the grid ends with exit code 0."""
    gfile = bm25_grid(tmp_path, launcher="subprocess")
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    real, started = engine.subprocess.Popen, []

    def popen(args, **kw):
        proc = real(args, **kw)
        started.append(proc)
        if len(started) == 1:
            (root / "seed1" / "evaluate.log").unlink()
        elif len(started) == 2:
            shutil.rmtree(root / "seed2")
        return proc

    monkeypatch.setattr(engine.subprocess, "Popen", popen)
    out = run_expecting(
        gfile,
        0,
        "warning: grid g: cell 'bm25/syn/seed1': its log evaluate.log vanished while it ran; its results are "
        "complete and kept",
        "warning: grid g: cell 'bm25/syn/seed2': its folder vanished while it ran; rerunning it from scratch",
    )
    assert len(started) == 3 and "[2/2] train bm25/syn/seed2: ran" in out
    assert (root / "seed2" / "evaluate.log").is_file() and (root / "seed2" / "metrics.json").is_file()
    assert listed(gfile) == {"bm25/syn/seed1": "done (its log evaluate.log is missing)", "bm25/syn/seed2": "done"}


def unfinish(cell: Path) -> None:
    """Remove a cell's results, as a run killed before it wrote them leaves it."""
    for name in ("metrics.json", "per_query.json"):
        (cell / name).unlink()


@pytest.mark.slow
def test_training_cells_with_partial_checkpoints_or_results(tmp_path, tiny_bert):
    """A trained cell and its evaluation on other data, then: the best checkpoint gone beside last.ckpt (restart),
    last.ckpt truncated (restart), per_query.json gone beside metrics.json (resumed from last.ckpt: the test again),
    and a finished cell's best checkpoint gone under an unfinished evaluation (skipped, exit code 1)."""
    gfile = tiny_grid(
        tmp_path,
        "t",
        "colbert",
        {"colbert": ["model=colbert", f"model.backbone={tiny_bert}"]},
        eval_data={"syn": SYN, "syn_start": SYN_START},
    )
    cell = tmp_path / "grids" / "t" / "colbert" / "syn" / "seed1"
    ev = cell / "eval-syn_start"
    ck = cell / "checkpoints"
    train_label, ev_label = "colbert/syn/seed1", "colbert/syn/seed1/eval-syn_start"
    run_expecting(gfile, 0)

    # the best checkpoint gone beside last.ckpt, the cell unfinished: restarted (resuming would test another model)
    (best,) = ck.glob("best-*.ckpt")
    best.unlink()
    unfinish(cell)
    shutil.rmtree(ev)
    assert listed(gfile)[train_label] == f"partial (best checkpoint {best.name} missing; will restart)"
    out = run_expecting(
        gfile,
        0,
        f"warning: grid t: cell '{train_label}': best checkpoint {best.name} missing; rerunning it from scratch",
    )
    assert f"train {train_label}: ran" in out and f"eval {ev_label}: ran" in out
    assert set(listed(gfile).values()) == {"done"}

    # last.ckpt truncated, the cell unfinished: restarted
    data = (ck / "last.ckpt").read_bytes()
    (ck / "last.ckpt").write_bytes(data[: len(data) // 2])
    unfinish(cell)
    state = listed(gfile)[train_label]
    assert state == "partial (last.ckpt unreadable (BadZipFile: File is not a zip file); will restart)", state
    out = run_expecting(
        gfile,
        0,
        f"warning: grid t: cell '{train_label}': {state[len('partial (') : -len('; will restart)')]}; "
        "rerunning it from scratch",
    )
    assert f"train {train_label}: ran" in out and f"eval {ev_label}: skipped" in out

    # metrics.json without per_query.json: resumed from last.ckpt (a run at max_steps repeats its test)
    (cell / "per_query.json").unlink()
    what = "per_query.json missing beside metrics.json"
    assert listed(gfile)[train_label] == f"partial ({what}; will resume from last.ckpt)"
    out = run_expecting(gfile, 0, f"warning: grid t: cell '{train_label}': {what}; rerunning it from its last.ckpt")
    assert f"train {train_label}: resumed" in out and (cell / "per_query.json").is_file()

    # a finished training cell's best checkpoint gone while its evaluation is unfinished: that evaluation is skipped
    (best,) = ck.glob("best-*.ckpt")
    best.unlink()
    unfinish(ev)
    # action=list shows it (fifth fault trial G1: `todo`, with the skip said only by a run)
    assert listed(gfile)[ev_label] == (
        f"unusable (the best checkpoint {best.name} of its training cell is missing; will be skipped)"
    )
    out = run_expecting(
        gfile,
        1,
        f"warning: grid t: cell '{ev_label}': the best checkpoint {best.name} of its training cell is missing; "
        f"skipped: delete '{cell}' to train it again (or restore the file)",
    )
    assert f"train {train_label}: skipped" in out and not (ev / "metrics.json").is_file()


def test_results_cut_short_or_without_their_pair_are_rerun(tmp_path):
    gfile = bm25_grid(tmp_path)
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    run_expecting(gfile, 0)
    text = (root / "seed1" / "per_query.json").read_text()
    (root / "seed1" / "per_query.json").write_text(text[: len(text) // 2])
    (root / "seed2" / "per_query.json").unlink()
    assert listed(gfile) == {
        "bm25/syn/seed1": "partial (per_query.json unreadable (cut short); will rerun)",
        "bm25/syn/seed2": "partial (per_query.json missing beside metrics.json; will rerun)",
    }
    out = run_expecting(
        gfile,
        0,
        "warning: grid g: cell 'bm25/syn/seed1': per_query.json unreadable (cut short); rerunning it",
        "warning: grid g: cell 'bm25/syn/seed2': per_query.json missing beside metrics.json; rerunning it",
    )
    assert "seed1: ran" in out and "seed2: ran" in out and (root / "seed1" / "per_query.json").read_text() == text
    assert set(listed(gfile).values()) == {"done"}


def test_a_table_over_a_cell_with_results_cut_short_names_the_file_and_tabulates_the_others(tmp_path, capsys):
    """The fourth fault trial's G2: action=table over a finished cell whose per_query.json was cut in half said
    "<cell folder>: unreadable results (...); delete the cell folder to recompute it" (exit 2): the folder, not the
    file, and advice that throws away a training cell's checkpoints. Now one line names the file and says action=run
    reruns the cell; the other cells are tabulated and that one counts as not finished (exit 0, as a missing cell);
    action=export names the file too; action=run reruns the cell by itself."""
    gfile = bm25_grid(tmp_path)
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    run_expecting(gfile, 0)
    pq = root / "seed1" / "per_query.json"
    text = pq.read_text()
    pq.write_text(text[: len(text) // 2])
    try:
        json.loads(pq.read_text())
    except ValueError as e:
        reason = str(e)
    code, out = grid_main(f"grid={gfile}", "action=table")
    assert code == 0 and warnings_of(out) == [
        f"warning: grid g: cell 'bm25/syn/seed1': '{pq}' is unreadable ({reason}); not tabulated: action=run (the "
        "same command without action=table) reruns that cell"
    ], out
    assert "1 of 2 result cells are not finished" in out
    results = json.loads((tmp_path / "grids" / "g" / "results.json").read_text())
    assert [c["status"] for c in results["cells"]] == ["missing", "done"]
    assert results["cells"][1]["per_query"] == json.loads((root / "seed2" / "per_query.json").read_text())
    capsys.readouterr()
    code, out = grid_main(f"grid={gfile}", "action=export", f"cells_file={tmp_path / 'cells.json.gz'}")
    assert code == 2 and not (tmp_path / "cells.json.gz").exists()
    assert capsys.readouterr().err == (
        f"error: cell bm25/syn/seed1: '{pq}' is unreadable ({reason}); run the grid (action=run) to rerun that cell, "
        "then export again\n"
    )
    out = run_expecting(
        gfile, 0, "warning: grid g: cell 'bm25/syn/seed1': per_query.json unreadable (cut short); rerunning it"
    )
    assert pq.read_text() == text and "seed2: skipped" in out


def test_a_grid_whose_cache_dir_is_a_file_stops_before_it_writes_anything(tmp_path, monkeypatch, capsys):
    """The fourth fault trial's G3: `data.cache_dir` in a grid's common a regular file stopped the first cell with
    "(File exists)" and "nothing was loaded or written" after the grid had written grid.yaml and the cell's cell.json.
    The grid's checks now probe every cell's output and cache folders first: the cell's line, exit 2, no file."""
    import experiments

    afile = tmp_path / "cachefile"
    afile.write_text("a file\n")
    gfile = bm25_grid(tmp_path, common=[*FAST, f"data.cache_dir={afile}"])
    monkeypatch.setattr(experiments, "raise_on_signals", dict)  # this test process keeps its own handlers
    monkeypatch.setattr("warnings.formatwarning", __import__("warnings").formatwarning)
    assert experiments.run([f"grid={gfile}"]) == 2
    assert capsys.readouterr().err == (
        f"error: grid g, cell bm25/syn/seed1: data.cache_dir: cannot write '{afile}' (it is a file, not a folder); "
        "move it away or choose another folder; nothing was loaded or written\n"
    )
    assert not (tmp_path / "grids").exists() and afile.read_text() == "a file\n"


def test_a_finished_cells_truncated_best_checkpoint_skips_the_cells_that_need_it(tmp_path, tiny_bert, monkeypatch):
    """A best checkpoint cut short is as lost as a missing one: the evaluation that needs it is skipped with one line
    (the grid once stopped on it with exit code 2, its later cells unvisited); an intact one is returned."""
    from conftest import fake_checkpoint

    from grid.engine import _finished_checkpoint

    cell = tmp_path / "colbert" / "syn" / "seed1"
    (cell / "checkpoints").mkdir(parents=True)
    (cell / "metrics.json").write_text(json.dumps({"best_step": 0}))
    best = fake_checkpoint(cell / "checkpoints" / "best-0.ckpt", tiny_bert)
    reads = []
    monkeypatch.setattr(engine, "read_header", lambda *a, **k: reads.append(a) or real(*a, **k))
    real = __import__("core.checkpoints", fromlist=["read_header"]).read_header
    for _ in range(3):  # every evaluation cell of the training cell asks: the header is read once per version
        assert _finished_checkpoint(cell, "its training cell") == (best, "")
    assert len(reads) == 1
    data = best.read_bytes()
    best.write_bytes(data[: len(data) // 2])
    assert _finished_checkpoint(cell, "its training cell") == (
        None,
        "the best checkpoint best-0.ckpt of its training cell is unreadable (BadZipFile: File is not a zip file); "
        f"skipped: delete '{cell}' to train it again (or restore the file)",
    )


def test_a_subprocess_cell_killed_by_a_signal_is_named_so(tmp_path):
    """A cell SIGKILLed (the OOM killer) could print nothing: the grid's line says how it ended and what a rerun does,
    not the last lines of its log."""
    script = tmp_path / "dies.py"
    script.write_text("import os, signal\nprint('working')\nos.kill(os.getpid(), signal.SIGKILL)\n")
    cell = tmp_path / "cell"
    log = cell / "train.log"
    rc, err = engine._launch(str(script), [], "subprocess", log, "row/syn/seed1")
    assert (rc, err) == (-9, f"killed by SIGKILL (its log: {log}); a rerun of the grid reruns it")
    (cell / "checkpoints").mkdir()
    (cell / "checkpoints" / "last.ckpt").write_bytes(b"x")
    rc, err = engine._launch(str(script), [], "subprocess", log, "row/syn/seed1")
    assert err == f"killed by SIGKILL (its log: {log}); its last.ckpt is kept: a rerun of the grid resumes the cell"


# a subprocess cell: train.py's first lines, then a last.ckpt, then training until stopped. Its SIGTERM path is
# train.py's in short (the real one: test_faults.py): the line naming the kept last.ckpt, exit code 143.
CELL = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
import core.signals
if {watch!r}:  # as where the kernel cannot be asked (not Linux): the thread that watches the parent
    core.signals._parent_death_signal = lambda signum: False
core.signals.stop_early()
cell = sys.argv[1]
last = os.path.join(cell, "checkpoints", "last.ckpt")
os.makedirs(os.path.dirname(last))
with open(last, "w") as f:
    f.write("step 1")

def stop(signum, frame):
    print(f"stopped: interrupted by SIGTERM at step 1; resume with ckpt_path={{last}}")
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
with open(os.path.join(cell, "pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(cell, "pid.tmp"), os.path.join(cell, "pid"))
time.sleep(60)
print("trained on after its grid died")
"""


def _running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, which only waits to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("how", ["pdeathsig", "parent watch"])
def test_a_subprocess_cell_ends_when_its_grid_is_killed(tmp_path, how):
    """experiments.py SIGKILLed while a subprocess cell trains (third fault trial S4): the cell, in its own session,
    trained on unseen under pid 1 and held its folder's lock, so a rerun of the grid stopped on it. It now gets
    SIGTERM when the grid dies and stops within seconds through its own SIGTERM path (its line in its log, its
    last.ckpt kept for the rerun to resume), by the kernel's parent-death signal or, where that is missing, by
    watching its parent."""
    cell = tmp_path / "cell"
    cell.mkdir()
    script = tmp_path / "cell.py"
    script.write_text(CELL.format(repo=str(engine.REPO), watch=how == "parent watch"))
    log = cell / "train.log"
    grid = os.fork()
    if grid == 0:  # the grid process: it runs the cell as experiments.py does, until it is killed
        try:
            engine._launch(str(script), [str(cell)], "subprocess", log, "row/syn/seed1")
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not (cell / "pid").exists():
        assert time.monotonic() < deadline and os.waitpid(grid, os.WNOHANG) == (0, 0), log.read_text()
        time.sleep(0.02)
    pid = int((cell / "pid").read_text())
    os.kill(grid, signal.SIGKILL)
    os.waitpid(grid, 0)
    killed = time.monotonic()
    try:
        while _running(pid):
            assert time.monotonic() - killed < 5, "the cell trains on after its grid died"
            time.sleep(0.05)
    finally:
        if _running(pid):  # the test's own stray: not left to run on after it
            os.kill(pid, signal.SIGKILL)
    last = cell / "checkpoints" / "last.ckpt"
    assert (
        log.read_text().splitlines()[-1] == f"stopped: interrupted by SIGTERM at step 1; resume with ckpt_path={last}"
    )
    assert last.read_text() == "step 1"


def test_an_unreadable_cell_json_is_checked_against_the_cells_config_yaml(tmp_path, capsys):
    """A finished cell's cell.json garbled (second fault trial G1): its config.yaml, the run's whole resolved config,
    stands in for it. Matching the plan: list says so, a run writes cell.json again with one warning and reuses the
    results; a config.yaml that differs names the key; no config.yaml makes the settings unknown (one error line)."""
    gfile = bm25_grid(tmp_path)
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    run_expecting(gfile, 0)
    metrics = {s: (root / s / "metrics.json").stat().st_mtime_ns for s in ("seed1", "seed2")}
    (root / "seed1" / "cell.json").write_text('{"argv": ["data.max_')
    assert listed(gfile) == {
        "bm25/syn/seed1": "done (cell.json unreadable (JSONDecodeError); its config.yaml has the planned settings)",
        "bm25/syn/seed2": "done",
    }
    out = run_expecting(
        gfile,
        0,
        "warning: grid g: cell 'bm25/syn/seed1': cell.json unreadable (JSONDecodeError); its config.yaml has the "
        "planned settings; wrote its cell.json again from the plan (its recorded wall time is lost)",
    )
    assert "seed1: skipped" in out and json.loads((root / "seed1" / "cell.json").read_text())["argv"]
    assert {s: (root / s / "metrics.json").stat().st_mtime_ns for s in metrics} == metrics
    assert set(listed(gfile).values()) == {"done"}

    # planned now with another setting: the garbled cell's config.yaml names what differs
    (root / "seed1" / "cell.json").write_text("\x00")
    other = listed(gfile, "eval.measures=[ndcg_cut_10,map]")["bm25/syn/seed1"]
    assert other.startswith("done (other settings: cell.json is unreadable (JSONDecodeError); its config.yaml differs")
    assert "eval.measures" in other
    # neither record readable: one line naming both, nothing run or written
    (root / "seed1" / "config.yaml").unlink()
    capsys.readouterr()
    code, out = grid_main(f"grid={gfile}")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in out + err, out + err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"error: grid g: 1 started cell(s) have other settings than planned now, e.g. bm25/syn/seed1 (cell.json is "
        "unreadable (JSONDecodeError) and its config.yaml is missing: its settings are unknown); delete those cells' "
        f"folders under {tmp_path / 'grids' / 'g'} to recompute them, or run with another output_root"
    ]
    assert {s: (root / s / "metrics.json").stat().st_mtime_ns for s in metrics} == metrics
    assert listed(gfile)["bm25/syn/seed1"] == (
        "done (other settings: cell.json is unreadable (JSONDecodeError) and its config.yaml is missing: "
        "its settings are unknown)"
    )


def test_a_dangling_last_checkpoint_link_is_named_and_restarts_the_cell(tmp_path, tiny_bert):
    """Third fault trial G2: a training cell whose last.ckpt is a dangling symbolic link (results gone) was listed
    `todo` and rerun with no word; it is an unreadable last.ckpt: named, and the cell restarts from scratch."""
    gfile = tiny_grid(tmp_path, "t", "colbert", {"colbert": ["model=colbert", f"model.backbone={tiny_bert}"]})
    ck = tmp_path / "grids" / "t" / "colbert" / "syn" / "seed1" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "last.ckpt").symlink_to(tmp_path / "gone.ckpt")
    assert listed(gfile) == {
        "colbert/syn/seed1": f"partial (last.ckpt unreadable (a symbolic link to '{tmp_path / 'gone.ckpt'}', which "
        "does not exist); will restart)"
    }


def test_results_of_another_json_shape_are_unreadable_not_a_traceback(tmp_path):
    """Sixth fault trial G3: a finished cell's metrics.json replaced by `[]` (valid JSON) was `done`, and the table
    died in a TypeError traceback. A result that is not a JSON object is unreadable: listed, tabulated as not
    finished, rerun by a run."""
    gfile = bm25_grid(tmp_path)
    root = tmp_path / "grids" / "g" / "bm25" / "syn"
    run_expecting(gfile, 0)
    (root / "seed1" / "metrics.json").write_text("[]")
    assert (
        listed(gfile)["bm25/syn/seed1"]
        == "partial (metrics.json unreadable (not a JSON object but a list); will rerun)"
    )
    code, out = grid_main(f"grid={gfile}", "action=table")
    assert code == 0 and "Traceback" not in out and "1 of 2 result cells are not finished" in out, out
    out = run_expecting(
        gfile,
        0,
        "warning: grid g: cell 'bm25/syn/seed1': metrics.json unreadable (not a JSON object but a list); rerunning it",
    )
    assert "seed1: ran" in out and set(listed(gfile).values()) == {"done"}


def test_a_folder_in_a_result_files_place_skips_the_cell_and_is_said(tmp_path):
    """Eighth fault trial G1: a finished cell's per_query.json replaced by a folder was "missing" to action=list,
    left out of the table without a word, and a run died in an IsADirectoryError traceback after deleting the cell's
    metrics.json. The cell is unusable until the folder is moved: listed so, said by the table, skipped by a run
    (exit 1) with its files kept; the other cells run."""
    gfile = bm25_grid(tmp_path)
    cell = tmp_path / "grids" / "g" / "bm25" / "syn" / "seed1"
    run_expecting(gfile, 0)
    (cell / "per_query.json").unlink()
    (cell / "per_query.json").mkdir()
    what = f"'{cell / 'per_query.json'}' is a folder, not a file"
    assert listed(gfile)["bm25/syn/seed1"] == f"unusable ({what}; will be skipped)"
    code, out = grid_main(f"grid={gfile}", "action=table")
    assert code == 0 and "Traceback" not in out, out
    assert warnings_of(out) == [
        f"warning: grid g: cell 'bm25/syn/seed1': {what}; not tabulated: move it away, then action=run (the same "
        "command without action=table) reruns that cell"
    ]
    metrics = (cell / "metrics.json").read_bytes()
    out = run_expecting(
        gfile, 1, f"warning: grid g: cell 'bm25/syn/seed1': {what}; skipped: move it away to run the cell"
    )
    assert (cell / "metrics.json").read_bytes() == metrics and (cell / "per_query.json").is_dir()
    (cell / "per_query.json").rmdir()
    run_expecting(
        gfile, 0, "warning: grid g: cell 'bm25/syn/seed1': per_query.json missing beside metrics.json; rerunning it"
    )
    assert set(listed(gfile).values()) == {"done"}


def test_the_grids_results_are_one_set(tmp_path, capsys, monkeypatch):
    """Ninth fault trial G2: with the grid's results.csv replaced by a folder, action=table replaced results.json
    (shrunk, when a cell had lost its results), then failed on results.csv and said the earlier results were
    unchanged. results.json, results.csv and the table are published together: a refused one leaves all three."""
    gfile = bm25_grid(tmp_path)
    grid = tmp_path / "grids" / "g"
    run_expecting(gfile, 0)
    (grid / "results.csv").unlink()
    (grid / "results.csv").mkdir()
    (grid / "bm25" / "syn" / "seed1" / "metrics.json").unlink()
    before = {n: (grid / n).read_bytes() for n in ("results.json", "table.md")}
    import experiments

    monkeypatch.setattr(experiments, "raise_on_signals", dict)  # this test process keeps its own handlers
    capsys.readouterr()
    assert experiments.run([f"grid={gfile}", "action=table"]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot write '{grid / 'results.csv'}' (it is a folder, not a file); earlier results in '{grid}' "
        "unchanged; move it away\n"
    )
    assert {n: (grid / n).read_bytes() for n in before} == before and not list(grid.glob(".results.tmp-*"))
    (grid / "results.csv").rmdir()
    assert grid_main(f"grid={gfile}", "action=table")[0] == 0
    assert (grid / "results.json").read_bytes() != before["results.json"] and (grid / "results.csv").is_file()


def test_an_evaluation_cell_under_a_training_folder_that_became_a_file_is_skipped(tmp_path):
    """Tenth fault trial G3b: a finished training cell's folder replaced by a file: action=list said both its cells
    would be skipped, but a run claimed the evaluation cell first, whose lock file would go inside that file: a
    FileExistsError traceback, the results not rewritten. Both cells are skipped with one line each, the others run
    and the table is written."""
    gfile = bm25_grid(tmp_path, eval_data={"syn": SYN, "syn_start": SYN_START})
    run_expecting(gfile, 0)
    cell = tmp_path / "grids" / "g" / "bm25" / "syn" / "seed1"
    shutil.rmtree(cell)
    cell.write_text("not a folder")
    said = f"'{cell}' is a file, not a folder; skipped: move it away to run the cell"
    out = run_expecting(
        gfile,
        1,
        f"warning: grid g: cell 'bm25/syn/seed1': {said}",
        f"warning: grid g: cell 'bm25/syn/seed1/eval-syn_start': {said}",
    )
    assert "Traceback" not in out and (tmp_path / "grids" / "g" / "results.json").is_file()
    assert cell.read_text() == "not a folder"
