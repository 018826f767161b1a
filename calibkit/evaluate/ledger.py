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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._io import sha256_bytes, text_lines
from calibkit.errors import CalibrationError
from calibkit.evaluate.sensitivity import SensitivityJob, SensitivityResult, run_jobs
from calibkit.executors import Executor, InProcessExecutor
from calibkit.progress import ProgressCallback, ProgressEvent

log = logging.getLogger("calibkit.evaluate.ledger")


class Ledger:
    """Append-only JSON Lines of finished evaluations.

    A record that cannot be used — a torn last line (interrupted write), invalid UTF-8 or JSON, JSON nested too
    deeply, or a record whose numbers are missing or not numbers (``"accuracy": null``) — is skipped and
    counted in ``skipped``: its evaluation simply runs again.
    """

    _NUMBERS = ("accuracy", "logit_mse", "mean_kl", "seconds")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._done: dict[str, dict[str, Any]] = {}
        self.skipped = 0
        if path.is_file():
            for line in text_lines(path.read_text(encoding="utf-8", errors="replace")):
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
    def usable(cls, rec: Any) -> bool:
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
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, sort_keys=True, allow_nan=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def job_key(job: SensitivityJob, table_sha: str, model_sha: str) -> str:
    payload = {
        "model": model_sha,
        "table": table_sha,
        "keep": sorted(job.keep_nodes),
        "texts": sha256_bytes("\n".join(job.texts).encode("utf-8")),
        "target": job.target,
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
