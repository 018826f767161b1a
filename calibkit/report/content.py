"""What a report says, in which order: a summary first, then plots, then the detailed tables.

It reads the typed results (``results.runs``); a number that does not apply is None there and shows as "—".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

from calibkit.report.blocks import Block, Bullets, Details, Document, Figure, Heading, Para, Span, Table
from calibkit.report.formatting import DASH, num, pct, points, shorten, text
from calibkit.report.plots import Plot, layer_name, target_accuracy
from calibkit.results.codec import format_of
from calibkit.results.flags import Flag
from calibkit.results.runs import (
    AGREEMENT_NOUNS,
    Comparison,
    ConfidenceBand,
    EngineEvaluation,
    Evidence,
    Fidelity,
    GoldScores,
    LayerVerdict,
    Range,
    Result,
    RowSelection,
    Speed,
    TaskResult,
    TimeEstimate,
    TrafficFidelity,
    TuneResult,
    duration_text,
    span_text,
)

MAX_DISAGREEMENTS = 200
MAX_TEXT = 300


def build_document(report: Result, plots: Sequence[Plot]) -> Document:
    names = {p.name for p in plots}
    if isinstance(report, TuneResult):
        return _tune_document(report, names)
    return _compare_document(report, names)


def _figures(names: set[str], order: Sequence[str]) -> tuple[Block, ...]:
    return tuple(Figure(n) for n in order if n in names)


def _subtitle(report: Result) -> str:
    return f"calibkit {text(report.calibkit_version)} · {format_of(report)}"


# ---------------------------------------------------------------- compare


def _baseline(engines: Sequence[EngineEvaluation]) -> EngineEvaluation | None:
    for wanted in ("reference", "A"):
        for e in engines:
            if e.name == wanted and e.accuracy is not None:
                return e
    return None


def _ci(r: Range | None, pts: bool = False) -> str:
    if r is None or r.low is None or r.high is None:
        return ""
    if pts:
        return f" [{100 * r.low:+.2f}, {100 * r.high:+.2f}]"
    return f" [{100 * r.low:.2f}, {100 * r.high:.2f}]"


def _engine_table(engines: Sequence[EngineEvaluation]) -> Table:
    base = _baseline(engines)
    rows = []
    for e in engines:
        delta = None
        if base is not None and e is not base and e.accuracy is not None and base.accuracy is not None:
            delta = e.accuracy - base.accuracy
        rows.append((
            text(e.name), text(e.precision), text(e.backend), pct(e.accuracy) + _ci(e.accuracy_ci),
            points(delta) if base is not None and e is not base else DASH,
            num(e.macro_f1) + (f" [{num(e.macro_f1_ci.low)}, {num(e.macro_f1_ci.high)}]"
                               if e.macro_f1_ci and e.macro_f1_ci.low is not None else ""),
            num(e.latency_ms.p50, 2), num(e.latency_ms.p95, 2), num(e.throughput_per_s, 1), num(e.batch_size),
            text(e.path),
        ))
    vs = f"Δ vs {base.name}" if base is not None else "Δ accuracy"
    return Table(
        headers=("engine", "precision", "backend", "accuracy [95 % CI]", vs, "macro F1 [95 % CI]", "p50 ms",
                 "p95 ms", "per s", "batch", "path"),
        rows=tuple(rows),
        numeric=(False, False, False, True, True, True, True, True, True, True, False),
    )


def _keep_layers(report: Comparison) -> tuple[tuple[str, LayerVerdict | None], ...]:
    if report.keep_in_higher_precision:
        named = ((node, report.layer(node)) for node in report.keep_in_higher_precision)
        return tuple((layer_name(x) if x else node, x) for node, x in named)
    return tuple((layer_name(x), x) for x in report.layers if x.flagged)


def _keep_table(keep: Sequence[tuple[str, LayerVerdict | None]]) -> Table:
    """The layers of one decision with what supports it: the measured effects where sensitivity measured any
    of them (a SQNR beside measured advice read as its reason), else the SQNR the heuristics judged."""
    measured = any(layer is not None and layer.sensitivity is not None for _, layer in keep)
    rows = []
    for node, layer in keep:
        rows.append((
            node,
            text(layer.op_type) if layer else DASH,
            layer.flag.value if layer else DASH,
            (_delta(layer, "only") if measured else num(layer.quant_sqnr_db, 1)) if layer else DASH,
            (_delta(layer, "all_but") if measured else num(layer.sqnr_db, 1)) if layer else DASH,
            "; ".join(layer.reasons) if layer and layer.reasons else DASH,
        ))
    cols = ("Δ only this INT8", "Δ all but this") if measured else ("own SQNR dB", "output SQNR dB")
    return Table(headers=("node", "op", "flag", *cols, "reasons"), rows=tuple(rows),
                 numeric=(False, False, False, True, True, False))


def _delta(layer: LayerVerdict, which: str) -> str:
    if layer.sensitivity is None:
        return DASH
    sens = layer.sensitivity.only_this_int8 if which == "only" else layer.sensitivity.all_but_this
    if sens is None:
        return DASH
    if sens.delta_low is None or sens.delta_high is None:
        return points(sens.delta)
    return points(sens.delta) + f" [{100 * sens.delta_low:+.2f}, {100 * sens.delta_high:+.2f}]"


def _layer_table(layers: Sequence[LayerVerdict]) -> Table:
    rows = tuple(
        (
            num(x.index), text(layer_name(x)), text(x.op_type), text(x.tensor), num(x.amax), num(x.fp_absmax),
            num(x.p9999), pct(x.clipped_fraction, 3), num(x.outlier_ratio, 1), num(x.nonfinite),
            num(x.quant_sqnr_db, 1), num(x.sqnr_db, 1), num(x.cosine, 4), _delta(x, "only"), _delta(x, "all_but"),
            x.flag.value,
            "; ".join(x.reasons) or DASH,
        )
        for x in layers
    )
    return Table(
        headers=("#", "node", "op", "tensor", "amax", "FP |x| max", "p99.99", "clipped", "outlier ratio",
                 "non-finite", "own SQNR dB", "output SQNR dB", "cosine", "Δ only this INT8", "Δ all but this", "flag",
                 "reasons"),
        rows=rows,
        numeric=(True, False, False, False, True, True, True, True, True, True, True, True, True, True, True, False,
                 False),
        highlight=tuple(x.flagged for x in layers),
    )


_TASK_NAMES = {"classification": "classification", "embedding": "embedding",
               "token-classification": "token classification", "regression": "regression (scores)",
               "multi-label": "multi-label classification"}


_Rows = list[tuple[str, str, str]]
_Metric = Callable[[str], "float | None"]


def _fidelity_rows(kind: str, t: Fidelity, texts: int = 0) -> _Rows:
    """(metric, value, what it measures) of B against A, in the task's own terms (a kind the report does not
    know: the classifier's rows and every measure it recorded)."""
    extra = {name: v for name, v in t.extra.items() if v is not None}
    rows, shown = _KIND_ROWS.get(kind, _classification_rows)(t, extra.get, texts)
    return rows + [(name.replace("_", " "), num(v, 4), DASH) for name, v in extra.items() if name not in shown]


