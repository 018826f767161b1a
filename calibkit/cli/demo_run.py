"""`calibkit demo run` (being written)."""

from __future__ import annotations

import typer


def register(demo_app: typer.Typer) -> None:
    return None
