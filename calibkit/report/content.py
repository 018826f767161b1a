"""What a report says, in which order: a summary first, then plots, then the detailed tables."""

from __future__ import annotations

from collections.abc import Sequence

from calibkit.report.blocks import Block, Bullets, Details, Document, Figure, Heading, Para, Span, Table
from calibkit.report.document import (
    CompareReport,
    ConfidenceBand,
    EngineResult,
    LayerResult,
    Range,
    Report,
    TaskFidelity,
    TuneReport,
)
from calibkit.report.formatting import DASH, num, pct, points, shorten, text
from calibkit.report.plots import Plot

MAX_DISAGREEMENTS = 200
MAX_TEXT = 300


def build_document(report: Report, plots: Sequence[Plot]) -> Document:
    names = {p.name for p in plots}
    if isinstance(report, TuneReport):
        return _tune_document(report, names)
    return _compare_document(report, names)


def _figures(names: set[str], order: Sequence[str]) -> tuple[Block, ...]:
    return tuple(Figure(n) for n in order if n in names)


# ---------------------------------------------------------------- compare


def _baseline(engines: Sequence[EngineResult]) -> EngineResult | None:
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


def _engine_table(engines: Sequence[EngineResult]) -> Table:
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


def _keep_layers(report: CompareReport) -> tuple[tuple[str, LayerResult | None], ...]:
    if report.keep_nodes:
        return tuple((node, report.layer_for_node(node)) for node in report.keep_nodes)
    return tuple((x.label, x) for x in report.layers if x.flagged)


def _keep_table(keep: Sequence[tuple[str, LayerResult | None]]) -> Table:
    rows = []
    for node, layer in keep:
        rows.append((
            node,
            text(layer.op_type) if layer else DASH,
            text(layer.flag) if layer else DASH,
            num(layer.quant_sqnr_db, 1) if layer else DASH,
            num(layer.sqnr_db, 1) if layer else DASH,
            "; ".join(layer.reasons) if layer and layer.reasons else DASH,
        ))
    return Table(headers=("node", "op", "flag", "own SQNR dB", "output SQNR dB", "reasons"), rows=tuple(rows),
                 numeric=(False, False, False, True, True, False))


def _delta(layer: LayerResult, which: str) -> str:
    sens = layer.only_this_int8 if which == "only" else layer.all_but_this
    if sens is None:
        return DASH
    if sens.delta_low is None or sens.delta_high is None:
        return points(sens.delta)
    return points(sens.delta) + f" [{100 * sens.delta_low:+.2f}, {100 * sens.delta_high:+.2f}]"


