"""One exception type for every user-facing input error.

Each message is one line that names where the problem is (file and line, or config key) and what was
expected, so a researcher can fix the input without reading a traceback.
"""


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


class TrainingStopped(RuntimeError):
    """Training stopped by a configured policy (e.g. `optim.nonfinite=stop`).

    The message says why and which checkpoint is the last good one.
    """
