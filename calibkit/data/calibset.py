"""A calibration set on disk: ``DIR/texts.jsonl`` (one ``{"text": ..., "label"?: ...}`` a line) and
``DIR/manifest.json`` (how it was drawn and how representative it is)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibkit._io import atomic_dir, dumps_json, file_kind, read_json, sha256_bytes, text_lines
from calibkit.data.textcheck import decode_counted, has_lone_surrogate, is_usable
from calibkit.errors import DataError
from calibkit.provenance import document_path
from calibkit.types import PathLike

TEXTS = "texts.jsonl"
MANIFEST = "manifest.json"

log = logging.getLogger("calibkit.data")


@dataclass(frozen=True)
class CalibrationSet:
    path: Path
    texts: tuple[str, ...]
    labels: tuple[str | None, ...] | None
    manifest: dict[str, Any] = field(default_factory=dict)
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


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """``folder/manifest.json`` as a JSON object; None when it is missing, unreadable or no object."""
    try:
        doc = read_json(folder / MANIFEST)  # a FIFO or a device there is unreadable, never waited on
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def manifest_log(manifest: Mapping[str, Any] | None, manifest_path: Path) -> ManifestLog | None:
    """The one reading of the log a manifest (read from ``manifest_path``) names; None when it names none."""
    src = manifest.get("source") if isinstance(manifest, Mapping) else None
    if not isinstance(src, dict):
        return None
    path = document_path(manifest_path, src.get("path"), dict(manifest or {}))
    if path is None:
        return None
    size, sha = src.get("size_bytes"), src.get("sha256")
    tf = manifest.get("text_field") if manifest is not None else None
    paths = tf.get("paths") if isinstance(tf, dict) else None
    red = manifest.get("redaction") if manifest is not None else None
    return ManifestLog(path, size if isinstance(size, int) and not isinstance(size, bool) else None,
                       sha if isinstance(sha, str) and sha else None,
                       ",".join(str(p) for p in paths) if isinstance(paths, list) and paths else None,
                       bool(red.get("enabled", True)) if isinstance(red, dict) else True)

def _texts_bytes(texts: Sequence[str], labels: Sequence[str | None] | None) -> bytes:
    lines = []
    for i, t in enumerate(texts):
        rec: dict[str, Any] = {"text": t}
        if labels is not None and labels[i] is not None:
            rec["label"] = labels[i]
        lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=True))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def write_calibration_set(
    out_dir: str | Path,
    texts: Sequence[str],
    labels: Sequence[str | None] | None,
    manifest: dict[str, Any],
) -> CalibrationSet:
    """Write texts.jsonl and manifest.json together, atomically (the folder appears complete or not at all)."""
    data = _texts_bytes(texts, labels)
    set_id = sha256_bytes(data)
    full = {**manifest, "texts_sha256": set_id, "count": len(texts)}
    with atomic_dir(out_dir, what="calibration set", legacy_names=(TEXTS, MANIFEST)) as tmp:
        (tmp / TEXTS).write_bytes(data)
        (tmp / MANIFEST).write_text(dumps_json(full), encoding="utf-8")
    return CalibrationSet(Path(out_dir), tuple(texts), tuple(labels) if labels is not None else None, full, set_id)


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
    manifest: dict[str, Any] = {}
    mpath = (p if p.is_dir() else p.parent) / MANIFEST
    if p.is_dir() and mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8", errors="replace"))
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{mpath} is not valid JSON ({type(exc).__name__})",
                            hint="re-create the set with `calibkit sample`, or remove the broken manifest") from None
        if not isinstance(manifest, dict):
            raise DataError(f"{mpath} is not a JSON object", hint="re-create the set with `calibkit sample`")
        recorded = manifest.get("texts_sha256")
        if isinstance(recorded, str) and recorded != sha256_bytes(raw):
            log.warning(
                "%s was changed after %s was written (%d texts, the manifest describes %s): the manifest's "
                "coverage figures describe other texts; re-run `calibkit sample`, or delete %s to use the texts "
                "as they are", texts_path, MANIFEST, len(texts), manifest.get("count", "?"), mpath)
            manifest = {**manifest, "stale": True}
    has_labels = any(lab is not None for lab in labels)
    return CalibrationSet(p, tuple(texts), tuple(labels) if has_labels else None, manifest, sha256_bytes(raw))
