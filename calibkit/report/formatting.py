"""Numbers and names as they appear in reports: one place, so Markdown and HTML agree. Missing values are "—"."""

from __future__ import annotations

import html
import re

DASH = "—"


def num(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return DASH
    if isinstance(value, int):
        return str(value)
    if value != 0 and (abs(value) >= 1e12 or abs(value) < 10 ** -digits):
        return f"{value:.{digits}g}"
    if abs(value) >= 1e5:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def pct(value: float | None, digits: int = 2) -> str:
    """A fraction in [0, 1] as a percentage; anything else is shown as it is (it may already be a percentage)."""
    if value is None:
        return DASH
    if -1.0 <= value <= 1.0:
        return f"{100.0 * value:.{digits}f} %"
    return f"{value:.{digits}f}"


def fraction_pct(value: float | None) -> str:
    """A fraction as a percentage with two decimals; None and NaN as a dash."""
    return DASH if value is None or value != value else f"{100 * value:.2f} %"


def interval_text(d: dict | None, signed: bool = False) -> str:
    """A JSON interval ``{"low": .., "high": ..}`` (fractions) as " [low, high]" in percent ("" when absent)."""
    if not d or d.get("low") is None:
        return ""
    if signed:
        return f" [{100 * d['low']:+.2f}, {100 * d['high']:+.2f}]"
    return f" [{100 * d['low']:.2f}, {100 * d['high']:.2f}]"


def points(value: float | None, digits: int = 2) -> str:
    """A signed accuracy difference (fractions) in percentage points."""
    if value is None:
        return DASH
    return f"{100.0 * value:+.{digits}f} pt"


def text(value: object) -> str:
    return DASH if value is None or value == "" else str(value)


def shorten(value: str, width: int) -> str:
    return value if len(value) <= width else value[: width // 2 - 1] + "…" + value[-(width - width // 2):]


# Characters a terminal or a viewer acts on instead of showing: C0 controls but tab and newline (ESC starts the
# ANSI sequences that recolour, move the cursor or retitle a terminal; CR overwrites a line), DEL, C1 controls
# (0x9b is a one-byte CSI) and the bidirectional overrides and isolates that reorder what is shown.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible_controls(value: str) -> str:
    """``value`` with every control character shown as an escape (``\\x1b``, ``\\u202e``) instead of acting
    on the terminal or the page: node names, paths and texts come from files anyone may have written."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                         else f"\\u{ord(m.group()):04x}", value)


def esc_html(value: object) -> str:
    return html.escape(visible_controls(text(value)), quote=True)


# Only what can start markup inside a line of a table cell or paragraph ("(" matters only after "]", which is
# escaped; "#", "+" and "-" only at the start of a line, which a cell never is).
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~$])")
_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


def esc_md(value: object) -> str:
    """Text that is safe inside a Markdown table cell: markup characters escaped, newlines folded to spaces,
    control characters shown as escapes (:func:`visible_controls`)."""
    s = visible_controls(_NEWLINES.sub(" ", text(value)))
    return _MD_SPECIAL.sub(r"\\\1", s)
