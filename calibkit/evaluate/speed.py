"""How fast a model serves, measured as a benchmark is, beside its reference in the same process.

Every model runs the same batches of real texts (each batch padded to its longest text, as a server pads a
batch): at batch 1 a seeded sample of single texts, at a larger batch size length-sorted chunks of a seeded
sample (what length buckets serve). Rounds are interleaved: each batch is run by every model back to back, their
order rotated from batch to batch, so a machine that slows down for a while slows every model alike; a first
round warms every session up and is not counted. A model's time at a batch size is the median over rounds of
that round's total; its speedup is the ratio of the reference's median to its own (the ratio of medians), with
the lowest and highest ratio of single rounds as its spread. Sessions are the served ones: ONNX Runtime with
every graph optimization (what Triton's ONNX Runtime backend and :mod:`calibkit.deploy` run), the same threads
for every model.

One function measures for tune (its confirmed candidates), compare (engine B against A) and deploy (the model it
writes against FP32), so the three report the same kind of number.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calibkit.cpus import usable_cpus
from calibkit.enginefiles.registry import ModelRunnerFactory, ModelSource
from calibkit.engines.base import BaseRunner, Feeds
from calibkit.engines.cpu import cpu_flags
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.results.runs import BatchSpeed, Speed

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.tokenizer import TextTokenizer

#: the batch sizes a served model is timed at: one request alone, and a full dynamic batch
SPEED_BATCH_SIZES = (1, 32)
#: texts timed at batch 1, and batches timed at each larger size, per round
SPEED_SINGLE_TEXTS = 32
SPEED_LARGE_BATCHES = 3
#: counted rounds (a warm-up round comes first): as many as fit the time budget, within these bounds
SPEED_ROUNDS = (3, 9)
#: seconds the counted rounds may take, all models together (the warm-up round prices one round)
SPEED_SECONDS = 30.0
#: the most holdout texts tune checks the served model on (a seeded sample of those whose agreement counts)
SERVED_CHECK_TEXTS = 2000
#: speedups within this share of the fastest are a tie (tune then prefers fidelity)
SPEED_TIE = 0.03

#: makes the runners timed: the run's runner factory (``Resources.runner_factory``)
MakeRunner = ModelRunnerFactory


@dataclass(frozen=True)
class SpeedBatches:
    """The batches every model is timed on: batch size -> feeds, and how many texts they hold."""

    feeds: Mapping[int, tuple[Feeds, ...]]
    texts: int


def speed_batches(encode: Callable[[Sequence[str]], Feeds], lengths: Sequence[int], texts: Sequence[str], *,
                  batch_sizes: Sequence[int] = SPEED_BATCH_SIZES, seed: int = 0,
                  single_texts: int = SPEED_SINGLE_TEXTS, large_batches: int = SPEED_LARGE_BATCHES,
                  within: Mapping[int, tuple[int, int]] | None = None) -> SpeedBatches:
    """Batches of ``texts`` (real traffic, never calibration texts) for :func:`measure_speed`: ``encode`` turns a
    list of texts into feeds, ``lengths`` are their token lengths (to sort the larger batches by). ``within``:
    for a batch size, the (shortest, longest) token lengths its texts are drawn from, as a server that batches
    requests by length bucket forms that batch size only of such requests."""
    rng = np.random.default_rng(seed)
    n = len(texts)
    feeds: dict[int, tuple[Feeds, ...]] = {}
    used: set[int] = set()
    for size in batch_sizes:
        want = single_texts if size == 1 else size * large_batches
        span = (within or {}).get(size)
        if span is None:
            pick = np.sort(rng.choice(n, size=min(want, n), replace=False)) if n else np.zeros(0, dtype=np.int64)
        else:
            pool = np.array([i for i in range(n) if span[0] <= lengths[i] <= span[1]], dtype=np.int64)
            pick = (np.sort(rng.choice(pool, size=min(want, pool.size), replace=False)) if pool.size
                    else np.zeros(0, dtype=np.int64))
        if size > 1:
            pick = pick[np.argsort([lengths[i] for i in pick], kind="stable")]
        chunks = [pick[i:i + size] for i in range(0, len(pick), size)]
        feeds[size] = tuple(encode([texts[int(j)] for j in c]) for c in chunks if len(c))
        used.update(int(j) for j in pick)
    return SpeedBatches(feeds, len(used))


def text_batches(tokenizer: TextTokenizer, input_names: Sequence[str], texts: Sequence[str], *, seed: int = 0,
                 batch_sizes: Sequence[int] = SPEED_BATCH_SIZES,
                 within: Mapping[int, tuple[int, int]] | None = None) -> SpeedBatches:
    """:func:`speed_batches` of ``texts`` through the model's tokenizer (its truncation included)."""
    names = tuple(input_names)
    lengths = [int(n) for n in np.minimum(tokenizer.token_lengths(list(texts)), tokenizer.max_length)]
    return speed_batches(lambda chunk: tokenizer.encode(list(chunk)).feeds(names), lengths, texts,
                         batch_sizes=batch_sizes, seed=seed, within=within)


def cpu_description() -> tuple[str, str]:
    """(the processor's model name, the instruction sets that decide ONNX Runtime's int8 kernels)."""
    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    flags = cpu_flags() or set()
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm") if f in flags]
    return name, (", ".join(isa) if isa else "no x86 SIMD flags read")


