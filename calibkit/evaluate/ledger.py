"""tune's resumable record of finished evaluations: ``OUT/.tune/ledger.jsonl``.

:class:`Ledger` is the file (append-only, fsynced, unusable lines skipped and rerun); :func:`job_key` names an
evaluation by everything that determines its result (model and table bytes, kept nodes, texts, target, task,
pooling, neighbour index), so a changed input never reads back a stale result; :class:`Evaluator` runs jobs
through it: recorded ones are read back, the rest run on the executor and are recorded as each comes back.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from calibkit._io import not_own_file, sha256_bytes, text_lines
from calibkit.errors import CalibrationError, UsageError
from calibkit.evaluate.sensitivity import SensitivityJob, SensitivityResult, run_jobs
from calibkit.executors import Executor, InProcessExecutor
from calibkit.progress import ProgressCallback, ProgressEvent
from calibkit.tasks import task_class

log = logging.getLogger("calibkit.evaluate.ledger")


class Ledger:
    """Append-only JSON Lines of finished evaluations.

    A record that cannot be used — a torn last line (interrupted write), invalid UTF-8 or JSON, JSON nested too
    deeply, or a record whose numbers are missing or not numbers (``"accuracy": null``) — is skipped and
    counted in ``skipped``: its evaluation simply runs again. A record that parses is verified against the job
    it is read back for before it is used (:func:`record_problem`: per-text vectors of the job's length, finite
    shares, class ids of the model); one that fails is logged and evaluated again. Only the plain file calibkit
    makes is read or appended to: anything else at its path (a link, a FIFO, a folder) is a UsageError.
    """

    _NUMBERS = ("accuracy", "logit_mse", "mean_kl", "seconds")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._done: dict[str, dict[str, Any]] = {}
        self.skipped = 0
        self._refuse_foreign()
        if path.is_file():
            with self._open(os.O_RDONLY) as fh:
                text = fh.read().decode("utf-8", errors="replace")
            for line in text_lines(text):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except (ValueError, RecursionError):
                    rec = None
                if self.usable(rec):
                    self._done[rec["key"]] = rec
                else:
                    self.skipped += 1
        if self.skipped:
            log.warning("%s: %d unusable record(s) skipped; those evaluations run again", path, self.skipped)
        self.loaded = len(self._done)

    @classmethod
    def usable(cls, rec: object) -> bool:
        """A record ``from_record`` can turn back into a SensitivityResult."""
        if not isinstance(rec, dict) or not isinstance(rec.get("key"), str) or not isinstance(rec.get("mode"), str):
            return False
        if rec.get("node") is not None and not isinstance(rec["node"], str):
            return False
        if rec.get("error") is not None and not isinstance(rec["error"], str):
            return False
        return all(isinstance(rec.get(k), (int, float)) and not isinstance(rec.get(k), bool) for k in cls._NUMBERS)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._done.get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        rec = {**record, "key": key}
        self._done[key] = rec
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT) as fh:
            fh.write((json.dumps(rec, sort_keys=True, allow_nan=True) + "\n").encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())

    def _refuse_foreign(self) -> None:
        """A UsageError when what stands at the ledger's path is not a file calibkit made: a symbolic link or a
        hard link would have tune append its records to another file, a FIFO would block the run for good."""
        why = not_own_file(self.path)
        if why is not None:
            raise UsageError(f"tune's ledger {self.path} is {why}, not the file calibkit writes; it is neither read "
                             "nor written through",
                             hint=f"remove or rename {self.path} (calibkit did not make it), then run again")

    def _open(self, flags: int) -> BinaryIO:
        """The ledger opened with ``flags``, never through a link and never blocking; refused as
        :meth:`_refuse_foreign` does when what is open is not calibkit's plain file."""
        extra = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags | extra, 0o666)
        except OSError:  # a link (ELOOP) or a FIFO without a reader (ENXIO) swapped in since: named
            self._refuse_foreign()
            raise
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return os.fdopen(fd, "ab" if flags & os.O_APPEND else "rb")
        os.close(fd)
        self._refuse_foreign()
        raise UsageError(f"tune's ledger {self.path} changed while it was opened", hint="run again")


