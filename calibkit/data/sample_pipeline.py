"""From a production log to a calibration set: the orchestration behind ``calibkit sample``.

One streaming pass over the log parses and validates each line, strips ``<script>``/``<style>`` blocks,
redacts personal data, de-duplicates (8-byte digests of normalized texts), estimates the token length, and
offers each first-seen text to a bounded per-stratum pool (length bucket x label) by seeded priority. After
the pass only the pool (a few thousand texts per stratum) is tokenized precisely (when a tokenizer is given),
clustered into topics, and the sample is allocated over (length bucket, label, topic) strata.

The population is the set of *distinct* texts: a hot query is one text, however often it was sent; how often
each sampled text was seen is recorded in the manifest (``sample_seen_counts``) for weighting.

Same log + same options + same seed -> the same texts in the same order, and a byte-identical manifest.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from calibkit._version import __version__
from calibkit.data.calibset import CalibrationSet, write_calibration_set
from calibkit.data.dedup import DedupIndex, Seen
from calibkit.data.logs import (
    MAX_TEXT_CHARS,
    LogRecord,
    ReadStats,
    detect_text_fields,
    parse_field_paths,
    read_log,
)
from calibkit.data.redact import REDACTION_KINDS, redact, strip_scripts
from calibkit.data.sampling import (
    PSI_EDGES,
    Candidate,
    PriorityPool,
    allocate,
    bucket_names,
    cluster_topics,
    estimate_tokens,
    histogram,
    length_bucket,
    length_psi,
    priority,
    verdict,
    weighted_ks,
)
from calibkit.errors import DataError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.requests.sample import SampleRequest
from calibkit.results.files import (
    CandidatePool,
    HotText,
    LabelStratification,
    LogHistogram,
    ManifestCleanup,
    ManifestDedup,
    ManifestLength,
    ManifestRedaction,
    ManifestSource,
    ManifestStrata,
    ManifestTextField,
    ManifestTopics,
    OverMax,
    Representativeness,
    SampleRecord,
    StratumRow,
)

log = logging.getLogger("calibkit.data.sample")

DEFAULT_MAX_LENGTH = 512
_Stratum = tuple[int, str | None]  # the pool's strata: (length bucket, label; None once labels are merged)
_PROGRESS_EVERY = 20_000
_HOT_KEPT = 10
_DUP_TEXTS_KEPT = 50_000
_LABELS_COUNTED = 100_000  # distinct labels tracked exactly; beyond, the count is reported as a lower bound


def label_strata_limit(size: int) -> int:
    """Most distinct labels worth stratifying a sample of ``size`` by: beyond it most label strata get one
    text or none, and the per-label pools crowd out rarer lengths (a 50,000-label field once lost every long
    text). Then the sample is stratified by length and topic only, and the manifest says why."""
    return max(20, size // 8)


@dataclass(frozen=True)
class Sample:
    """The texts drawn (with their labels when the log has a label field) and the manifest's record of how."""

    texts: tuple[str, ...]
    labels: tuple[str | None, ...] | None
    record: SampleRecord


def check_log(path: Path) -> None:
    """Refuse a log that is missing, not a file, unreadable or empty (with a hint)."""
    if not path.exists():
        raise DataError(f"log not found: {path}", hint="pass the path of a JSON Lines log (.jsonl or .jsonl.gz)")
    if not path.is_file():
        raise DataError(f"not a file: {path}", hint="pass the path of a JSON Lines log (.jsonl or .jsonl.gz)")
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions") from exc
    if path.stat().st_size == 0:
        raise DataError(f"log is empty: {path}", hint="point calibkit sample at a log with requests in it")


def resolve_text_fields(path: Path, text_field: str | None) -> tuple[tuple[str, ...], bool]:
    """The checked log's text field paths: ``text_field`` parsed (comma-separated fallbacks), or auto-detected
    from the first lines when None. Returns (paths, auto_detected)."""
    check_log(path)
    if text_field:
        return parse_field_paths(text_field), False
    fields = detect_text_fields(path)
    log.info("text field auto-detected: %s", ", ".join(fields))
    return fields, True


