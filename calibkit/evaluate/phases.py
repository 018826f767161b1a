"""Where a long run's time goes: wall time, texts evaluated and CPU use of each step (:class:`PhaseClock`)."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from calibkit.results.runs import FP32_PHASE, PhaseCost


def _cpu_self() -> float:
    """CPU seconds of this process so far, every thread (ONNX Runtime's intra-op threads included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass(eq=False)
class PhaseClock:
    """Times the steps of one run. ``counter`` (set once it exists: tune's ledger Evaluator) has ``texts`` and
    ``worker_cpu``, the texts evaluated and the CPU seconds of worker processes so far."""

    cpus: int
    counter: object | None = None
    phases: list[PhaseCost] = field(default_factory=list)

    def _counts(self) -> tuple[int, float]:
        c = self.counter
        return (int(getattr(c, "texts", 0)), float(getattr(c, "worker_cpu", 0.0))) if c is not None else (0, 0.0)

    @contextlib.contextmanager
    def phase(self, name: str, texts: int = 0) -> Iterator[None]:
        """Time the body as phase ``name``; ``texts``: texts it evaluates outside the counter (FP32's)."""
        t0, c0 = time.perf_counter(), _cpu_self()
        n0, w0 = self._counts()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            n1, w1 = self._counts()
            cpu = _cpu_self() - c0 + (w1 - w0)
            util = cpu / (seconds * self.cpus) if seconds > 0 and self.cpus else None
            self.phases.append(PhaseCost(name, seconds, texts + n1 - n0, cpu, util))

    def result(self) -> tuple[PhaseCost, ...]:
        """The phases so far, each with its wall time in FP32 passes over the evidence."""
        ref = next((p for p in self.phases if p.phase == FP32_PHASE), None)
        per = ref.seconds if ref is not None and ref.seconds > 0 else None
        return tuple(replace(p, fp32_passes=p.seconds / per if per else None) for p in self.phases)
