"""Traffic as evidence: unlabeled production texts drawn from a log, for measuring fidelity to FP32.

Agreement with FP32 needs no labels, so the best evidence of what production will see is the log the
calibration set was sampled from. :func:`draw_traffic` reads a log through ``sample``'s own code path
(:func:`calibkit.data.sample_pipeline.clean_log`: the same reader, field options, broken-line counting,
``<script>`` stripping and personal-data redaction), then

- excludes every text that is in the calibration set, or among ``exclude_texts`` (the eval set's, so the
  traffic is independent of it), and counts how many by reason: while reading, by the normalised content
  digest ``sample`` dedups with (NFKC, case-folded, whitespace collapsed; a log text matches before or after
  redaction, so a set sampled with ``--no-redact`` is excluded as well); then, before the draw, by what the
  model sees (:func:`model_view_keys`: the token ids the model's tokenizer gives, truncated as the model reads
  them; without a tokenizer, a normalisation that also drops control and format characters such as zero-width
  spaces and soft hyphens, and accents), so a text that differs from a calibration text only where the
  tokenizer does not look is excluded too, and ``size`` texts are drawn when that many are left;
- keeps one text per normalised group (the population is the set of distinct texts, as in ``sample``);
- draws up to ``size`` texts stratified by token length with ``sample``'s strata code (the per-stratum
  priority pools of :mod:`calibkit.data.sampling`, the same length buckets, proportional allocation with at
  least one text per non-empty bucket), seeded: the same log, options and seed give the same texts in the
  same (canonical, seeded) order, whatever the order of the log's lines.

The result is a frozen :class:`TrafficEvidence` that records where its rows came from. :func:`split_traffic`
cuts it into a search part and a holdout part the way tune splits a labelled set (seeded, by content,
stratified — here by length bucket). :func:`default_traffic_log` finds the log named in a calibration set's
manifest, refusing one that is gone or changed.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import stat
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._io import shown_path
from calibkit.data.calibset import CalibrationSet, manifest_log
from calibkit.data.dedup import DedupIndex, digest, normalize
from calibkit.data.logs import BROKEN_KINDS, ReadStats, is_gzip
from calibkit.data.sample_pipeline import (
    CleanText,
    CleanupTally,
    candidate_lengths,
    clean_log,
    resolve_text_fields,
)
from calibkit.data.sampling import (
    Candidate,
    PriorityPool,
    allocate,
    bucket_names,
    estimate_tokens,
    length_bucket,
    priority,
)
from calibkit.errors import DataError
from calibkit.evidence.subsets import EvalSubset, stratified_split
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.provenance import MANIFEST_JSON
from calibkit.results.runs import Evidence, RowSelection

log = logging.getLogger("calibkit.evaluate.traffic")

DEFAULT_TRAFFIC_SIZE = 4000
_PROGRESS_EVERY = 5000
TRAFFIC_HINT = "pass the log to draw traffic texts from with --traffic LOG (JSON Lines, plain or .gz)"


@dataclass(frozen=True)
class TrafficOptions:
    """How traffic texts are drawn. ``text_field``/``strict``/``redact`` mean what they mean for ``sample``;
    ``tokenizer`` (tokenizer.json or a model folder): exact token lengths for the strata (else the word-piece
    estimate ``sample`` uses)."""

    size: int = DEFAULT_TRAFFIC_SIZE
    seed: int = 0
    text_field: str | None = None
    strict: bool = False
    redact: bool = True
    tokenizer: Path | None = None
    max_length: int | None = None


@dataclass(frozen=True)
class TrafficSource:
    """The log the rows came from: its path, SHA-256 and size as read, and the text field(s) used."""

    path: str
    sha256: str
    size_bytes: int
    gzip: bool
    text_fields: tuple[str, ...]
    text_field_auto_detected: bool

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size_bytes": self.size_bytes, "gzip": self.gzip,
                "text_fields": list(self.text_fields), "text_field_auto_detected": self.text_field_auto_detected}


@dataclass(frozen=True)
class TrafficStratum:
    """One token-length bucket: distinct texts of the log in it (``population``, estimated from the pool
    when lengths are measured exactly) and how many were drawn."""

    length_bucket: str
    population: float
    drawn: int


@dataclass(frozen=True)
class TrafficEvidence:
    """Unlabeled texts drawn from a log, with the record of where each row came from.

    Row ``i`` is ``texts[i]``; ``keys[i]`` is its normalised content digest (16 hex digits, ``sample``'s dedup
    key), ``line_numbers[i]`` the (1-based) log line it was first seen on, ``seen_counts[i]`` how often the log
    holds it, ``lengths[i]`` its token length (``length_measure``). ``excluded`` counts what was left out, by
    reason: ``calibration_set`` (distinct texts that are in the calibration set, or that the model reads as one
    of its texts), ``calibration_set_lines`` (the log lines holding the first kind), ``eval_set`` and
    ``eval_set_lines`` (the same for the eval set's texts, when they were excluded), ``duplicate_lines``
    (repeats of a text already seen), ``emptied_by_cleanup`` (texts that held only ``<script>``/``<style>``),
    ``broken_lines`` (unusable lines; by kind in ``lines``). ``population``: distinct usable texts outside the
    excluded sets (``size_drawn`` of them were drawn; an estimate where the model-view check took texts out of
    a full length stratum).
    ``part``: "all", or "search"/"holdout" for the parts :func:`split_traffic` makes.
    """

    source: TrafficSource
    texts: tuple[str, ...]
    keys: tuple[str, ...]
    line_numbers: tuple[int, ...]
    seen_counts: tuple[int, ...]
    lengths: tuple[int, ...]
    size_requested: int
    seed: int
    population: int
    excluded: dict[str, int] = field(default_factory=dict)
    calibration_set_id: str | None = None
    length_measure: str = "word-piece estimate"
    strata: tuple[TrafficStratum, ...] = ()
    redaction: dict[str, int] = field(default_factory=dict)
    lines: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    part: str = "all"

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def size_drawn(self) -> int:
        return len(self.texts)

    @property
    def content_sha256(self) -> str:
        """SHA-256 over the rows' keys in order: equal for the same rows drawn from any copy of the log."""
        return hashlib.sha256("\n".join(self.keys).encode()).hexdigest()

    def take(self, subset: EvalSubset, part: str) -> TrafficEvidence:
        """The rows of ``subset`` (indices into this evidence), as evidence of its own labelled ``part``."""
        idx = subset.indices

        def pick(values: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(values[i] for i in idx)

        return replace(self, texts=pick(self.texts), keys=pick(self.keys), line_numbers=pick(self.line_numbers),
                       seen_counts=pick(self.seen_counts), lengths=pick(self.lengths), part=part)

    def without(self, texts: Sequence[str], reason: str) -> TrafficEvidence:
        """These rows less those whose normalised text is one of ``texts`` (counted under ``excluded[reason]``):
        a text in both the eval set and the traffic could fall in the search split as one and in the holdout as
        the other."""
        drop = {digest(normalize(t)) for t in texts}
        keep = [i for i, t in enumerate(self.texts) if digest(normalize(t)) not in drop]
        if len(keep) == len(self.texts):
            return self

        def pick(values: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(values[i] for i in keep)

        gone = len(self.texts) - len(keep)
        return replace(self, texts=pick(self.texts), keys=pick(self.keys), line_numbers=pick(self.line_numbers),
                       seen_counts=pick(self.seen_counts), lengths=pick(self.lengths),
                       population=max(0, self.population - gone), excluded={**self.excluded, reason: gone})

    def to_dict(self, *, max_rows: int = 5000) -> dict[str, Any]:
        """Provenance for reports and ledgers (no texts; the row keys when there are at most ``max_rows``)."""
        d: dict[str, Any] = {
            "kind": "traffic", "part": self.part, "source": self.source.to_dict(),
            "size_requested": self.size_requested, "size_drawn": self.size_drawn, "seed": self.seed,
            "population": self.population, "excluded": dict(self.excluded),
            "calibration_set_id": self.calibration_set_id, "length_measure": self.length_measure,
            "strata": [{"length_bucket": s.length_bucket, "population": round(s.population, 1), "drawn": s.drawn}
                       for s in self.strata],
            "redaction": dict(self.redaction), "lines": dict(self.lines), "warnings": list(self.warnings),
            "content_sha256": self.content_sha256,
        }
        if self.size_drawn <= max_rows:
            d["keys"] = list(self.keys)
            d["line_numbers"] = list(self.line_numbers)
        return d


@dataclass(frozen=True)
class TrafficSplit:
    """tune's two parts of the traffic: ``search`` (candidates are judged on it) and ``holdout`` (the verdict
    on texts the search never saw). ``*_subset``: the same parts as indices into the whole evidence."""

    search: TrafficEvidence
    holdout: TrafficEvidence
    search_subset: EvalSubset
    holdout_subset: EvalSubset


@dataclass(frozen=True)
class DefaultTrafficLog:
    """The log a calibration set's manifest names, with what ``sample`` read it with."""

    path: Path
    sha256: str
    size_bytes: int | None
    text_field: str | None  # comma-separated paths, as --text-field takes them
    redact: bool


def key_hex(key: int) -> str:
    return f"{key:016x}"


def calibration_keys(calibration_set: CalibrationSet | Sequence[str]) -> set[int]:
    """Normalised digests of a calibration set's texts (``sample``'s dedup key)."""
    texts = calibration_set.texts if isinstance(calibration_set, CalibrationSet) else calibration_set
    return {digest(normalize(t)) for t in texts}


def default_traffic_log(calibration_set: CalibrationSet) -> DefaultTrafficLog:
    """The log named in ``calibration_set``'s manifest, when it is still there with the size it had; its
    SHA-256 is checked by :func:`draw_traffic` in the same pass that reads it (``expected_sha256``).

    Raises DataError (the hint says to pass --traffic) when the set has no manifest naming a log, or the log
    is gone or has another size."""
    where = f"calibration set {calibration_set.path}"
    folder = calibration_set.path if calibration_set.path.is_dir() else calibration_set.path.parent
    src = manifest_log(calibration_set.manifest, folder / MANIFEST_JSON)
    if src is None or src.sha256 is None:
        raise DataError(f"{where} names no source log in its manifest, so there is no default traffic",
                        hint=TRAFFIC_HINT)
    path, size = src.path, src.size_bytes
    if not path.is_file():
        raise DataError(f"the log {path} that {where} was sampled from is no longer there", hint=TRAFFIC_HINT)
    if size is not None and path.stat().st_size != size:
        raise DataError(f"the log {path} changed since {where} was sampled from it ({path.stat().st_size:,} bytes, "
                        f"then {size:,})", hint=TRAFFIC_HINT)
    return DefaultTrafficLog(path, src.sha256, size, src.text_field, src.redact)


def draw_default_traffic(calibration_set: CalibrationSet, options: TrafficOptions = TrafficOptions(),
                         progress: ProgressCallback | None = None, *,
                         exclude_texts: Sequence[str] = ()) -> TrafficEvidence:
    """:func:`draw_traffic` from the calibration set's own log (:func:`default_traffic_log`), with the text
    field and redaction ``sample`` used unless ``options`` names a text field."""
    d = default_traffic_log(calibration_set)
    opts = replace(options, text_field=options.text_field or d.text_field, redact=d.redact)
    return draw_traffic(d.path, opts, calibration_set=calibration_set, expected_sha256=d.sha256, progress=progress,
                        exclude_texts=exclude_texts)


def model_view(text: str) -> str:
    """The text as a tokenizer of the BERT family reads it, for matching when no tokenizer is at hand: control
    and format characters (zero-width space, soft hyphen, byte-order mark, ...) and accents dropped,
    case-folded, whitespace collapsed. Coarser than any one tokenizer (a cased model tells "Apple" from
    "apple"), so texts it matches may be told apart by the model, never the other way round."""
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(ch for ch in decomposed if ch.isspace() or unicodedata.category(ch)[0] not in "CM")
    return " ".join(unicodedata.normalize("NFKC", kept).casefold().split())


def model_view_keys(texts: Sequence[str], tokenizer: Path | None, max_length: int | None = None) -> list[int]:
    """One key per text, equal for texts the model cannot tell apart: the digest of the token ids the model's
    ``tokenizer`` gives (truncated to ``max_length`` as the model reads them), or without a tokenizer the digest
    of :func:`model_view`."""
    if tokenizer is None:
        return [digest(model_view(t)) for t in texts]
    from calibkit.data.tokenizer import TextTokenizer

    tok = TextTokenizer(tokenizer, max_length)
    keys: list[int] = []
    for i in range(0, len(texts), 1024):
        enc = tok.encode(texts[i : i + 1024])
        keys += [int.from_bytes(hashlib.blake2b(enc.input_ids[j, : enc.lengths[j]].tobytes(), digest_size=8)
                                .digest(), "big") for j in range(len(enc.lengths))]
    return keys


def check_traffic_log(path: Path) -> None:
    """DataError for a traffic log that is missing or not a regular file (a device such as /dev/null, a pipe):
    its size and SHA-256 are recorded and it is read more than once (text field detection, the draw)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(f"traffic log not found: {path}", hint=TRAFFIC_HINT + ", or --no-traffic") from None
    except OSError as exc:
        raise DataError(f"cannot read the traffic log {path}: {exc.strerror or exc}", hint=TRAFFIC_HINT) from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a character device" if stat.S_ISCHR(mode) else
                "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
        raise DataError(f"the traffic log {path} is {kind}, not a log file",
                        hint="pass a JSON Lines log file (plain or .gz) with --traffic, or --no-traffic for no "
                             "traffic evidence")


def draw_traffic(
    log_path: str | os.PathLike[str],
    options: TrafficOptions = TrafficOptions(),
    *,
    calibration_set: CalibrationSet | None = None,
    expected_sha256: str | None = None,
    progress: ProgressCallback | None = None,
    exclude_texts: Sequence[str] = (),
) -> TrafficEvidence:
    """Draw up to ``options.size`` distinct texts of the log that are neither in ``calibration_set`` nor among
    ``exclude_texts`` (the eval set's: counted as ``eval_set``), stratified by token length, seeded (see the
    module docstring). One streaming pass over the log; memory is bounded by the pools (``size`` candidates per
    length bucket, plus one per excluded text: room for those the model-view check takes out) and the dedup
    digests.

    ``expected_sha256``: the log must have this SHA-256 (checked on the pass that reads it): a changed log is
    refused with a hint to pass --traffic. Raises DataError when no usable text is left, saying when the log
    holds only eval-set texts (it is the eval set, not independent evidence)."""
    path = Path(log_path)
    cb = progress or no_progress
    if options.size < 1:
        raise DataError(f"--traffic-size must be at least 1 (got {options.size})")
    check_traffic_log(path)
    fields, auto = resolve_text_fields(path, options.text_field)
    cal_texts = tuple(calibration_set.texts) if calibration_set is not None else ()
    read = _read_log(path, fields, options, cal_texts, exclude_texts, cb)
    if expected_sha256 is not None and read.stats.sha256 != expected_sha256:
        raise DataError(f"the log {path} changed since the calibration set was sampled from it (SHA-256 "
                        f"{read.stats.sha256[:12]}…, then {expected_sha256[:12]}…)", hint=TRAFFIC_HINT)
    cands, weights, why, population = _pooled(read, path, fields, cal_texts, exclude_texts, options)
    lengths, measure, max_len = candidate_lengths(cands, options.tokenizer, options.max_length, cb,
                                                  "tokenizing traffic candidates")
    strata = _LengthStrata.drawn(cands, weights, lengths, options.size)
    chosen = strata.chosen
    warnings = _draw_warnings(int((lengths[chosen] > max_len).sum()) if chosen else 0, max_len, measure)
    if calibration_set is not None and not why["calibration_set"]:
        log.info("none of the %d calibration texts occurs in %s", len(calibration_set), path)
    stats, names = read.stats, bucket_names()
    ev = TrafficEvidence(
        source=TrafficSource(str(path), stats.sha256, read.file_size, is_gzip(path), tuple(fields), auto),
        texts=tuple(cands[i].text for i in chosen),
        keys=tuple(key_hex(cands[i].key) for i in chosen),
        line_numbers=tuple(int(cands[i].line_no) for i in chosen),
        seen_counts=tuple(int(read.dedup.counts[cands[i].key]) for i in chosen),
        lengths=tuple(int(lengths[i]) for i in chosen),
        size_requested=options.size,
        seed=options.seed,
        population=population,
        excluded=read.excluded_record(why, eval_set=bool(exclude_texts)),
        calibration_set_id=calibration_set.id if calibration_set is not None else None,
        length_measure=measure,
        strata=tuple(TrafficStratum(names[b], round(strata.population[b], 3), strata.allocated.get(b, 0))
                     for b in sorted(strata.members)),
        redaction={k: int(v) for k, v in sorted(read.tally.redactions.items())} if options.redact else {},
        lines={"read": stats.lines, "usable": stats.records,
               "broken": {k: stats.broken[k] for k in BROKEN_KINDS if stats.broken[k]},
               "gzip_truncated": stats.gzip_truncated},
    )
    short = shortfall_warning(ev)
    return replace(ev, warnings=(*([short] if short else []), *warnings))


@dataclass
class _LogPass:
    """The running record of :func:`draw_traffic`'s one pass over the log (mutable on purpose, like
    ReadStats): the pool of candidates per length bucket and what the calibration set and the eval set took
    out, by dedup group and by line."""

    pool: PriorityPool
    seed: int
    cal_keys: set[int]
    in_eval: set[int]
    file_size: int
    stats: ReadStats = field(default_factory=ReadStats)
    dedup: DedupIndex = field(default_factory=DedupIndex)
    tally: CleanupTally = field(default_factory=CleanupTally)
    excluded_groups: dict[int, str] = field(default_factory=dict)  # group key -> why: calibration_set | eval_set
    eval_groups: set[int] = field(default_factory=set)  # excluded groups in the eval set
    excluded_lines: dict[str, int] = field(default_factory=lambda: {"calibration_set": 0, "eval_set": 0})
    exclude: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.exclude = self.cal_keys | self.in_eval  # a text in both is counted as a calibration text

    def take(self, item: CleanText) -> None:
        """One cleaned line: excluded (counted, its group withdrawn from the pool), or offered to the pool when
        it is the first line of its dedup group."""
        seen = item.seen
        if seen is None:
            return
        hit = raw = None
        if self.exclude:
            raw = digest(normalize(item.raw_text)) if item.raw_text is not item.text else None
            hit = seen.key if seen.key in self.exclude else raw if raw in self.exclude else None
        if hit is not None:
            reason = "calibration_set" if hit in self.cal_keys else "eval_set"
            self.excluded_lines[reason] += 1
            if not seen.first and seen.key not in self.excluded_groups:
                # its group's first line was offered (its raw text is a calibration text, its redacted text came
                # first from another line): take it back, count and pooled member, so no drawn row shares a group
                # with the set and its length stratum is not counted one text too many
                self.pool.withdraw(seen.key, length_bucket(estimate_tokens(item.text)))
            self.excluded_groups.setdefault(seen.key, reason)
            if seen.key in self.in_eval or raw in self.in_eval:
                self.eval_groups.add(seen.key)
            return
        if not seen.first:
            return
        est = estimate_tokens(item.text)
        self.pool.offer(length_bucket(est), Candidate(priority(seen.key, self.seed), seen.key, item.text, None, est,
                                                      item.record.line_no))

    def excluded_record(self, why: dict[str, int], *, eval_set: bool) -> dict[str, int]:
        """TrafficEvidence.excluded: distinct texts and lines taken out, by reason (``eval_set``: an eval set
        was given), duplicates, lines cleanup emptied and broken lines."""
        lines = self.excluded_lines
        return {
            "calibration_set": why["calibration_set"],
            **({"eval_set": why["eval_set"]} if eval_set else {}),
            "calibration_set_lines": lines["calibration_set"],
            **({"eval_set_lines": lines["eval_set"]} if eval_set else {}),
            "duplicate_lines": self.dedup.duplicates - max(0, sum(lines.values()) - len(self.excluded_groups)),
            "emptied_by_cleanup": self.tally.emptied,
            "broken_lines": self.stats.broken_total,
        }


def _read_log(path: Path, fields: Sequence[str], options: TrafficOptions, cal_texts: Sequence[str],
              exclude_texts: Sequence[str], cb: ProgressCallback) -> _LogPass:
    """The one streaming pass over the log through ``sample``'s cleanup."""
    # a bucket never gets more than ``size`` texts; the extra room is for the texts the model-view check takes out
    read = _LogPass(PriorityPool(capacity=options.size + len(cal_texts) + len(exclude_texts)), options.seed,
                    calibration_keys(cal_texts), {digest(normalize(t)) for t in exclude_texts}, path.stat().st_size)
    stats, task = read.stats, "reading traffic log"
    cb(ProgressEvent(task, 0, read.file_size))
    for item in clean_log(path, fields, None, strict=options.strict, redact_pii=options.redact, stats=stats,
                          dedup=read.dedup, tally=read.tally):
        if stats.records % _PROGRESS_EVERY == 0:
            cb(ProgressEvent(task, stats.bytes_read, read.file_size, f"{stats.lines:,} lines"))
        read.take(item)
    cb(ProgressEvent(task, read.file_size, read.file_size, f"{stats.lines:,} lines"))
    return read


def _pooled(read: _LogPass, path: Path, fields: Sequence[str], cal_texts: Sequence[str],
            exclude_texts: Sequence[str], options: TrafficOptions
            ) -> tuple[list[Candidate], list[float], dict[str, int], int]:
    """The pool's candidates and weights less what the model cannot tell from a calibration or eval text (taken
    out before the draw), the distinct texts excluded for each reason, and the population left; DataError when
    nothing is left."""
    why = dict.fromkeys(("calibration_set", "eval_set"), 0)
    for reason in read.excluded_groups.values():
        why[reason] += 1
    cands, weights = read.pool.weighted_members()
    by_view: dict[str, tuple[int, float]] = {}
    if read.exclude and cands:
        cands, weights, by_view = _without_model_view_matches(cands, weights, cal_texts, exclude_texts, options)
        for reason in why:
            why[reason] += by_view.get(reason, (0, 0.0))[0]
    unique = read.dedup.unique
    population = unique - len(read.excluded_groups) - round(sum(by_view.get(r, (0, 0.0))[1] for r in why))
    if population <= 0 or not cands:
        is_eval_set = bool(exclude_texts) and len(read.eval_groups) + by_view.get("in_eval", (0, 0.0))[0] >= unique
        raise _nothing_left(path, unique, why, read.stats.lines, fields, is_eval_set)
    return cands, weights, why, population


@dataclass(frozen=True)
class _LengthStrata:
    """The candidates by token-length bucket: each bucket's population (pool weights), its members (lowest
    priority first), how many it was allotted and the candidates drawn (lowest priority first)."""

    population: dict[int, float]
    members: dict[int, list[int]]
    allocated: dict[int, int]
    chosen: list[int]

    @classmethod
    def drawn(cls, cands: Sequence[Candidate], weights: Sequence[float], lengths: np.ndarray,
              size: int) -> _LengthStrata:
        population: dict[int, float] = {}
        members: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            b = length_bucket(int(n))
            population[b] = population.get(b, 0.0) + weights[i]
            members.setdefault(b, []).append(i)
        for b in members:
            members[b].sort(key=lambda i: (cands[i].priority, cands[i].key))
        alloc = allocate(population, {b: len(v) for b, v in members.items()}, size, 1)
        chosen = sorted((i for b, n in alloc.items() for i in members[b][:n]),
                        key=lambda i: (cands[i].priority, cands[i].key))
        return cls(population, members, alloc, chosen)


def shortfall_warning(ev: TrafficEvidence, holdout_fraction: float | None = None) -> str | None:
    """What drawing fewer traffic texts than asked means, or None when ``ev`` holds as many as asked: asked and
    drawn, why (the log's lines, the broken and duplicate ones, the distinct texts the calibration set and the
    eval set took out) and what it costs: every interval judged on the traffic is about sqrt(asked / drawn)
    times as wide; with ``holdout_fraction`` (tune's --holdout), how many texts tune's holdout gets."""
    asked, drawn = ev.size_requested, len(ev)
    if drawn >= asked:
        return None
    x, lines = ev.excluded, ev.lines
    why = [f"{int(lines.get('read', 0)):,} lines"]
    for key, what in (("broken_lines", "broken"), ("emptied_by_cleanup", "emptied by cleanup"),
                      ("duplicate_lines", "duplicates of earlier lines")):
        if x.get(key):
            why.append(f"{x[key]:,} {what}")
    out = [f"{x[key]:,} distinct texts of the {what} excluded" for key, what in
           (("calibration_set", "calibration set"), ("eval_set", "eval set")) if x.get(key)]
    text = (f"drew {drawn:,} traffic texts of the {asked:,} asked for (--traffic-size): "
            f"{shown_path(ev.source.path)} holds "
            f"{', '.join(why)}{'; ' + ', '.join(out) if out else ''}; {ev.population:,} distinct texts were left. "
            f"Every interval judged on the traffic is about {math.sqrt(asked / max(drawn, 1)):.1f}x as wide as with "
            f"{asked:,} texts")
    if holdout_fraction is not None and holdout_fraction > 0:
        text += (f": tune's holdout (--holdout {holdout_fraction:g}) gets about {round(drawn * holdout_fraction):,} "
                 f"of them instead of {round(asked * holdout_fraction):,}, so the confirmation's lower bound is "
                 "that much further below the agreement measured")
    return text + "; pass a larger log, or a --traffic-size the log can fill"


def _draw_warnings(over: int, max_len: int, measure: str) -> list[str]:
    """What the draw should say besides a shortfall (:func:`shortfall_warning`): texts the model reads
    truncated."""
    warnings: list[str] = []
    if over:
        warnings.append(f"{over:,} drawn texts are longer than {max_len} tokens ({measure}): the model reads them "
                        "truncated")
    return warnings


def _without_model_view_matches(cands: list[Candidate], weights: list[float], cal_texts: Sequence[str],
                                 eval_texts: Sequence[str], options: TrafficOptions
                                 ) -> tuple[list[Candidate], list[float], dict[str, tuple[int, float]]]:
    """The pool's candidates less those whose :func:`model_view_keys` equals a calibration or eval text's, with
    how many went for each reason and the population they stood for (their pool weights); ``in_eval``
    counts those in the eval set, whether in the calibration set too or not."""
    view = model_view_keys([c.text for c in cands], options.tokenizer, options.max_length)
    cal = set(model_view_keys(list(cal_texts), options.tokenizer, options.max_length))
    ev = set(model_view_keys(list(eval_texts), options.tokenizer, options.max_length))
    keep: list[int] = []
    gone: dict[str, tuple[int, float]] = {}

    def count(reason: str, i: int) -> None:
        n, w = gone.get(reason, (0, 0.0))
        gone[reason] = (n + 1, w + weights[i])

    for i, k in enumerate(view):
        reason = "calibration_set" if k in cal else "eval_set" if k in ev else None
        if reason is None:
            keep.append(i)
            continue
        count(reason, i)
        if k in ev:
            count("in_eval", i)
    return [cands[i] for i in keep], [weights[i] for i in keep], gone


def _nothing_left(path: Path, unique: int, why: dict[str, int], lines: int, fields: Sequence[str],
                  is_eval_set: bool) -> DataError:
    if not unique:
        return DataError(f"{path}: no traffic texts to draw: no usable text in {lines:,} lines (text field: "
                         f"{', '.join(fields)})", hint="pass a log with requests in it (--traffic LOG), and check "
                         "--text-field")
    if is_eval_set:
        return DataError(f"{path}: every one of its {unique:,} distinct texts is in the eval set: it is the eval "
                         "set, not independent traffic evidence",
                         hint="pass a log of production requests with --traffic, or --no-traffic to judge on the "
                              "eval set alone")
    where = "the calibration set" + (" or the eval set" if why["eval_set"] else "")
    return DataError(f"{path}: no traffic texts to draw: all {unique:,} distinct texts are in {where} (or read "
                     "as one of them by the model)",
                     hint="pass a log with requests the calibration set does not hold (--traffic LOG), and check "
                          "--text-field")


def split_traffic(evidence: TrafficEvidence, holdout_fraction: float, seed: int = 0) -> TrafficSplit:
    """Search and holdout parts, as tune splits a labelled set (:func:`calibkit.evidence.subsets.stratified_split`:
    seeded, by row content, so the same texts split the same way in any order), stratified by length bucket
    instead of label."""
    strata = [length_bucket(n) for n in evidence.lengths]
    search, hold = stratified_split(evidence.keys, strata, holdout_fraction, seed)
    return TrafficSplit(evidence.take(search, "search"), evidence.take(hold, "holdout"), search, hold)


__all__: Sequence[str] = (
    "DEFAULT_TRAFFIC_SIZE", "TrafficOptions", "TrafficSource", "TrafficStratum", "TrafficEvidence", "TrafficSplit",
    "DefaultTrafficLog", "draw_traffic", "draw_default_traffic", "default_traffic_log", "split_traffic",
    "calibration_keys", "evidence_of",
)


def evidence_of(traffic: TrafficEvidence | None) -> Evidence | None:
    """Where the traffic rows came from, as result evidence: the log, its sha256, the rows drawn (content hash
    of their normalised texts) and what was excluded (calibration texts, duplicates, broken lines)."""
    if traffic is None:
        return None
    excluded = tuple(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(traffic.excluded.items()) if v)
    rows = RowSelection(len(traffic), traffic.population, traffic.seed, "stratified by token length",
                        traffic.content_sha256)
    return Evidence(str(traffic.source.path), len(traffic), (), rows, labelled=False,
                    exclusions=(f"log sha256: {traffic.source.sha256}", *excluded))
