"""Confirming the search's choice on the holdout split by fixed-sequence testing (the winner's curse).

The search accepts the candidate with the most INT8 among those that met the target on the search split. Each
was certified at the stated confidence on its own, but the accepted one is the best of up to
``max_evaluations`` looks at the same rows, and the plans at the edge that passed by the luck of those rows
are the ones it prefers. Measured on the demo's sentence embedder: its plan certified 95.75 % of neighbours
kept on 2,520 search texts and kept 94.72 % on 1,080 texts the search never saw.

The holdout split is fresh. Testing several plans on it needs a correction for the choice among them, except
when they are tested in an order fixed before the holdout is read: fixed-sequence testing (Maurer, Hothorn &
Lehmacher 1995; the fixed-sequence procedure of "Learn then Test", Angelopoulos, Bates, Candès, Jordan & Lei
2021) tests one hypothesis after another, each at the full level alpha, stops at the first it cannot reject,
and keeps the chance of any wrong rejection at most alpha. Here the order is the search's passing candidates
from the least INT8 to the most (fixed by the search split alone), a rejection is the search's own decision
rule saying "meets" on the holdout, and the plan is the last candidate confirmed: the chance that it does not
meet the target is at most alpha = 1 - agreement_confidence, its choice included. Chosen over a Bonferroni
correction of the search (alpha / 40 per candidate), which would ask every candidate for the evidence only the
edge ones need; and over a third split, which would thin the evidence the search and the report rest on.

The sequence holds at most ``limit`` candidates (tune's default 4): the passing one with the least INT8, which
makes sure something can be confirmed, then the ``limit - 1`` with the most. A test near the target reads the
whole holdout, so each candidate more is about one more pass over it; on the demo classifier six passing
candidates made the confirmation 323 s of a 922-s tune on two cores, the four in the middle serving only as
finer fallbacks. Any order fixed from the search split alone keeps the guarantee, a shorter one included. A
candidate far above the target stops early: the labelled rows, which accuracy needs in full, are read first,
and agreement is settled on as much traffic as it needs (evidence.plan_decisions).

Candidates are tested ``batch`` at a time (the next ones in the order, in parallel); the decisions read are
those of the one-by-one procedure, so a batch only evaluates some candidates the procedure would not have
reached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calibkit.evidence.candidates import Measured, Plan
from calibkit.evidence.plan_decisions import Judged
from calibkit.results.runs import ConfirmStep, finite


def confirm_order(tried: Sequence[Measured], limit: int | None = None) -> list[int]:
    """The candidates that met the target on the search split, least INT8 first (ties: higher agreement, then
    the order the search measured them): the order fixed before the holdout is read. ``limit``: at most that
    many, the first of them and the ``limit - 1`` last."""
    passing = [i for i, m in enumerate(tried) if m.meets]
    order = sorted(passing, key=lambda i: (tried[i].int8_flops_fraction,
                                           -(tried[i].agreement if tried[i].agreement == tried[i].agreement else 0.0),
                                           i))
    if limit is not None and len(order) > max(limit, 2):
        order = [order[0], *order[len(order) - max(limit, 2) + 1:]]
    return order


def fixed_sequence(tried: Sequence[Measured], judge: Callable[[Sequence[Plan]], Sequence[Judged]], batch: int = 1,
                   limit: int | None = None) -> tuple[int | None, tuple[ConfirmStep, ...]]:
    """(index in ``tried`` of the last candidate confirmed, or None when the first fails; every test read, in
    order, each naming its candidate by that index). ``judge`` decides plans on the holdout
    (evidence.plan_decisions.PlanJudge.judge); ``limit``: the most candidates tested (:func:`confirm_order`)."""
    order = confirm_order(tried, limit)
    chosen: int | None = None
    steps: list[ConfirmStep] = []
    step = max(1, batch)
    for start in range(0, len(order), step):
        part = order[start:start + step]
        for i, j in zip(part, judge([tried[i].plan for i in part]), strict=True):
            steps.append(ConfirmStep(i, tried[i].int8_flops_fraction, bool(j.meets), int(j.texts),
                                     finite(j.agreement), finite(getattr(j, "cosine", None))))
            if not steps[-1].meets:
                return chosen, tuple(steps)
            chosen = i
    return chosen, tuple(steps)
