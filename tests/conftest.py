"""Shared fixtures. Unit tests run on tiny random BERTs built here (a ColBERT step < 1 s); only smoke tests
and benchmarks load MiniLM."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A phase's progress lines (core/progress.py) depend on how fast this machine runs it: a test's output must not, so
# none prints unless a test asks (tests/test_progress.py sets the threshold itself).
os.environ.setdefault("ISORANK_PROGRESS_QUIET_S", "1000000")

# data.cache_dir defaults to the user's cache directory, $XDG_CACHE_HOME/isorank (datamodules/config.py): every test
# and every process a test starts (they inherit this environment) builds its caches under a temporary folder instead,
# never in the real ~/.cache. One folder per user, shared by the xdist workers and kept between sessions, as the
# checkout's .cache/ was: the caches are content-keyed and locked for sharing, and a session need not rebuild them.
# The Hugging Face cache stays where it was (its default follows XDG_CACHE_HOME): offline tests may read it.
os.environ.setdefault("HF_HOME", str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"))
os.environ["XDG_CACHE_HOME"] = str(Path(tempfile.gettempdir()) / f"isorank-tests-{os.getuid()}")

# Under pytest-xdist (`-n N`) each worker runs one thread: N workers then share the cores without oversubscription,
# and the train.py / evaluate.py processes a worker starts inherit these variables. The same thread count is not
# enough for bit-for-bit comparisons between a run inside the worker and one in a process of its own (they differed
# by 1e-8-4e-7, cause unknown): such tests compare runs started alike. Set before the test modules import torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()


# a tiny synthetic run on the CPU: seconds per job with a tiny BERT (tests of the capabilities and the recipes)
TINY_RUN = [
    "data=synthetic",
    "data.num_docs=40",
    "data.num_train_queries=6",
    "data.num_val_queries=4",
    "data.num_test_queries=6",
    "data.max_train_triples=24",
    "data.candidate_depth=12",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "eval.probe_queries=6",
    "eval.probe_docs=12",
]


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)  # a plugin may have imported torch before the variables above were read


def project_sources(*packages: str, root: Path = REPO) -> list[Path]:
    """The project's own Python files: the packages and top-level modules pyproject.toml installs (or `packages`,
    a subset of them), as git lists them (tracked, or untracked and not ignored) in a checkout, else found below
    each package folder. Never a virtual environment, build folder or cache inside the checkout."""
    import subprocess

    import tomllib

    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = [p.rstrip("*") for p in setup["packages"]["find"]["include"]]
    modules = [f"{m}.py" for m in setup.get("py-modules", [])]
    wanted = list(packages) or declared
    assert set(wanted) <= set(declared), f"not a package of pyproject.toml: {sorted(set(wanted) - set(declared))}"
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *wanted, *modules],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        files = [root / f for f in listed if f.endswith(".py") and (root / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist, say)
        files = [f for pkg in wanted for f in (root / pkg).rglob("*.py")] + [
            root / m for m in modules if (root / m).is_file()
        ]
    keep = [f for f in files if f.relative_to(root).parts[0] in {*wanted, *([] if packages else modules)}]
    return sorted(set(keep))


def sighup_default() -> None:
    """preexec_fn of a job a test sends SIGHUP to: the signal at its default, whatever the suite was started under.

    A suite started under `nohup` hands its children SIGHUP ignored, which a job then keeps ignoring (by design:
    core/signals.py), so a test of what SIGHUP does to a job would read the launcher's disposition, not the job's.
    """
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def small_run(
    *extra: str,
    triples: int = 40,
    eval_queries: int = 12,
    depth: int = 20,
    probe_queries: int = 8,
    probe_docs: int = 16,
    logger: bool = False,
) -> list[str]:
    """The tiny CPU run the end-to-end tests start from (one list, not a copy per file); sizes as keywords.

    `extra` overrides follow; logger=True leaves out `logger=none` (the default logger)."""
    return [
        "data=synthetic",
        f"data.max_train_triples={triples}",
        f"data.max_eval_queries={eval_queries}",
        f"data.candidate_depth={depth}",
        *([] if logger else ["logger=none"]),
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu",
        f"eval.probe_queries={probe_queries}",
        f"eval.probe_docs={probe_docs}",
        *extra,
    ]


def job_args(script: str, args: list[str]) -> list[str]:
    """The arguments of `args` that the job `script` runs for them reads (pipeline/jobs.py `applied`), in order.

    A setup list shared by several jobs (fine-tuning and evaluating the same tiny run) holds keys some of them do not
    read, which their command lines refuse; a grid passes its overrides the same way."""
    from pipeline.config import compose
    from pipeline.jobs import applied, select

    cfg = compose(args)
    return applied(args, select(cfg, script), cfg)


def finetune_steps(steps: int, before_training: bool = False) -> list[str]:
    """How the tiny end-to-end runs fine-tune: batches of 8, `steps` steps, a validation every 2 steps."""
    return [
        "data.batch_size=8",
        f"trainer.max_steps={steps}",
        "trainer.val_check_interval=2",
        f"eval.before_training={'true' if before_training else 'false'}",
    ]


def quick_eval(*extra: str, logger: str = "none") -> list[str]:
    """A quick CPU evaluation of any collection (16 test queries, depth 20), shared by the entry-point and ATS tests."""
    return [
        f"logger={logger}",
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu",
        "eval.probe_queries=8",
        "eval.probe_docs=16",
        "data.max_eval_queries=16",
        "data.candidate_depth=20",
        *extra,
    ]


# synthetic collection sizes for tests that only need the pipeline to run (bad input, empty splits, locks)
SMALL_SYNTHETIC = [
    "data.num_docs=60",
    "data.num_train_queries=10",
    "data.num_val_queries=4",
    "data.num_test_queries=4",
    "data.num_topics=4",
]
# the grid tests' training data: a synthetic collection with its own data seed, big enough for a 16-query test
GRID_SYN = [
    "data=synthetic",
    "data.data_seed=3",
    "data.num_docs=120",
    "data.num_train_queries=30",
    "data.num_val_queries=8",
    "data.num_test_queries=16",
    "data.num_topics=6",
]


def glow_head(batch_size: int) -> list[str]:
    """A small Glow head (32 units, one layer) that trains in seconds; the tests using it differ only in its batch."""
    return [
        "head=glow",
        "head.hidden_units=32",
        "head.hidden_layers=1",
        f"head.batch_size={batch_size}",
        "head.lr=1e-3",
    ]


def synthetic_config(cache_dir, **settings):
    """The data tests' small SyntheticConfig (120 docs, 60/8/8 queries, 4 topics) in cache_dir; `settings` override."""
    from datamodules.sources.synthetic import SyntheticConfig

    sizes = dict(num_docs=120, num_train_queries=60, num_val_queries=8, num_test_queries=8, num_topics=4)
    return SyntheticConfig(**{**sizes, **settings, "cache_dir": str(cache_dir)})


