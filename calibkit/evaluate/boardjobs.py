"""Sensitivity and tuning jobs run on switchboards (:mod:`calibkit.evaluate.switchboard`), split by texts over
every worker.

A :class:`~calibkit.evaluate.jobs.SensitivityJob` names a variant (kept nodes, a table) and its texts. Here each
job becomes a few :class:`BoardUnit` chunks of its texts and a :class:`~calibkit.evaluate.switchboard.Setting`;
the units of all jobs of one call are mapped together, so the workers stay busy across jobs instead of waiting
for the slowest one, and each worker process builds one ONNX Runtime session per switchboard for the whole run
(:func:`_session`). The job's result is scored on the driver from its stitched outputs with the same
:func:`~calibkit.evaluate.jobs.score_outputs` a per-variant job uses, so a result is the same whichever path
made it (to float rounding of the batch shapes).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calibkit.data.encode import TokenBudget
from calibkit.errors import CalibkitError, ModelError
from calibkit.evaluate.jobs import SensitivityJob, SensitivityResult, load_calibration_table, score_outputs
from calibkit.evaluate.shipping import tokenizer_files
from calibkit.evaluate.switchboard import Board, Setting, build_board, setting
from calibkit.executors.base import Executor, Shared, fetch, materialize
from calibkit.tasks import task_class

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.base import BaseRunner
    from calibkit.types import CalibrationTable

log = logging.getLogger("calibkit.evaluate.boardjobs")

TENSORRT = "tensorrt"
ONNXRUNTIME = "onnxruntime"
# padded tokens per batch at most: a sample of 64 log texts holds one or two of 512 tokens, which would pad a
# batch of 32 to 16,384 tokens where its texts hold about 1,300 (batches of short texts stay at the batch size)
BATCH_TOKENS = TokenBudget(max_batch_tokens=4096)
MIN_UNIT_COST = 1024.0  # tokens: below this a unit pays more in per-unit overhead than it computes
UNITS_PER_WORKER = 4  # enough units that a slow one does not leave the other workers idle at the end


def served(jobs: Sequence[SensitivityJob]) -> bool:
    """Whether these jobs can run on switchboards: both layouts, as exact Q/DQ arithmetic (the switchboard
    module; 7-bit weights are built one variant at a time)."""
    return bool(jobs) and all(j.target in (TENSORRT, ONNXRUNTIME) for j in jobs)


@dataclass(frozen=True)
class BoardUnit:
    """Some texts of one job, under one setting of one board."""

    board: Shared[Board]
    tokenizer: Shared[dict[str, bytes]]  # {file name: bytes}
    tokenizer_file: str | None
    texts: Shared[tuple[str, ...]]  # the job's texts
    rows: tuple[int, ...]  # which of them: consecutive in the job's length order (see run_on_boards)
    switches: tuple[bool, ...]
    scales: tuple[float, ...]
    zeros: tuple[int, ...]
    batch_size: int
    threads: int
    max_length: int | None
    output_name: str | None
    pooling: str | None


@dataclass(frozen=True)
class UnitOutput:
    values: np.ndarray | None  # outputs of the unit's rows; None when the unit failed
    seconds: float
    cpu_seconds: float = 0.0
    error: str | None = None
    error_hint: str | None = None


# -- worker side -----------------------------------------------------------------------------------------------
_sessions_lock = threading.Lock()
_sessions: dict[tuple[str, str, int, str | None], tuple[BaseRunner, TextTokenizer]] = {}
_MAX_SESSIONS = 2  # the plain model and its smoothed copy: the boards of one tune run


def _session(u: BoardUnit) -> tuple[BaseRunner, TextTokenizer]:
    """This process's runner of ``u.board`` (made once per board and thread count) and its tokenizer."""
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner

    key = (u.board.key, u.tokenizer.key, u.threads, u.tokenizer_file)
    with _sessions_lock:
        hit = _sessions.get(key)
        if hit is not None:
            return hit
        while len(_sessions) >= _MAX_SESSIONS:
            old = _sessions.pop(next(iter(_sessions)))
            old[0].deactivate()
        board: Board = fetch(u.board)
        tok_dir = materialize(u.tokenizer)
        tok = TextTokenizer(str(tok_dir / u.tokenizer_file if u.tokenizer_file else tok_dir), max_length=u.max_length)
        runner = model_runner(board.model, threads=u.threads, layout=TENSORRT, name="switchboard", keep_model=False)
        runner.activate()
        _sessions[key] = (runner, tok)
        return runner, tok


