"""`calibkit tune`: search the mixed-precision plan that meets an accuracy target with the most INT8."""

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
    handle_errors,
    out,
    say,
    token_budget,
    warn,
)
from calibkit.executors import EXECUTOR_HELP

HELP = (
    "Find the plan that keeps accuracy within --max-drop of FP32 (and, with --min-agreement, at least that "
    "percentage of FP32's predictions unchanged) while keeping as much MatMul/Gemm work (FLOPs) in INT8 as "
    "possible.\n\n"
    "An eval set without labels works too: FP32's own predictions become the labels and the target is agreement "
    "alone (--min-agreement, default 99 there).\n\n"
    "The eval set is split (stratified by label, seeded, by row content) into a search part, used for every "
    "decision, and a holdout part, measured only for the final plan: the verdict gives the plan's accuracy "
    "difference to FP32 and its agreement with FP32 on the holdout with 95 % intervals, and says whether the "
    "holdout supports the claim (supported / not confirmed / contradicted). Layers are ranked by the output "
    "damage (KL divergence to FP32) of quantizing only that layer, per FLOP; the fewest are kept, "
    "and every candidate is measured. The calibration table is the one whose all-INT8 model flips the fewest "
    "FP32 predictions on the search split (accuracy differences between INT8 variants are mostly noise); "
    "--method auto adds a per-tensor table (per tensor the method with the best SQNR at its layer). "
    "Statistics are reused; finished evaluations are kept, so an interrupted run resumes.\n\n"
    "Writes OUT/model.int8.onnx, calibration.cache, calibration.json, plan.json (layers kept and why), "
    "tune.json, and a report with the accuracy vs INT8-coverage curve. OUT and the report folder must be new, "
    "empty or written by calibkit (--force moves anything else aside, never deletes it), and apart from the "
    "inputs.\n\n"
    "Examples:\n\n"
    "  calibkit tune demo_assets/model --calibration-set calibration_sets/logs-n512-s0 "
    "--eval-set demo_assets/data/test.jsonl --max-drop 0.5\n\n"
    "  calibkit tune model/ -c calib/ -e test.parquet --max-drop 1 --relative --method entropy --workers 4\n\n"
    "  calibkit tune model/ -c calib/ -e test.jsonl --max-drop 0.5 --min-agreement 99\n"
    "  calibkit tune runs/minilm-smoothed -c calib/ -e test.jsonl --min-agreement 99   (a folder written by "
    "`calibkit smooth`: fewer layers to keep, measured against the same FP32 function)\n"
    "  calibkit tune model/ -c calib/ -e test.parquet --executor dask://10.0.0.5:8786   (a Dask cluster: "
    "statistics in shards, every candidate a work unit; re-run the same command to resume)\n"
)


def register(app: typer.Typer) -> None:
    app.command("tune", help=HELP, short_help="Find the mixed-precision plan that meets an accuracy target.")(tune)


