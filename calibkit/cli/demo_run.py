"""`calibkit demo run`: every step of the workflow on the demo assets."""

from __future__ import annotations

from pathlib import Path

import typer

from calibkit.cli._common import FLOAT, INTEGER, RichProgress, count, handle_errors, out

HELP = (
    "Run the whole workflow on the demo: prepare the assets (if not done), sample the production log, "
    "calibrate with every method, build FP32/FP16/INT8 engines, compare them layer by layer, tune the "
    "mixed-precision plan, and write reports/demo-<variant>/index/index.html — open that first.\n\n"
    "Examples:\n\n"
    "  calibkit demo run                 # fine-tuned model: 2 min of fine-tuning, then about 24 min on 2 cores\n\n"
    "  calibkit demo run --fast          # logistic-regression head and small subsets; its estimate is printed first\n"
)


def register(demo_app: typer.Typer) -> None:
    demo_app.command("run", help=HELP, short_help="Run every workflow step on the demo assets.")(run)


def run(
    fast: bool = typer.Option(False, "--fast", help="Quick variant (for tests and a first look)."),
    workdir: Path | None = typer.Option(None, "--workdir", help="Demo assets folder (default demo_assets[-fast])."),
    reports_dir: Path = typer.Option(Path("reports"), "--reports", help="Where reports go."),
    max_drop: float | None = typer.Option(None, "--max-drop", parser=FLOAT,
        help="Tune target in points (default 0.5; fast 1.0)."),
    workers: int | None = typer.Option(None, "--workers", parser=INTEGER, help="Processes for sensitivity and tuning."),
) -> None:
    with handle_errors():
        from calibkit.demo.prepare import check_demo_folder
        from calibkit.demo.workflow import WorkflowOptions, run_workflow
        from calibkit.outdirs import check_writable

        kw: dict = {"reports_dir": reports_dir, "workers": workers,
                    "workdir": workdir or Path("demo_assets-fast" if fast else "demo_assets")}
        if max_drop is not None:
            kw["max_drop"] = max_drop
        opts = WorkflowOptions.quick(**kw) if fast else WorkflowOptions(**kw)
        check_demo_folder(Path(opts.workdir))
        for folder, option in ((opts.workdir, "--workdir"), (opts.reports_dir, "--reports"),
                               (opts.calibration_sets_dir, "calibration_sets")):
            check_writable(folder, option=option)
        with RichProgress() as progress:
            res = run_workflow(opts, progress=progress)
        s = res.summary
        out.print(f"FP32 accuracy {100 * s['fp32_accuracy']:.2f} %; INT8 by method: "
                  + ", ".join(f"{m} {100 * a:.2f} %" for m, a in s["method_accuracy"].items()))
        t = s["tune"]
        verdict = t.get("holdout_verdict") or {}
        holdout = {True: "supports the plan", False: "does NOT support the plan"}.get(verdict.get("supported"),
                                                                                   "gives no verdict")
        agreement = t.get("agreement_holdout")
        out.print(f"tuned plan: {count(len(t['kept_nodes']), 'layer')} kept, {100 * t['int8_flops_fraction']:.1f} % of "
                  f"MatMul/Gemm FLOPs in INT8; target {'met' if t['met_target'] else 'NOT met'} on the search "
                  f"split; holdout {100 * t['accuracy_holdout']:.2f} % vs FP32 {100 * t['fp32_accuracy_holdout']:.2f} %"
                  + (f", agreement {100 * agreement:.2f} %" if agreement is not None else "")
                  + f": the holdout {holdout}")
        out.print(f"open first: {res.index_html}")
