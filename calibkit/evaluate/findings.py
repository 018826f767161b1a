"""Findings: flags that share one cause (a calibration method clipping a whole family of tensors, such as every
attention Softmax output) reported as one finding with its fix, instead of one flag per layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibkit.quantize.rangecheck import HARMFUL_CLIP_RATIO, clipping_fix
from calibkit.results.flags import FLAG_ORDER, Flag, LayerFlag, Thresholds


@dataclass(frozen=True)
class FlaggedInput:
    """One quantized input of one node, its flag, and what is known about its range: ``family`` (the tensor's
    kind: :data:`calibkit.quantize.rangecheck.SOFTMAX` or ``GELU``, from ``tensor_families``), the calibration
    ``method`` of its range, ``amax``, the largest |x| observed in FP (``observed_absmax``) and the share of
    values the range clips."""

    node: str
    tensor: str
    flag: LayerFlag
    family: str | None = None
    method: str | None = None
    amax: float | None = None
    observed_absmax: float | None = None
    clipped_fraction: float | None = None


@dataclass(frozen=True)
class Finding:
    """Flagged inputs with one shared cause, and the one fix for all of them."""

    cause: str  # "clipping"
    family: str
    method: str | None
    members: tuple[FlaggedInput, ...]  # the inputs whose range is cut
    same_nodes: tuple[FlaggedInput, ...]  # other flagged inputs of the same nodes (their output carries the cut)
    fix: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.node for m in (*self.members, *self.same_nodes)))

    @property
    def flag_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in (*self.members, *self.same_nodes):
            out[m.flag.flag.value] = out.get(m.flag.flag.value, 0) + 1
        return out

    @property
    def message(self) -> str:
        amax = [m.amax for m in self.members if m.amax is not None]
        seen = [m.observed_absmax for m in self.members if m.observed_absmax is not None]
        rng = ""
        if amax and seen:
            lo, hi = min(amax), max(amax)
            rng = (f" at amax {lo:.3g}" if lo == hi else f" at amax {lo:.3g}-{hi:.3g}") + \
                f" while their values reach {max(seen):.3g}"
        by = f" by {self.method}" if self.method else ""
        flags = ", ".join(f"{n} {k}" for k, n in sorted(self.flag_counts.items()))
        n_inputs = len(self.members) + len(self.same_nodes)
        return (f"{len(self.members)} {self.family} are clipped{by}{rng}: one cause behind {n_inputs} flagged "
                f"inputs of {len(self.nodes)} nodes ({flags}); fix the range rather than keeping these nodes "
                f"in higher precision: {self.fix}")

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "family": self.family, "method": self.method, "nodes": list(self.nodes),
                "tensors": [m.tensor for m in self.members],
                "same_node_tensors": [m.tensor for m in self.same_nodes], "flags": self.flag_counts,
                "fix": self.fix, "message": self.message}


def _clipped(item: FlaggedInput, thresholds: Thresholds) -> bool:
    ratio = HARMFUL_CLIP_RATIO.get(item.family or "")
    if ratio is None:
        return False
    if item.amax is not None and item.observed_absmax:  # the range against what was observed decides
        return 0 < item.amax < ratio * item.observed_absmax
    return item.clipped_fraction is not None and item.clipped_fraction > thresholds.max_clipped_fraction


def group_flags(items: Sequence[FlaggedInput], thresholds: Thresholds = Thresholds(), *, min_members: int = 2
                ) -> tuple[tuple[Finding, ...], tuple[FlaggedInput, ...]]:
    """(findings, the flagged inputs no finding explains). A finding gathers the flagged inputs (flag not OK)
    of one tensor family whose ranges one method cuts (amax below the family's share of the observed maximum;
    where either is unknown, more than ``thresholds.max_clipped_fraction`` of the values clipped), when there
    are at least ``min_members`` of them, together with the other flagged inputs of the same nodes. Inputs are
    listed in the order given."""
    flagged = [i for i in items if i.flag.flag is not Flag.OK]
    groups: dict[tuple[str, str | None], list[FlaggedInput]] = {}
    for i in flagged:
        if i.family is not None and _clipped(i, thresholds):
            groups.setdefault((i.family, i.method), []).append(i)
    findings: list[Finding] = []
    used: set[tuple[str, str]] = set()
    for (family, method), members in groups.items():
        if len(members) < min_members:
            continue
        nodes = {m.node for m in members}
        member_keys = {(m.node, m.tensor) for m in members}
        same = tuple(i for i in flagged if i.node in nodes and (i.node, i.tensor) not in member_keys
                     and (i.node, i.tensor) not in used)
        fix = clipping_fix(family)
        findings.append(Finding("clipping", family, method, tuple(members), same, fix))
        used |= member_keys | {(i.node, i.tensor) for i in same}
    rest = tuple(i for i in flagged if (i.node, i.tensor) not in used)
    return tuple(findings), rest


def strongest(flags: Sequence[Flag]) -> Flag:
    """The most severe of ``flags`` (OK for none): keep-fp32 > keep-fp16 > insufficient evidence > watch > ok."""
    return max(flags, key=FLAG_ORDER.index, default=Flag.OK)