def _embedding_rows(t: Fidelity, metric: _Metric, texts: int) -> tuple[_Rows, set[str]]:
    k = metric("k")
    kk = f"top-{int(k)}" if k is not None else "top-k"
    rows = [
        ("cosine to A, mean", num(t.cosine_mean, 5), "per text, between B's and A's embedding"),
        ("cosine to A, min", num(t.cosine_min, 5), "the least faithful text"),
        ("same nearest neighbour", pct(metric("retrieval_top1_agreement") or t.agreement),
         "each eval text queries the others by cosine: B's top-1 is A's; the FP32 index is those "
         + (f"{texts:,} " if texts else "") + "texts, so the value depends on its size (no interval: the "
         "neighbours are looked up among the same texts, not drawn apart)"),
        (f"{kk} neighbour overlap", num(metric("retrieval_overlap_at_k"), 4),
         f"mean share of A's {kk} neighbours that B also ranks in its {kk}"),
    ]
    return rows, {"retrieval_top1_agreement", "retrieval_overlap_at_k", "k"}


def _token_rows(t: Fidelity, metric: _Metric, texts: int) -> tuple[_Rows, set[str]]:
    rows = [
        ("same label per token", pct(t.agreement), "argmax of B equals A's, over real (non-padding) tokens"),
        ("entity F1 against A", num(metric("entity_f1"), 4),
         "B's BIO entities (exact span and type) scored against A's"),
        ("cosine to A, mean", num(t.cosine_mean, 5), "per text, over its real tokens' logits"),
        ("cosine to A, min", num(t.cosine_min, 5), "the least faithful text"),
    ]
    return rows, {"entity_f1"}


def _multi_label_rows(t: Fidelity, metric: _Metric, texts: int) -> tuple[_Rows, set[str]]:
    rows = [
        ("same label set", pct(t.agreement), "every label's yes/no (logit above 0) of B equals A's"),
        ("same decision per label", pct(metric("label_decision_agreement")), "over every (text, label)"),
        ("logit cosine, mean", num(t.cosine_mean, 5), "per text, between B's and A's logits"),
        ("logit cosine, min", num(t.cosine_min, 5), "the least faithful text"),
    ]
    for who in ("A", "B"):
        if metric(f"{who}_exact_set_accuracy") is not None:
            rows += [(f"{who}: exact label set", pct(metric(f"{who}_exact_set_accuracy")),
                      "against the eval set's label sets"),
                     (f"{who}: micro / macro F1", f"{num(metric(f'{who}_micro_f1'), 4)} / "
                      f"{num(metric(f'{who}_macro_f1'), 4)}", "over every (text, label) / per label, averaged")]
    return rows, {"label_decision_agreement"} | {f"{w}_{m}" for w in "AB"
                                                 for m in ("exact_set_accuracy", "micro_f1", "macro_f1")}


