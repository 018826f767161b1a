"""A candidate plan, and what the plan search measured of it: the values the decision rules judge and the
confirmation orders.

A :data:`Plan` names the nodes a candidate keeps in higher precision (every other placed node is INT8), sorted, so
that equal plans are equal keys. A :class:`Measured` is a candidate as the plan search (``evaluate.search``)
measured and decided it on the search split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Plan = tuple[str, ...]  # node names kept in higher precision, sorted


def as_plan(nodes: Sequence[str] | set[str] | frozenset[str]) -> Plan:
    return tuple(sorted(set(nodes)))


@dataclass(frozen=True)
class Measured:
    plan: Plan
    accuracy: float
    int8_flops_fraction: float
    stage: str  # "all-int8" | "prefix" | "anchor" | "bisect" | "prune"
    meets: bool
    agreement: float = float("nan")  # share of FP32's predictions kept (the task's agreement)
    cosine: float = float("nan")  # embeddings: mean cosine to FP32's vectors
    texts: int | None = None  # search rows the decision rested on, when the evaluator says (a Judged score)
