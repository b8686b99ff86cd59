"""One exception type for every user-facing input error.

Each message is one line that names where the problem is (file and line, or config key) and what was
expected, so a researcher can fix the input without reading a traceback.
"""

import json
from dataclasses import fields


class InputError(ValueError):
    """Bad user input: a data file, a config key or a checkpoint. The message is the whole story."""

    def __init__(self, where: str, problem: str):
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


def check_choice(key: str, value, choices) -> None:
    """For string options with a fixed set of values (a misspelt choice must not fall through to a default)."""
    if value not in choices:
        raise InputError(f"config key '{key}'", f"got {value!r}; expected one of {sorted(choices)}")


def check_unused(group: str, obj, keys, why: str, remedy: str) -> None:
    """Refuse a setting of a switch left off: a key of `keys` of the dataclass `obj` away from its default.

    Silently unused by every job, it is an error naming the key, `why` it is unused (the switch that is off) and the
    `remedy`: `config key 'optim.margin': is 0.5 but optim.loss is 'ce' ...; leave it at 1.0 or set optim.loss=hinge`.
    """
    defaults = {f.name: f.default for f in fields(obj)}
    for key in keys:
        value, default = getattr(obj, key), defaults[key]
        if value != default:
            raise InputError(
                f"config key '{group}.{key}'",
                f"is {_shown(value)} but {why}; leave it at {_shown(default)} or {remedy}",
            )


def _shown(value) -> str:
    """Show a config value as a message does: strings quoted, None and booleans as YAML writes them."""
    return f"'{value}'" if isinstance(value, str) else json.dumps(value)


class TrainingStopped(RuntimeError):
    """Training stopped by a configured policy (e.g. `optim.nonfinite=stop`).

    The message says why and which checkpoint is the last good one.
    """