def _regression_rows(t: Fidelity, metric: _Metric, texts: int) -> tuple[_Rows, set[str]]:
    rows = [
        ("scores within tolerance", pct(t.agreement),
         f"|B - A| at most {num(metric('tolerance'), 4)} (1 % of A's spread over the eval texts)"),
        ("mean |B - A|", num(metric("mean_abs_error"), 5), "over texts"),
        ("max |B - A|", num(metric("max_abs_error"), 5), "the least faithful text"),
        ("correlation with A", num(t.cosine_mean, 5), "Pearson, over the eval texts"),
        ("rank correlation with A", num(metric("spearman"), 5), "Spearman: does B order the texts as A does"),
    ]
    for who in ("A", "B"):
        if metric(f"{who}_mae_vs_labels") is not None:
            rows += [(f"{who}: mean |score - label|", num(metric(f"{who}_mae_vs_labels"), 5),
                      "against the eval set's target scores"),
                     (f"{who}: RMSE against the labels", num(metric(f"{who}_rmse_vs_labels"), 5), DASH)]
    return rows, {"tolerance", "mean_abs_error", "max_abs_error", "spearman", "A_mae_vs_labels",
                  "A_rmse_vs_labels", "B_mae_vs_labels", "B_rmse_vs_labels"}


def _classification_rows(t: Fidelity, metric: _Metric, texts: int) -> tuple[_Rows, set[str]]:
    return [
        ("same prediction", pct(t.agreement), "argmax of B equals A's"),
        ("logit cosine, mean", num(t.cosine_mean, 5), "per text, between B's and A's logits"),
        ("logit cosine, min", num(t.cosine_min, 5), "the least faithful text"),
    ], set()


# a saved document names its kind, and reports render saved documents: the rows are keyed by that name (the
# report layer sits below the task package, so it cannot ask the kind itself)
_KIND_ROWS: dict[str, Callable[[Fidelity, _Metric, int], tuple[_Rows, set[str]]]] = {
    "embedding": _embedding_rows, "token-classification": _token_rows, "multi-label": _multi_label_rows,
    "regression": _regression_rows, "classification": _classification_rows,
}


def _confidence_blocks(bands: Sequence[ConfidenceBand]) -> list[Block]:
    """Flips by how sure A was: a flip where A's top two classes were nearly tied is a coin toss A made too."""
    if not bands or not any(b.flips for b in bands):
        return []
    total = sum(b.flips or 0 for b in bands)
    unsure = bands[0]
    rows = tuple((f"{num(b.low, 2)} to {num(b.high, 2)}", num(b.texts), num(b.flips),
                  pct((b.flips or 0) / b.texts) if b.texts else DASH) for b in bands)
    return [
        Para.of(f"Of the {total} flips, ", Span(num(unsure.flips), bold=True),
                f" are texts on which A's top two classes were within {num(unsure.high, 2)} of each other in "
                f"probability ({num(unsure.texts)} texts), where A itself was nearly undecided."),
        Table(headers=("A's top-2 probability gap", "texts", "flips", "flip rate"), rows=rows,
              numeric=(False, True, True, True)),
    ]


def _task_blocks(t: TaskResult, texts: int = 0) -> list[Block]:
    fid = t.fidelity if t.fidelity is not None else Fidelity(None, None, None)
    measured = any(v is not None for v in (fid.agreement, fid.cosine_mean, *fid.extra.values()))
    if not measured and (t.gold is None or not t.gold.engines):
        return []
    kind = _TASK_NAMES.get(t.kind, text(t.kind))
    blocks: list[Block] = [Heading(2, f"Task fidelity: {kind}")]
    blocks.append(Para.of("B against A in the terms of the task calibkit chose for output ",
                          Span(text(t.output), code=True), " (", Span(kind, bold=True), "; ",
                          "labelled eval set" if t.labelled else "no labels needed", ")."))
    blocks.append(Table(headers=("B against A", "value", "what it measures"),
                        rows=tuple(_fidelity_rows(t.kind, fid, texts)), numeric=(False, True, False)))
    if t.gold is not None and t.gold.engines:
        blocks += _gold_blocks(t.gold)
    return blocks


def _gold_blocks(gold: GoldScores) -> list[Block]:
    unscored = (f"; {num(gold.unscored_words)} words past the token limit or without tokens are not scored"
                if gold.unscored_words else "")
    return [
        Heading(3, "Against the gold labels"),
        Para.of(f"Word-level BIO tags of the eval set: {num(gold.words)} words scored, {num(gold.entities)} gold "
                f"entities{unscored}. A word's prediction is its first token's."),
        Table(
            headers=("engine", "token accuracy [95 % CI]", "entity F1", "entity precision", "entity recall"),
            rows=tuple((text(name), pct(g.token_accuracy) + _ci(g.token_accuracy_ci), num(g.entity_f1, 4),
                        num(g.entity_precision, 4), num(g.entity_recall, 4)) for name, g in gold.engines.items()),
            numeric=(False, True, True, True, True),
        ),
    ]


def _traffic_blocks(t: TrafficFidelity | None) -> list[Block]:
    """B against A on unlabeled production traffic (``--traffic``): where it came from and what it says."""
    if t is None:
        return []
    ev, fid = t.evidence, t.fidelity
    agreement = fid.agreement if t.agreement_ci is None or t.agreement_ci.estimate is None else t.agreement_ci.estimate
    items = [
        Para.of("Decisions unchanged: ", Span(pct(agreement) + _ci(t.agreement_ci), bold=True),
                f" on {num(ev.count)} texts (flips, texts whose prediction changed: {num(t.flips)})"),
        Para.of(f"Cosine similarity of the outputs: mean {num(fid.cosine_mean, 4)}, min {num(fid.cosine_min, 4)}"
                + (f"; mean KL {num(t.mean_kl)}" if t.mean_kl is not None else "")),
    ]
    items += [Para.of(f"{name.replace('_', ' ')}: {num(v, 4)}") for name, v in fid.extra.items() if v is not None]
    return [
        Heading(2, "Traffic fidelity"),
        Para.of("B against A on ", Span(num(ev.count), bold=True), " unlabeled texts from ",
                Span(text(ev.path), code=True), _rows_text(ev.rows) + " (no labels needed)."),
        Bullets(tuple(items)),
        *_exclusions(ev),
    ]


