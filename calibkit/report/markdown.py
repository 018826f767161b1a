"""Markdown writer: GitHub-flavoured tables, plots referenced as files under plots/."""

from __future__ import annotations

from collections.abc import Sequence

from calibkit.report.blocks import Block, Bullets, Details, Document, Figure, Heading, Para, Table
from calibkit.report.formatting import esc_md
from calibkit.report.plots import Plot


def render_markdown(document: Document, plots: Sequence[Plot], plot_dir: str = "plots") -> str:
    by_name = {p.name: p for p in plots}
    lines = [f"# {esc_md(document.title)}", "", f"_{esc_md(document.subtitle)}_", ""]
    for block in document.blocks:
        lines += _block(block, by_name, plot_dir)
    return "\n".join(lines).rstrip() + "\n"


def _spans(para: Para) -> str:
    out = []
    for span in para.spans:
        # Code spans are written as escaped plain text: inside backticks the escapes would show.
        s = esc_md(span.text)
        out.append(f"**{s}**" if span.bold else s)
    return "".join(out)


def _block(block: Block, plots: dict[str, Plot], plot_dir: str) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * min(block.level, 6) + " " + esc_md(block.text), ""]
    if isinstance(block, Para):
        return [_spans(block), ""]
    if isinstance(block, Bullets):
        return [*("- " + _spans(item) for item in block.items), ""]
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        plot = plots.get(block.plot)
        if plot is None:
            return []
        return [f"![{esc_md(plot.alt)}]({plot_dir}/{plot.name}.png)", "", f"_{esc_md(plot.caption)}_", ""]
    if isinstance(block, Details):
        lines = [f"### {esc_md(block.summary)}", ""]
        for inner in block.blocks:
            lines += _block(inner, plots, plot_dir)
        return lines
    return []


def _table(table: Table) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(esc_md(c) for c in cells) + " |"

    align = [("---:" if table.numeric[i] else "---") if i < len(table.numeric) else "---"
             for i in range(len(table.headers))]
    lines = [row(table.headers), "| " + " | ".join(align) + " |"]
    for i, cells in enumerate(table.rows):
        if i < len(table.highlight) and table.highlight[i]:
            cells = (f"▶ {cells[0]}", *cells[1:])
        lines.append(row(cells))
    lines.append("")
    if table.note:
        lines += [f"_{esc_md(table.note)}_", ""]
    return lines
