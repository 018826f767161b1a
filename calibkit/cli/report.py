"""`calibkit report`: re-render a report folder (Markdown, HTML, plots) from its JSON."""

from __future__ import annotations

from pathlib import Path

import typer

from calibkit.cli._common import FORCE, RichProgress, guard_out_dir, handle_errors, say

_HELP = (
    "Re-render a compare or tune report from its JSON.\n\n"
    "Reads REPORT.json (written by `calibkit compare` or `calibkit tune`, or the report.json of an earlier "
    "report) and writes a report folder: report.json, report.md, a self-contained report.html (plots embedded: "
    "open it in any browser, mail it, attach it to a ticket) and plots/*.png.\n\n"
    "The folder is written under a temporary name and swapped in when complete, so a failure leaves the "
    "previous report as it was. It is replaced as a whole: --out must be a new folder or hold only an earlier "
    "report.\n\n"
    "A folder holding anything else is refused, --force or not: calibkit never moves or deletes a file it did "
    "not write, and re-rendering in place never moves REPORT.json.\n\n"
    "Examples:\n\n"
    "  calibkit report reports/minilm-int8/report.json   (re-render in place)\n\n"
    "  calibkit report compare.json --out reports/minilm-int8\n\n"
    "  calibkit report tune.json -o /tmp/tune && xdg-open /tmp/tune/report.html\n"
)


def register(app: typer.Typer) -> None:
    app.command("report", help=_HELP,
                short_help="Re-render a compare or tune report from its JSON.", no_args_is_help=True)(report)


def report(
    report_json: Path = typer.Argument(..., metavar="REPORT.json", help="A calibkit-compare/1 or calibkit-tune/1 "
                                       "JSON document."),
    out_dir: Path = typer.Option(None, "--out", "-o", metavar="DIR", help="Report folder to write. Default: the "
                                 "folder of REPORT.json when it is named report.json, else <name>-report/ beside "
                                 "it."),
    force: bool = FORCE,
) -> None:
    with handle_errors():
        from calibkit.report.render import REPORT_NAMES, default_out_dir, render_report
        from calibkit.results.codec import load_document

        target = out_dir if out_dir is not None else default_out_dir(report_json)
        # REPORT.json may lie inside the folder it re-renders (in place): it is read before the swap
        in_place = (target / "report.json").absolute().resolve() == report_json.absolute().resolve()
        guard_out_dir(target, inputs=[] if in_place else [report_json], force=force, legacy_names=REPORT_NAMES)
        doc = load_document(report_json)
        with RichProgress() as progress:
            paths = render_report(doc, target, progress=progress, source=report_json)
        say(f"wrote {paths.html}")
        say(f"      {paths.markdown}  ({len(paths.plots)} plots in {paths.html.parent / 'plots'})")