class _Fixed:
    """A runner seen through fixed extra feeds (the setting): what predict_outputs sees is the model's own
    inputs."""

    def __init__(self, runner, extra: dict[str, np.ndarray]) -> None:  # type: ignore[no-untyped-def]
        self._runner = runner
        self._extra = extra
        self.input_specs = tuple(s for s in runner.input_specs if s.name not in extra)
        self.output_names = runner.output_names

    def infer(self, feeds):  # type: ignore[no-untyped-def]
        return self._runner.infer({**feeds, **self._extra})


def run_board_unit(u: BoardUnit) -> UnitOutput:
    """The work unit: the unit's texts through this process's session of the board, under the unit's setting.
    Failures come back in ``error``, never raised (as :func:`~calibkit.evaluate.jobs.run_sensitivity_job`)."""
    from calibkit.evaluate.predict import predict_outputs

    start, cpu = time.perf_counter(), time.process_time()
    try:
        runner, tok = _session(u)
        every = fetch(u.texts)
        texts = [every[i] for i in u.rows]
        feeds = Setting(np.asarray(u.switches, dtype=bool), np.asarray(u.scales, dtype=np.float32),
                        np.asarray(u.zeros, dtype=np.uint8)).feeds()
        values = predict_outputs(_Fixed(runner, feeds), tok, texts, batch_size=u.batch_size,  # type: ignore[arg-type]
                                 output_name=u.output_name, pooling=u.pooling, budget=BATCH_TOKENS).values
    except CalibkitError as exc:
        return UnitOutput(None, time.perf_counter() - start, time.process_time() - cpu, exc.message, exc.hint)
    return UnitOutput(values, time.perf_counter() - start, time.process_time() - cpu)


# -- driver side -----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _board(path: str, size: int, mtime_ns: int) -> Board:
    """The switchboard of the model file (built once per file version in this process)."""
    from calibkit.graph import load_model
    from calibkit.quantize.placement import plan_placement

    model = load_model(path)
    board = build_board(model, plan_placement(model))
    if len(board.model) >= 2**31:  # protobuf's limit; never reached: serialization fails first
        raise ModelError("the switchboard model is over 2 GB")
    return board


_shared_boards: weakref.WeakKeyDictionary[Executor, dict[int, tuple[Board, Shared]]] = weakref.WeakKeyDictionary()


def _share_board(executor: Executor, board: Board) -> Shared:
    """``executor.share(board)`` once per executor and board: sharing hashes the value's pickle, hundreds of MB
    for a BERT-base board, and tune evaluates through the same board hundreds of times."""
    memo = _shared_boards.setdefault(executor, {})
    hit = memo.get(id(board))
    if hit is None or hit[0] is not board:
        hit = memo[id(board)] = (board, executor.share(board))
    return hit[1]