def _rows_text(rows: RowSelection | None) -> str:
    return "" if rows is None else (f", {rows.count} of {rows.of} rows, {rows.strategy}, seed {rows.seed}, content "
                                    f"sha256 {rows.content_sha256[:16]}")


def _exclusions(ev: Evidence) -> list[Block]:
    """What was left out of the evidence, and why (calibration texts, duplicates; the source's hash)."""
    if not ev.exclusions:
        return []
    return [Para.of("Left out and provenance: " + "; ".join(ev.exclusions) + ".")]


def _compare_summary(report: Comparison) -> list[Block]:
    ev = report.eval_set
    labels = ", ".join(ev.labels) if ev.labels else DASH
    blocks: list[Block] = [Heading(2, "Summary"), Para.of(
        "Evaluated on ", Span(num(ev.count), bold=True), " texts from ", Span(text(ev.path), code=True),
        f" (labels: {labels}).")]
    if report.engines:
        blocks.append(_engine_table(report.engines))
    o = report.outputs
    d = report.accuracy_diff
    if d is not None and d.estimate is not None:
        settle = (f"; about {d.examples_to_settle:,} examples would settle it"
                  if d.verdict == "not significant" and d.examples_to_settle else "")
        blocks.append(Para.of(
            "Accuracy of B minus A: ", Span(f"{points(d.estimate)}{_ci(d.interval, pts=True)}", bold=True),
            f" (95 % paired interval; exact McNemar p {num(d.mcnemar_p)}): ", Span(text(d.verdict), bold=True),
            f"{settle}."))
    for w in report.warnings:
        blocks.append(Para.of(Span("Warning:", bold=True), " " + w))
    flips = None if report.agreement is None else 1.0 - report.agreement
    blocks.append(Bullets((
        Para.of("Agreement of the predictions of A and B: ",
                Span(pct(report.agreement) + _ci(report.agreement_ci), bold=True),
                (f" on {num(report.eval_set.count)} texts" if report.eval_set.count else "")
                + f" (flips, texts whose prediction changed: {pct(flips)})"),
        Para.of(f"Cosine similarity of the outputs: mean {num(o.cosine_mean, 4)}, min {num(o.cosine_min, 4)}"),
        Para.of(f"Output error: max |Δ| {num(o.max_abs_error)}, mean |Δ| {num(o.mean_abs_error)}"
                + (f", logit MSE {num(o.logit_mse)}" if o.logit_mse is not None else "")
                + (f", mean KL {num(o.mean_kl)}" if o.mean_kl is not None else "")),
        Para.of(_flips_listed(report, flips)),
    )))
    blocks += _speed_table(report.speed, "B", "A") if report.speed is not None else (
        [Para.of(f"Speed {report.speed_note}.")] if report.speed_note else [])
    blocks += _confidence_blocks(report.flips_by_confidence)
    blocks += _task_blocks(report.task, report.eval_set.count)
    blocks += _traffic_blocks(report.traffic)
    if report.layer_samples or report.sensitivity_samples:
        sens = num(report.sensitivity_samples) if report.sensitivity_samples else "no"
        blocks.append(Para.of(f"Per-layer statistics from {num(report.layer_samples)} texts; per-layer "
                              f"sensitivity from {sens} texts (random subsets stratified by label, seed "
                              f"{text(report.seed)})."))
    return blocks


def _speed_table(sp: Speed, model: str, reference: str) -> list[Block]:
    """A model's speed against its reference, one row per batch size (evaluate.speed)."""
    return [Para.of(f"Speed of {model} against {reference}, served (ONNX Runtime, every graph optimization, "
                    f"{sp.threads} threads; {text(sp.cpu)}: {text(sp.isa)}), the same batches of {num(sp.texts)} "
                    f"texts in {sp.rounds} interleaved rounds, a warm-up round not counted:"),
            Table(headers=("batch size", "batches", f"{reference} ms per batch", f"{model} ms per batch",
                           f"speed-up over {reference}", "lowest–highest round"),
                  rows=tuple((str(b.batch_size), str(b.batches), num(b.reference_ms, 3), num(b.model_ms, 3),
                              f"{b.speedup:.2f}x", f"{b.speedup_low:.2f}–{b.speedup_high:.2f}x") for b in sp.at),
                  numeric=(True, True, True, True, True, True))]


def _tune_speed_blocks(report: TuneResult) -> list[Block]:
    final = report.final
    if final.speed is None and not final.speed_note:
        return []
    blocks: list[Block] = [Heading(2, "Speed")]
    if final.speed is not None:
        blocks += _speed_table(final.speed, "the plan", "FP32")
    blocks += [Para.of(line[0].upper() + line[1:] + ".") for line in report.speed_lines
               if not line.startswith("served speed (")]
    return blocks


