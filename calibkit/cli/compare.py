"""`calibkit compare`: two engines on a labelled eval set, layer by layer, with layers to keep in FP16."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import typer

from calibkit.cli._common import (
    FORCE_HELP,
    MAX_BATCH_TOKENS_HELP,
    MEMORY_BUDGET_HELP,
    RichProgress,
    count,
    guard_out_dir,
    guard_out_file,
    handle_errors,
    out,
    say,
    token_budget,
    warn,
)
from calibkit.executors import EXECUTOR_HELP

HELP = (
    "Compare engine A (baseline, e.g. FP32/FP16) with engine B (e.g. INT8) on a labelled eval set.\n\n"
    "Reports accuracy, macro-F1, confusion matrix and latency of each engine; agreement and logit error between "
    "them; and, for every quantized layer of the INT8 model (in graph order): the FP range and percentiles "
    "against the INT8 clipping range, the clipped fraction, the outlier ratio, SQNR and cosine of the layer's "
    "output, the accuracy effect of quantizing only this layer / keeping only this layer in higher precision, "
    "and a keep-in-FP16 flag with the reasons that triggered it.\n\n"
    "Every accuracy, macro-F1, agreement and B-A difference carries a 95 % interval for paired predictions on "
    "the same examples (Wilson, paired bootstrap, exact McNemar). A difference whose interval covers zero is "
    "'not significant'; a per-layer effect within its own uncertainty is 'insufficient-evidence' (with the "
    "number of examples that would settle it); and no layer is advised to stay in FP16 while B is not "
    "significantly less accurate than A. Layer statistics, sensitivity samples and --limit use random subsets "
    "stratified by label, drawn from --seed by row content (the same rows in any file order give the same "
    "subset); the report lists the rows used.\n\n"
    "The eval set is JSONL, CSV/TSV, Parquet (columns text + label; labels as names or ids) or a Hugging Face "
    "datasets folder. A and B must be built from the same FP32 model.\n\n"
    "Outputs are checked before any work: --json must be a writable file path (an existing file only if it is "
    "an earlier compare document); the report folder must be new, empty or written by calibkit (--force moves "
    "anything else aside, never deletes it).\n\n"
    "Examples:\n\n"
    "  calibkit compare fp32.onnx int8.onnx --eval-set data/test.jsonl\n\n"
    "  calibkit compare fp16.onnx int8.onnx --reference fp32.onnx --eval-set test.parquet --json cmp.json\n\n"
    "  calibkit compare a.onnx b.onnx --eval-set test.csv --limit 500 --no-sensitivity --threshold-sqnr 25\n"
)


def register(app: typer.Typer) -> None:
    app.command("compare", help=HELP, short_help="Compare two engines, overall and layer by layer.")(compare)


def compare(
    engine_a: Path = typer.Argument(..., help="Engine A (.onnx or .engine with its .calibkit.json sidecar)."),
    engine_b: Path = typer.Argument(..., help="Engine B, built from the same FP32 model as A."),
    eval_set: Path = typer.Option(
        ..., "--eval-set", "-e", help="Eval set (JSONL, CSV, Parquet, datasets); labels optional: without them, "
        "fidelity to A is reported instead of accuracy."
    ),
    reference: Path | None = typer.Option(
        None, "--reference", help="Higher-precision engine (FP32) for FP ranges and reference logits."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write the calibkit-compare/1 JSON document here."),
    report: Path | None = typer.Option(
        None, "--report", help="Report folder (default reports/<timestamp>-<A>-vs-<B>/)."
    ),
    no_report: bool = typer.Option(False, "--no-report", help="Write no report folder."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Examples per inference batch."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Use N eval examples, drawn at random and stratified by label (--seed)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the --limit, layer-statistics and sensitivity subsets."),
    layers: bool = typer.Option(True, "--layers/--no-layers", help="Per-layer ranges and SQNR."),
    layer_samples: int = typer.Option(
        512, "--layer-samples", min=1, help="Examples streamed for layer statistics (stratified subset)."
    ),
    sensitivity: bool = typer.Option(
        True, "--sensitivity/--no-sensitivity", help="Per-layer accuracy effect (rebuilds a variant per layer)."
    ),
    sensitivity_samples: int = typer.Option(
        256, "--sensitivity-samples", min=1, help="Examples per variant (stratified subset)."
    ),
    memory_budget: str = typer.Option("1G", "--memory-budget", help=MEMORY_BUDGET_HELP + " For the layer taps."),
    max_batch_tokens: int | None = typer.Option(None, "--max-batch-tokens", help=MAX_BATCH_TOKENS_HELP),
    sensitivity_layers: int | None = typer.Option(
        None, "--sensitivity-layers", min=1,
        help="Only the K layers with the worst own SQNR or most zeroed weights (default: every layer).",
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Processes for sensitivity (default min(2, cpus))."
    ),
    executor: str | None = typer.Option(None, "--executor", help=EXECUTOR_HELP + " Runs the sensitivity variants."),
    threshold_sqnr: float = typer.Option(
        20.0, "--threshold-sqnr", help="Flag layers whose own quantization SQNR (dB) is below."
    ),
    threshold_clipped: float = typer.Option(1e-3, "--threshold-clipped", help="Flag layers clipping more than this."),
    threshold_outlier: float = typer.Option(10.0, "--threshold-outlier", help="Flag max/p99.99 above this."),
    threshold_recovery: float = typer.Option(
        0.5, "--threshold-recovery", help="Flag when keeping only this layer recovers more points than this."
    ),
    threshold_cost: float = typer.Option(
        0.5, "--threshold-cost", help="Flag when quantizing only this layer costs more points than this."
    ),
    text_column: str | None = typer.Option(None, "--text-column", help="Text column (default: text, sentence, ...)."),
    label_column: str | None = typer.Option(None, "--label-column", help="Label column (default: label, ...)."),
    split: str | None = typer.Option(None, "--split", help="Split of a datasets DatasetDict (default test)."),
    max_disagreements: int = typer.Option(50, "--max-disagreements", min=0, help="Disagreeing examples to list."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP + " Applies to --report."),
    task: str | None = typer.Option(
        None, "--task", help="classification | embedding | token-classification | regression | multi-label "
        "[default: from the "
        "model's outputs and config.json: logits [batch, classes], last_hidden_state (mean-pooled) or a pooled "
        "embedding, logits [batch, seq, labels], a single score or problem_type regression, problem_type "
        "multi_label_classification]."
    ),
) -> None:
    with handle_errors():
        from calibkit._io import commit_together, write_json
        from calibkit.consistency import check_engines
        from calibkit.data.evalset import load_eval_set
        from calibkit.engines.artifact import EngineArtifact
        from calibkit.evaluate.compare import (
            CompareOptions,
            check_same_model,
            compare_engines,
            ensure_known_labels,
            expects_label_sets,
        )
        from calibkit.evaluate.flags import Thresholds
        from calibkit.evaluate.subsets import limit_eval_set

        inputs = [engine_a, engine_b, reference, eval_set]
        if json_path:
            guard_out_file(json_path, inputs=inputs, option="--json", owned=_is_compare_json)
        report_dir = None if no_report else report or _default_report_dir(engine_a, engine_b)
        if report_dir is not None:
            from calibkit.report.render import REPORT_NAMES

            guard_out_dir(report_dir, inputs=inputs, option="--report", force=force, legacy_names=REPORT_NAMES)
            if json_path and report_dir.absolute().resolve() in json_path.absolute().resolve().parents:
                from calibkit.errors import UsageError

                raise UsageError(f"--json {json_path} lies inside --report {report_dir}, which is replaced as a "
                                 "whole", hint="write --json outside the report folder (the report holds "
                                 "report.json anyway)")
        a = EngineArtifact.load(engine_a)
        b = EngineArtifact.load(engine_b)
        ref = EngineArtifact.load(reference) if reference else None
        check_same_model([a, b] + ([ref] if ref else []))
        check_engines({"A": a, "B": b, **({"reference": ref} if ref else {})}, sources=layers or sensitivity)
        tok_dir = next((e.tokenizer for e in (a, b, ref) if e and e.tokenizer), None)
        full = load_eval_set(eval_set, text_column=text_column, label_column=label_column, split=split,
                             label_sets=expects_label_sets(tok_dir))
        # the whole file, not only the --limit subset: a bad label is the file's fault whichever rows are drawn
        ensure_known_labels(full, tok_dir)
        ev, rows = limit_eval_set(full, limit, seed)
        opts = CompareOptions(
            budget=token_budget(memory_budget, max_batch_tokens),
            batch_size=batch_size,
            layers=layers,
            layer_samples=layer_samples,
            sensitivity=sensitivity and layers,
            sensitivity_samples=sensitivity_samples,
            sensitivity_layers=sensitivity_layers,
            workers=workers,
            max_disagreements=max_disagreements,
            seed=seed,
            task=task,
            thresholds=Thresholds(
                min_sqnr_db=threshold_sqnr,
                max_clipped_fraction=threshold_clipped,
                max_outlier_ratio=threshold_outlier,
                min_recovery_points=threshold_recovery,
                max_cost_points=threshold_cost,
            ),
        )
        from dataclasses import replace

        from calibkit.executors import from_spec

        with from_spec(executor, workers) as ex, RichProgress() as progress:
            result = compare_engines(a, b, ev, reference=ref, options=replace(opts, executor=ex), progress=progress,
                                     rows=rows)
        doc = result.to_dict()
        with commit_together():  # --json and the report folder are replaced together or not at all
            if json_path:
                write_json(json_path, doc)
            if report_dir is not None:
                _render(doc, report_dir)
        _print_summary(result, json_path, report_dir)


def _is_compare_json(path: Path) -> bool:
    """An earlier `compare --json` document (a file calibkit may overwrite)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith("calibkit-compare/")


