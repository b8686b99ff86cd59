"""A fork server for the entry scripts (train.py, evaluate.py, experiments.py), started once per test process.

Importing the pipeline (torch, Lightning, transformers, wandb) takes 5-10 s of every `python train.py` start on the
project's 2-core machine: most of a tiny end-to-end run. This server imports it once, then runs each requested
script in a child forked from that state: a process of its own, with the requested arguments, working folder and
environment, stdout and stderr in the requested files and its own exit code, exactly as `python script.py args` but
for the imports already done. conftest.run_script uses it when the test asks for nothing a fork cannot give (see
there); a test that sends signals to the process, or runs with another environment, starts a real subprocess.

Protocol, one JSON object per line: the client writes {"argv", "cwd", "env", "stdout", "stderr", "fsize"}; the
server answers `@pid <pid>` once the child runs and `@exit <returncode>` when it ended (negative: killed by that
signal), as subprocess reports it. Not part of the project: tests only.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import signal
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# what every entry script imports first; the child then starts where a fresh process would be after these imports
import experiments  # noqa: E402, F401
import pipeline.cli  # noqa: E402, F401
import pipeline.run  # noqa: E402, F401


def _child(request: dict) -> None:
    """Become `python <argv>`: files, folder, environment, then the script as __main__; never returns normally."""
    os.setpgid(0, 0)  # its own process group: a timeout kills the child with every process it started
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_TRUNC)):
        target = os.open(path, flags)
        os.dup2(target, fd)
        os.close(target)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC)
    os.dup2(err, 2)
    os.close(err)
    if request.get("fsize") is not None:  # a full disk: the write fails with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (request["fsize"], request["fsize"]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))  # read at start-up by a fresh one
    # as a fresh interpreter has them: Ctrl-C raises KeyboardInterrupt, SIGTERM kills, SIGPIPE ignored (EPIPE errors)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # what `python script.py` puts first
    # SystemExit (sys.exit in the script) or any exception leaves the interpreter here as it would leave a fresh one:
    # atexit handlers, the traceback on stderr and exit code 1 for an uncaught exception
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def serve() -> None:
    sys.stdout.write("@ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        sys.stdout.write(f"@pid {pid}\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"@exit {os.waitstatus_to_exitcode(status)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