@dataclass
class CleanupTally:
    """What cleanup did while a log was read (mutable on purpose: the running tally, like ReadStats)."""

    scripts_removed: int = 0
    emptied: int = 0  # texts that held only <script>/<style> blocks
    redactions: Counter[str] = field(default_factory=Counter)
    redacted_texts: int = 0


@dataclass(frozen=True)
class CleanText:
    """One usable log record after cleanup. ``seen`` is None when cleanup emptied the text (it is counted in
    the tally, not deduplicated; ``emptied`` says so) or when no dedup index was given; ``raw_text`` is the text
    before redaction (the same object when nothing was redacted)."""

    record: LogRecord
    text: str
    raw_text: str
    seen: Seen | None
    emptied: bool = False


def clean_log(
    path: Path,
    fields: Sequence[str],
    label_field: str | None = None,
    *,
    strict: bool,
    redact_pii: bool,
    stats: ReadStats,
    dedup: DedupIndex | None,
    tally: CleanupTally,
) -> Iterator[CleanText]:
    """``sample``'s one code path from log lines to clean texts: the streaming reader (broken lines counted
    by kind in ``stats``), ``<script>``/``<style>`` blocks removed, personal data redacted (``redact_pii``),
    each text offered to ``dedup`` (normalised digest; None: duplicates are not tracked, so memory does not grow
    with the log). Used by ``sample``, the traffic evidence of compare and tune and deploy's traffic, so all see
    the same texts for the same log and options."""
    for rec in read_log(path, fields, label_field, strict=strict, stats=stats):
        text, n_scripts = strip_scripts(rec.text)
        if n_scripts:
            tally.scripts_removed += n_scripts
            if not text.strip():
                tally.emptied += 1
                yield CleanText(rec, text, text, None, emptied=True)
                continue
        raw = text
        if redact_pii:
            r = redact(text)
            if r.counts:
                text = r.text
                tally.redactions.update(r.counts)
                tally.redacted_texts += 1
        yield CleanText(rec, text, raw, dedup.add(text) if dedup is not None else None)


def draw_sample(request: SampleRequest, progress: ProgressCallback | None = None) -> Sample:
    """Read the request's log and choose the calibration texts; writes nothing. Steps: one streaming pass keeps
    a bounded candidate pool per (length, label) stratum (:func:`_read_log`); the pool's texts get precise
    lengths and topic clusters (:func:`_measure_pool`); the size is allocated over length x label x topic
    strata (:func:`_allocate_sample`); the manifest says how (:func:`_manifest`)."""
    path = Path(request.logs)
    cb = progress or no_progress
    fields, auto = resolve_text_fields(path, request.text_field)
    read = _read_log(path, fields, request, cb)
    _check_usable(path, fields, request, read)
    pool = _measure_pool(read, request, cb)
    drawn = _allocate_sample(pool, read.by_label, request)
    s_labels = tuple(pool.cands[i].label for i in drawn.chosen) if request.label_field is not None else None
    return Sample(tuple(pool.cands[i].text for i in drawn.chosen), s_labels,
                  _manifest(path, fields, auto, request, read, pool, drawn))


@dataclass(frozen=True)
class _LogPass:
    """What the streaming pass over the log keeps: counts, the bounded candidate pool and the estimated
    length histogram of every distinct text."""

    stats: ReadStats
    dedup: DedupIndex
    tally: CleanupTally
    pool: PriorityPool[_Stratum]
    est_hist: np.ndarray
    over_max_est: int
    dup_texts: dict[int, str]
    labels_distinct: set[str | None]
    label_limit: int
    by_label: bool
    file_size: int