def _default_report_dir(a: Path, b: Path) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{stamp}-{a.stem}-vs-{b.stem}"


def _render(doc: dict, out_dir: Path) -> None:
    from calibkit._io import write_json

    try:
        from calibkit.report.render import render_report
    except ImportError:  # the report renderer is optional at this layer: keep the JSON
        write_json(out_dir / "report.json", doc)
        warn(f"report renderer not available; wrote {out_dir / 'report.json'}")
        return
    render_report(doc, out_dir)


def _print_summary(result, json_path: Path | None, report_dir: Path | None) -> None:  # noqa: ANN001
    from rich.table import Table

    t = Table(title=f"eval set {result.eval_set.path.name}: {len(result.eval_set)} examples (95 % intervals)")
    for col in ("engine", "precision", "accuracy", "macro-F1", "p50 ms/batch", "items/s"):
        t.add_column(col)
    for e in result.engines:
        t.add_row(
            f"{e.name}: {e.artifact.path.name}",
            e.artifact.precision.value,
            f"{e.metrics.accuracy * 100:.2f} %" + _ci(e.accuracy_ci, 100, 1) if e.metrics else "-",
            f"{e.metrics.macro_f1:.4f}" + _ci(e.macro_f1_ci, 1, 3) if e.metrics else "-",
            f"{e.latency.p50_ms:.1f}",
            f"{e.latency.throughput_per_s:.0f}",
        )
    out.print(t)
    ag = result.agreement
    d = result.accuracy_diff
    if d is not None:
        iv = d.interval
        out.print(f"B - A accuracy {iv.estimate * 100:+.2f} points (95 % CI {iv.low * 100:+.2f} to "
                  f"{iv.high * 100:+.2f}; McNemar p {d.mcnemar_p:.3g}; {d.b_only} fixed, {d.a_only} broken): "
                  f"{d.verdict}")
    if result.task != "classification" and result.fidelity is not None:
        fid = result.fidelity
        extra = "  ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in fid.extra.items() if k != "k")
        what = {"embedding": f"nearest-neighbour agreement (top-1 among the eval texts) {fid.agreement * 100:.2f} %",
                "token-classification": f"per-token agreement {fid.agreement * 100:.2f} %",
                "multi-label": f"same label set {fid.agreement * 100:.2f} %, same decision per label "
                               f"{fid.extra.get('label_decision_agreement', float('nan')) * 100:.2f} %",
                "regression": f"scores within {fid.extra.get('tolerance', float('nan')):.3g} of A's on "
                              f"{fid.agreement * 100:.2f} % of texts"}.get(result.task, "")
        out.print(f"task {result.task} ({result.task_output}): {what}  cosine to A mean {fid.cosine_mean:.5f} "
                  f"min {fid.cosine_min:.5f}  {extra}")
    if result.task in ("regression", "multi-label"):  # no argmax to flip: the task line above says it all
        out.print(f"output error: max |err| {ag.max_abs_error:.4g}, mean |err| {ag.mean_abs_error:.4g}")
    else:
        out.print(
            f"agreement {ag.agreement * 100:.2f} %{_ci(result.agreement_ci, 100, 2)}, flips "
            f"{(1 - ag.agreement) * 100:.2f} %  logit cosine mean {ag.cosine_mean:.5f} min {ag.cosine_min:.5f}  "
            f"max |err| {ag.max_abs_error:.4g}  mean KL {result.output_error.mean_kl:.3g}  "
            f"({len(result.disagreements)} disagreements listed)"
        )
    bands = result.flips_by_confidence
    if bands and sum(b.flips for b in bands):
        out.print("flips by A's top-2 probability gap: " + ", ".join(
            f"{b.flips} of {b.texts} texts at {b.low:g}-{b.high:g}" for b in bands)
            + f" ({bands[0].flips} where A itself was nearly undecided)")
    for w in result.warnings:
        warn(w)
    flagged = [r for r in result.layers if r.flag.flag.value != "ok"]
    if result.layers:
        lt = Table(title=f"{len(flagged)} of {len(result.layers)} quantized layer inputs flagged")
        for col in ("#", "node", "tensor", "amax", "fp absmax", "clipped", "own SQNR", "out SQNR", "flag", "reasons"):
            lt.add_column(col)
        for r in flagged[:25]:
            m, s = r.measurement, r.measurement.spec
            lt.add_row(
                str(s.index), s.label, s.tensor, _f(s.amax), _f(m.fp_absmax),
                f"{m.clipped_fraction:.1e}" if m.clipped_fraction is not None else "-",
                _f(m.quant_sqnr_db), _f(m.sqnr_db), r.flag.flag.value, "; ".join(r.flag.reasons),
            )
        if flagged:
            out.print(lt)
        keep = result.keep_in_higher_precision
        unsure = sum(r.flag.flag.value == "insufficient-evidence" for r in result.layers)
        if keep:
            label = {r.measurement.spec.node: r.measurement.spec.label for r in result.layers}
            shown = [label.get(n, n) for n in keep[:12]]
            say(f"recommendation: keep {count(len(keep), 'node')} in {result.recommended_precision}: "
                      f"{', '.join(shown)}" + (" ..." if len(keep) > 12 else ""))
        else:
            say("recommendation: no layer needs higher precision on this evidence")
        if unsure:
            say(f"{count(unsure, 'layer')}: insufficient evidence (effect within its 95 % interval; see the reasons)")
    if json_path:
        say(f"JSON: {json_path}")
    if report_dir:
        say(f"report: {report_dir}")


def _ci(iv, scale: float, digits: int) -> str:  # noqa: ANN001
    if iv is None or iv.low != iv.low:
        return ""
    return f" [{iv.low * scale:.{digits}f}, {iv.high * scale:.{digits}f}]"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"
