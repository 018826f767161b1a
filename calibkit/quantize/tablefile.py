"""``calibration.json``: the calibration table plus everything needed to trust and reproduce it, a typed
:class:`calibkit.results.files.CalibrationDocument` written and read through :mod:`calibkit.results.codec`.

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
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from calibkit._io import read_json, record_path, write_json
from calibkit.errors import CalibrationError, DataError, ModelError
from calibkit.provenance import PATHS_RELATIVE, recorded_paths
from calibkit.quantize.rangecheck import check_extremes, check_ranges
from calibkit.results.codec import CALIBRATION_FORMAT, document_json, parse_document
from calibkit.results.files import CalibrationDocument, DocumentDigests, TensorRecord
from calibkit.types import CalibrationTable

__all__ = ["CALIBRATION_FORMAT", "CalibrationFile", "load_calibration_json", "write_calibration_json"]

_AGAIN = "re-run `calibkit calibrate` to write it again"


@dataclass(frozen=True)
class CalibrationFile:
    """A parsed calibration.json: ``document`` as written, its other fields read from it with their paths
    resolved. ``tensors`` maps tensor -> its range and statistics summary; ``raw`` is the whole JSON
    document, its path fields made absolute (for readers not yet on ``document``).
    ``source_model``, ``tokenizer`` and ``calibration_set``: the paths it names, resolved (None: not recorded)."""

    path: Path
    table: CalibrationTable
    target: str
    op_types: tuple[str, ...]
    exclude: tuple[str, ...]
    quantized_nodes: tuple[str, ...]
    kept_nodes: tuple[str, ...]
    tensors: Mapping[str, TensorRecord]
    files: Mapping[str, str]
    raw: dict[str, Any]
    source_model: Path | None
    tokenizer: Path | None
    calibration_set: Path | None
    sha256: DocumentDigests
    document: CalibrationDocument | None

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
            check_file(self.source_model, self.sha256.source_model or self.table.model_sha256,
                       what=f"the source model named by {self.path}",
                       hint=f"restore the model it was calibrated on, or {again}")
        if self.tokenizer is not None and self.tokenizer.exists():
            for want, now, what in ((self.sha256.tokenizer, tokenizer_sha256, "tokenizer files"),
                                    (self.sha256.labels, labels_sha256, "label names (config.json id2label)")):
                if want is not None and now(self.tokenizer) != want:
                    raise ModelError(f"the {what} of {self.tokenizer}, named by {self.path}, are not the ones it "
                                     "was written with", hint=f"restore that tokenizer folder, or {again}")
        recorded = self.sha256.files or {}
        for key in files:
            f = self.file(key)
            if f is not None and f.is_file():
                check_file(f, recorded.get(key), what=f"{key} named by {self.path}",
                           hint=f"restore the file calibkit wrote, or {again}")


def write_calibration_json(path: str | os.PathLike[str], document: CalibrationDocument | CalibrationTable,
                           extras: Mapping[str, Any] | None = None) -> Path:
    """Write calibration.json through the codec: its paths recorded relative to the document's folder (where it
    will be once its folder is swapped in) and every named file recorded by sha256 (see the module docstring).
    A table with ``extras`` (the document's other fields as JSON values) is read into a document first."""
    from calibkit.consistency import file_sha256, labels_sha256, tokenizer_sha256

    if isinstance(document, CalibrationTable):
        unknown = sorted(set(extras or {}) - {f.name for f in fields(CalibrationDocument)})
        if unknown:
            raise TypeError(f"calibration.json has no field {', '.join(unknown)}")
        document = parse_document(CalibrationDocument, {**(extras or {}), "format": CALIBRATION_FORMAT,
                                                        "table": document.to_dict()})
    digests: dict[str, Any] = {}
    source_model, tokenizer, cs = document.source_model, document.tokenizer, document.calibration_set
    if source_model:
        named = Path(source_model)
        if named.is_file():
            digests["source_model"] = file_sha256(named)
        source_model = record_path(path, named)
    if tokenizer:
        named = Path(tokenizer)
        if named.exists():
            digests["tokenizer"], digests["labels"] = tokenizer_sha256(named), labels_sha256(named)
        tokenizer = record_path(path, named)
    if cs is not None and cs.path:
        cs = replace(cs, path=record_path(path, cs.path))
    if document.files is not None:
        beside = {k: Path(path).parent / v for k, v in document.files.items()}
        digests["files"] = {k: file_sha256(f) for k, f in beside.items() if f.is_file()}
    written = replace(document, source_model=source_model, tokenizer=tokenizer, calibration_set=cs,
                      paths=PATHS_RELATIVE, sha256=DocumentDigests(**digests))
    write_json(path, document_json(written))
    return Path(path)


def _resolve(p: Path, document: CalibrationDocument, value: str | None) -> Path | None:
    """A path the document names, absolute: relative to its folder (documents with ``paths``), else as
    written before that rule (relative to the folder the command runs in)."""
    if not value:
        return None
    if document.paths == PATHS_RELATIVE:
        return recorded_paths(p, value, doc_relative=True)[0]
    return Path(os.path.abspath(value))


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
        if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
            fmt = doc.get("format") if isinstance(doc, dict) else None
            raise CalibrationError(f"{p} is not a calibkit calibration file (format {fmt!r})")
        ranges = doc["table"]["ranges"]
        if not isinstance(ranges, list) or not all(isinstance(r, dict) for r in ranges):
            raise TypeError("table.ranges is not a list of objects")
        tensors = doc.get("tensors", {})
        if not isinstance(tensors, dict):
            raise TypeError("tensors is not an object")
        check_ranges(((str(r.get("tensor")), r.get("amax")) for r in ranges), source=str(p),
                     stats={k: v for k, v in tensors.items() if isinstance(v, dict)},
                     hint="re-run `calibkit calibrate` to write the ranges again (calibkit never writes these)")
        document = parse_document(CalibrationDocument, doc)
        check_extremes(((r.tensor, r.amax, r.observed_min, r.observed_max) for r in document.table.ranges),
                       source=str(p), stats={k: v for k, v in tensors.items() if isinstance(v, dict)},
                       hint="re-run `calibkit calibrate` (or `calibkit tune`, for a table it wrote) to write the "
                            "ranges and their statistics again: calibkit writes both from one measurement, and an "
                            "edited extreme changes the onnxruntime layout's grid")
    except CalibrationError:
        raise
    except DataError as exc:
        raise CalibrationError(f"cannot read calibration file {p}: {exc.message}", hint=_AGAIN) from None
    except RecursionError:
        raise CalibrationError(f"cannot read calibration file {p}: JSON nested too deeply", hint=_AGAIN) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(f"cannot read calibration file {p}: {exc}", hint=_AGAIN) from exc
    source_model, tokenizer = _resolve(p, document, document.source_model), _resolve(p, document, document.tokenizer)
    cset = _resolve(p, document, document.calibration_set.path) if document.calibration_set is not None else None
    raw = {**doc, **{k: str(v) for k, v in (("source_model", source_model), ("tokenizer", tokenizer))
                     if v is not None}}
    if cset is not None:
        raw["calibration_set"] = {**doc["calibration_set"], "path": str(cset)}
    return CalibrationFile(
        path=p,
        table=document.table,
        target=document.target or "tensorrt",
        op_types=document.op_types or (),
        exclude=document.exclude or (),
        quantized_nodes=document.quantized_nodes or (),
        kept_nodes=document.kept_nodes or (),
        tensors=document.tensors or {},
        files=document.files or {},
        raw=raw,
        source_model=source_model,
        tokenizer=tokenizer,
        calibration_set=cset,
        sha256=document.sha256 or DocumentDigests(),
        document=document,
    )
