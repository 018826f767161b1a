"""A tiny document model shared by the Markdown and HTML writers: content is decided once, in content.py.

Every string in a block is plain, unescaped text; each writer escapes it for its own format.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    text: str
    bold: bool = False
    code: bool = False


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    spans: tuple[Span, ...]

    @staticmethod
    def of(*parts: str | Span) -> Para:
        return Para(tuple(p if isinstance(p, Span) else Span(p) for p in parts))


@dataclass(frozen=True)
class Bullets:
    items: tuple[Para, ...]


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...] = ()
    highlight: tuple[bool, ...] = ()  # per row: draw attention (a flagged layer, a rejected plan)
    note: str = ""


@dataclass(frozen=True)
class Figure:
    plot: str  # Plot.name


@dataclass(frozen=True)
class Details:
    """A long section the HTML folds away; Markdown shows it as a sub-heading."""

    summary: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)


Block = Heading | Para | Bullets | Table | Figure | Details


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    blocks: tuple[Block, ...]