def _keep_blocks(report: Comparison) -> list[Block]:
    layers = report.layers
    keep = _keep_layers(report)
    precision = (report.recommendation.precision or "higher precision").upper()
    blocks: list[Block] = [Heading(2, "Layers to keep in higher precision")]
    rec = report.recommendation
    if rec.verdict:
        blocks.append(Para.of(Span("Verdict: ", bold=True), text(rec.verdict)))
    blocks += _sensitivity_blocks(report)
    if rec.verdict and not keep and not rec.measured:
        return blocks + _finding_blocks(report)
    watched = [x for x in layers if x.flag is Flag.WATCH]
    unsure = [x for x in layers if x.flag is Flag.INSUFFICIENT]
    # one sentence per run, from the layers' flags: the same decisions the verdict and the tables read
    if keep:
        # counted in nodes, as the verdict counts them (a node quantizes one or two inputs, one row each below)
        more = {x.node for x in unsure} - {x.node if x else n for n, x in keep}
        rest = (f"{len(more)} more {'is' if len(more) == 1 else 'are'} not settled (below); the rest can run "
                "in INT8." if more else "the rest can run in INT8.")
        blocks.append(Para.of("Keep ", Span(f"{len(keep)} of {len({x.node for x in layers})}", bold=True),
                              f" quantized layers in {precision}; {rest}"))
        explained = {n for f in report.findings for n in f.nodes} & {x.node if x else n for n, x in keep}
        if explained:
            blocks.append(Para.of(f"{len(explained)} of them share a clipped range with other flagged layers "
                                  "(Findings, below): fixing that range is the alternative to keeping them."))
        blocks.append(_keep_table(keep))
    elif unsure:
        one = len(unsure) == 1
        blocks.append(Para.of(f"None shown to need it, but {len(unsure)} {'layer is' if one else 'layers are'} not "
                              f"settled (below; {len(layers)} quantized in all): whether {'it' if one else 'they'} "
                              "can run in INT8 is not known on this evidence."))
    elif layers:
        blocks.append(Para.of(f"None: all {len(layers)} quantized layers can run in INT8."))
    else:
        blocks.append(Para.of("No per-layer analysis in this report."))
    if watched:
        blocks.append(Para.of(
            Span(f"{len(watched)} layer{'s' * (len(watched) != 1)} to watch", bold=True),
            ": a heuristic threshold fired, but what was measured keeps INT8's effect within the thresholds there "
            "(the layer's own sensitivity, or the whole model's accuracy where the layer was not measured on its "
            "own); the last reason gives the measurement.",
        ))
        blocks.append(_keep_table(tuple((layer_name(x), x) for x in watched)))
    if unsure:
        blocks.append(Para.of(
            Span(f"{len(unsure)} layer{'s' * (len(unsure) != 1)} with insufficient evidence", bold=True),
            ": a measured effect, or the 95 % upper bound of a recovery, reaches past its threshold without being "
            "settled; the reasons say how many examples would settle it.",
        ))
        blocks.append(_keep_table(tuple((layer_name(x), x) for x in unsure)))
    return blocks + _finding_blocks(report)


def _sensitivity_blocks(report: Comparison) -> list[Block]:
    """What per-layer sensitivity ran on and judged by, or why it did not run."""
    sv = report.sensitivity
    if sv is None:
        return []
    if not sv.measured:
        return [Para.of("Per-layer sensitivity: ", Span("not measured", bold=True),
                        f" ({text(sv.why_not)})." if sv.why_not else ".")]
    parts = [f"all INT8 there: agreement {pct(sv.all_int8_agreement)}"]
    if sv.all_int8_cosine is not None:
        parts.append(f"mean cosine {num(sv.all_int8_cosine, 5)}")
    if sv.all_int8_accuracy is not None:
        parts.append(f"accuracy {pct(sv.all_int8_accuracy)} (reference {pct(sv.reference_accuracy)})")
    return [Para.of("Per-layer sensitivity: ", Span(f"{num(sv.layers)} layers", bold=True),
                    f" measured on {num(sv.samples)} texts of the {text(sv.source)}, judged by {text(sv.basis)}; "
                    + ", ".join(parts) + ".")]


def _finding_blocks(report: Comparison) -> list[Block]:
    """Flags that one cause explains, as one finding each with its fix."""
    if not report.findings:
        return []
    blocks: list[Block] = [Heading(2, f"Findings ({len(report.findings)})")]
    for f in report.findings:
        blocks.append(Para.of(Span(text(f.cause), bold=True), f": {text(f.message)} Fix: {text(f.fix)}"))
    return blocks


def _flips_listed(report: Comparison, flips: float | None) -> str:
    """How many of the flips the Flips section lists (one vocabulary: a flip is a text whose prediction
    changed), and why none are listed when the task's predictions are not classes."""
    changed = None if flips is None else round(flips * report.eval_set.count)
    if report.disagreements or not changed:
        return f"Flips listed below: {len(report.disagreements)}" + (f" of {changed}" if changed else "")
    return (f"Flips listed below: none of {changed} (this task's predictions are not classes, e.g. an embedder's "
            "nearest neighbours: see the task section)")