def synthetic_data(cache_dir, seed: int, tokenizer=None, setup: bool = True, **settings):
    """The data module most data tests build: synthetic_config(cache_dir, **settings), run seed `seed`, set up."""
    from datamodules.datamodule import RankingDataModule

    dm = RankingDataModule(synthetic_config(cache_dir, **settings), tokenizer=tokenizer, seed=seed)
    if setup:
        dm.setup()
    return dm


def msmarco_shaped_config(folder, cache_dir, **settings):
    """The `data=tsv` config of bench/synthetic_msmarco.py's files in `folder` (id triples), cache in `cache_dir`."""
    from bench import synthetic_msmarco as sm
    from datamodules.sources.tsv import TsvConfig

    f = sm.files(folder)
    return TsvConfig(
        collection=str(f["collection"]),
        cache_dir=str(cache_dir),
        train_queries=str(f["queries.train"]),
        train_qrels=str(f["qrels.train"]),
        train_triples=str(f["triples"]),
        val_queries=str(f["queries.dev"]),
        val_qrels=str(f["qrels.dev"]),
        test_queries=str(f["queries.test"]),
        test_qrels=str(f["qrels.test"]),
        **settings,
    )


def tiny_ranker_and_data(tmp_path: Path, backbone: str, model: str, **settings):
    """(ranker `model` on `backbone`, its tiny synthetic data module, not set up): what the isotropy tests measure."""
    import torch

    from lightning_modules.module import RankingModule

    torch.manual_seed(0)
    module = RankingModule({"name": model, "backbone": backbone, "query_max_len": 12, "doc_max_len": 24}, {})
    dm = synthetic_data(
        tmp_path / "cache",
        0,
        module.pair_tokenizer,
        setup=False,
        num_docs=60,
        num_train_queries=4,
        num_val_queries=2,
        num_test_queries=5,
        num_topics=3,
        candidate_depth=10,
        data_seed=0,
        **settings,
    )
    return module, dm


