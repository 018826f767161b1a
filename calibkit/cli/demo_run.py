"""`calibkit demo run`: every step of the workflow on the demo assets."""

from __future__ import annotations

from pathlib import Path

import typer

from calibkit.cli._common import FLOAT, INTEGER, RichProgress, handle_errors, out

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
        from calibkit.demo.workflow import WorkflowOptions, run_workflow, verdict_lines
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
        # every verdict with its interval, the ones the holdout did not confirm first
        for line in verdict_lines(res.document) if res.document is not None else ():
            out.print(line, markup=False, highlight=False)
        out.print(f"open first: {res.index_html}")