def _disagreement_blocks(report: Comparison) -> list[Block]:
    blocks: list[Block] = [Heading(2, f"Flips: texts whose prediction changed ({len(report.disagreements)} "
                                      "listed)")]
    if not report.disagreements:
        flips = None if report.agreement is None else 1.0 - report.agreement
        return [*blocks, Para.of("A and B agree on every text." if not flips else _flips_listed(report, flips))]
    shown = report.disagreements[:MAX_DISAGREEMENTS]
    note = (f"First {MAX_DISAGREEMENTS} of {len(report.disagreements)}; all are in report.json."
            if len(report.disagreements) > MAX_DISAGREEMENTS else "")
    blocks.append(Table(
        headers=("#", "label", "A", "B", "A's top-2 gap", "text"),
        rows=tuple((num(d.index), text(d.label), text(d.pred_a), text(d.pred_b), num(d.confidence_a, 3),
                    shorten(text(d.text), MAX_TEXT)) for d in shown),
        numeric=(True, False, False, False, True, False),
        note=note,
    ))
    return blocks


def _subset_rows(report: Comparison) -> tuple[tuple[str, str], ...]:
    named = [("eval rows (--limit)", report.eval_set.rows), ("layers subset", report.subsets.layers),
             ("sensitivity subset", report.subsets.sensitivity)]
    return tuple((name, _rows_text(rows)[2:]) for name, rows in named if rows is not None)


def _setting_text(value: object) -> str:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return DASH if value is None else str(value)


def _compare_document(report: Comparison, plots: set[str]) -> Document:
    blocks = _compare_summary(report) + _keep_blocks(report)
    figures = _figures(plots, ("sqnr", "ranges", "histograms", "confusion"))
    if figures:
        blocks += [Heading(2, "Plots"), *figures]
    flagged = [x for x in report.layers if x.flagged]
    if flagged:
        blocks += [Heading(2, f"Flagged layers ({len(flagged)})"), _layer_table(flagged)]
    if report.layers:
        blocks.append(Details(f"All {len(report.layers)} layers", (_layer_table(report.layers),)))
    blocks += _disagreement_blocks(report)
    subsets = _subset_rows(report)
    if subsets:
        blocks.append(Details("Rows used by each measurement", (Table(headers=("subset", "rows"), rows=subsets),)))
    thresholds = sorted(dataclasses.asdict(report.thresholds).items())
    blocks += _time_blocks(report.time_estimate)
    blocks.append(Details("Thresholds used to flag layers", (Table(
        headers=("threshold", "value"), rows=tuple((k, _setting_text(v)) for k, v in thresholds)),)))
    return Document("Quantization comparison", _subtitle(report), tuple(blocks))


# ---------------------------------------------------------------- tune


def _target_blocks(report: TuneResult) -> list[Block]:
    t = report.target
    if t.max_drop is None:
        drop = DASH
    elif t.relative:
        drop = f"{t.max_drop:g} % of it (relative)"
    else:
        drop = f"{t.max_drop:g} pt"
    noun = AGREEMENT_NOUNS.get(t.task, "FP32's predictions")
    agree = f"at least {t.min_agreement:g} % of {noun} unchanged" if t.min_agreement is not None else ""
    cosine = f"a mean cosine to FP32 of at least {t.min_cosine:g}" if t.min_cosine is not None else ""
    if t.max_drop is None and (agree or cosine):
        blocks: list[Block] = [Para.of("Target (fidelity to FP32, no labels): ",
                                       Span(" and ".join(x for x in (agree, cosine) if x), bold=True),
                                       ", on the search split.")]
    else:
        blocks = [Para.of("Target: accuracy at least ", Span(pct(target_accuracy(t)), bold=True),
                          f" (FP32 {pct(t.fp32_accuracy)} minus {drop})" + (f" and {agree}" if agree else "")
                          + ", on the search split.")]
    for w in report.warnings:
        blocks.append(Para.of(Span("Warning:", bold=True), " " + w))
    flips = {k: v for k, v in report.methods.all_int8_flip_rate_search.items() if v is not None}
    if flips:
        blocks.append(Para.of(f"Calibration table: {text(report.methods.chosen)}, the one whose all-INT8 model changes "
                              f"the fewest of {noun} on the search split ("
                              + ", ".join(f"{k} {100 * v:.2f} %" for k, v in flips.items()) + ")."))
    return blocks


def _smoothing_blocks(report: TuneResult) -> list[Block]:
    """Whether tune also searched the smoothed (SmoothQuant) model, which variant the plan is built on, and why."""
    sm = report.smoothing
    if sm is None:
        return []
    if not sm.tried:
        return [Para.of("Smoothing: ", Span("not tried", bold=True), f" ({text(sm.note)}).")]
    chosen = "smoothed" if sm.chosen else "plain"
    why = f"calibration table {text(report.methods.chosen)}, chosen by {report.methods.chosen_by}"
    details = [f"{num(sm.activations_smoothed)} activations smoothed"] if sm.activations_smoothed is not None else []
    if sm.max_output_deviation is not None:
        details.append(f"largest FP32 output deviation {num(sm.max_output_deviation)}")
    if sm.model:
        details.append(f"model {sm.model}")
    if sm.note:
        details.append(sm.note)
    return [Para.of("Smoothing (SmoothQuant, alpha auto): tried; the plan is built on the ", Span(chosen, bold=True),
                    f" model ({why})" + (f": {'; '.join(details)}" if details else "") + ".")]