def job_key(job: SensitivityJob, table_sha: str, model_sha: str) -> str:
    payload = {
        "model": model_sha,
        "table": table_sha,
        "keep": sorted(job.keep_nodes),
        "texts": sha256_bytes("\n".join(job.texts).encode("utf-8")),
        "target": job.target,
        # onnxruntime-layout jobs run as exact Q/DQ arithmetic on the switchboard since 0.3 (fused kernels before)
        **({"arithmetic": "exact"} if job.target == "onnxruntime" else {}),
        "mode": job.mode,
        # per-text values (evidence.rowfidelity) since 0.3: records from before lack them and run again
        "values": 2,
        "task": job.task,
        "pooling": job.pooling,
        "index": None if job.neighbour_index is None else sha256_bytes(
            np.ascontiguousarray(job.neighbour_index, dtype=np.float64).tobytes()
            + np.asarray(job.index_rows if job.index_rows is not None else (), dtype=np.int64).tobytes()),
    }
    return sha256_bytes(json.dumps(payload, sort_keys=True).encode("utf-8"))[:32]


def result_record(r: SensitivityResult) -> dict[str, Any]:
    return {
        "mode": r.mode, "node": r.node, "accuracy": r.accuracy, "logit_mse": r.logit_mse,
        "mean_kl": r.mean_kl, "seconds": r.seconds, "error": r.error, "flip_rate": r.flip_rate,
        "predictions": list(r.predictions), "agreement_values": list(r.agreement_values),
        "cosine_values": list(r.cosine_values),
    }


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers(rec: dict[str, Any], field: str) -> list[Any] | str:
    """The list ``rec[field]`` (absent: empty), or why it is not a list of numbers."""
    vals = rec.get(field, [])
    if not isinstance(vals, list) or not all(_is_number(v) for v in vals):
        return f"{field} is not a list of numbers"
    return vals


def record_problem(rec: dict[str, Any], job: SensitivityJob) -> str | None:
    """Why ``rec`` (a usable ledger record, :meth:`Ledger.usable`) cannot be ``job``'s result, or None.

    Checked against what it is for: its mode and node are the job's; the per-text agreement values are one
    finite value in [0, 1] per text of the job and the flip rate is 1 minus their mean; predictions (a
    classifier's) are one class id per text, each a class of the model (the reference's width); cosines are
    one per text or none; seconds are finite and not negative; the accuracy is NaN or a share, and where the
    job has labels it is the share of predictions that match them; logit error and KL are NaN or not negative."""
    n = len(job.texts)
    if rec.get("mode") != job.mode or rec.get("node") != job.node:
        return f"it is the result of {rec.get('mode')}/{rec.get('node')}, not of {job.mode}/{job.node}"
    seconds = float(rec["seconds"])
    if not (np.isfinite(seconds) and seconds >= 0):
        return f"seconds {seconds} is not a finite duration"
    agree = _numbers(rec, "agreement_values")
    if isinstance(agree, str):
        return agree
    if len(agree) != n:
        return f"{len(agree)} agreement values for {n} texts"
    a = np.asarray(agree, dtype=np.float64)
    if not np.all(np.isfinite(a) & (a >= 0) & (a <= 1)):
        return "an agreement value that is not a finite share in [0, 1]"
    flip = rec.get("flip_rate", float("nan"))
    if not _is_number(flip):
        return "flip_rate is not a number"
    if n and not abs(float(flip) - (1.0 - float(a.mean()))) <= 1e-9:
        return f"flip_rate {flip} is not 1 - the mean agreement ({1.0 - float(a.mean())})"
    preds = rec.get("predictions", [])
    if not isinstance(preds, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in preds):
        return "predictions are not a list of class ids"
    classifies = task_class(job.task).classifies
    if classifies:
        if len(preds) != n:
            return f"{len(preds)} predictions for {n} texts"
        ref = np.asarray(job.reference_logits)
        classes = int(ref.shape[-1]) if ref.ndim >= 2 else None
        if classes is not None and any(not 0 <= v < classes for v in preds):
            return f"a predicted class outside the model's {classes} classes"
    cos = _numbers(rec, "cosine_values")
    if isinstance(cos, str):
        return cos
    if len(cos) not in (0, n):
        return f"{len(cos)} cosine values for {n} texts"
    acc = float(rec["accuracy"])
    if not (np.isnan(acc) or 0.0 <= acc <= 1.0):
        return f"accuracy {acc} is not a share"
    if classifies and n and len(job.labels) == n:
        want = float(np.mean(np.asarray(preds) == np.asarray(job.labels)))
        if not abs(acc - want) <= 1e-9:
            return f"accuracy {acc} is not the share of its predictions that match the labels ({want})"
    for k in ("logit_mse", "mean_kl"):
        v = float(rec[k])
        if not (np.isnan(v) or v >= 0):
            return f"{k} {v} is negative"
    return None


