"""Self-contained HTML writer: inline CSS, plots embedded as base64 PNG, no external resources, no script."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from calibkit.report.blocks import Block, Bullets, Details, Document, Figure, Heading, Para, Table
from calibkit.report.formatting import esc_html
from calibkit.report.plots import Plot

_CSS = """
:root { color-scheme: light; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: #1d2329; background: #fff; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 1.7em; margin: 0 0 4px; }
h2 { font-size: 1.25em; margin: 2em 0 .6em; padding-bottom: 4px; border-bottom: 1px solid #dde3e9; }
.subtitle { color: #5f6b77; margin: 0 0 1.2em; }
code { font: .9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f2f4f7;
       padding: 1px 4px; border-radius: 3px; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; margin: .6em 0 1em; }
table { border-collapse: collapse; font-size: .86em; }
th, td { padding: 4px 9px; border-bottom: 1px solid #e6eaee; text-align: left; vertical-align: top; }
th { background: #f5f7f9; position: sticky; top: 0; font-weight: 600; white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.hl td { background: #fff4e5; }
tr.hl td:first-child { box-shadow: inset 3px 0 0 #e67e22; }
td { overflow-wrap: anywhere; max-width: 34em; }
.note { color: #5f6b77; font-size: .88em; margin-top: -.4em; }
figure { margin: 1.2em 0 1.8em; }
figure img { max-width: 100%; height: auto; border: 1px solid #e6eaee; border-radius: 4px; }
figcaption { color: #5f6b77; font-size: .9em; margin-top: 4px; }
figcaption b { color: #1d2329; }
details { margin: 1em 0; }
summary { cursor: pointer; font-weight: 600; }
"""


def render_html(document: Document, plots: Sequence[Plot]) -> str:
    by_name = {p.name: p for p in plots}
    body = "\n".join(_block(b, by_name) for b in document.blocks)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{esc_html(document.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
        f"<h1>{esc_html(document.title)}</h1>\n<p class=\"subtitle\">{esc_html(document.subtitle)}</p>\n"
        f"{body}\n</main>\n</body>\n</html>\n"
    )


def _spans(para: Para) -> str:
    out = []
    for span in para.spans:
        s = esc_html(span.text)
        if span.code:
            s = f"<code>{s}</code>"
        if span.bold:
            s = f"<b>{s}</b>"
        out.append(s)
    return "".join(out)


def _block(block: Block, plots: dict[str, Plot]) -> str:
    if isinstance(block, Heading):
        level = min(max(block.level, 1), 6)
        return f"<h{level}>{esc_html(block.text)}</h{level}>"
    if isinstance(block, Para):
        return f"<p>{_spans(block)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_spans(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        plot = plots.get(block.plot)
        if plot is None:
            return ""
        data = base64.b64encode(plot.png).decode("ascii")
        return (f"<figure><img alt=\"{esc_html(plot.alt)}\" src=\"data:image/png;base64,{data}\">"
                f"<figcaption><b>{esc_html(plot.title)}.</b> {esc_html(plot.caption)}</figcaption></figure>")
    if isinstance(block, Details):
        inner = "\n".join(_block(b, plots) for b in block.blocks)
        return f"<details><summary>{esc_html(block.summary)}</summary>\n{inner}\n</details>"
    return ""


def _table(table: Table) -> str:
    def cls(i: int) -> str:
        return ' class="n"' if i < len(table.numeric) and table.numeric[i] else ""

    head = "".join(f"<th{cls(i)}>{esc_html(h)}</th>" for i, h in enumerate(table.headers))
    rows = []
    for r, cells in enumerate(table.rows):
        hl = ' class="hl"' if r < len(table.highlight) and table.highlight[r] else ""
        rows.append(f"<tr{hl}>" + "".join(f"<td{cls(i)}>{esc_html(c)}</td>" for i, c in enumerate(cells)) + "</tr>")
    note = f"\n<p class=\"note\">{esc_html(table.note)}</p>" if table.note else ""
    return (f"<div class=\"scroll\"><table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(rows)
            + f"\n</tbody></table></div>{note}")