def module_and_data(cfg):
    """(RankingModule, the data module read for fitting) of a composed config, seeded as train.py seeds: what the
    tests that drive the pipeline's trainer themselves (build_trainer, then fit) start from."""
    import pytorch_lightning as pl
    from omegaconf import OmegaConf

    from lightning_modules.module import RankingModule
    from pipeline.stages import load_data

    pl.seed_everything(0)
    dm = load_data(cfg, fit=True)
    module = RankingModule(
        OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures)
    )
    dm.tokenizer = module.pair_tokenizer
    return module, dm


def tiny_bi_encoders(backbone: str) -> dict:
    """RepBERT (pooled vectors) and ColBERT (token vectors, passages cut at 24 tokens) on `backbone`, seeded, in eval
    mode: the pair the streaming-encoder tests run."""
    import torch

    from models.rankers import build_ranker
    from models.rankers.colbert import ColBERTConfig
    from models.rankers.repbert import RepBERTConfig

    torch.manual_seed(0)
    return {
        "repbert": build_ranker(RepBERTConfig(backbone=backbone)).eval(),
        "colbert": build_ranker(ColBERTConfig(backbone=backbone, doc_max_len=24)).eval(),
    }


def cpu_windows(ranker, numbered, encoder=None, *, output: str = "auto", batch_size: int = 4, sort: bool = True):
    """The batches (window, ids, vectors) of `numbered` windows of passages, on the CPU in fp32, by `encoder`
    (default: retrieval/encode.py `encode_windows`; or the serial loop it replaced, bench/bench_encode.py)."""
    import torch

    from models.loading import pair_tokenizer_for
    from retrieval.encode import encode_windows

    return (encoder or encode_windows)(
        ranker,
        pair_tokenizer_for(ranker),
        numbered,
        side="docs",
        batch_size=batch_size,
        device=torch.device("cpu"),
        precision="fp32",
        sort=sort,
        output=output,
    )


def compile_skip_reason() -> str | None:
    """Why torch.compile cannot run here (None: it can): it needs a C compiler for its CPU kernels and Python < 3.14."""
    import shutil
    import sys

    if sys.version_info >= (3, 14):
        return "torch.compile does not support this Python"
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        return "torch.compile needs a C compiler (none on PATH)"
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def require_shared(root: Path, relpaths: tuple[str, ...] = (), what: str = "shared data") -> None:
    """The one place that decides what a test does when files under ../shared are missing: in CI (env CI=true)
    fail, since CI must run every data test; anywhere else skip, naming the missing path. `relpaths` are relative to
    `root` (none: the folder itself); `what` names them in the message."""
    missing = [p for p in (root.joinpath(r) for r in (relpaths or ("",))) if not p.exists()]
    if not missing:
        return
    names = ", ".join(str(p) for p in missing)
    if in_ci():
        pytest.fail(
            f"{what} missing in CI (CI=true): {names}; CI must provide ../shared/{root.name} next to the repo",
            pytrace=False,
        )
    pytest.skip(f"{what} not present: {names}")


def require_shared_data(*relpaths: str) -> None:
    """Data under ../shared/data (require_shared): skipped when missing, a failure in CI."""
    require_shared(SHARED_DATA, relpaths)


def pytest_runtest_setup(item):
    """`@pytest.mark.data("cranfield", ...)`: the test reads those paths under ../shared/data; when one is missing it
    is skipped here, before its fixtures are built (outside CI)."""
    for mark in item.iter_markers("data"):
        if not in_ci():
            require_shared_data(*mark.args)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    """In CI a missing data path fails the test itself (reported FAILED, with the missing path)."""
    for mark in item.iter_markers("data"):
        require_shared_data(*mark.args)


