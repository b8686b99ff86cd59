"""`key=value` command lines for the benches, the grammar of train.py / evaluate.py:

    python -m bench.bench_speed rankers=colbert precision=fp32,bf16 steps=5 out=/tmp/speed.json

A bench declares its options as a dataclass (snake_case fields with defaults; `field(metadata={"choices": ...})`
for a fixed set of values) and calls `parse(Options, argv, __doc__)`. Values are YAML-typed and checked against the
field types by OmegaConf (`null` for None); an unknown key, a wrong-typed value or a value outside its choices exits
with code 2 and one line, as argparse did. `help` (or `-h`, `--help`) prints the keys with their defaults.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import NoReturn, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")

HELP = ("help", "-h", "--help")


def error(message: str) -> NoReturn:
    """One line on stderr and exit code 2 (the benches' usage errors)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def usage(schema: type, doc: str | None = None) -> str:
    lines = [doc.strip(), ""] if doc else []
    lines.append("keys (key=value):")
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        choices = f.metadata.get("choices")
        lines.append(f"  {f.name}={default}" + (f"  ({' | '.join(map(str, choices))})" if choices else ""))
    return "\n".join(lines)


def parse(schema: type[T], argv: list[str] | None = None, doc: str | None = None) -> T:
    """The `schema` instance of the `key=value` args `argv` (default: sys.argv[1:]) over its defaults."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if any(a in HELP for a in argv):
        print(usage(schema, doc))
        raise SystemExit(0)
    keys = [f.name for f in dataclasses.fields(schema)]
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            error(f"argument '{arg}': expected key=value with a key of {keys}")
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv))
        opts = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or getattr(e, "key", None) or "?"
        problem = str(e).splitlines()[0]
        if "not in" in problem:
            problem = f"unknown key; expected one of {keys}"
        error(f"key '{key}': {problem}")
    for f in dataclasses.fields(schema):
        choices = f.metadata.get("choices")
        if choices is not None and getattr(opts, f.name) not in choices:
            error(f"key '{f.name}': got {getattr(opts, f.name)!r}; expected one of {list(choices)}")
    return opts
