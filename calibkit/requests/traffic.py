"""Where unlabeled traffic evidence comes from: :class:`Traffic` (a keyword) or a log's path.

The one rule for reading a word, from the command line or the API: ``Traffic.DEFAULT``/``Traffic.AUTO`` (the enum
members) are the keywords; a :class:`~pathlib.Path` (any ``os.PathLike``) is always a log; a plain string is the
keyword it spells (``"auto"``, ``"default"``) unless a file by that name exists, which is then the log — so a log
named ``auto`` needs no ``./auto``, and ``Traffic.AUTO`` (or ``--traffic auto`` where no such file is) always
means the calibration set's own log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

from calibkit.requests.options import Choice

_V = TypeVar("_V")


class Traffic(Choice):
    """``DEFAULT``: the calibration set's own log when it is still there unchanged, else none; ``AUTO``: the log
    named in the calibration set's manifest (refused when it is gone or changed)."""

    DEFAULT = "default"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: _V) -> Traffic | Path | _V:
        """A keyword or a log path from ``value`` by the module's rule; None, drawn evidence and anything this
        cannot read (left for ``validate()`` to refuse) as they are."""
        if isinstance(value, cls) or value is None:
            return value
        if isinstance(value, os.PathLike):
            return Path(value)
        if isinstance(value, str):
            if value in {m.value for m in cls} and not Path(value).exists():
                return cls(value)
            return Path(value)
        return value


def traffic_path(traffic: object) -> Path | None:
    """The log a traffic choice reads, when it names one by path (an input the outputs must stay apart from)."""
    return traffic if isinstance(traffic, Path) else None
