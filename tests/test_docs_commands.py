"""Every `python train.py | evaluate.py | experiments.py ...` command documented in README.md and docs/*.md composes
and validates: each is run with `--dry-run` appended (compose and check the config, load and write nothing; for
experiments.py every cell's config, as `action=list`) and must exit 0.

A command may name a checkpoint (or an input file such as `analysis.run`) that an earlier documented command
produces: "checkpoint '...' does not exist" (or "'...' does not exist" of that key) for a path the command names is
tolerated. Commands come from ```bash (sh, shell, console) fences, one per line
(`\\` continuations joined, a leading `$ ` prompt and leading `VAR=value` environment assignments allowed), and from
inline `code` in the prose. Synopsis notation is read as such: a `...` argument or `key=...` is dropped, an optional
`[key=value]` is validated as `key=value`, and a command with an all-caps placeholder value (`grid=NAME`) other than a
checkpoint path is skipped, saying so.

The dry runs execute the entry scripts in this process (runpy, `__name__ == "__main__"`, sys.argv set: the code
path of the command line without a Python start-up per command); test_entry_scripts_dry_run_in_a_subprocess runs
each script once as a real command line."""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.docs

SCRIPTS = ("train.py", "evaluate.py", "experiments.py")
# docs/extending.md's commands name the ranker, head, analysis and source its recipes add: test_extending.py dry-runs
# them with the recipes registered
DOC_FILES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("**/*.md") if p.name != "extending.md")]
ENV = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
_SHELL = {"bash", "sh", "shell", "console", "zsh"}
_ASSIGN = r"[A-Za-z_][A-Za-z0-9_]*=\S*"
_COMMAND = re.compile(rf"^((?:{_ASSIGN}\s+)*)python3? ({'|'.join(re.escape(s) for s in SCRIPTS)})(?=\s|$)(.*)$")
_INLINE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")  # an inline code span may wrap onto the next line
_SHELL_OPS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1"}
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # PATH, NAME, N
_MISSING_CKPT = re.compile(r"checkpoint '([^']+)' does not exist")
# an input file a schema declares (core/inputs.py, e.g. analysis.run), checked at --dry-run since issue 48
_MISSING_INPUT = re.compile(r"config key '([\w.]+)': '([^']+)' does not exist \(resolved to ")


def documented_commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command text) of every documented train/evaluate/experiments command in a Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, prose, fence, i = [], [], None, 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if fence is None and m:
            fence = (m.group(1)[0], len(m.group(1)), m.group(2).lower())
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= fence[1] and not m.group(2):
                fence = None
            elif fence[2] in _SHELL:
                start, text = i + 1, line.strip()
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i].strip()
                text = text.removeprefix("$ ")
                if _COMMAND.match(text):
                    found.append((start, text))
        else:
            prose.append((i + 1, line))
        i += 1
    text = "\n".join(line for _, line in prose)
    for m in _INLINE.finditer(text):
        code = " ".join(m.group(1).split())
        if _COMMAND.match(code):
            found.append((prose[text.count("\n", 0, m.start())][0], code))
    return sorted(found)


def _cases():
    for path in DOC_FILES:
        for line, command in documented_commands(path):
            yield pytest.param(command, id=f"{path.relative_to(REPO)}:{line}")


def parse(command: str) -> tuple[dict[str, str], str, list[str], list[str]]:
    """(environment assignments, script, arguments as a user's shell passes them, placeholders left in them)."""
    m = _COMMAND.match(command)
    env = dict(a.split("=", 1) for a in m.group(1).split())
    args = []
    for tok in shlex.split(m.group(3), comments=True):
        if tok in _SHELL_OPS or tok.startswith((">", "2>")):
            break  # the rest is for the shell (a pipe, a redirection, a second command)
        if tok == "..." or tok.endswith("=..."):
            continue  # synopsis: "and more arguments", "a value of your choice"
        if tok.startswith("[") and tok.endswith("]"):
            tok = tok[1:-1]  # synopsis: an optional argument
        args.append(tok)
    placeholders = [a for a in args if "=" in a and _PLACEHOLDER.match(a.split("=", 1)[1]) and not _checkpoint_arg(a)]
    return env, m.group(2), args, placeholders


def _checkpoint_arg(arg: str) -> bool:
    key, _, value = arg.partition("=")
    return "ckpt" in key or value.endswith((".ckpt", ".pt"))


def dry_run(script: str, args: list[str]) -> int:
    """`python <script> <args> --dry-run`, executed in this process; the exit code."""
    argv = [str(REPO / script), *args, "--dry-run"]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    raise AssertionError(f"{script} returned without sys.exit")


def assert_ok_or_missing_checkpoint(rc: int, out: str, err: str, args: list[str], where: str) -> None:
    if rc == 0:
        return
    named = {a.split("=", 1)[1] for a in args if "=" in a and _checkpoint_arg(a)}
    named |= {value for key, value in _MISSING_INPUT.findall(err) if f"{key}={value}" in args}
    missing = set(_MISSING_CKPT.findall(err)) | {value for _, value in _MISSING_INPUT.findall(err)}
    if rc == 2 and missing and missing <= named and not any(Path(REPO, p).exists() for p in missing):
        return  # a checkpoint an earlier documented command writes
    raise AssertionError(f"{where}: exit code {rc}\nstdout: {out[-2000:]}\nstderr: {err[-4000:]}")


@pytest.mark.parametrize("command", list(_cases()))
def test_documented_command_dry_runs(command, monkeypatch, capsys):
    env, script, args, placeholders = parse(command)
    if placeholders:
        pytest.skip(f"synopsis with placeholder {placeholders[0]}: {command}")
    monkeypatch.chdir(REPO)
    for k, v in {**ENV, **env}.items():
        monkeypatch.setenv(k, v)
    rc = dry_run(script, args)
    out, err = capsys.readouterr()
    assert_ok_or_missing_checkpoint(rc, out, err, args, command)


def test_readme_documents_commands_of_every_script():
    """Guards the extraction above: README.md shows each entry script, in a fence and inline."""
    found = documented_commands(REPO / "README.md")
    for script in SCRIPTS:
        assert any(f" {script}" in c for _, c in found), script


def _first_runnable(script: str) -> list[str] | None:
    for path in DOC_FILES:
        for _, command in documented_commands(path):
            env, s, args, placeholders = parse(command)
            if s == script and not env and not placeholders and not any(_checkpoint_arg(a) for a in args):
                return args
    return None


@pytest.mark.slow  # a fresh interpreter each (~10 s of imports): the one check of a real start from a shell
@pytest.mark.parametrize("script", SCRIPTS)
def test_entry_scripts_dry_run_in_a_subprocess(script):
    """Once per script, as a shell runs it: a fresh interpreter, cwd the repo root, the documented arguments."""
    args = _first_runnable(script)
    if args is None:
        pytest.skip(f"no documented {script} command without a checkpoint or placeholder")
    proc = subprocess.run(
        [sys.executable, script, *args, "--dry-run"],
        cwd=REPO,
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{script} {' '.join(args)} --dry-run: {proc.returncode}\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip(), "--dry-run printed nothing"