def from_record(rec: dict[str, Any]) -> SensitivityResult:
    return SensitivityResult(rec["mode"], rec.get("node"), float(rec["accuracy"]), float(rec["logit_mse"]),
                             float(rec["mean_kl"]), float(rec["seconds"]), rec.get("error"),
                             flip_rate=float(rec.get("flip_rate", float("nan"))),
                             predictions=tuple(int(v) for v in rec.get("predictions", ())),
                             agreement_values=tuple(float(v) for v in rec.get("agreement_values", ())),
                             cosine_values=tuple(float(v) for v in rec.get("cosine_values", ())))


class Evaluator:
    """Runs SensitivityJobs through the ledger: finished ones are read back, the rest run on the executor, and
    each result is in the ledger as soon as it comes back (an interrupt loses only the units in flight)."""

    def __init__(self, ledger: Ledger, model_sha: str, executor: Executor, progress: ProgressCallback) -> None:
        self.ledger = ledger
        self.model_sha = model_sha
        self.executor = executor
        self.progress = progress
        self.reused = 0
        self.ran = 0
        self.rejected = 0  # records read back that failed verification (record_problem): evaluated again
        self.texts = 0  # texts evaluated by the jobs that ran (read back from the ledger: not counted)
        # CPU seconds of those jobs in worker processes (in-process jobs are the driver's own CPU time)
        self.worker_cpu = 0.0
        self._remote = not isinstance(executor, InProcessExecutor)

    def run(self, jobs: Sequence[SensitivityJob], table_sha: str | Sequence[str], task: str) -> list[SensitivityResult]:
        """Each job's result, in order. ``table_sha``: the table every job reads, or one per job (jobs of several
        tables in one call keep every worker busy until the last of them, not until the end of each table)."""
        shas = [table_sha] * len(jobs) if isinstance(table_sha, str) else list(table_sha)
        if len(shas) != len(jobs):
            raise ValueError(f"{len(jobs)} jobs but {len(shas)} table hashes")
        keys = [job_key(j, sha, self.model_sha) for j, sha in zip(jobs, shas)]
        out: list[SensitivityResult | None] = []
        todo: list[int] = []
        for i, k in enumerate(keys):
            rec = self.ledger.get(k)
            why = record_problem(rec, jobs[i]) if rec is not None and not rec.get("error") else None
            if why is not None:
                self.rejected += 1
                log.warning("%s: the record of %s %s failed verification (%s); evaluated again",
                            self.ledger.path, jobs[i].mode, jobs[i].node or "", why)
                rec = None
            if rec is not None and not rec.get("error"):
                out.append(from_record(rec))
                self.reused += 1
            else:
                out.append(None)
                todo.append(i)
        reused = len(jobs) - len(todo)
        self.progress(ProgressEvent(task, reused, len(jobs)))

        def record(pos: int, r: SensitivityResult) -> None:
            i = todo[pos]
            out[i] = r
            self.ran += 1
            self.texts += len(jobs[i].texts)
            self.worker_cpu += r.cpu_seconds if self._remote else 0.0
            if not r.error:
                self.ledger.put(keys[i], result_record(r))
            self.progress(ProgressEvent(task, sum(x is not None for x in out), len(jobs)))

        if todo:
            run_jobs([jobs[i] for i in todo], executor=self.executor, task=task, on_result=record)
        failed = [r for r in out if r is not None and r.error]
        if failed:
            raise CalibrationError(f"{len(failed)} evaluations failed, e.g.: {failed[0].error}",
                                   hint=failed[0].error_hint or "run with --verbose for each evaluation's log")
        return [r for r in out if r is not None]