def measure_speed(models: Mapping[str, ModelSource], reference: str, batches: SpeedBatches, *,
                  make_runner: MakeRunner, threads: int | None = None, rounds: tuple[int, int] = SPEED_ROUNDS,
                  seconds: float = SPEED_SECONDS, progress: ProgressCallback | None = None) -> dict[str, Speed]:
    """Each of ``models`` (label -> ONNX model) against ``models[reference]``, on ``batches``: label -> its
    :class:`Speed` (the reference's own is left out). Every session is open at once (made by ``make_runner``, the
    run's runner factory, with ``threads`` intra-op threads: default every usable CPU). The warm-up round's time
    sets how many rounds are counted: as many as ``seconds`` holds, within ``rounds`` (least, most)."""
    if reference not in models:
        raise ValueError(f"the reference {reference!r} is not among the models timed")
    cb = progress or no_progress
    threads = threads or usable_cpus()
    names = list(models)
    sizes = [s for s, f in batches.feeds.items() if f]
    runners = {m: make_runner(models[m], threads=threads, name=f"speed: {m}") for m in names}
    for r in runners.values():
        r.activate()
    try:
        start = time.perf_counter()
        _round(runners, names, batches, sizes, 0, None, 0)  # warm-up, not counted
        warm_up = time.perf_counter() - start
        counted = int(min(max(seconds // max(warm_up, 1e-9), rounds[0]), rounds[1]))
        # totals[model][size][round]: seconds of that round's batches of that size
        totals = {m: {s: np.zeros(counted) for s in sizes} for m in names}
        for rnd in range(1, counted + 1):
            cb(ProgressEvent("speed", rnd - 1, counted, message=f"round {rnd} of {counted}, "
                             f"{len(names)} models at batch {', '.join(str(s) for s in sizes)}"))
            _round(runners, names, batches, sizes, rnd, totals, rnd - 1)
    finally:
        for r in runners.values():
            r.deactivate()
    cb(ProgressEvent("speed", counted, counted))
    cpu, isa = cpu_description()
    out: dict[str, Speed] = {}
    for m in names:
        if m == reference:
            continue
        at = []
        for size in sizes:
            ref, own = totals[reference][size], totals[m][size]
            count = len(batches.feeds[size])
            per_round = ref / np.maximum(own, 1e-12)
            at.append(BatchSpeed(batch_size=size, batches=count,
                                 reference_ms=float(1e3 * np.median(ref) / count),
                                 model_ms=float(1e3 * np.median(own) / count),
                                 speedup=float(np.median(ref) / max(float(np.median(own)), 1e-12)),
                                 speedup_low=float(per_round.min()), speedup_high=float(per_round.max())))
        out[m] = Speed(model=m, reference=reference, backend="onnxruntime", threads=threads, rounds=counted,
                       texts=batches.texts, cpu=cpu, isa=isa, at=tuple(at))
    return out


def _round(runners: Mapping[str, BaseRunner], names: Sequence[str], batches: SpeedBatches, sizes: Sequence[int],
           rnd: int, into: Mapping[str, Mapping[int, np.ndarray]] | None, slot: int) -> None:
    """One round: every batch run by every model back to back, the order rotated from batch to batch; each
    model's seconds per batch size added into ``into[model][size][slot]`` (None: not counted)."""
    for size in sizes:
        for i, feed in enumerate(batches.feeds[size]):
            shift = (rnd + i) % len(names)
            for m in [*names[shift:], *names[:shift]]:
                start = time.perf_counter()
                runners[m].infer(feed)
                if into is not None:
                    into[m][size][slot] += time.perf_counter() - start


def fastest(speeds: Mapping[int, Speed], fidelity: Mapping[int, float], tie: float = SPEED_TIE) -> int:
    """Of candidates (id -> speed, id -> fidelity), the fastest at its slowest batch size; candidates within
    ``tie`` of it are a tie, narrowed at each batch size timed (the one the candidates gain least at first) to
    those within ``tie`` of the fastest there, then broken by fidelity (then the lower id). A plan as fast at
    batch 32 but 12 % slower at batch 1 is not written for being a little more faithful: every candidate
    carries the claim, and speed is what the user quantizes for."""
    def narrow(tied: list[int], speed_of: Callable[[Speed], float | None]) -> list[int]:
        known = {i: v for i in tied if (v := speed_of(speeds[i])) is not None}
        if not known:
            return tied
        best = max(known.values())
        return [i for i in tied if i not in known or known[i] >= best * (1.0 - tie)]

    tied = narrow(list(speeds), lambda s: s.slowest.speedup)
    sizes = sorted({b.batch_size for s in speeds.values() for b in s.at},
                   key=lambda n: max(b.speedup for s in speeds.values() if (b := s.at_batch(n)) is not None))
    for n in sizes:
        def at_size(s: Speed, n: int = n) -> float | None:
            return None if (b := s.at_batch(n)) is None else b.speedup

        tied = narrow(tied, at_size)

    def faithful(i: int) -> float:
        f = fidelity.get(i, float("nan"))
        return f if f == f else float("-inf")

    return max(tied, key=lambda i: (faithful(i), -i))