def _read_log(path: Path, fields: Sequence[str], options: SampleRequest, cb: ProgressCallback) -> _LogPass:
    """One pass through ``clean_log``: every distinct text is counted in the length histogram and offered to
    the pool of its (length bucket, label) stratum; label strata are merged away once there are too many."""
    stats = ReadStats()
    dedup = DedupIndex()
    tally = CleanupTally()
    max_len_cap = options.max_length or DEFAULT_MAX_LENGTH
    est_hist = np.zeros(len(PSI_EDGES), dtype=np.int64)
    over_max_est = 0
    pool: PriorityPool[_Stratum] = PriorityPool(capacity=max(4 * options.size, 1024))
    dup_texts: dict[int, str] = {}
    label_limit = label_strata_limit(options.size)
    labels_distinct: set[str | None] = set()
    by_label = options.label_field is not None
    file_size = path.stat().st_size
    cb(ProgressEvent("reading log", 0, file_size))
    for item in clean_log(path, fields, options.label_field, strict=options.strict, redact_pii=options.redact,
                          stats=stats, dedup=dedup, tally=tally):
        if stats.records % _PROGRESS_EVERY == 0:
            cb(ProgressEvent("reading log", stats.bytes_read, file_size, f"{stats.lines:,} lines"))
        if item.seen is None:
            continue
        rec, text, seen = item.record, item.text, item.seen
        if not seen.first:
            if seen.key not in dup_texts and len(dup_texts) < _DUP_TEXTS_KEPT:
                dup_texts[seen.key] = text
            continue
        est = estimate_tokens(text)
        est_hist[np.searchsorted(PSI_EDGES, est, side="right") - 1] += 1
        if est > max_len_cap:
            over_max_est += 1
        cand = Candidate(priority(seen.key, options.seed), seen.key, text, rec.label, est, rec.line_no)
        if options.label_field is not None and len(labels_distinct) < _LABELS_COUNTED:
            labels_distinct.add(rec.label)
            if by_label and len(labels_distinct) > label_limit:
                by_label = False
                pool = _merge_label_strata(pool)
        pool.offer((length_bucket(est), rec.label if by_label else None), cand)
    cb(ProgressEvent("reading log", file_size, file_size, f"{stats.lines:,} lines"))
    return _LogPass(stats, dedup, tally, pool, est_hist, over_max_est, dup_texts, labels_distinct, label_limit,
                    by_label, file_size)


def _check_usable(path: Path, fields: Sequence[str], options: SampleRequest, read: _LogPass) -> None:
    """DataError for a log that cannot give the sample: empty, no usable text, fewer distinct texts than
    --size."""
    stats, dedup = read.stats, read.dedup
    if stats.lines == 0:
        raise DataError(f"log is empty: {path}", hint="point calibkit sample at a log with requests in it")
    if dedup.unique == 0:
        kinds = ", ".join(f"{k}: {v}" for k, v in stats.broken.items() if v) or "none"
        raise DataError(
            f"{path}: no usable text in {stats.lines:,} lines (broken lines by kind: {kinds}; "
            f"text field: {', '.join(fields)})",
            hint="check --text-field (a dotted path such as request.text) and that lines are JSON objects",
        )
    if options.size > dedup.unique:
        raise DataError(
            f"--size {options.size} is larger than the {dedup.unique:,} distinct usable texts in {path}",
            hint=f"ask for --size {dedup.unique} or fewer, or sample a larger log",
        )


@dataclass(frozen=True)
class _Pool:
    """The candidates with their population weights, precise lengths and topic clusters."""

    cands: list[Candidate]
    weights: np.ndarray
    lengths: np.ndarray
    max_len: int
    measure: str
    topics: np.ndarray
    capacity: int


def _measure_pool(read: _LogPass, options: SampleRequest, cb: ProgressCallback) -> _Pool:
    """Every pooled candidate with its stratum's weight, its length (the tokenizer's when given, else the
    word-piece estimate) and its topic cluster."""
    pool = read.pool
    cands, weights = pool.weighted_members()
    tokenizer = Path(options.tokenizer) if options.tokenizer else None
    lengths, measure, max_len = candidate_lengths(cands, tokenizer, options.max_length, cb,
                                                  "tokenizing candidates")
    cb(ProgressEvent("clustering topics", 0, 1))
    topics = cluster_topics([c.text for c in cands], options.clusters, options.seed)
    cb(ProgressEvent("clustering topics", 1, 1))
    return _Pool(cands, np.asarray(weights, dtype=np.float64), lengths, int(max_len), measure, topics, pool.capacity)


