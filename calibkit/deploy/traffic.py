"""The traffic a deployment will serve: request texts from a log, and their token lengths.

The log is read through ``calibkit sample``'s own code path (:func:`calibkit.data.sample_pipeline.clean_log`:
the same text-field auto-detection and dotted ``--text-field`` paths, broken lines counted by kind, oversized
texts cut), and each text goes through the same cleanup (``<script>``/``<style>`` blocks removed, personal
data redacted unless ``redact=False``: the texts end up in the perf_analyzer file). Unlike sampling, duplicates
are kept: a hot query is real load. Past ``max_texts`` usable lines a seeded reservoir keeps a uniform sample,
so memory stays bounded on any log.

Default log: the one the calibration set was drawn from (``source.path`` in its ``manifest.json``), when it
is still there with the bytes it had (its size, and its sha256 checked in the pass that reads it).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calibkit.errors import DataError, UsageError
from calibkit.results.documents import TrafficRecord
from calibkit.types import PathLike

DEFAULT_MAX_TEXTS = 50_000


@dataclass(frozen=True)
class Traffic:
    path: Path
    texts: tuple[str, ...]  # in log order (a uniform sample of them past max_texts)
    lines: int
    usable: int  # usable lines in the whole log
    broken: dict[str, int]
    text_fields: tuple[str, ...]
    sampled: bool
    redacted: bool

    def record(self, *, origin: str) -> TrafficRecord:
        """deploy.json's record of the traffic; ``origin``: where its path came from (see TrafficRecord)."""
        return TrafficRecord(path=os.path.abspath(self.path), lines=self.lines, usable=self.usable,
                             texts=len(self.texts), sampled=self.sampled, redacted=self.redacted, origin=origin,
                             broken=dict(self.broken), text_fields=self.text_fields)


def read_traffic(path: PathLike, *, text_field: str | None = None, strict: bool = False, redact: bool = True,
                 max_texts: int = DEFAULT_MAX_TEXTS, seed: int = 0, expected_sha256: str | None = None) -> Traffic:
    """The traffic of a log; ``expected_sha256``: the bytes the log must have (a DataError naming it if not)."""
    from calibkit.data.logs import ReadStats, detect_text_fields, parse_field_paths
    from calibkit.data.sample_pipeline import CleanupTally, clean_log

    p = Path(path)
    if not p.is_file():
        raise DataError(f"traffic log not found: {p}", hint="pass --traffic with a JSON Lines log (.jsonl, .jsonl.gz)")
    if max_texts < 1:
        raise UsageError(f"--max-texts must be at least 1 (got {max_texts})")
    if p.stat().st_size == 0:
        raise DataError(f"traffic log {p} is empty", hint="pass --traffic with a log that holds requests")
    fields = parse_field_paths(text_field) if text_field else detect_text_fields(p)
    stats = ReadStats()
    rng = random.Random(seed)
    kept: list[tuple[int, str]] = []
    seen = 0
    # sample's own cleanup path, without dedup: duplicates are kept (a hot query is real load) and memory stays
    # bounded by the reservoir
    for c in clean_log(p, fields, strict=strict, redact_pii=redact, stats=stats, dedup=None, tally=CleanupTally()):
        if c.emptied:
            continue
        seen += 1
        if len(kept) < max_texts:
            kept.append((c.record.line_no, c.text))
        else:
            j = rng.randrange(seen)
            if j < max_texts:
                kept[j] = (c.record.line_no, c.text)
    if not kept:
        kinds = ", ".join(f"{k} {v}" for k, v in stats.broken.items() if v) or "none"
        raise DataError(f"traffic log {p} has no usable text in {stats.lines:,} lines (broken lines by kind: {kinds}; "
                        f"text field: {', '.join(fields)})",
                        hint="check --text-field (a dotted path such as request.text) and that lines are JSON objects")
    if expected_sha256 and stats.sha256 and stats.sha256 != expected_sha256:
        raise DataError(f"the log {p} changed since calibkit recorded it (when the calibration set was drawn from "
                        f"it, or tune judged on it): sha256 {stats.sha256[:12]}…, then {expected_sha256[:12]}…",
                        hint="pass --traffic LOG.jsonl (the requests the model will serve) to use it as it is now")
    kept.sort()
    return Traffic(path=p, texts=tuple(t for _, t in kept), lines=stats.lines, usable=seen,
                   broken={k: v for k, v in stats.broken.items() if v}, text_fields=tuple(fields),
                   sampled=seen > max_texts, redacted=redact)


@dataclass(frozen=True)
class SourceLog:
    """The log a calibration set's manifest names: where it is now, and its size and sha256 then."""

    path: Path
    size_bytes: int | None
    sha256: str | None


def log_of_calibration_set(cset: Path) -> SourceLog | None:
    """The log a calibration set was drawn from, when its manifest names one (read by
    :func:`calibkit.provenance.document_path`: a relative path against the manifest's folder)."""
    from calibkit.data.calibset import MANIFEST, manifest_log, read_manifest

    log = manifest_log(read_manifest(cset), cset / MANIFEST)
    return None if log is None else SourceLog(log.path, log.size_bytes, log.sha256)


def find_calibration_set(set_id: str, roots: Sequence[Path]) -> Path | None:
    """A calibration-set folder under ``roots`` whose manifest records ``texts_sha256 == set_id`` (a folder
    whose manifest cannot be read is not it: its set is not known)."""
    from calibkit.data.calibset import read_manifest
    from calibkit.errors import DataError

    if not set_id:
        return None
    for root in roots:
        if not root.is_dir():
            continue
        for manifest in sorted(root.glob("*/manifest.json")):
            try:
                doc = read_manifest(manifest.parent)
            except DataError:
                continue
            if doc is not None and doc.texts_sha256 == set_id:
                return manifest.parent
    return None


def default_traffic_log(calibration_set: Path | None, source: Path) -> SourceLog:
    """The calibration set's log, or a UsageError saying why there is none and what to pass. Its sha256 is
    checked by :func:`read_traffic` (``expected_sha256``) in the pass that reads it."""
    hint = "pass --traffic LOG.jsonl (the requests the model will serve; the format `calibkit sample` reads)"
    if calibration_set is None:
        raise UsageError(f"no --traffic given, and the calibration set behind {source} is not known or not found",
                         hint=hint)
    log = log_of_calibration_set(calibration_set)
    if log is None:
        raise UsageError(f"no --traffic given, and the calibration set {calibration_set} names no source log",
                         hint=hint)
    if not log.path.is_file():
        raise UsageError(f"no --traffic given, and the log {log.path} named by {calibration_set}/manifest.json no "
                         "longer exists", hint=hint)
    if log.size_bytes is not None and log.path.stat().st_size != log.size_bytes:
        raise UsageError(f"no --traffic given, and the log {log.path} named by {calibration_set}/manifest.json "
                         f"changed since the set was drawn ({log.path.stat().st_size:,} bytes, then "
                         f"{log.size_bytes:,})", hint=hint)
    return log
