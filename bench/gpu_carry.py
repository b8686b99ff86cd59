"""Prepare what the lent GPU machine needs and cannot fetch: `.gpu/`, carried with the working tree.

    python -m bench.gpu_carry [dest=.gpu] [python_version=3.12] [pylate=true]

That machine (the device tool's nvidia-h200) has no internet and its own Python 3.12, torch, transformers and
pytorch-lightning (/work/.library/device/KINDS.md). This writes, here, where the package registries are reachable:
- `<dest>/wheels`: the project's packages it lacks (bench/requirements-gpu-project.txt), wheels for its Python;
- `<dest>/pylate-wheelhouse`: PyLate and what it needs there (bench/requirements-gpu-pylate.txt), unless pylate=false;
- `<dest>/tokenizer`: the MiniLM tokenizer (the random backbones' tokenizer; MiniLM's weights stay behind);
- `<dest>/COMMIT`: this checkout's commit (no .git travels), which the records there name;
then checks that the working tree that travels (tracked and untracked, not ignored files, and `<dest>`) stays under
the device tool's 64 MiB. `<dest>` is git-ignored, so the device call names it in `carry`:

    run(command="bash bench/gpu_session.sh shapes=minilm", carry=[".gpu"], timeout_s=600)

A wheel is downloaded for the target's interpreter and platforms (`pip download --only-binary=:all: --no-deps`);
one already in the folder is kept, and one the requirements no longer name (an older pin) is removed: two versions of
a package stop pip's whole install there. Exit 2 with one line when pip fails or the tree is over the limit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import options, record

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 64 * 2**20  # what the device tool sends: tracked and untracked-not-ignored files and `carry`
PLATFORMS = (  # manylinux tags the machine's pip accepts (glibc 2.35+), newest first
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


@dataclass
class Options:
    dest: str = ".gpu"
    python_version: str = "3.12"  # the machine's (KINDS.md: Python 3.12.3)
    pylate: bool = True


def requirements(name: str) -> list[str]:
    """The requirement lines of bench/<name> (comments and blank lines left out)."""
    lines = (REPO / "bench" / name).read_text().splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


def download(reqs: list[str], folder: Path, python_version: str) -> None:
    """`pip download` of `reqs` (pinned, no dependencies) as binary wheels for the target into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(folder)]
    cmd += ["--python-version", python_version, "--implementation", "cp", *platforms, *reqs]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR")] or p.stderr.strip().splitlines()
        options.error(f"pip download into {folder} failed: {(errors or ['no message'])[-1]}")


def _key(name: str, version: str) -> tuple[str, str]:
    """A distribution's name and version as a wheel's file name spells them (lower case, runs of - _ . as _)."""
    return re.sub(r"[-_.]+", "_", name).lower(), version


def prune(folder: Path, reqs: list[str]) -> list[str]:
    """Remove the wheels of `folder` that no line of `reqs` (name==version) names; return their file names."""
    wanted = {_key(*r.split("==")) for r in reqs}
    stale = [w for w in sorted(folder.glob("*.whl")) if _key(*w.name.split("-")[:2]) not in wanted]
    for w in stale:
        w.unlink()
    return [w.name for w in stale]


def travelling_bytes(extra: Path) -> int:
    """Bytes of the files the device tool sends: tracked and untracked-not-ignored files, and `extra`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    files = {REPO / name.decode() for name in listed if name}
    files |= {f for f in extra.rglob("*") if f.is_file()}
    return sum(f.stat().st_size for f in files if f.is_file())


def main(argv: list[str] | None = None) -> Path:
    opts = options.parse(Options, argv, __doc__)
    dest = Path(opts.dest)
    dest = dest if dest.is_absolute() else REPO / dest
    if dest.resolve().parent == REPO.resolve():
        # the trailing slash: a folder pattern (/.gpu/) matches a path named as a folder, whether or not it exists
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{dest}/"], cwd=REPO).returncode == 0
        if not ignored:
            options.error(
                f"dest={opts.dest}: not git-ignored, so it would travel twice; add /{dest.name}/ to .gitignore"
            )
    folders = {"requirements-gpu-project.txt": dest / "wheels"}
    if opts.pylate:
        folders["requirements-gpu-pylate.txt"] = dest / "pylate-wheelhouse"
    for name, folder in folders.items():
        download(requirements(name), folder, opts.python_version)
        for stale in prune(folder, requirements(name)):
            print(f"removed {folder / stale}: bench/{name} no longer names it")
    from transformers import AutoTokenizer  # lazy: heavy

    from models.rankers.backbone import resolve

    AutoTokenizer.from_pretrained(resolve("minilm")).save_pretrained(dest / "tokenizer")
    commit = record.git_commit()
    (dest / "COMMIT").write_text(commit + "\n")
    size = travelling_bytes(dest)
    carried = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {carried / 2**20:.1f} MiB for Python {opts.python_version}, commit {commit}")
    print(f"the working tree with it: {size / 2**20:.1f} MiB of the device tool's {LIMIT_BYTES / 2**20:.0f}")
    if size > LIMIT_BYTES:
        options.error(f"{size / 2**20:.1f} MiB would travel, over the device tool's 64 MiB: carry less")
    return dest


if __name__ == "__main__":
    main()