def candidate_lengths(cands: Sequence[Candidate], tokenizer: Path | None, max_length: int | None,
                      cb: ProgressCallback, task: str) -> tuple[np.ndarray, str, int]:
    """(token length of each candidate, how it was measured, the maximum length): the tokenizer's lengths
    when one is given (in chunks, progress under ``task``), else the word-piece estimate taken while reading.
    Shared by ``sample`` and the traffic evidence of compare and tune."""
    if tokenizer is None:
        return (np.asarray([c.est_tokens for c in cands], dtype=np.int64), "word-piece estimate",
                max_length or DEFAULT_MAX_LENGTH)
    from calibkit.data.tokenizer import TextTokenizer

    tok = TextTokenizer(tokenizer)
    texts = [c.text for c in cands]
    step = 2048
    chunks = []
    for i in range(0, len(texts), step):
        chunks.append(tok.token_lengths(texts[i : i + step]))
        cb(ProgressEvent(task, min(i + step, len(texts)), len(texts)))
    lengths = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    return lengths, f"tokenizer ({tokenizer})", max_length or tok.max_length


@dataclass(frozen=True)
class _Drawn:
    """The strata (length bucket, label, topic) with their population and members, the allocation and the
    chosen candidates (indices into the pool, in priority order)."""

    strata_pop: dict[tuple, float]
    members_of: dict[tuple, list[int]]
    alloc: dict[tuple, int]
    chosen: list[int]


def _allocate_sample(pool: _Pool, by_label: bool, options: SampleRequest) -> _Drawn:
    """Proportional allocation of --size over the final strata (at least --min-per-stratum each), the
    lowest-priority members of each stratum chosen."""
    cands = pool.cands
    final_keys = [(length_bucket(int(n)), c.label if by_label else None, int(t))
                  for n, c, t in zip(pool.lengths, cands, pool.topics)]
    strata_pop: dict[tuple, float] = {}
    members_of: dict[tuple, list[int]] = {}
    for i, k in enumerate(final_keys):
        strata_pop[k] = strata_pop.get(k, 0.0) + float(pool.weights[i])
        members_of.setdefault(k, []).append(i)
    for k in members_of:
        members_of[k].sort(key=lambda i: (cands[i].priority, cands[i].key))
    alloc = allocate(strata_pop, {k: len(v) for k, v in members_of.items()}, options.size, options.min_per_stratum)
    chosen = sorted(
        (i for k, n in alloc.items() for i in members_of[k][:n]), key=lambda i: (cands[i].priority, cands[i].key)
    )
    return _Drawn(strata_pop, members_of, alloc, chosen)


def _sample_warnings(options: SampleRequest, read: _LogPass) -> tuple[list[str], LabelStratification | None]:
    """The manifest's warnings (a label field with too many values to stratify by, texts cut to
    MAX_TEXT_CHARS) and its label-stratification record."""
    warnings: list[str] = []
    label_info: LabelStratification | None = None
    if options.label_field is not None:
        n_labels = len(read.labels_distinct)
        label_info = LabelStratification(distinct=n_labels, distinct_is_lower_bound=n_labels >= _LABELS_COUNTED,
                                         limit=read.label_limit, stratified=read.by_label)
        if not read.by_label:
            warnings.append(
                f"--label-field {options.label_field} has {'at least ' if n_labels >= _LABELS_COUNTED else ''}"
                f"{n_labels:,} distinct values (more than {read.label_limit}) for a sample of {options.size}: "
                "the sample is not stratified by label (labels are still kept); is it a class label?")
    if read.stats.oversized:
        warnings.append(f"{read.stats.oversized:,} texts longer than {MAX_TEXT_CHARS:,} characters were cut to "
                        f"that length before processing (first at line {read.stats.oversized_first_lines[0]})")
    return warnings, label_info