def shared_data(*parts: str) -> Path:
    """Path under ../shared/data; a test that reads it carries `@pytest.mark.data(...)` naming it. Missing anyway:
    require_shared_data's skip or fail."""
    require_shared_data(str(Path(*parts))) if parts else require_shared_data()
    return SHARED_DATA.joinpath(*parts)


def read_dated_record(md: str | Path, tsv: str | Path, folder: Path, command: str, columns: list[str]):
    """Check a bench's dated record (bench/record.py: `<date>-<slug>.md` in `folder` with its date, `command`, commit
    and machine; the `.tsv` beside it headed by `columns`) and return (its Markdown, the TSV's rows as dicts)."""
    md, tsv = Path(md), Path(tsv)
    assert md.parent == folder and tsv.parent == folder and md.stem == tsv.stem
    text = md.read_text()
    for fact in ("- Date: ", f"- Command: `{command}", "- Commit: ", "- Machine: ", f"]({tsv.name})"):
        assert fact in text, fact
    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t") == columns
    return text, [dict(zip(columns, line.split("\t"))) for line in lines[1:]]


def make_tiny_bert(path: Path, seed: int = 0, hidden: int = 32, layers: int = 2, dropout: float = 0.1) -> Path:
    """A random BERT with MiniLM's uncased WordPiece tokenizer, saved as an HF model directory."""
    from models.rankers.backbone import save_random_bert  # lazy: the rankers package registers every ranker

    save_random_bert(
        path,
        seed=seed,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return str(make_tiny_bert(tmp_path_factory.mktemp("tiny_bert")))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models in a module's tests: one torch thread is fastest; two on a shared 2-core CPU spin-wait (25x slower
    here). Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_encoders(tiny_bert_nodropout) -> dict:
    """`tiny_bi_encoders` on the dropout-free tiny BERT, built once per module."""
    return tiny_bi_encoders(tiny_bert_nodropout)


@pytest.fixture(scope="session")
def tiny_bert_nodropout(tmp_path_factory) -> str:
    """Deterministic forward passes: DDP-vs-single-process comparisons need identical computations."""
    return str(make_tiny_bert(tmp_path_factory.mktemp("tiny_bert_nd"), dropout=0.0))


@pytest.fixture
def crash_when(monkeypatch):
    """`crash_when(predicate)`: every Trainer that the pipeline builds from now on raises RuntimeError("simulated
    crash") at the end of the first training batch where predicate(trainer) holds, as a killed job would stop
    (no checkpoint written on the way out). Undone at the end of the test, or by calling the returned `undo`."""
    from fault_driver import with_callback
    from pytorch_lightning import Callback

    def install(predicate):
        class Crash(Callback):
            def on_train_batch_end(self, trainer, *args):
                if predicate(trainer):
                    raise RuntimeError("simulated crash")

        with_callback(Crash(), monkeypatch.setattr)
        return monkeypatch.undo

    return install


