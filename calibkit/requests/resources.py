"""The options that say what a run may use, not what it computes: :class:`ResourceOptions`.

They are no field of any request (the same request gives the same result on one process or a cluster); the API
opens them into the one :class:`calibkit.resources.Resources` value of a call (``calibkit.api.resources``), and the
command line declares its ``--workers``, ``--executor``, ``--memory-budget`` and ``--max-batch-tokens`` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from calibkit.executors import EXECUTOR_HELP
from calibkit.requests.checks import COUNT_OR_NONE, WORKERS, Bound, check_numbers
from calibkit.requests.options import check_bounds, option

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.executors.base import Executor

DEFAULT_MEMORY_BUDGET = "1G"
MEMORY_BUDGET_HELP = ("Bytes of tapped activations held at once, e.g. 512M, 1G, 4G (while one batch's statistics "
                      "run the next is inferred: two batches of half the budget each).")
MEMORY_BYTES = Bound(low=1, high=1 << 62, integer=True, example="1G")
MAX_BATCH_TOKENS_HELP = "Most padded tokens (batch x longest text) per batch [default: no limit]."


@dataclass(frozen=True, kw_only=True)
class ResourceOptions:
    """What a call may use, as the caller spells it: opened into ``Resources`` by ``calibkit.api.resources``."""

    workers: int | None = option(None, bound=WORKERS, help="Local worker processes of the evaluations (default: "
                                 "one per usable CPU; compare's sensitivity: min(2, CPUs)).")
    executor: Executor | str | None = option(
        None, cli_type=str | None,
        help=EXECUTOR_HELP + " calibrate without one collects statistics in this process, with one in shards on its "
                             "workers (merged bit-identically). From Python, an Executor value too.")
    memory_budget: str | int = option(DEFAULT_MEMORY_BUDGET, cli_type=str, help=MEMORY_BUDGET_HELP)
    max_batch_tokens: int | None = option(None, bound=COUNT_OR_NONE, help=MAX_BATCH_TOKENS_HELP)

    def __post_init__(self) -> None:
        self.validate()  # checked once, when the value is made

    def validate(self) -> None:
        """UsageError for a number out of range or a memory budget that is no size (before any work)."""
        from calibkit.data.encode import parse_size

        check_bounds(self)
        if isinstance(self.memory_budget, str):
            parse_size(self.memory_budget)
        else:
            check_numbers({"--memory-budget": (self.memory_budget, MEMORY_BYTES)})