def _manifest(path: Path, fields: Sequence[str], auto: bool, options: SampleRequest, read: _LogPass, pool: _Pool,
              drawn: _Drawn) -> SampleRecord:
    """manifest.json's sample record: the source, the reading and cleanup counts, dedup, lengths, strata and
    how representative the sample's lengths are of the log's."""
    stats, tally, cands, chosen = read.stats, read.tally, pool.cands, drawn.chosen
    warnings, label_info = _sample_warnings(options, read)
    length, representativeness = _length_sections(read, pool, chosen)
    return SampleRecord(
        calibkit_version=__version__,
        kind="calibration-set",
        source=ManifestSource(path=str(path), size_bytes=read.file_size, sha256=stats.sha256, gzip=_gz(path)),
        seed=options.seed,
        size_requested=options.size,
        text_field=ManifestTextField(paths=tuple(fields), auto_detected=auto),
        label_field=options.label_field,
        lines=stats.record(),
        warnings=tuple(warnings),
        cleanup=ManifestCleanup(
            policy="markup kept as production sends it; <script> and <style> blocks removed",
            script_blocks_removed=tally.scripts_removed,
            texts_emptied_by_cleanup=tally.emptied,
        ),
        redaction=ManifestRedaction(
            enabled=options.redact,
            counts={k: int(tally.redactions.get(k, 0)) for k in REDACTION_KINDS},
        ),
        dedup=_dedup_section(read),
        length=length,
        representativeness=representativeness,
        strata=_strata_section(options, read, pool, drawn, label_info),
        sample_seen_counts=tuple(int(read.dedup.counts[cands[i].key]) for i in chosen),
        sample_line_numbers=tuple(int(cands[i].line_no) for i in chosen),
    )


def _dedup_section(read: _LogPass) -> ManifestDedup:
    dedup = read.dedup
    hottest = sorted(((c, k) for k, c in dedup.counts.items() if c > 1), key=lambda x: (-x[0], x[1]))[:_HOT_KEPT]
    return ManifestDedup(
        normalization="NFKC, case-folded, whitespace collapsed",
        distinct_texts=dedup.unique,
        duplicate_lines=dedup.duplicates,
        exact_duplicates=dedup.exact_duplicates,
        normalized_duplicates=dedup.normalized_duplicates,
        groups_seen_more_than_once=dedup.groups_repeated(),
        hottest=tuple(HotText(seen=c, text=_preview(read.dup_texts.get(k, ""))) for c, k in hottest),
    )


def _length_sections(read: _LogPass, pool: _Pool, chosen: list[int]) -> tuple[ManifestLength, Representativeness]:
    """``length`` (texts over the maximum, the log's estimated histogram) and ``representativeness`` (PSI and
    KS of the sample's lengths against the log's, weighted by stratum)."""
    lengths, w, max_len = pool.lengths, pool.weights, pool.max_len
    s_len = lengths[chosen]
    pop_frac = histogram(lengths, w)
    smp_frac = histogram(s_len)
    psi = length_psi(pop_frac, smp_frac)
    ks = weighted_ks(lengths.astype(np.float64), w, s_len.astype(np.float64))
    pop_over = float(w[lengths > max_len].sum())
    length = ManifestLength(
        measure=pool.measure,
        max_length=int(max_len),
        over_max=OverMax(
            population_estimated=int(round(pop_over)),
            sample=int((s_len > max_len).sum()),
            sample_indices=tuple(int(i) for i in np.nonzero(s_len > max_len)[0]),
        ),
        log_histogram_estimated=LogHistogram(
            edges=tuple(PSI_EDGES),
            counts=tuple(int(x) for x in read.est_hist),
            over_max=read.over_max_est,
        ),
    )
    representativeness = Representativeness(
        measure=pool.measure,
        bin_edges=tuple(PSI_EDGES),
        population_fraction=tuple(round(float(x), 6) for x in pop_frac),
        sample_fraction=tuple(round(float(x), 6) for x in smp_frac),
        psi=round(psi, 6),
        ks=round(ks, 6),
        verdict=verdict(psi),
        thresholds={"representative": "PSI < 0.1", "slightly shifted": "PSI < 0.25"},
    )
    return length, representativeness


