"""One error tree. The CLI maps each class to an exit code and a one-line message."""

from __future__ import annotations


class CalibkitError(Exception):
    """Base of every error calibkit raises on purpose. ``hint`` tells the user what to do."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(CalibkitError):
    """Arguments that do not fit together."""

    exit_code = 2


class DataError(CalibkitError):
    """Input data (logs, calibration sets, eval sets) that cannot be used."""

    exit_code = 3


class ModelError(CalibkitError):
    """An ONNX model, tokenizer or config that cannot be used."""

    exit_code = 4


class CalibrationError(CalibkitError):
    """Statistics or ranges that cannot be computed or read."""

    exit_code = 5


class BackendError(CalibkitError):
    """An inference backend failed (ONNX Runtime session, TensorRT build)."""

    exit_code = 6


class MissingDependencyError(CalibkitError):
    """An optional dependency is not installed; the message names the extra to install."""

    exit_code = 7


class TargetMissedError(CalibkitError):
    """A stated target was missed (compare --min-agreement/--max-drop, tune --fail-if-missed): outputs written"""

    exit_code = 8
