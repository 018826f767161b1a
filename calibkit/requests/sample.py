"""What ``calibkit sample`` is asked: :class:`SampleRequest`, every option declared once.

The data layer's sampling (``data.sample_pipeline``) reads the request as its configuration, so this module
imports only the declarations (``requests.options``, ``requests.checks``) and the foundation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from calibkit.requests.checks import INT_LIMIT, Bound, check_names, check_paths
from calibkit.requests.options import check_bounds, option
from calibkit.types import PathLike, check_seed

#: the suffixes a log's name loses in the default output folder (``x.jsonl.gz`` gives ``x``)
_LOG_SUFFIXES = (".gz", ".jsonl", ".json", ".ndjson", ".log", ".txt")


def default_out_dir(log_path: str | os.PathLike[str], size: int, seed: int) -> Path:
    """calibration_sets/<log stem>-n<N>-s<seed> (``x.jsonl.gz`` has stem ``x``)."""
    name = Path(log_path).name
    for suffix in _LOG_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return Path("calibration_sets") / f"{name}-n{size}-s{seed}"


@dataclass(frozen=True, kw_only=True)
class SampleRequest:
    """A calibration set drawn from a production log: ``size`` texts over (length bucket, label, topic) strata,
    redacted and de-duplicated."""

    logs: PathLike = option(argument=True, positional=True, cli_type=Path,
                            help="JSON Lines log (.jsonl, .jsonl.gz), one request per line.")
    out: PathLike | None = option(
        None, flags=("--out", "-o"), positional=True, cli_type=Path | None,
        help="Output folder (default: calibration_sets/LOGSTEM-nN-sSEED, e.g. calibration_sets/prod-n512-s0).")
    size: int = option(512, flags=("--size", "-n"), bound=Bound(low=1, high=INT_LIMIT, integer=True, example="512"),
                       help="Number of texts to draw.")
    seed: int = option(0, help="Seed of the draw: same seed, same sample.")
    text_field: str | None = option(
        None, help="Dotted path of the text, e.g. request.text; comma-separated fallbacks allowed "
                   "(request.text,text). Default: auto-detect (text, request.text, input, prompt, query, ...).")
    label_field: str | None = option(None, help="Dotted path of a label to stratify by and keep, e.g. label.")
    tokenizer: PathLike | None = option(
        None, cli_type=Path | None,
        help="tokenizer.json or a model folder: precise token lengths and the model's maximum length "
             "(default: a word-piece estimate and 512).")
    strict: bool = option(False, help="Fail at the first broken line instead of skipping it.")
    redact: bool = option(True, flags=("--redact/--no-redact",),
                          help="Replace e-mails, phone/card numbers and IPs by placeholders (--no-redact: keep them).")
    clusters: int = option(12, bound=Bound(low=1, high=INT_LIMIT, integer=True, example="12"),
                           help="Topic clusters to stratify by (1 disables).")
    # ---- the draw's knobs: no command line sets them
    max_length: int | None = option(None, cli=False, api=False,
                                    help="Longest text in tokens (None: the tokenizer's maximum, else 512).")
    min_per_stratum: int = option(1, cli=False, api=False, help="Fewest texts drawn from each non-empty stratum.")

    def __post_init__(self) -> None:
        self.validate()  # a request that exists is valid: checked once, when it is made

    @property
    def out_dir(self) -> Path:
        """``out``, by default calibration_sets/<log stem>-n<size>-s<seed>."""
        return Path(self.out) if self.out is not None else default_out_dir(self.logs, self.size, self.seed)

    def validate(self) -> None:
        """Every check that needs no file read: UsageError naming the option and what to pass instead."""
        check_paths({"logs": self.logs}, {"out": self.out, "tokenizer": self.tokenizer})
        check_names({"text_field": self.text_field, "label_field": self.label_field})
        check_seed(self.seed)
        check_bounds(self)
