"""`calibkit tune`: search the mixed-precision plan that meets an accuracy target with the most INT8."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import typer

from calibkit.cli._common import RichProgress, handle_errors, out
from calibkit.executors import EXECUTOR_HELP

HELP = (
    "Find the plan that keeps accuracy within --max-drop of FP32 while keeping as much MatMul/Gemm work "
    "(FLOPs) in INT8 as possible.\n\n"
    "The eval set is split (stratified, seeded) into a search part, used for every decision, and a holdout "
    "part, measured only for the final plan, so over-fitting shows. Layers are ranked by how much keeping "
    "each one in higher precision brings the output back to FP32; the fewest are kept, and every candidate "
    "is measured. --method auto picks, per tensor, the calibration method with the best SQNR at its layer. "
    "Statistics are reused; finished evaluations are kept, so an interrupted run resumes.\n\n"
    "Writes OUT/model.int8.onnx, calibration.cache, calibration.json, plan.json (layers kept and why), "
    "tune.json, and a report with the accuracy vs INT8-coverage curve.\n\n"
    "Examples:\n\n"
    "  calibkit tune demo_assets/model --calibration-set calibration_sets/logs-n512-s0 "
    "--eval-set demo_assets/data/test.jsonl --max-drop 0.5\n\n"
    "  calibkit tune model/ -c calib/ -e test.parquet --max-drop 1 --relative --method entropy --workers 4\n\n"
    "  calibkit tune model/ -c calib/ -e test.parquet --executor dask://10.0.0.5:8786   (a Dask cluster: "
    "statistics in shards, every candidate a work unit; re-run the same command to resume)\n"
)


def register(app: typer.Typer) -> None:
    app.command("tune", help=HELP)(tune)


def tune(
    model: Path = typer.Argument(..., help="Model folder (model.onnx + tokenizer + config.json) or an .onnx file."),
    calibration_set: Path = typer.Option(..., "--calibration-set", "-c", help="Folder written by `calibkit sample`."),
    eval_set: Path = typer.Option(..., "--eval-set", "-e", help="Labelled eval set (JSONL, CSV, Parquet, datasets)."),
    max_drop: float = typer.Option(0.5, "--max-drop", min=0.0, help="Allowed accuracy drop below FP32 (points)."),
    relative: bool = typer.Option(False, "--relative", help="Read --max-drop as percent of FP32 accuracy."),
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
    sensitivity_layers: int | None = typer.Option(
        16, "--sensitivity-layers", min=1, help="Measure sensitivity for the K layers with the worst own SQNR."
    ),
    max_evaluations: int = typer.Option(40, "--max-evaluations", min=1, help="Budget of candidate plans."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N eval examples."),
    percentile: float = typer.Option(99.99, "--percentile", help="Percentile for the percentile method."),
    seed: int = typer.Option(0, "--seed", help="Seed of the search/holdout split."),
) -> None:
    with handle_errors():
        from calibkit.data.evalset import load_eval_set
        from calibkit.data.modeldir import ModelDir
        from calibkit.errors import UsageError
        from calibkit.evaluate.tune import TuneConfig, run_tune
        from calibkit.types import Method, MethodParams

        if method != "auto" and method not in {m.value for m in Method}:
            raise UsageError(f"unknown --method {method!r}", hint="use auto, entropy, minmax, percentile or mse")
        if target not in ("tensorrt", "onnxruntime"):
            raise UsageError(f"unknown --target {target!r}", hint="use tensorrt or onnxruntime")
        md = ModelDir.resolve(model, tokenizer)
        ev = load_eval_set(eval_set).head(limit)
        cfg = TuneConfig(
            max_drop=max_drop, relative=relative, method=method, holdout_fraction=holdout,
            sensitivity_samples=sensitivity_samples, sensitivity_layers=sensitivity_layers,
            max_evaluations=max_evaluations, workers=workers,
            seed=seed, target=target, params=MethodParams(percentile=percentile),
        )
        dest = out_dir or Path("runs") / f"tune-{md.onnx_path.parent.name or md.onnx_path.stem}"
        report_dir = None
        render = None
        if not no_report:
            from calibkit.report.render import render_report

            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            report_dir = report or Path("reports") / f"{stamp}-tune"
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


def _summary(res, report_dir: Path | None) -> None:  # noqa: ANN001
    from rich.table import Table

    d = res.doc
    t = Table(title="tune")
    t.add_column("")
    t.add_column("search", justify="right")
    t.add_column("holdout", justify="right")

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.2f} %"

    t.add_row("FP32", pct(d["target"]["fp32_accuracy"]), pct(d["target"]["fp32_accuracy_holdout"]))
    allint8 = next((c for c in d["candidates"] if not c["kept_nodes"]), None)
    t.add_row("all INT8", pct(allint8["accuracy_search"] if allint8 else None),
              pct(d["final"]["all_int8_accuracy_holdout"]))
    t.add_row(f"plan ({len(res.kept_nodes)} layers kept)", pct(d["final"]["accuracy_search"]),
              pct(d["final"]["accuracy_holdout"]))
    out.print(t)
    verdict = "met" if res.met_target else "NOT met (the most accurate plan measured is written)"
    out.print(f"target {verdict}; INT8 share of MatMul/Gemm FLOPs: {100 * res.int8_flops_fraction:.1f} %; "
              f"{len(d['candidates'])} candidates measured, {d['evaluations_reused']} evaluations reused")
    for n in res.kept_nodes:
        out.print(f"  keep {n}")
    out.print(f"wrote {res.out_dir}/ (model.int8.onnx, calibration.cache, calibration.json, plan.json)")
    if report_dir:
        out.print(f"report: {report_dir}/report.html")