def _strata_section(options: SampleRequest, read: _LogPass, pool: _Pool, drawn: _Drawn,
                    label_info: LabelStratification | None) -> ManifestStrata:
    cands, topics = pool.cands, pool.topics
    names = bucket_names()
    labels_seen = sorted({c.label for c in cands}, key=lambda v: "" if v is None else v)
    topic_examples: dict[int, str] = {}
    for i in sorted(range(len(cands)), key=lambda i: (cands[i].priority, cands[i].key)):
        topic_examples.setdefault(int(topics[i]), _preview(cands[i].text))
    has_labels = options.label_field is not None
    return ManifestStrata(
        definition="length bucket x label x topic cluster; proportional allocation, "
        f"minimum {options.min_per_stratum} per non-empty stratum",
        length_buckets=tuple(names),
        labels=tuple(labels_seen) if has_labels and read.by_label else None,
        label_stratification=label_info,
        topics=ManifestTopics(
            method="HashingVectorizer(2^14, english stop words) + k-means fitted on up to 4,000 "
            "candidates spread over the pool, then assigned to all",
            clusters=int(topics.max()) + 1 if len(topics) else 0,
            examples={str(k): v for k, v in sorted(topic_examples.items())},
        ),
        candidate_pool=CandidatePool(size=len(cands), per_stratum_capacity=pool.capacity),
        table=tuple(
            StratumRow(
                length_bucket=names[k[0]],
                label=k[1],
                topic=k[2],
                population=round(drawn.strata_pop[k], 1),
                candidates=len(drawn.members_of[k]),
                sample=drawn.alloc.get(k, 0),
            )
            for k in sorted(drawn.members_of, key=lambda k: (k[0], "" if k[1] is None else k[1], k[2]))
        ),
    )


def _merge_label_strata(pool: PriorityPool[_Stratum]) -> PriorityPool[_Stratum]:
    """The same pool keyed by length bucket only. Exact: the lowest priorities of a union of strata are among
    the lowest priorities kept in each of them."""
    merged: PriorityPool[_Stratum] = PriorityPool(pool.capacity)
    population: Counter[_Stratum] = Counter()
    for s in pool.strata():
        key = (s[0], None)
        population[key] += pool.population[s]
        for c in pool.members(s):
            merged.offer(key, c)
    merged.population.update(population)
    return merged


def sample_log(request: SampleRequest, progress: ProgressCallback | None = None) -> CalibrationSet:
    """Draw a sample and write ``texts.jsonl`` + ``manifest.json`` into the request's OUT atomically. The
    manifest names the log relative to its own folder where that is near (as calibration.json names what it
    was made from), so readers find it from any working folder (:func:`calibkit.provenance.document_path`)."""
    from calibkit._io import record_path
    from calibkit.provenance import MANIFEST_JSON, PATHS_RELATIVE

    s = draw_sample(request, progress)
    src = s.record.source
    record = replace(s.record, source=replace(src, path=record_path(Path(request.out_dir) / MANIFEST_JSON, src.path)),
                     paths=PATHS_RELATIVE)
    return write_calibration_set(request.out_dir, s.texts, s.labels, record)


def _preview(text: str, n: int = 80) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 1] + "…"


def _gz(path: Path) -> bool:
    from calibkit.data.logs import is_gzip

    return is_gzip(path)


__all__: Sequence[str] = ("SampleRequest", "Sample", "draw_sample", "sample_log", "clean_log",
                          "CleanText", "CleanupTally", "resolve_text_fields", "check_log")
