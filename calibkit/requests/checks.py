"""What values an option takes, checked before any work: numbers by their :class:`Bound`, paths, names.

Every request's ``validate()`` and every API function ask these, so a command line and a Python caller get the same
checks and the same messages (each naming the option as the command line spells it, and what to pass instead).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calibkit.errors import UsageError

#: the largest whole number any option takes: numpy, ONNX Runtime and JSON readers all hold an int64
INT_LIMIT = (1 << 63) - 1
#: the most worker processes a local pool is asked for
MAX_WORKERS = 1024


@dataclass(frozen=True)
class Bound:
    """What values a numeric option takes: finite always; ``low``/``high`` inclusive, ``above``/``below``
    exclusive; ``integer``: a whole ``int`` (``bool`` is not one); ``optional``: None allowed; ``example``:
    a value to suggest; ``what``: its name in messages."""

    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None
    integer: bool = False
    optional: bool = False
    example: str = ""
    what: str = ""  # what the option is, e.g. "a percentage" (default: a finite number / a whole number)

    def describe(self) -> str:
        """What the option takes, e.g. "a whole number, at least 1" or "a percentage in [0, 100]"."""
        kind = self.what or ("a whole number" if self.integer else "a finite number")
        return f"{kind} {self.range()}".strip() if self.range().startswith("in ") else \
            ", ".join(x for x in (kind, self.range()) if x)

    def range(self) -> str:
        lo = f"[{self.low:g}" if self.low is not None else f"({self.above:g}" if self.above is not None else ""
        hi = f"{self.high:g}]" if self.high is not None and self.high < INT_LIMIT else \
            f"{self.below:g})" if self.below is not None else ""
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"at least {self.low:g}" if self.low is not None else f"more than {self.above:g}"
        if hi:
            return f"at most {self.high:g}" if self.high is not None else f"less than {self.below:g}"
        return ""

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` (None: nothing): not the kind of number wanted (a string, a bool, NaN or
        an infinity, a fraction for a whole number), or out of range."""
        if value is None:
            return None if self.optional else f"be {self.describe()}"
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or self.integer and not isinstance(value, int)):
            return f"be {self.describe()}"
        if abs(value) > INT_LIMIT:
            return f"be at most {INT_LIMIT} in size"
        inside = ((self.low is None or value >= self.low) and (self.high is None or value <= self.high)
                  and (self.above is None or value > self.above) and (self.below is None or value < self.below))
        return None if inside else f"be {self.describe() if self.what else self.range()}"

    def admits(self, value: object) -> bool:
        return self.problem(value) is None


COUNT = Bound(low=1, high=INT_LIMIT, integer=True)
COUNT_OR_NONE = Bound(low=1, high=INT_LIMIT, integer=True, optional=True)
WORKERS = Bound(low=1, high=MAX_WORKERS, integer=True, optional=True, example="2")
PERCENTILE = Bound(above=0, high=100, example="99.99")
TRAFFIC_SIZE = Bound(low=1, high=INT_LIMIT, integer=True, example="4000")


def check_numbers(checks: Mapping[str, tuple[object, Bound]]) -> None:
    """UsageError for the first option whose value its :class:`Bound` does not admit (NaN, an infinity, a
    string, a float where a whole number goes, a value out of range), naming the option, the value and what it
    takes. Every API function calls this before it reads a file or starts any work."""
    for option, (value, bound) in checks.items():
        problem = bound.problem(value)
        if problem is not None:
            shown = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else f"{value}"
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise UsageError(f"{option} must {problem}, got {shown}",
                             hint=f"e.g. {option} {bound.example}" if bound.example else
                             f"pass {option} as {bound.describe()}")


def check_paths(required: Mapping[str, object], optional: Mapping[str, object] | None = None, *,
                loaded: tuple[type, ...] = ()) -> None:
    """UsageError for an argument that should be a path (a str or os.PathLike, or one of the ``loaded`` calibkit
    values the function also takes) and is something else: None where it is ``required``, a number, a list."""
    optional = optional or {}
    for name, value in (*required.items(), *optional.items()):
        if value is None and name in optional:
            continue
        if not isinstance(value, (str, os.PathLike, *loaded)):
            what = " or ".join(["a path (str or os.PathLike)", *(t.__name__ for t in loaded)])
            raise UsageError(f"{name} must be {what}, got {type(value).__name__}",
                             hint=f"pass {name} as a file or folder path, e.g. {name}='runs/x'")


def check_names(names: Mapping[str, object] | None = None, lists: Mapping[str, object] | None = None, *,
                required: Sequence[str] = ()) -> None:
    """UsageError for an argument that should be a name (a str; None too unless it is ``required``) or a list
    of names (a str alone is not one: ``exclude="fc1"`` would read as three one-letter patterns) and is
    something else."""
    for name, value in (names or {}).items():
        if (value is not None or name in required) and not isinstance(value, str):
            raise UsageError(f"{name} must be a string, got {type(value).__name__}", hint=f"e.g. {name}='...'")
    for name, value in (lists or {}).items():
        if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{name} must be a list of strings, got {type(value).__name__}",
                             hint=f"e.g. {name}=['...'] (a list, even of one)")