class ForkServer:
    """The client of tests/forkserver.py: one server per test process, started at the first run_script that can use
    it; each run is a child forked after the pipeline's imports (5-10 s saved a run), with its own pid, exit code,
    stdout and stderr. What the imports print (warnings of a library, say) is printed again at the head of every
    run's output, where a fresh process prints it."""

    RUNTIME = ("PYTEST_CURRENT_TEST",)  # variables no import reads, changing from one test to the next

    def __init__(self):
        self.proc = None
        self.env: dict = {}

    def start(self, env: dict) -> None:
        import subprocess
        import sys
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="isorank-forkserver-"))
        with open(self.folder / "imports.err", "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "forkserver.py")],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.env, self.pending = env, b""
        self.head_out = "".join(f"{line}\n" for line in self._until("@ready", timeout=300)[0])
        self.head_err = (self.folder / "imports.err").read_text(errors="replace")

    def _until(self, tag: str, timeout: float) -> tuple[list[str], str]:
        """Lines read before the line starting with `tag`, and that line's value; TimeoutError after `timeout` s."""
        import select
        import time

        before, end = [], time.monotonic() + timeout
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text == tag or text.startswith(tag + " "):
                    return before, text[len(tag) :].strip()
                before.append(text)
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(tag)
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"the fork server stopped: {(self.folder / 'imports.err').read_text()[-3000:]}")
                self.pending += chunk

    def run(self, argv: list[str], cwd: Path, env: dict, timeout: float, extra_env: dict, fsize: int | None):
        """`argv` forked from a server started with `env`; the child's environment also has `extra_env` (read when
        the script runs, not by the imports) and, with `fsize`, a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored)."""
        import json
        import signal
        import subprocess

        # pytest names the running test in the environment: the child gets it, the server need not restart for it
        runtime = {k: env.pop(k) for k in list(env) if k in self.RUNTIME}
        if self.proc is None or self.proc.poll() is not None or env != self.env:
            self.stop()
            self.start(env)
        extra_env = {**runtime, **extra_env}
        out, err = self.folder / "run.out", self.folder / "run.err"
        request = {
            "argv": argv[1:],
            "cwd": str(cwd),
            "env": {**env, **extra_env},
            "stdout": str(out),
            "stderr": str(err),
            "fsize": fsize,
        }
        out.touch()
        err.touch()
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = int(self._until("@pid", timeout=60)[1])
        try:
            code = int(self._until("@exit", timeout=timeout)[1])
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)  # the child leads its own process group: its ranks and cells go too
            self._until("@exit", timeout=60)
            raise subprocess.TimeoutExpired(argv, timeout) from None
        _wait_for_group(pid, timeout=60)
        text = (out.read_text(errors="replace"), err.read_text(errors="replace"))
        return subprocess.CompletedProcess(argv, code, self.head_out + text[0], self.head_err + text[1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self.proc = None


def _wait_for_group(pgid: int, timeout: float) -> None:
    """Wait until no live process of group `pgid` is left (zombies aside), at most `timeout` s.

    The forked child leads its own process group; the ranks it launches (DDP) belong to it and write to the same
    files, and may outlive it by a moment (a survivor printing why it stopped). subprocess.run waits for them by
    waiting for its pipes' end; this is the same wait for the files the fork server writes to."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended while we looked
            if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
                alive = True
                break
        if not alive:
            return
        time.sleep(0.1)


FORK_SERVER = ForkServer()


@pytest.fixture(scope="session", autouse=True)
def _stop_fork_server():
    yield
    FORK_SERVER.stop()


def run_script(
    script: str,
    *args: str,
    cwd: Path = REPO,
    timeout: int = 600,
    check: bool = True,
    env: dict | None = None,
    extra_env: dict | None = None,
    fsize: int | None = None,
    fork: bool = True,
):
    """Run train.py / evaluate.py / experiments.py (or a test driver such as tests/fault_driver.py) as a user would,
    as a process of its own; the CompletedProcess.

    Forked from the fork server (ForkServer: the same process but for the imports done once) unless `env=` replaces
    the environment or fork=False: then a fresh interpreter, `python script args`. `extra_env`: variables the
    script reads when it runs (fault injection); `fsize`: the process may write files of at most this many bytes."""
    import resource
    import signal
    import subprocess
    import sys

    default = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    target = [script] if script.startswith("-") else [str(REPO / script)]  # "-m", "pkg.module" runs a module
    argv = [sys.executable, *target, *args]
    if fork and env is None and not script.startswith("-"):
        proc = FORK_SERVER.run(argv, cwd=cwd, env=default, timeout=timeout, extra_env=extra_env or {}, fsize=fsize)
    else:

        def limits():
            if fsize is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing it
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

        env = {**(env if env is not None else default), **(extra_env or {})}
        proc = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=limits
        )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def fake_checkpoint(path, backbone: str, name: str = "colbert"):
    """A ranker checkpoint as train.py saves it (the keys load_module reads), with weights moved away from the
    backbone's so the fine-tuned and backbone series differ."""
    import torch

    from lightning_modules.module import RankingModule

    model, optim = {"name": name, "backbone": backbone}, {}
    m = RankingModule(model, optim)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.ranker.encoder.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    torch.save({"state_dict": m.state_dict(), "hyper_parameters": {"model": model, "optim": optim}}, path)
    return path
