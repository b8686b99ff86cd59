"""Declared ranges of numeric config keys, checked when the config is composed.

So `--dry-run` checks them too, before any file is written or any model loaded.

Each schema lists its numeric keys once, in its `__post_init__`:

    check_ranges("optim", self, lr=POSITIVE, weight_decay=NON_NEGATIVE, warmup_steps=NON_NEGATIVE)

A value outside its range is one line naming the key, the value and what is allowed, e.g.
`config key 'optim.lr': is -1.0; expected > 0`. Null is left to the schema's types: a key typed `int | None`
takes null (it means "off" or "the default"), a key typed `int` does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import InputError


@dataclass(frozen=True)
class Range:
    """The allowed values of a numeric config key: `value in r` tests one, `str(r)` describes them in messages.

    Numbers from `lo` to `hi` (None: unbounded; `lo_open` / `hi_open` leave the bound itself out), plus the
    special values in `also` (Lightning's -1 = no limit, "auto"). `integer`: whole numbers only, for keys typed Any
    where an int and a float mean different things. `note` says why, in the message.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    also: tuple = ()
    integer: bool = False
    note: str = ""

    def __contains__(self, value) -> bool:
        if any(type(value) is type(a) and value == a for a in self.also):
            return True
        # bool is an int to Python, never a count here; NaN and inf pass no bound check either
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if self.lo is not None and not (value > self.lo if self.lo_open else value >= self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def __str__(self) -> str:
        what = "an integer" if self.integer else "a number"
        if self.lo is not None and self.hi is not None:
            text = (
                f"{what} in {'(' if self.lo_open else '['}{_num(self.lo)}, "
                f"{_num(self.hi)}{')' if self.hi_open else ']'}"
            )
        elif self.lo is not None:
            text = f"{what + ' ' if self.integer else ''}{'>' if self.lo_open else '>='} {_num(self.lo)}"
        elif self.hi is not None:
            text = f"{what + ' ' if self.integer else ''}{'<' if self.hi_open else '<='} {_num(self.hi)}"
        else:
            text = what
        text = ", or ".join([text, *(repr(a) for a in self.also)])
        return f"{text} ({self.note})" if self.note else text


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


POSITIVE = Range(0, lo_open=True)  # learning rates, temperatures, scales
NON_NEGATIVE = Range(0)  # warm-up steps, weight decay, worker counts, seeds
COUNT = Range(1)  # batch sizes, depths, layers, dimensions, epochs
FRACTION = Range(0, 1, hi_open=True)  # dropout, shares of a split
PROBABILITY = Range(0, 1)
SEED = Range(
    0, 2**32 - 1, integer=True
)  # numpy and Lightning's seed_everything take no other (Lightning silently uses 0 instead)


def check_range(key: str, value, allowed: Range | tuple[Range, ...]) -> None:
    """`value` of config key `key` (null passes: the schema's type decides) lies in `allowed` (a tuple: in any)."""
    ranges = allowed if isinstance(allowed, tuple) else (allowed,)
    if value is None or any(value in r for r in ranges):
        return
    raise InputError(f"config key '{key}'", f"is {value!r}; expected {', or '.join(map(str, ranges))}")


def check_ranges(group: str, obj, **ranges: Range | tuple[Range, ...]) -> None:
    """`check_range` of each `obj.<key>` as config key `<group>.<key>`."""
    for key, allowed in ranges.items():
        check_range(f"{group}.{key}", getattr(obj, key), allowed)