def _tune_traffic_blocks(report: TuneResult) -> list[Block]:
    ev = report.eval_set
    if ev.traffic is None:
        return []
    return [Para.of("Traffic: agreement with FP32 is also judged on ", Span(num(ev.traffic.count), bold=True),
                    " unlabeled texts from ", Span(text(ev.traffic.path), code=True),
                    f"{_rows_text(ev.traffic.rows)}: {num(ev.traffic_search)} in the search split, "
                    f"{num(ev.traffic_holdout)} in the hold-out split."), *_exclusions(ev.traffic)]


def _evidence_cost_blocks(report: TuneResult) -> list[Block]:
    """What the plan search paid per decision: texts of the search split per candidate, by decision rule."""
    cost = report.evidence_cost
    if cost is None or not cost.candidates:
        return []
    rule = ("each candidate judged on growing chunks until its decision was settled" if cost.rule == "sequential"
            else "each candidate judged on the whole search split")
    done = (f"; the accepted plan then ran on the remaining {num(cost.completion_texts)} texts so its numbers rest "
            "on the whole split" if cost.completion_texts else "")
    if cost.confirm_texts:
        done += f"; the hold-out confirmation read {num(cost.confirm_texts)} texts"
    return [Para.of(f"Evidence per decision ({text(cost.rule)}: {rule}): ", Span(f"{cost.texts_median:g}", bold=True),
                    f" texts per candidate (median) of {num(cost.split_texts)} in the search split; "
                    f"{num(cost.texts_total)} in all for {num(cost.candidates)} candidates{done}.")]


def _time_blocks(e: TimeEstimate | None) -> list[Block]:
    """The long part's estimate, made before it started, against the time it took: the whole, then each step."""
    if e is None:
        return []
    took = f"; it took {duration_text(e.actual_seconds)}" if e.actual_seconds is not None else ""
    if e.resumed:
        took += f", reusing {num(e.resumed)} evaluations of an earlier run"
    cut = e.shortcut
    shorter = ""
    if cut is not None:
        saved = 100.0 * (1.0 - cut.likely_seconds / e.likely_seconds) if e.likely_seconds > 0 else 0.0
        shorter = (f" {cut.option} would have shortened it to about "
                   f"{span_text(cut.likely_seconds, cut.worst_seconds)} (-{saved:.0f} %).")
    rows = tuple((text(s.step), span_text(s.likely_seconds, s.worst_seconds),
                  duration_text(s.actual_seconds) if s.actual_seconds is not None else DASH) for s in e.steps)
    return [
        Heading(2, "Time"),
        Para.of("Estimated before the long part started: about ",
                Span(span_text(e.likely_seconds, e.worst_seconds), bold=True),
                f" (likely to worst, from an FP32 text's {1000 * e.text_seconds:.2g} ms on this machine, timed on "
                f"{num(e.measured_texts)} texts){took}.{shorter}"),
        *([Table(headers=("step", "estimated", "took"), rows=rows, numeric=(False, True, True))] if rows else []),
    ]


def _confirmation_blocks(report: TuneResult) -> list[Block]:
    """How the holdout confirmed the plan (fixed-sequence testing): each candidate tested, least INT8 first."""
    cf = report.confirmation
    if cf is None or not cf.steps:
        return []
    chose = (f"the plan is candidate {cf.chosen}, the last one confirmed" if cf.chosen is not None
             else "none was confirmed, so the plan is the search's own choice")
    same = "" if cf.chosen != cf.search_choice or cf.chosen is None else " (also the search's own choice)"
    para = Para.of(f"Confirmation on the hold-out split ({num(cf.holdout_texts)} texts): the candidates that met the "
                   f"target on the search split (when many did, the one with the least INT8 and those with the most) "
                   f"were tested there from the least INT8 up with the search's decision "
                   f"rule ({text(cf.rule)}, final test at {100 * cf.final_test_confidence:g} %), stopping at the first "
                   "that failed; ", Span(chose + same, bold=True),
                   f". The search alone chose candidate {cf.search_choice}. "
                   + (f"Tested in a fixed order, the choice keeps the chance that the plan misses the target at "
                      f"{100 * (1 - cf.confidence):g} %." if cf.chosen is not None else
                      "The holdout gives the written plan no guarantee; the verdict above says what it measured."))
    rows = tuple((str(s.candidate), pct(s.int8_flops_fraction, 1), pct(s.agreement),
                  DASH if s.cosine is None else f"{s.cosine:.5f}", num(s.texts), "yes" if s.meets else "no")
                 for s in cf.steps)
    return [para, Table(headers=("candidate", "INT8 share", "agreement on the texts read", "mean cosine",
                                 "hold-out texts read", "confirmed"),
                        rows=rows, numeric=(True, True, True, True, True, False))]


