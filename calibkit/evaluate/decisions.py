"""Decisions on measured evidence: each layer's flag (with its reasons) from its measurements and sensitivity.

Takes values, reads no files and runs no model: compare measures, this module decides, ``results.runs``
holds the outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from calibkit.evaluate.sensitivity import LayerSensitivity as MeasuredSensitivity
from calibkit.evaluate.sensitivity import SensitivityAnalysis, SensitivityResult
from calibkit.evidence.intervals import PairedDifference
from calibkit.results.flags import Flag, Thresholds, flag_layer, gate_on_overall
from calibkit.results.runs import (
    Comparison,
    Difference,
    Gate,
    LayerSensitivity,
    LayerVerdict,
    Recommendation,
    SensitivityEvidence,
    SensitivityRun,
    finite,
)
from calibkit.tasks import kind_names, task_class

#: the reason a layer's keep-only-it variant was not run (:func:`cost_settles`)
NOT_KEPT_ALONE = ("keeping only this layer in higher precision was not measured: quantizing only it already "
                  "settles its flag")


def fidelity_name(task: str) -> str:
    """What the per-text fidelity of a task kind is called ("agreement" for a name no kind has)."""
    return task_class(task).fidelity_name if task in kind_names() else "agreement"


def fidelity_basis(task: str, labelled: bool) -> str:
    """What sensitivity judges layers by, in words."""
    return task_class(task).fidelity_basis(labelled) if task in kind_names() else "agreement"


def layer_verdicts(measured: Sequence[Any], weight_errors: Mapping[str, Any], sensitivity: SensitivityAnalysis | None,
                   thresholds: Thresholds, overall: PairedDifference | None) -> tuple[LayerVerdict, ...]:
    """A verdict per measured layer input (``evaluate.taps.LayerMeasurement``): its flag from the heuristics,
    the measured sensitivity where there is one (accuracy where the texts have labels, else fidelity to the
    reference in the task's terms), and no keep-in-FP16 advice while B is not significantly less accurate than
    A (``overall``)."""
    by_node = {ls.node: ls for ls in sensitivity.layers} if sensitivity else {}
    name = fidelity_name(sensitivity.task) if sensitivity else "agreement"
    out = []
    for m in measured:
        ls = by_node.get(m.spec.node)
        ws = weight_errors.get(m.spec.node)
        flag = flag_layer(
            thresholds,
            sqnr_db=m.sqnr_db,
            clipped_fraction=m.clipped_fraction,
            outlier_ratio=m.outlier_ratio,
            nonfinite=m.nonfinite,
            fp_absmax=m.fp_absmax,
            quant_sqnr_db=m.quant_sqnr_db,
            weight_sqnr_db=ws.sqnr_db if ws else None,
            zeroed_weights=ws.zeroed_fraction if ws else None,
            only_this_delta=ls.only_this_delta if ls and not ls.only_this.error else None,
            all_but_this_delta=ls.all_but_this_delta if ls and ls.all_but_this and not ls.all_but_this.error
            else None,
            only_this_diff=ls.only_this_diff if ls else None,
            all_but_this_diff=ls.all_but_this_diff if ls else None,
            flips_removed=ls.flips_removed if ls else None,
            agreement_cost=ls.agreement_cost if ls else None,
            cosine_recovered=ls.cosine_recovered if ls else None,
            cosine_cost=ls.cosine_cost if ls else None,
            fidelity_name=name,
        )
        flag = gate_on_overall(flag, overall)
        if ls is not None and ls.all_but_this is None:
            flag = replace(flag, reasons=(*flag.reasons, NOT_KEPT_ALONE))
        s = m.spec
        out.append(LayerVerdict(
            index=int(s.index), node=s.node, op_type=s.op_type, tensor=s.tensor, flag=flag.flag,
            reasons=tuple(flag.reasons), module=s.module, output=s.output, amax=finite(s.amax),
            fp_min=finite(m.fp_min), fp_max=finite(m.fp_max), fp_absmax=finite(m.fp_absmax), p99=finite(m.p99),
            p9999=finite(m.p9999), clipped_fraction=finite(m.clipped_fraction),
            outlier_ratio=finite(m.outlier_ratio), nonfinite=int(m.nonfinite or 0), sqnr_db=finite(m.sqnr_db),
            quant_sqnr_db=finite(m.quant_sqnr_db), weight_sqnr_db=finite(ws.sqnr_db) if ws else None,
            weight_zeroed_fraction=finite(ws.zeroed_fraction) if ws else None, cosine=finite(m.cosine),
            sensitivity=_sensitivity(ls) if ls is not None else None,
        ))
    return tuple(out)


def cost_settles(thresholds: Thresholds, task: str) -> Callable[[MeasuredSensitivity], bool]:
    """Whether a layer measured by quantizing only it already has its final flag: a settled cost past its
    threshold keeps the layer (``flag_layer``: a settled measured harm is keep-fp16, or keep-fp32 where its
    range asks for it, whatever else is measured), so keeping only it in higher precision cannot change the
    flag and is not run. Anything else (no cost, or one not settled) needs the other variant."""
    name = fidelity_name(task)

    def settles(ls: MeasuredSensitivity) -> bool:
        if ls.only_this.error:
            return False
        flag = flag_layer(thresholds, sqnr_db=None, clipped_fraction=None, outlier_ratio=None, nonfinite=0,
                          fp_absmax=None, only_this_delta=ls.only_this_delta, only_this_diff=ls.only_this_diff,
                          agreement_cost=ls.agreement_cost, cosine_cost=ls.cosine_cost, fidelity_name=name)
        return flag.measured_harm

    return settles


def _run(r: SensitivityResult, delta: float | None, diff: PairedDifference | None) -> SensitivityRun:
    d = Difference.of(diff)
    return SensitivityRun(
        accuracy=finite(r.accuracy), delta=finite(delta), logit_mse=finite(r.logit_mse), mean_kl=finite(r.mean_kl),
        flip_rate=finite(r.flip_rate), delta_low=d.low if d else None, delta_high=d.high if d else None,
        significant=d.significant if d else None, examples_to_settle=d.examples_to_settle if d else None,
        agreement=finite(1.0 - r.flip_rate), cosine=finite(r.mean_cosine),
    )


def _sensitivity(ls: MeasuredSensitivity) -> LayerSensitivity:
    abt = ls.all_but_this
    return LayerSensitivity(
        only_this_int8=_run(ls.only_this, ls.only_this_delta, ls.only_this_diff),
        all_but_this=_run(abt, ls.all_but_this_delta, ls.all_but_this_diff) if abt is not None
        else SensitivityRun(None, None, None, None),
        flips_removed=Difference.of(ls.flips_removed),
        agreement_cost=Difference.of(ls.agreement_cost),
        cosine_recovered=Difference.of(ls.cosine_recovered),
        cosine_cost=Difference.of(ls.cosine_cost),
    )


def recommend(verdicts: Sequence[LayerVerdict], evidence: SensitivityEvidence,
              thresholds: Thresholds = Thresholds()) -> Recommendation:
    """The nodes to keep and the verdict in words, from the layers' flags alone (so the verdict, the layer
    table and the findings tell one story): keep the nodes flagged keep-fp16/keep-fp32; "not settled" while a
    layer's flag is insufficient-evidence (a measured effect, or a recovery's 95 % upper bound, reaching past
    its threshold); "no layer needs higher precision" only on per-layer evidence that settled every layer.
    ``thresholds`` is kept for callers; the flags already applied them."""
    del thresholds
    keep = tuple(dict.fromkeys(v.node for v in verdicts if v.flag in (Flag.KEEP_FP16, Flag.KEEP_FP32)))
    precision = "fp32" if any(v.flag is Flag.KEEP_FP32 for v in verdicts) else "fp16"
    unsure = sorted({v.node for v in verdicts if v.flag is Flag.INSUFFICIENT} - set(keep))  # "more": not kept
    on = (f"per-layer sensitivity on {evidence.samples} {evidence.source} texts, judged by {evidence.basis}"
          if evidence.measured else "")
    if keep:
        how = on if evidence.measured else f"ranges and SQNR alone ({evidence.why_not})"
        verdict = f"keep {len(keep)} node{'s' * (len(keep) != 1)} in {precision} (from {how})"
        if unsure:
            verdict += (f"; {len(unsure)} more node{'s' * (len(unsure) != 1)} not settled (95 % intervals reach past "
                        "the thresholds)")
    elif not evidence.measured:
        verdict = (f"not measured: {evidence.why_not}; the flags come from ranges and SQNR alone, so whether "
                   "any layer needs higher precision is not known")
    elif unsure:
        verdict = (f"not settled: no layer is shown to need higher precision, but the 95 % intervals of "
                   f"{len(unsure)} node{'s' * (len(unsure) != 1)}' effects reach past the thresholds ({on}); more "
                   "texts (--sensitivity-samples, --traffic-size) would settle them")
    elif evidence.all_int8_agreement is not None and evidence.all_int8_agreement < 0.99:
        verdict = (f"no single layer recovers more than the thresholds, yet all-INT8 keeps only "
                   f"{evidence.all_int8_agreement * 100:.1f} % {fidelity_name(evidence.task)}"
                   f" ({on}): the loss is spread over many layers — try `calibkit smooth`, another method, or "
                   "`calibkit tune`")
    else:
        verdict = f"no layer needs higher precision on this evidence ({on})"
    return Recommendation(keep, precision, evidence.measured, verdict)


def missed_targets(result: Comparison, *, min_agreement: float | None = None,
                   max_drop: float | None = None) -> tuple[str, ...]:
    """What ``result`` misses of the targets (empty: all met), one line each: ``min_agreement``, the percentage
    of A's predictions B keeps (the point estimate, as printed); ``max_drop``, the most accuracy points B may
    lose against A (needs labels)."""
    missed = []
    if min_agreement is not None:
        if result.agreement is None:
            missed.append("agreement: the task has no per-text decision to agree on")
        elif 100.0 * result.agreement < min_agreement:
            shown, limit = deciding_digits(100.0 * result.agreement, min_agreement)
            missed.append(f"agreement {shown} % is below --min-agreement {limit} %")
    if max_drop is not None:
        a, b = result.engine_a.accuracy, result.engine_b.accuracy
        if a is None or b is None:
            missed.append("accuracy drop: the eval set has no labels to score")
        elif 100.0 * (a - b) > max_drop:
            shown, limit = deciding_digits(100.0 * (a - b), max_drop)
            missed.append(f"accuracy drop {shown} points is above --max-drop {limit}")
    return tuple(missed)


def gate(result: Comparison, min_agreement: float | None, max_drop: float | None) -> Gate | None:
    """The CI gate of a compare request's targets on its result (None when it names none)."""
    if min_agreement is None and max_drop is None:
        return None
    return Gate(min_agreement, max_drop, missed_targets(result, min_agreement=min_agreement, max_drop=max_drop))


def deciding_digits(value: float, limit: float, digits: int = 2) -> tuple[str, str]:
    """``value`` printed with the fewest decimals (at least ``digits``) that tell it from ``limit``, and
    ``limit`` as given or at those decimals, so a gate's message never reads "84.16 % is below 84.16 %": the
    comparison is exact, and the line shows the digits that decided it."""
    for d in range(digits, 18):
        shown, bound = f"{value:.{d}f}", f"{limit:.{d}f}"
        if shown != bound:
            return shown, f"{limit:g}" if d == digits else bound
    return repr(value), repr(limit)