def tune(
    model: Path = typer.Argument(..., help="Model folder (model.onnx + tokenizer + config.json) or an .onnx file."),
    calibration_set: Path = typer.Option(..., "--calibration-set", "-c", help="Folder written by `calibkit sample`."),
    eval_set: Path = typer.Option(..., "--eval-set", "-e", help="Labelled eval set (JSONL, CSV, Parquet, datasets)."),
    max_drop: float = typer.Option(0.5, "--max-drop", min=0.0, help="Allowed accuracy drop below FP32 (points)."),
    relative: bool = typer.Option(False, "--relative", help="Read --max-drop as percent of FP32 accuracy."),
    min_agreement: float | None = typer.Option(
        None, "--min-agreement", help="Also require this percentage of FP32's predictions unchanged (e.g. 99)."
    ),
    agreement_confidence: float = typer.Option(
        0.9, "--agreement-confidence",
        help="A plan meets --min-agreement on the search split only when the one-sided lower bound of its "
             "agreement at this confidence reaches it (0.5: the point estimate), so the claim survives the holdout.",
    ),
    method: str = typer.Option("auto", "--method", "-m", help="auto | entropy | minmax | percentile | mse."),
    out_dir: Path | None = typer.Option(None, "--out", "-o", help="Output folder (default runs/tune-<model>/)."),
    report: Path | None = typer.Option(None, "--report", help="Report folder (default reports/<time>-tune/)."),
    no_report: bool = typer.Option(False, "--no-report", help="Write no report folder."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="Tokenizer folder when MODEL is an .onnx file."),
    target: str = typer.Option("tensorrt", "--target", help="Q/DQ layout: tensorrt | onnxruntime."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Evaluation processes (default min(2, cpus))."),
    executor: str | None = typer.Option(None, "--executor", help=EXECUTOR_HELP),
    holdout: float = typer.Option(0.3, "--holdout", help="Fraction of the eval set held out for the final check."),
    sensitivity_samples: int = typer.Option(256, "--sensitivity-samples", min=8, help="Examples per ranking run."),
    memory_budget: str = typer.Option("1G", "--memory-budget", help=MEMORY_BUDGET_HELP + " For the layer taps."),
    max_batch_tokens: int | None = typer.Option(None, "--max-batch-tokens", help=MAX_BATCH_TOKENS_HELP),
    sensitivity_layers: int | None = typer.Option(
        None, "--sensitivity-layers", min=1,
        help="Measure sensitivity only for the K layers with the worst own SQNR (default: every layer).",
    ),
    max_evaluations: int = typer.Option(40, "--max-evaluations", min=1, help="Budget of candidate plans."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Use N eval examples, drawn at random and stratified by label (--seed)."
    ),
    percentile: float = typer.Option(99.99, "--percentile", help="Percentile for the percentile method."),
    seed: int = typer.Option(0, "--seed", help="Seed of the --limit subset and the search/holdout split."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP + " Applies to --out and --report."),
) -> None:
    with handle_errors():
        from calibkit.data.evalset import load_eval_set
        from calibkit.data.modeldir import ModelDir
        from calibkit.errors import UsageError
        from calibkit.evaluate.compare import ensure_known_labels
        from calibkit.evaluate.subsets import limit_eval_set
        from calibkit.evaluate.tune import TuneConfig, run_tune
        from calibkit.types import Method, MethodParams

        if method != "auto" and method not in {m.value for m in Method}:
            raise UsageError(f"unknown --method {method!r}", hint="use auto, entropy, minmax, percentile or mse")
        if target not in ("tensorrt", "onnxruntime"):
            raise UsageError(f"unknown --target {target!r}", hint="use tensorrt or onnxruntime")
        md = ModelDir.resolve(model, tokenizer)
        dest = out_dir or Path("runs") / f"tune-{md.onnx_path.parent.name or md.onnx_path.stem}"
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        report_dir = None if no_report else report or Path("reports") / f"{stamp}-tune"
        inputs = [model, calibration_set, eval_set, tokenizer]
        guard_out_dir(dest, inputs=inputs, force=force, legacy_names=_OUT_NAMES)
        if report_dir is not None:
            _check_apart(dest, report_dir)
            from calibkit.report.render import REPORT_NAMES

            guard_out_dir(report_dir, inputs=inputs, option="--report", force=force, legacy_names=REPORT_NAMES)
        full = load_eval_set(eval_set)
        ensure_known_labels(full, str(md.onnx_path.parent))  # the whole file, not only the --limit subset
        ev, _rows = limit_eval_set(full, limit, seed)
        cfg = TuneConfig(
            max_drop=max_drop, relative=relative, min_agreement=min_agreement,
            agreement_confidence=agreement_confidence, method=method, holdout_fraction=holdout,
            sensitivity_samples=sensitivity_samples, sensitivity_layers=sensitivity_layers,
            max_evaluations=max_evaluations, workers=workers,
            seed=seed, target=target, params=MethodParams(percentile=percentile),
            budget=token_budget(memory_budget, max_batch_tokens),
        )
        render = None
        if report_dir is not None:
            from calibkit.report.render import render_report

            render = render_report
        import contextlib

        from calibkit.executors import from_spec

        # without --executor run_tune evaluates in a local pool of --workers; a chosen executor also shards the
        # statistics
        with contextlib.ExitStack() as stack, RichProgress() as progress:
            ex = stack.enter_context(from_spec(executor, workers)) if executor else None
            res = run_tune(md, calibration_set, ev, dest, cfg, progress=progress, render=render,
                           report_dir=report_dir, executor=ex)
        _summary(res, report_dir)


_OUT_NAMES = ("model.int8.onnx", "calibration.cache", "calibration.json", "plan.json", "tune.json")


def _check_apart(out_dir: Path, report_dir: Path) -> None:
    from calibkit.errors import UsageError

    a, b = out_dir.absolute().resolve(), report_dir.absolute().resolve()
    if a == b or a in b.parents or b in a.parents:
        raise UsageError(f"--out {out_dir} and --report {report_dir} overlap; each is written as a whole",
                         hint="pass two separate folders, e.g. --out runs/tune --report reports/tune")


def _summary(res, report_dir: Path | None) -> None:  # noqa: ANN001
    from rich.table import Table

    d = res.doc
    t = Table(title="tune (agreement: share of FP32's predictions kept)")
    for col in ("", "accuracy search", "accuracy holdout", "agreement search", "agreement holdout"):
        t.add_column(col, justify="right" if col else "left")

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.2f} %"

    f = d["final"]
    t.add_row("FP32", pct(d["target"]["fp32_accuracy"]), pct(d["target"]["fp32_accuracy_holdout"]), "", "")
    allint8 = next((c for c in d["candidates"] if not c["kept_nodes"]), None)
    t.add_row("all INT8", pct(allint8["accuracy_search"] if allint8 else None),
              pct(f["all_int8_accuracy_holdout"]), pct(allint8.get("agreement_search") if allint8 else None),
              pct(f.get("all_int8_agreement_holdout")))
    t.add_row(f"plan ({count(len(res.kept_nodes), 'layer')} kept)", pct(f["accuracy_search"]),
              pct(f["accuracy_holdout"]), pct(f.get("agreement_search")), pct(f.get("agreement_holdout")))
    out.print(t)
    m = d["methods"]
    out.print(f"calibration: {m['chosen']} (fewest flips of FP32 on the search split: "
              + ", ".join(f"{k} {100 * v:.2f} %" for k, v in m.get("all_int8_flip_rate_search", {}).items()) + ")")
    verdict = "met" if res.met_target else "NOT met (the most accurate plan measured is written)"
    conf = d["target"].get("agreement_confidence")
    if d["target"].get("min_agreement") is not None and conf is not None and conf > 0.5:
        say(f"--min-agreement {d['target']['min_agreement']:g} counts as met on the search split when the one-sided "
            f"{100 * conf:g} % lower bound of the agreement reaches it (--agreement-confidence; 0.5: the estimate)")
    say(f"target {verdict}; INT8 share of linear FLOPs (fused ops included): {100 * res.int8_flops_fraction:.1f} %; "
              f"{len(d['candidates'])} candidates measured, {d['evaluations_reused']} evaluations reused")
    verdict_h = f.get("holdout_verdict") or {}
    if verdict_h.get("text"):
        word = {True: "the holdout supports the claim", False: "the holdout does NOT support the claim",
                None: "no holdout verdict"}[verdict_h.get("supported")]
        say(f"{word}: {verdict_h['text']}")
    for w in d.get("warnings", []):
        warn(w)
    modules = f.get("kept_modules") or {}
    for n in res.kept_nodes:
        say(f"  keep {modules[n]} ({n})" if modules.get(n) and modules[n] not in n else f"  keep {n}")
    say(f"wrote {res.out_dir}/ ({', '.join(_OUT_NAMES)})")
    if report_dir:
        say(f"report: {report_dir}/report.html")
