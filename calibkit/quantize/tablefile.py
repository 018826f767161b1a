"""``calibration.json``: the calibration table plus everything needed to trust and reproduce it.

Other commands (build, compare, tune) read it with :func:`load_calibration_json`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibkit._io import read_json, write_json
from calibkit.errors import CalibrationError
from calibkit.quantize.rangecheck import check_ranges
from calibkit.types import CalibrationTable

CALIBRATION_FORMAT = "calibkit-calibration/1"


@dataclass(frozen=True)
class CalibrationFile:
    """A parsed calibration.json. ``tensors`` maps tensor -> its statistics summary (amax, scale, min, max,
    p99_99, nan/posinf/neginf counts, count); ``raw`` is the whole document."""

    path: Path
    table: CalibrationTable
    target: str = "tensorrt"
    op_types: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    quantized_nodes: tuple[str, ...] = ()
    kept_nodes: tuple[str, ...] = ()
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def file(self, key: str) -> Path | None:
        """Absolute path of a file written beside calibration.json (``model``, ``cache``, ``stats``)."""
        name = self.files.get(key)
        return (self.path.parent / name) if name else None


def write_calibration_json(path: str | os.PathLike[str], table: CalibrationTable, extras: dict[str, Any]) -> Path:
    doc = {**extras, "format": CALIBRATION_FORMAT, "table": table.to_dict()}
    write_json(path, doc)
    return Path(path)


def load_calibration_json(path: str | os.PathLike[str]) -> CalibrationFile:
    p = Path(path)
    if p.is_dir():
        p = p / "calibration.json"
    if not p.is_file():
        raise CalibrationError(
            f"calibration file not found: {p}", hint="run `calibkit calibrate MODEL --calibration-set DIR` first"
        )
    try:
        doc = read_json(p)
        if doc.get("format") != CALIBRATION_FORMAT:
            raise CalibrationError(f"{p} is not a calibkit calibration file (format {doc.get('format')!r})")
        ranges = doc["table"]["ranges"]
        if not isinstance(ranges, list) or not all(isinstance(r, dict) for r in ranges):
            raise TypeError("table.ranges is not a list of objects")
        tensors = doc.get("tensors", {})
        if not isinstance(tensors, dict):
            raise TypeError("tensors is not an object")
        check_ranges(((str(r.get("tensor")), r.get("amax")) for r in ranges), source=str(p),
                     stats={k: v for k, v in tensors.items() if isinstance(v, dict)},
                     hint="re-run `calibkit calibrate` to write the ranges again (calibkit never writes these)")
        table = CalibrationTable.from_dict(doc["table"])
    except CalibrationError:
        raise
    except RecursionError:
        raise CalibrationError(f"cannot read calibration file {p}: JSON nested too deeply",
                               hint="re-run `calibkit calibrate` to write it again") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(
            f"cannot read calibration file {p}: {exc}", hint="re-run `calibkit calibrate` to write it again"
        ) from exc
    return CalibrationFile(
        path=p,
        table=table,
        target=str(doc.get("target", "tensorrt")),
        op_types=tuple(doc.get("op_types", ())),
        exclude=tuple(doc.get("exclude", ())),
        quantized_nodes=tuple(doc.get("quantized_nodes", ())),
        kept_nodes=tuple(doc.get("kept_nodes", ())),
        tensors=dict(doc.get("tensors", {})),
        files=dict(doc.get("files", {})),
        raw=doc,
    )
