"""What ``calibkit export`` is asked: :class:`ExportRequest`, every option declared once, and
:class:`ExportSource`, what its SOURCE turned out to be (``exporter.pipeline.resolve_source``), which the request
also takes in place of a path.

The export (``exporter.pipeline``) reads the request as its configuration and the task names and the tolerance's
default from here; this module imports only the declarations and the foundation.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from calibkit.errors import UsageError
from calibkit.requests.checks import Bound, check_names, check_paths
from calibkit.requests.options import check_bounds, option
from calibkit.types import PathLike

#: the tasks an exported folder can serve, as calibkit's commands read them
TASKS = ("classification", "embedding", "token-classification", "regression", "multi-label")
DEFAULT_TOLERANCE = 1e-4  # of the source's largest |output|: float32 rounding is 1e-7..1e-5 of it


class SourceKind(str, enum.Enum):
    HUGGING_FACE = "hugging-face"
    SENTENCE_TRANSFORMERS = "sentence-transformers"
    ONNX = "onnx"


@dataclass(frozen=True)
class ExportSource:
    """What ``calibkit export`` was given."""

    kind: SourceKind
    path: Path  # as given: a folder, or an .onnx file
    tokenizer: Path  # the folder holding the tokenizer files
    config: Path | None  # config.json of the transformer (None: an ONNX file without one)
    checkpoint: Path | None = None  # the transformer's save_pretrained folder (Hugging Face, sentence-transformers)
    pooling: str | None = None  # sentence-transformers: mean | cls | max | lasttoken
    normalize: bool = False  # sentence-transformers: a Normalize module follows the pooling
    max_seq_length: int | None = None  # sentence-transformers: the tokens its Transformer module reads
    lowercase: bool = False  # sentence-transformers: do_lower_case, texts lowercased before tokenizing


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    """The model folder every other command reads, exported from the user's own model: FP32 ONNX with dynamic
    batch and sequence axes, the task recorded, its outputs checked against the source's."""

    source: PathLike | ExportSource = option(
        argument=True, positional=True, cli_type=Path,
        help="A Hugging Face folder (PyTorch or safetensors weights, any task head), a sentence-transformers folder, "
             "or an .onnx file (copied and checked, not re-exported); from Python, a resolved ExportSource too.")
    out: PathLike = option(flags=("--out", "-o"), positional=True, cli_type=Path,
                           help="The model folder to write (new, or calibkit's; atomically: a refused export leaves "
                                "nothing).")
    tokenizer: PathLike | None = option(
        None, cli_type=Path | None, help="Tokenizer folder, when it is not inside SOURCE (an .onnx file's).")
    task: str | None = option(
        None, help=f"{', '.join(TASKS[:-1])} or {TASKS[-1]} (default: from config.json's architectures and "
                   "problem_type). embedding exports the encoder of any head.")
    tolerance: float = option(DEFAULT_TOLERANCE, bound=Bound(above=0, example="1e-4"),
                              help="Largest accepted |ONNX - PyTorch| relative to the largest output.")

    def __post_init__(self) -> None:
        for name in ("source", "out", "tokenizer"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)):  # anything else is left for validate() to refuse
                object.__setattr__(self, name, Path(value))
        self.validate()  # a request that exists is valid: checked once, when it is made

    def validate(self) -> None:
        """Every check that reads no file: UsageError naming the option and what to pass instead."""
        check_paths({"source": self.source, "out": self.out}, {"tokenizer": self.tokenizer}, loaded=(ExportSource,))
        check_names({"task": self.task})
        check_bounds(self)
        if self.task is not None and self.task not in TASKS:
            raise UsageError(f"unknown --task {self.task!r}", hint=f"choose {', '.join(TASKS)}")