def _plan_bullets(report: TuneResult) -> Bullets:
    final = report.final
    target = target_accuracy(report.target)
    judged = final.accuracy_holdout if final.accuracy_holdout is not None else final.accuracy_search
    verdict = DASH if target is None or judged is None else ("yes" if judged >= target - 1e-12 else "no")
    if report.target.max_drop is None and (report.target.min_agreement is not None
                                           or report.target.min_cosine is not None):
        verdict = "yes" if report.target.met else "no"  # fidelity alone: the search's own decision
    hold = final.holdout_evidence
    supported = final.holdout_verdict.supported if final.holdout_verdict is not None else None
    items = [Para.of("Share of FLOPs in INT8: ", Span(pct(final.int8_flops_fraction, 1), bold=True))]
    if report.target.task == "classification" and report.target.fp32_accuracy is not None:  # labelled
        items.append(Para.of(f"Accuracy on the search set: {pct(final.accuracy_search)}; on the hold-out set: ",
                             Span(pct(final.accuracy_holdout), bold=True)))
    if final.agreement_search is not None or final.agreement_holdout is not None:
        items.append(Para.of(f"Agreement with FP32 on the search set: {pct(final.agreement_search)}; on the "
                             "hold-out set: ", Span(pct(final.agreement_holdout)
                                                    + _ci(hold.agreement if hold else None), bold=True)))
    if final.cosine_search is not None or final.cosine_holdout is not None:
        c = hold.cosine if hold is not None else None
        ci = "" if c is None or c.low is None else f" (95 % CI {num(c.low, 5)} to {num(c.high, 5)})"
        items.append(Para.of(f"Mean cosine to FP32 on the search set: {num(final.cosine_search, 5)}; on the "
                             "hold-out set: ", Span(num(final.cosine_holdout, 5) + ci, bold=True)))
    d = hold.accuracy_minus_fp32 if hold is not None else None
    if d is not None and d.estimate is not None:
        items.append(Para.of("Hold-out accuracy minus FP32: ",
                             Span(points(d.estimate) + _ci(d.interval, pts=True), bold=True), f" ({text(d.verdict)})"))
    items.append(Para.of(f"Meets the target on the search set: {verdict}"
                         if supported is not None else f"Meets the target: {verdict}"))
    if supported is not None and final.holdout_verdict is not None:
        says = report.holdout_says or ""
        items.append(Para.of(Span(says[:1].upper() + says[1:], bold=True),
                             f": {text(final.holdout_verdict.text)}."))
    items.append(Para.of(f"Layers kept in higher precision: {len(final.kept_nodes)}"))
    return Bullets(tuple(items))


def _candidate_table(report: TuneResult) -> Table:
    chosen = set(report.final.kept_nodes)
    if report.target.task != "classification":
        return Table(
            headers=("id", "method", "INT8 FLOPs", "agreement search", "cosine search", "kept", "accepted",
                     "kept nodes"),
            rows=tuple((num(c.id), text(c.method), pct(c.int8_flops_fraction, 1), pct(c.agreement_search),
                        num(c.cosine_search, 5), str(len(c.kept_nodes)), "yes" if c.accepted else "no",
                        shorten(", ".join(c.kept_nodes), 160) or DASH) for c in report.candidates),
            numeric=(True, False, True, True, True, True, False, False),
            highlight=tuple(set(c.kept_nodes) == chosen for c in report.candidates),
            note="Highlighted: the chosen plan.",
        )
    return Table(
        headers=("id", "method", "INT8 FLOPs", "accuracy search", "agreement search", "accuracy hold-out",
                 "kept", "accepted", "kept nodes"),
        rows=tuple((num(c.id), text(c.method), pct(c.int8_flops_fraction, 1), pct(c.accuracy_search),
                    pct(c.agreement_search), pct(c.accuracy_holdout), str(len(c.kept_nodes)),
                    "yes" if c.accepted else "no",
                    shorten(", ".join(c.kept_nodes), 160) or DASH) for c in report.candidates),
        numeric=(True, False, True, True, True, True, True, False, False),
        highlight=tuple(set(c.kept_nodes) == chosen for c in report.candidates),
        note="Highlighted: the chosen plan.",
    )


def _tune_document(report: TuneResult, plots: set[str]) -> Document:
    blocks: list[Block] = [Heading(2, "Summary"), Para.of("Claim: ", Span(report.claim, bold=True), "."),
                           *_target_blocks(report), _plan_bullets(report)]
    final = report.final
    if final.kept_nodes:
        blocks.append(Table(
            headers=("kept node", "reasons"),
            rows=tuple((final.label(n), "; ".join(final.reasons_for(n)) or DASH) for n in final.kept_nodes),
        ))
    blocks += (_tune_speed_blocks(report) + _smoothing_blocks(report) + _tune_traffic_blocks(report)
               + _evidence_cost_blocks(report) + _confirmation_blocks(report))
    if report.peers:
        ref = final.accuracy_holdout
        blocks.append(Heading(2, "Peers"))
        blocks.append(Table(
            headers=("tool", "accuracy", "calibkit plan vs it"),
            rows=tuple((text(p.name), pct(p.accuracy),
                        points(ref - p.accuracy) if ref is not None and p.accuracy is not None else DASH)
                       for p in report.peers),
            numeric=(False, True, True),
        ))
    figures = _figures(plots, ("tune", "speed"))
    if figures:
        blocks += [Heading(2, "Plots"), *figures]
    if report.candidates:
        blocks += [Heading(2, f"Candidates ({len(report.candidates)})"), _candidate_table(report)]
    blocks += _time_blocks(report.time_estimate)
    return Document("Accuracy-driven tuning", _subtitle(report), tuple(blocks))