def board_for(path: str) -> Board:
    st = Path(path).stat()
    return _board(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _table(path: str, size: int, mtime_ns: int) -> CalibrationTable:
    return load_calibration_table(path)


def _setting(board: Board, job: SensitivityJob) -> Setting:
    p = Path(job.calibration_json)
    p = p / "calibration.json" if p.is_dir() else p
    st = p.stat()
    return setting(board, _table(str(p.resolve()), st.st_size, st.st_mtime_ns), job.keep_nodes,
                   weights_only=job.target == ONNXRUNTIME)


def text_cost(lengths: np.ndarray) -> np.ndarray:
    """A text's share of the work in tokens: its length, and attention's square term (whose weight against the
    dense layers is about length / (3 x hidden); 1,024 stands for a small hidden size)."""
    n = np.asarray(lengths, dtype=np.float64)
    return n + n * n / 1024.0


def cut_units(lengths: np.ndarray, batch_size: int, target: float) -> list[tuple[int, int]]:
    """(start, stop) runs of ``lengths`` (sorted ascending) of about ``target`` cost each, cut at whole batches
    (the batches one evaluation of the whole job makes), and within a batch only where a single batch costs more
    than ``target``: a run of the longest texts is as long to compute as a run of short ones, so no unit is left
    running alone while the other workers wait."""
    cost = text_cost(lengths)
    units: list[tuple[int, int]] = []
    start, acc = 0, 0.0
    for b in range(0, len(lengths), batch_size):
        stop = min(b + batch_size, len(lengths))
        c = float(cost[b:stop].sum())
        if acc and acc + c > target:
            units.append((start, b))
            start, acc = b, 0.0
        if c > target:  # one batch alone is too much: its own runs of about ``target``
            piece = start
            run = 0.0
            for i in range(b, stop):
                if run and run + cost[i] > target:
                    units.append((piece, i))
                    piece, run = i, 0.0
                run += float(cost[i])
            start, acc = piece, run
            continue
        acc += c
    if start < len(lengths) or not units:
        units.append((start, len(lengths)))
    return units


def run_on_boards(jobs: Sequence[SensitivityJob], executor: Executor,
                  finished: Callable[[int, SensitivityResult], None]) -> list[SensitivityResult]:
    """Every job's result, in order; ``finished(i, result)`` as each job's last unit comes back."""
    boards: dict[str, Shared] = {}
    tokenizers: dict[str, tuple[Shared, str | None]] = {}
    threads = executor.task_threads or executor.threads_per_task  # a pool of one worker per core: 1 thread each
    lengths = [_lengths(j) for j in jobs]
    total = sum(float(text_cost(n).sum()) for n in lengths)
    target = max(MIN_UNIT_COST, total / max(1, executor.workers * UNITS_PER_WORKER))
    units: list[BoardUnit] = []
    owner: list[int] = []
    failed: dict[int, SensitivityResult] = {}
    for i, job in enumerate(jobs):
        try:
            board = board_for(job.source_model)
            if job.source_model not in boards:
                boards[job.source_model] = _share_board(executor, board)
            s = _setting(board, job)
        except CalibkitError as exc:
            failed[i] = SensitivityResult(job.mode, job.node, float("nan"), float("nan"), float("nan"), 0.0,
                                          error=exc.message, error_hint=exc.hint)
            continue
        if job.tokenizer not in tokenizers:
            files, single = tokenizer_files(Path(job.tokenizer))
            tokenizers[job.tokenizer] = (executor.share(files), single)
        tok, single = tokenizers[job.tokenizer]
        texts = executor.share(tuple(job.texts))
        pooling = job.pooling if task_class(job.task).pools else None
        # units are runs of the job's texts in predict_outputs' own (stable) length order, cut at whole batches:
        # every text is batched with the same neighbours as in one evaluation of the whole job
        order = np.argsort(lengths[i], kind="stable")
        for start, stop in cut_units(lengths[i][order], job.batch_size, target):
            units.append(BoardUnit(boards[job.source_model], tok, single, texts,
                                   tuple(int(v) for v in order[start:stop]),
                                   tuple(bool(v) for v in s.switches), tuple(float(v) for v in s.scales),
                                   tuple(int(v) for v in s.zeros),
                                   job.batch_size, threads, job.max_length, job.output_name, pooling))
            owner.append(i)
    results: list[SensitivityResult | None] = [None] * len(jobs)
    parts: dict[int, dict[int, UnitOutput]] = {}
    expected = {i: owner.count(i) for i in set(owner)}
    for i, r in failed.items():
        results[i] = r
        finished(i, r)

    def collect(pos: int, out: UnitOutput) -> None:
        i = owner[pos]
        got = parts.setdefault(i, {})
        got[pos] = out
        if len(got) == expected[i]:
            done = sorted(got)
            result = _stitch(jobs[i], [units[k].rows for k in done], [got[k] for k in done])
            results[i] = result
            del parts[i]
            finished(i, result)

    if units:
        executor.map(run_board_unit, units, task="evaluations", on_result=collect)
    return [r for r in results if r is not None]


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str, max_length: int | None) -> TextTokenizer:
    from calibkit.data.tokenizer import TextTokenizer

    return TextTokenizer(path, max_length=max_length)


def _lengths(job: SensitivityJob) -> np.ndarray:
    """Each text's length as predict_outputs batches it."""
    tok = _tokenizer(job.tokenizer, job.max_length)
    return np.minimum(tok.token_lengths(job.texts), tok.max_length)


def _stitch(job: SensitivityJob, rows: Sequence[tuple[int, ...]], outs: Sequence[UnitOutput]) -> SensitivityResult:
    """The job's result from its units' outputs (each for ``rows`` of the job's texts)."""
    seconds = float(sum(o.seconds for o in outs))
    cpu = float(sum(o.cpu_seconds for o in outs))
    bad = next((o for o in outs if o.values is None), None)
    if bad is not None:
        return SensitivityResult(job.mode, job.node, float("nan"), float("nan"), float("nan"), seconds,
                                 error=bad.error, error_hint=bad.error_hint, cpu_seconds=cpu)
    parts = [(r, o.values) for r, o in zip(rows, outs) if o.values is not None and len(r)]
    if not parts:
        return replace(score_outputs(job, np.zeros((0, 0), dtype=np.float32), seconds), cpu_seconds=cpu)
    first = parts[0][1]
    width = max(v.shape[1] for _, v in parts) if first.ndim >= 3 else None
    shape = (len(job.texts), width, *first.shape[2:]) if width is not None else (len(job.texts), *first.shape[1:])
    values = np.zeros(shape, dtype=np.float32)  # sequence outputs: zeros past each text, as predict_outputs pads
    for r, v in parts:
        values[np.asarray(r, dtype=np.int64), : v.shape[1]] = v
    return replace(score_outputs(job, values, seconds), cpu_seconds=cpu)
