"""Render a compare or tune document to report.json, report.md, report.html and plots/*.png, atomically."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibkit._io import atomic_dir, write_bytes, write_json, write_text
from calibkit.errors import UsageError
from calibkit.outdirs import MARKER
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.report.content import build_document
from calibkit.report.html import render_html
from calibkit.report.markdown import render_markdown
from calibkit.report.plots import make_plots
from calibkit.results.codec import FORMATS, parse_result, to_document
from calibkit.results.runs import Result

log = logging.getLogger("calibkit.report")

JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"
HTML_NAME = "report.html"
PLOT_DIR = "plots"
_OWN = {JSON_NAME, MARKDOWN_NAME, HTML_NAME, PLOT_DIR, MARKER}
# what a report folder holds: replaceable without a marker listing its files (older reports)
REPORT_NAMES = frozenset({*_OWN, f"{PLOT_DIR}/*.png"})
_TASK = "render report"


@dataclass(frozen=True)
class ReportPaths:
    json: Path
    markdown: Path
    html: Path
    plots: tuple[Path, ...]


def render_report(doc: dict[str, Any] | Result, out_dir: Path, *, progress: ProgressCallback | None = None,
                  source: Path | None = None) -> ReportPaths:
    """Write ``doc`` (a typed result, or a calibkit-compare/1 or calibkit-tune/1 document) as a report folder
    ``out_dir``.

    A document is read leniently (``results.codec.parse_result(strict=False)``: hand-edited and older documents
    render, missing values as "—") and written to report.json as it is; ``source`` names its file in errors.
    The folder is built under a temporary name and swapped in whole, so a failed render leaves the previous
    report intact. ``out_dir`` is replaced as a unit: it must not exist, or hold only a previous report.
    Raises :class:`DataError` for a document that is not a report, :class:`UsageError` for an unusable folder.
    """
    out_dir = Path(out_dir).absolute()
    _check_out_dir(out_dir)
    if isinstance(doc, dict):
        report = parse_result(doc, strict=False, source=source)
    elif type(doc) in FORMATS:
        report, doc = doc, to_document(doc)
    else:
        report = parse_result(doc)  # refuses it, saying what it is
    cb = progress or no_progress
    total = 4
    cb(ProgressEvent(_TASK, 0, total, "reading"))
    plots = make_plots(report)
    cb(ProgressEvent(_TASK, 1, total, f"{len(plots)} plots"))
    document = build_document(report, plots)
    markdown = render_markdown(document, plots, plot_dir=PLOT_DIR)
    cb(ProgressEvent(_TASK, 2, total, "markdown"))
    html = render_html(document, plots)
    cb(ProgressEvent(_TASK, 3, total, "html"))
    with atomic_dir(out_dir, what="report", legacy_names=REPORT_NAMES) as tmp:
        write_json(tmp / JSON_NAME, doc)
        write_text(tmp / MARKDOWN_NAME, markdown)
        write_text(tmp / HTML_NAME, html)
        for plot in plots:
            write_bytes(tmp / PLOT_DIR / f"{plot.name}.png", plot.png)
    cb(ProgressEvent(_TASK, 4, total, "written"))
    log.info("report written to %s (%d plots)", out_dir, len(plots))
    return ReportPaths(
        json=out_dir / JSON_NAME,
        markdown=out_dir / MARKDOWN_NAME,
        html=out_dir / HTML_NAME,
        plots=tuple(out_dir / PLOT_DIR / f"{p.name}.png" for p in plots),
    )


def _check_out_dir(out_dir: Path) -> None:
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"{out_dir} exists and is not a folder", hint="pass a new folder for the report")
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in _OWN)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" …" if len(foreign) > 5 else "")
        raise UsageError(
            f"{out_dir} holds files that are not part of a report ({shown}); a report replaces its whole folder",
            hint="pass a new or empty folder, e.g. reports/<run>",
        )


def default_out_dir(json_path: Path) -> Path:
    """Where `calibkit report X.json` writes: beside a report.json, in place; otherwise a folder named after X."""
    json_path = Path(json_path)
    if json_path.name == JSON_NAME:
        return json_path.parent
    return json_path.with_name(f"{json_path.stem}-report")