def _layer_table(layers: Sequence[LayerResult]) -> Table:
    rows = tuple(
        (
            num(x.index), text(x.node), text(x.op_type), text(x.tensor), num(x.amax), num(x.fp_absmax),
            num(x.p9999), pct(x.clipped_fraction, 3), num(x.outlier_ratio, 1), num(x.nonfinite),
            num(x.quant_sqnr_db, 1), num(x.sqnr_db, 1), num(x.cosine, 4), _delta(x, "only"), _delta(x, "all_but"),
            text(x.flag),
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


def _fidelity_rows(t: TaskFidelity) -> list[tuple[str, str, str]]:
    """(metric, value, what it measures) of B against A, in the task's own terms."""
    k = t.metric("k")
    kk = f"top-{int(k)}" if k is not None else "top-k"
    if t.kind == "embedding":
        rows = [
            ("cosine to A, mean", num(t.cosine_mean, 5), "per text, between B's and A's embedding"),
            ("cosine to A, min", num(t.cosine_min, 5), "the least faithful text"),
            ("same nearest neighbour", pct(t.metric("retrieval_top1_agreement") or t.agreement),
             "each eval text queries the others by cosine: B's top-1 is A's"),
            (f"{kk} neighbour overlap", num(t.metric("retrieval_overlap_at_k"), 4),
             f"mean share of A's {kk} neighbours that B also ranks in its {kk}"),
        ]
        shown = {"retrieval_top1_agreement", "retrieval_overlap_at_k", "k"}
    elif t.kind == "token-classification":
        rows = [
            ("same label per token", pct(t.agreement), "argmax of B equals A's, over real (non-padding) tokens"),
            ("entity F1 against A", num(t.metric("entity_f1"), 4),
             "B's BIO entities (exact span and type) scored against A's"),
            ("cosine to A, mean", num(t.cosine_mean, 5), "per text, over its real tokens' logits"),
            ("cosine to A, min", num(t.cosine_min, 5), "the least faithful text"),
        ]
        shown = {"entity_f1"}
    elif t.kind == "multi-label":
        rows = [
            ("same label set", pct(t.agreement), "every label's yes/no (logit above 0) of B equals A's"),
            ("same decision per label", pct(t.metric("label_decision_agreement")), "over every (text, label)"),
            ("logit cosine, mean", num(t.cosine_mean, 5), "per text, between B's and A's logits"),
            ("logit cosine, min", num(t.cosine_min, 5), "the least faithful text"),
        ]
        for who in ("A", "B"):
            if t.metric(f"{who}_exact_set_accuracy") is not None:
                rows += [(f"{who}: exact label set", pct(t.metric(f"{who}_exact_set_accuracy")),
                          "against the eval set's label sets"),
                         (f"{who}: micro / macro F1", f"{num(t.metric(f'{who}_micro_f1'), 4)} / "
                          f"{num(t.metric(f'{who}_macro_f1'), 4)}", "over every (text, label) / per label, averaged")]
        shown = {"label_decision_agreement"} | {f"{w}_{m}" for w in "AB"
                                                for m in ("exact_set_accuracy", "micro_f1", "macro_f1")}
    elif t.kind == "regression":
        rows = [
            ("scores within tolerance", pct(t.agreement),
             f"|B - A| at most {num(t.metric('tolerance'), 4)} (1 % of A's spread over the eval texts)"),
            ("mean |B - A|", num(t.metric("mean_abs_error"), 5), "over texts"),
            ("max |B - A|", num(t.metric("max_abs_error"), 5), "the least faithful text"),
            ("correlation with A", num(t.cosine_mean, 5), "Pearson, over the eval texts"),
            ("rank correlation with A", num(t.metric("spearman"), 5), "Spearman: does B order the texts as A does"),
        ]
        for who in ("A", "B"):
            if t.metric(f"{who}_mae_vs_labels") is not None:
                rows += [(f"{who}: mean |score - label|", num(t.metric(f"{who}_mae_vs_labels"), 5),
                          "against the eval set's target scores"),
                         (f"{who}: RMSE against the labels", num(t.metric(f"{who}_rmse_vs_labels"), 5), DASH)]
        shown = {"tolerance", "mean_abs_error", "max_abs_error", "spearman", "A_mae_vs_labels", "A_rmse_vs_labels",
                 "B_mae_vs_labels", "B_rmse_vs_labels"}
    else:
        rows = [
            ("same prediction", pct(t.agreement), "argmax of B equals A's"),
            ("logit cosine, mean", num(t.cosine_mean, 5), "per text, between B's and A's logits"),
            ("logit cosine, min", num(t.cosine_min, 5), "the least faithful text"),
        ]
        shown = set()
    rows += [(m.name.replace("_", " "), num(m.value, 4), DASH) for m in t.extra if m.name not in shown]
    return rows


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


def _task_blocks(t: TaskFidelity | None) -> list[Block]:
    if t is None or (t.agreement is None and t.cosine_mean is None and not t.extra and not t.gold):
        return []
    kind = _TASK_NAMES.get(t.kind or "", text(t.kind))
    blocks: list[Block] = [Heading(2, f"Task fidelity: {kind}")]
    blocks.append(Para.of("B against A in the terms of the task calibkit chose for output ",
                          Span(text(t.output), code=True), " (", Span(kind, bold=True), "; ",
                          "labelled eval set" if t.labelled else "no labels needed", ")."))
    blocks.append(Table(headers=("B against A", "value", "what it measures"), rows=tuple(_fidelity_rows(t)),
                        numeric=(False, True, False)))
    if t.gold:
        blocks.append(Heading(3, "Against the gold labels"))
        unscored = (f"; {num(t.gold_unscored_words)} words past the token limit or without tokens are not scored"
                    if t.gold_unscored_words else "")
        blocks.append(Para.of(f"Word-level BIO tags of the eval set: {num(t.gold_words)} words scored, "
                              f"{num(t.gold_entities)} gold entities{unscored}. A word's prediction is its first "
                              "token's."))
        blocks.append(Table(
            headers=("engine", "token accuracy [95 % CI]", "entity F1", "entity precision", "entity recall"),
            rows=tuple((text(g.engine), pct(g.token_accuracy) + _ci(g.token_accuracy_ci), num(g.entity_f1, 4),
                        num(g.entity_precision, 4), num(g.entity_recall, 4)) for g in t.gold),
            numeric=(False, True, True, True, True),
        ))
    return blocks


def _compare_document(report: CompareReport, plots: set[str]) -> Document:
    blocks: list[Block] = [Heading(2, "Summary")]
    labels = ", ".join(report.eval_labels) if report.eval_labels else DASH
    blocks.append(Para.of("Evaluated on ", Span(num(report.eval_count), bold=True), " texts from ",
                          Span(text(report.eval_path), code=True), f" (labels: {labels})."))
    if report.engines:
        blocks.append(_engine_table(report.engines))
    o = report.outputs
    d = report.accuracy_diff
    if d is not None and d.range.estimate is not None:
        settle = (f"; about {d.examples_to_settle:,} examples would settle it"
                  if d.verdict == "not significant" and d.examples_to_settle else "")
        blocks.append(Para.of(
            "Accuracy of B minus A: ", Span(f"{points(d.range.estimate)}{_ci(d.range, pts=True)}", bold=True),
            f" (95 % paired interval; exact McNemar p {num(d.mcnemar_p)}): ", Span(text(d.verdict), bold=True),
            f"{settle}."))
    for w in report.warnings:
        blocks.append(Para.of(Span("Warning:", bold=True), " " + w))
    flips = None if report.agreement is None else 1.0 - report.agreement
    blocks.append(Bullets((
        Para.of("Agreement of the predictions of A and B: ",
                Span(pct(report.agreement) + _ci(report.agreement_ci), bold=True),
                f" (flips: {pct(flips)})"),
        Para.of(f"Cosine similarity of the outputs: mean {num(o.cosine_mean, 4)}, min {num(o.cosine_min, 4)}"),
        Para.of(f"Output error: max |Δ| {num(o.max_abs_error)}, mean |Δ| {num(o.mean_abs_error)}"
                + (f", logit MSE {num(o.logit_mse)}" if o.logit_mse is not None else "")
                + (f", mean KL {num(o.mean_kl)}" if o.mean_kl is not None else "")),
        Para.of(f"Disagreements: {len(report.disagreements)}"),
    )))
    blocks += _confidence_blocks(report.flips_by_confidence)
    blocks += _task_blocks(report.task)
    if report.layer_samples or report.sensitivity_samples:
        sens = num(report.sensitivity_samples) if report.sensitivity_samples else "no"
        blocks.append(Para.of(f"Per-layer statistics from {num(report.layer_samples)} texts; per-layer "
                              f"sensitivity from {sens} texts (random subsets stratified by label, seed "
                              f"{text(report.seed)})."))
    keep = _keep_layers(report)
    precision = (report.keep_precision or "higher precision").upper()
    blocks.append(Heading(2, "Layers to keep in higher precision"))
    if keep:
        blocks.append(Para.of("Keep ", Span(f"{len(keep)} of {len(report.layers)}", bold=True),
                              f" quantized layers in {precision}; the rest can run in INT8."))
        blocks.append(_keep_table(keep))
    elif report.layers and any(x.flag == "watch" for x in report.layers):
        blocks.append(Para.of(f"None: all {len(report.layers)} quantized layers can run in INT8."))
    elif report.layers and any(x.flag == "insufficient-evidence" for x in report.layers):
        blocks.append(Para.of("None on this evidence: no measured effect is larger than its own uncertainty."))
    elif report.layers:
        blocks.append(Para.of(f"None: all {len(report.layers)} quantized layers passed the thresholds."))
    else:
        blocks.append(Para.of("No per-layer analysis in this report."))
    watched = [x for x in report.layers if x.flag == "watch"]
    if watched:
        blocks.append(Para.of(
            Span(f"{len(watched)} layers to watch", bold=True),
            ": a heuristic threshold fired, but the measured sensitivity says INT8 costs nothing there.",
        ))
        blocks.append(_keep_table(tuple((x.label, x) for x in watched)))
    unsure = [x for x in report.layers if x.flag == "insufficient-evidence"]
    if unsure:
        blocks.append(Para.of(
            Span(f"{len(unsure)} layers with insufficient evidence", bold=True),
            ": a measured effect passed a threshold but lies within its own 95 % interval; the reasons say how "
            "many examples would settle it.",
        ))
        blocks.append(_keep_table(tuple((x.label, x) for x in unsure)))
    figures = _figures(plots, ("sqnr", "ranges", "histograms", "confusion"))
    if figures:
        blocks += [Heading(2, "Plots"), *figures]
    flagged = [x for x in report.layers if x.flagged]
    if flagged:
        blocks += [Heading(2, f"Flagged layers ({len(flagged)})"), _layer_table(flagged)]
    if report.layers:
        blocks.append(Details(f"All {len(report.layers)} layers", (_layer_table(report.layers),)))
    blocks.append(Heading(2, f"Disagreements ({len(report.disagreements)})"))
    if report.disagreements:
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
    else:
        blocks.append(Para.of("A and B agree on every text."))
    if report.subsets:
        blocks.append(Details("Rows used by each measurement", (Table(
            headers=("subset", "rows"), rows=tuple((s.name, s.value) for s in report.subsets)),)))
    if report.thresholds:
        blocks.append(Details("Thresholds used to flag layers", (Table(
            headers=("threshold", "value"), rows=tuple((s.name, s.value) for s in report.thresholds)),)))
    subtitle = f"calibkit {text(report.calibkit_version)} · {report.format}"
    return Document("Quantization comparison", subtitle, tuple(blocks))


# ---------------------------------------------------------------- tune


def _tune_document(report: TuneReport, plots: set[str]) -> Document:
    blocks: list[Block] = [Heading(2, "Summary")]
    if report.max_drop is None:
        drop = DASH
    elif report.relative:
        drop = f"{report.max_drop:g} % of it (relative)"
    else:
        drop = f"{report.max_drop:g} pt"
    agree = (f" and at least {report.min_agreement:g} % of FP32's predictions unchanged"
             if report.min_agreement is not None else "")
    blocks.append(Para.of("Target: accuracy at least ", Span(pct(report.target_accuracy), bold=True),
                          f" (FP32 {pct(report.fp32_accuracy)} minus {drop}){agree}, on the search split."))
    for w in report.warnings:
        blocks.append(Para.of(Span("Warning:", bold=True), " " + w))
    if report.method_flips:
        blocks.append(Para.of(f"Calibration table: {text(report.chosen_method)}, the one whose all-INT8 model flips "
                              "the fewest FP32 predictions on the search split ("
                              + ", ".join(f"{x.name} {x.value}" for x in report.method_flips) + ")."))
    final = report.final
    if final is None:
        blocks.append(Para.of("No plan was chosen."))
    else:
        target = report.target_accuracy
        judged = final.accuracy_holdout if final.accuracy_holdout is not None else final.accuracy_search
        verdict = DASH if target is None or judged is None else ("yes" if judged >= target - 1e-12 else "no")
        items = [
            Para.of("Share of FLOPs in INT8: ", Span(pct(final.int8_flops_fraction, 1), bold=True)),
            Para.of(f"Accuracy on the search set: {pct(final.accuracy_search)}; on the hold-out set: ",
                    Span(pct(final.accuracy_holdout), bold=True)),
        ]
        if final.agreement_search is not None or final.agreement_holdout is not None:
            items.append(Para.of(f"Agreement with FP32 on the search set: {pct(final.agreement_search)}; on the "
                                 "hold-out set: ", Span(pct(final.agreement_holdout) + _ci(final.holdout_agreement),
                                                        bold=True)))
        d = final.holdout_accuracy_diff
        if d is not None and d.range.estimate is not None:
            items.append(Para.of("Hold-out accuracy minus FP32: ",
                                 Span(points(d.range.estimate) + _ci(d.range, pts=True), bold=True),
                                 f" ({text(d.verdict)})"))
        items.append(Para.of(f"Meets the target on the search set: {verdict}"
                             if final.holdout_supported is not None else f"Meets the target: {verdict}"))
        if final.holdout_supported is not None:
            items.append(Para.of("The hold-out split ", Span("supports" if final.holdout_supported else
                                                              "does not support", bold=True),
                                 f" the claim: {text(final.holdout_verdict)}."))
        items.append(Para.of(f"Layers kept in higher precision: {len(final.kept_nodes)}"))
        blocks.append(Bullets(tuple(items)))
        if final.kept_nodes:
            blocks.append(Table(
                headers=("kept node", "reasons"),
                rows=tuple((n, "; ".join(final.reasons_for(n)) or DASH) for n in final.kept_nodes),
            ))
    if report.peers:
        ref = final.accuracy_holdout if final else None
        blocks.append(Heading(2, "Peers"))
        blocks.append(Table(
            headers=("tool", "accuracy", "calibkit plan vs it"),
            rows=tuple((text(p.name), pct(p.accuracy),
                        points(ref - p.accuracy) if ref is not None and p.accuracy is not None else DASH)
                       for p in report.peers),
            numeric=(False, True, True),
        ))
    figures = _figures(plots, ("tune",))
    if figures:
        blocks += [Heading(2, "Plots"), *figures]
    if report.candidates:
        chosen = set(final.kept_nodes) if final else None
        blocks.append(Heading(2, f"Candidates ({len(report.candidates)})"))
        blocks.append(Table(
            headers=("id", "method", "INT8 FLOPs", "accuracy search", "agreement search", "accuracy hold-out",
                     "kept", "accepted", "kept nodes"),
            rows=tuple((num(c.id), text(c.method), pct(c.int8_flops_fraction, 1), pct(c.accuracy_search),
                        pct(c.agreement_search), pct(c.accuracy_holdout), str(len(c.kept_nodes)),
                        DASH if c.accepted is None else ("yes" if c.accepted else "no"),
                        shorten(", ".join(c.kept_nodes), 160) or DASH) for c in report.candidates),
            numeric=(True, False, True, True, True, True, True, False, False),
            highlight=tuple(chosen is not None and set(c.kept_nodes) == chosen for c in report.candidates),
            note="Highlighted: the chosen plan." if final else "",
        ))
    subtitle = f"calibkit {text(report.calibkit_version)} · {report.format}"
    return Document("Accuracy-driven tuning", subtitle, tuple(blocks))
