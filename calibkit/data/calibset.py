"""A calibration set on disk: ``DIR/texts.jsonl`` (one ``{"text": ..., "label"?: ...}`` a line) and
``DIR/manifest.json`` (how it was drawn and how representative it is)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from calibkit._io import atomic_dir, dumps_json, file_kind, read_json, sha256_bytes, text_lines
from calibkit.data.textcheck import decode_counted, has_lone_surrogate, is_usable
from calibkit.errors import DataError
from calibkit.provenance import PATHS_KEY, document_path
from calibkit.results.codec import document_json, parse_document
from calibkit.results.files import CalibrationSetManifest, SampleRecord
from calibkit.types import PathLike

TEXTS = "texts.jsonl"
MANIFEST = "manifest.json"

log = logging.getLogger("calibkit.data")


@dataclass(frozen=True)
class CalibrationSet:
    path: Path
    texts: tuple[str, ...]
    labels: tuple[str | None, ...] | None
    manifest: CalibrationSetManifest | None = None  # None: a bare .jsonl file, or a folder without manifest.json
    id: str = ""  # sha256 of texts.jsonl: identifies the set for statistics caching

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        # the texts themselves run to megabytes: a notebook cell or a log line shows what the set is instead
        labelled = "unlabelled" if self.labels is None else f"{sum(x is not None for x in self.labels)} labelled"
        return f"CalibrationSet({str(self.path)!r}, {len(self.texts)} texts, {labelled}, id={self.id[:12]})"


@dataclass(frozen=True)
class ManifestLog:
    """The log a calibration set's manifest names (``source``), with what ``sample`` read it with."""

    path: Path  # where it is now: a relative path read against the manifest's folder (provenance.document_path)
    size_bytes: int | None
    sha256: str | None
    text_field: str | None  # comma-separated paths, as --text-field takes them
    redact: bool


def read_manifest(folder: Path) -> CalibrationSetManifest | None:
    """``folder/manifest.json`` as its typed manifest; None when no regular file stands there (a FIFO or a
    device there is never read). One that is not readable JSON, not an object or holds a mistyped field raises
    a DataError naming the file (and the field); a missing field reads as absent (sets of earlier versions)."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    hint = "re-create the set with `calibkit sample`, or remove the broken manifest"
    try:
        doc = read_json(path)  # opened without blocking: what is there now may no longer be a regular file
    except (OSError, ValueError, RecursionError) as exc:
        raise DataError(f"{path} is not readable JSON ({type(exc).__name__})", hint=hint) from None
    try:
        return parse_document(CalibrationSetManifest, doc, source=path)
    except DataError as exc:  # the codec's hint names compare and tune documents: say what fixes a manifest
        raise DataError(exc.message, hint=hint) from None


def manifest_log(manifest: CalibrationSetManifest | None, manifest_path: Path) -> ManifestLog | None:
    """The one reading of the log a manifest (read from ``manifest_path``) names; None when it names none."""
    record = manifest.sample if manifest is not None else None
    if record is None:
        return None
    src = record.source
    path = document_path(manifest_path, src.path, {PATHS_KEY: record.paths})
    if path is None:
        return None
    return ManifestLog(path, src.size_bytes, src.sha256 or None, ",".join(record.text_field.paths) or None,
                       record.redaction.enabled)


def _texts_bytes(texts: Sequence[str], labels: Sequence[str | None] | None) -> bytes:
    lines = []
    for i, t in enumerate(texts):
        rec: dict[str, str] = {"text": t}
        label = labels[i] if labels is not None else None
        if label is not None:
            rec["label"] = label
        lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=True))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def write_calibration_set(
    out_dir: str | Path,
    texts: Sequence[str],
    labels: Sequence[str | None] | None,
    sample: SampleRecord | None = None,
) -> CalibrationSet:
    """Write texts.jsonl and manifest.json together, atomically (the folder appears complete or not at all).
    The manifest holds the texts' sha256 and count, and ``sample``: what ``calibkit sample`` recorded of how
    they were drawn (None: a set given as it is)."""
    data = _texts_bytes(texts, labels)
    set_id = sha256_bytes(data)
    manifest = CalibrationSetManifest(texts_sha256=set_id, count=len(texts), sample=sample)
    with atomic_dir(out_dir, what="calibration set", legacy_names=(TEXTS, MANIFEST)) as tmp:
        (tmp / TEXTS).write_bytes(data)
        (tmp / MANIFEST).write_text(dumps_json(document_json(manifest)), encoding="utf-8")
    return CalibrationSet(Path(out_dir), tuple(texts), tuple(labels) if labels is not None else None, manifest,
                          set_id)


def load_calibration_set(path: PathLike) -> CalibrationSet:
    """Read a calibration-set folder, or a bare .jsonl file of ``{"text": ...}`` records."""
    p = Path(path)
    texts_path = p / TEXTS if p.is_dir() else p
    if texts_path.exists() and not texts_path.is_file():
        raise DataError(f"calibration set {texts_path} is {file_kind(texts_path.stat().st_mode)}, not a file",
                        hint="pass a folder written by `calibkit sample`, or a .jsonl file of {\"text\": ...} records")
    if not texts_path.is_file():
        raise DataError(
            f"calibration set not found: {texts_path}",
            hint="create one with `calibkit sample LOGS.jsonl --out DIR`",
        )
    raw = texts_path.read_bytes()
    texts: list[str] = []
    labels: list[str | None] = []
    for n, line in enumerate(text_lines(decode_counted(raw, f"calibration set {texts_path}")), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{texts_path}:{n}: not valid JSON ({exc.msg})") from exc
        except RecursionError:
            raise DataError(f"{texts_path}:{n}: JSON nested too deeply to read") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f'{texts_path}:{n}: expected an object with a string "text" field')
        if has_lone_surrogate(rec["text"]):
            raise DataError(f"{texts_path}:{n}: the text holds a lone UTF-16 surrogate (e.g. \\udc00)",
                            hint="re-create the set with `calibkit sample`, which counts such lines as broken")
        if not is_usable(rec["text"]):  # as eval sets: a blank text calibrates on padding and special tokens only
            raise DataError(f"{texts_path}:{n}: the text is blank (only whitespace, control or zero-width "
                            "characters)", hint="remove the line, or re-create the set with `calibkit sample`, "
                                                "which counts such lines as broken")
        texts.append(rec["text"])
        lab = rec.get("label")
        labels.append(None if lab is None else str(lab))
    if not texts:
        raise DataError(f"calibration set {texts_path} holds no texts")
    manifest = read_manifest(p) if p.is_dir() else None
    if manifest is not None and manifest.texts_sha256 and manifest.texts_sha256 != sha256_bytes(raw):
        log.warning(
            "%s was changed after %s was written (%d texts, the manifest describes %s): the manifest's "
            "coverage figures describe other texts; re-run `calibkit sample`, or delete %s to use the texts "
            "as they are", texts_path, MANIFEST, len(texts), manifest.count, p / MANIFEST)
        manifest = replace(manifest, stale=True)
    has_labels = any(lab is not None for lab in labels)
    return CalibrationSet(p, tuple(texts), tuple(labels) if has_labels else None, manifest, sha256_bytes(raw))
