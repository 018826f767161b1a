"""``calibration.json``: the calibration table plus everything needed to trust and reproduce it.

Other commands (build, compare, tune, deploy) read it with :func:`load_calibration_json`.

The document travels with its folder: the paths it names (``source_model``, ``tokenizer``,
``calibration_set.path``) are recorded relative to its own folder when they are near it (absolute otherwise),
and every file it names is recorded by sha256 (``sha256``: the source model, the tokenizer and label names, the
files written beside it). :meth:`CalibrationFile.check_named_files` checks them when they are used, so a moved or
copied folder works or is refused by name, never served with another folder's model or tokenizer. Documents
written before this rule name paths relative to the folder their run ran in; they are read as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibkit._io import read_json, record_path, write_json
from calibkit.errors import CalibrationError, ModelError
from calibkit.provenance import PATHS_KEY, PATHS_RELATIVE, document_relative, recorded_paths
from calibkit.quantize.rangecheck import check_ranges
from calibkit.types import CalibrationTable

CALIBRATION_FORMAT = "calibkit-calibration/1"


@dataclass(frozen=True)
class CalibrationFile:
    """A parsed calibration.json. ``tensors`` maps tensor -> its statistics summary (amax, scale, min, max,
    p99_99, nan/posinf/neginf counts, count); ``raw`` is the whole document, its path fields made absolute.
    ``source_model``, ``tokenizer`` and ``calibration_set``: the paths it names, resolved (None: not recorded)."""

    path: Path
    table: CalibrationTable
    target: str
    op_types: tuple[str, ...]
    exclude: tuple[str, ...]
    quantized_nodes: tuple[str, ...]
    kept_nodes: tuple[str, ...]
    tensors: dict[str, dict[str, Any]]
    files: dict[str, str]
    raw: dict[str, Any]
    source_model: Path | None
    tokenizer: Path | None
    calibration_set: Path | None
    sha256: dict[str, Any]

    def file(self, key: str) -> Path | None:
        """Absolute path of a file written beside calibration.json (``model``, ``cache``, ``stats``)."""
        name = self.files.get(key)
        return (self.path.parent / name) if name else None

    def check_named_files(self, *, files: tuple[str, ...] = ("model",)) -> None:
        """Refuse, naming the file, a source model, tokenizer (files or label names) or file beside the
        document (``files``: keys of ``files``) whose bytes are not the ones recorded when the document was
        written: a folder moved next to another model, or a file swapped in since."""
        from calibkit.consistency import check_file, labels_sha256, tokenizer_sha256

        again = "re-run the command that wrote this folder (`calibkit calibrate` or `calibkit tune`)"
        if self.source_model is not None and self.source_model.is_file():
            check_file(self.source_model, self.sha256.get("source_model") or self.table.model_sha256,
                       what=f"the source model named by {self.path}",
                       hint=f"restore the model it was calibrated on, or {again}")
        if self.tokenizer is not None and self.tokenizer.exists():
            for key, now in (("tokenizer", tokenizer_sha256), ("labels", labels_sha256)):
                want = self.sha256.get(key)
                if isinstance(want, str) and now(self.tokenizer) != want:
                    what = "tokenizer files" if key == "tokenizer" else "label names (config.json id2label)"
                    raise ModelError(f"the {what} of {self.tokenizer}, named by {self.path}, are not the ones it "
                                     "was written with", hint=f"restore that tokenizer folder, or {again}")
        recorded = self.sha256.get("files") if isinstance(self.sha256.get("files"), dict) else {}
        for key in files:
            f = self.file(key)
            if f is not None and f.is_file():
                check_file(f, recorded.get(key), what=f"{key} named by {self.path}",
                           hint=f"restore the file calibkit wrote, or {again}")


_PATH_FIELDS = ("source_model", "tokenizer")


def write_calibration_json(path: str | os.PathLike[str], table: CalibrationTable, extras: dict[str, Any]) -> Path:
    """Write calibration.json: the paths of ``extras`` recorded relative to the document's folder (where it will
    be once its folder is swapped in) and every named file recorded by sha256 (see the module docstring)."""
    from calibkit.consistency import file_sha256, labels_sha256, tokenizer_sha256

    doc = {**extras, "format": CALIBRATION_FORMAT, "table": table.to_dict(), PATHS_KEY: PATHS_RELATIVE}
    digests: dict[str, Any] = {}
    for key in _PATH_FIELDS:
        if isinstance(doc.get(key), (str, os.PathLike)) and str(doc[key]):
            named = Path(doc[key])
            if key == "source_model" and named.is_file():
                digests[key] = file_sha256(named)
            elif key == "tokenizer" and named.exists():
                digests["tokenizer"] = tokenizer_sha256(named)
                digests["labels"] = labels_sha256(named)
            doc[key] = record_path(path, named)
    cs = doc.get("calibration_set")
    if isinstance(cs, dict) and isinstance(cs.get("path"), str) and cs["path"]:
        doc["calibration_set"] = {**cs, "path": record_path(path, cs["path"])}
    files = doc.get("files")
    if isinstance(files, dict):
        beside = {k: Path(path).parent / v for k, v in files.items() if isinstance(v, str)}
        digests["files"] = {k: file_sha256(f) for k, f in beside.items() if f.is_file()}
    doc["sha256"] = digests
    write_json(path, doc)
    return Path(path)


def _resolve_paths(p: Path, doc: dict[str, Any]) -> dict[str, Path | None]:
    """The paths the document names, absolute: relative to its folder (documents with ``paths``), else as
    written before that rule (relative to the folder the command runs in)."""
    rel = document_relative(doc)
    out: dict[str, Path | None] = {}
    cs = doc.get("calibration_set")
    for key, value in (*((k, doc.get(k)) for k in _PATH_FIELDS),
                       ("calibration_set", cs.get("path") if isinstance(cs, dict) else None)):
        if not isinstance(value, str) or not value:
            out[key] = None
        elif rel:
            out[key] = recorded_paths(p, value, doc_relative=True)[0]
        else:
            out[key] = Path(os.path.abspath(value))
    return out


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
    paths = _resolve_paths(p, doc)
    raw = {**doc, **{k: str(v) for k, v in paths.items() if k in _PATH_FIELDS and v is not None}}
    if paths["calibration_set"] is not None:
        raw["calibration_set"] = {**doc["calibration_set"], "path": str(paths["calibration_set"])}
    sha = doc.get("sha256")
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
        raw=raw,
        source_model=paths["source_model"],
        tokenizer=paths["tokenizer"],
        calibration_set=paths["calibration_set"],
        sha256=dict(sha) if isinstance(sha, dict) else {},
    )
