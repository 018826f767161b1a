"""One-node variants on a switchboard: wall time and host CPU utilisation of one batch of sensitivity jobs.

    python benchmarks/bench_board_units.py --model DIR --log LOG [--texts 256] [--variants 12] [--workers N]

The model's all-INT8 variant and ``--variants`` one-node variants (that node alone INT8), each on the same
``--texts`` texts drawn from the log (seeded), run as one call on a process pool of ``--workers`` (default: one
per usable CPU), as tune's sensitivity step runs them. The table gives every activation the same range: the
arithmetic, not the accuracy, is what is timed. Prints the wall time of a first call (boards built, shipped and
loaded by every worker) and of a second (sessions reused), each with the host's CPU utilisation.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def cpu() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--variants", type=int, default=12)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--work", type=Path, default=Path("runs/bench-board-units"))
    args = ap.parse_args()
    import numpy as np

    from calibkit.evaluate.boardjobs import run_on_boards
    from calibkit.evaluate.jobs import ALL_INT8, ONLY_THIS, SensitivityJob
    from calibkit.executors import default_workers
    from calibkit.executors.pool import ProcessPoolExecutor
    from calibkit.graph import load_model
    from calibkit.quantize.placement import plan_placement
    from calibkit.quantize.tablefile import write_calibration_json
    from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange

    model = args.model / "model.onnx"
    placement = plan_placement(load_model(model, load_external_data=False))
    nodes = [n.name for n in placement.nodes]
    table = CalibrationTable("bench", "bench", Method.MINMAX, MethodParams(),
                             tuple(TensorRange(t, 8.0, Method.MINMAX) for t in placement.activations))
    args.work.mkdir(parents=True, exist_ok=True)
    write_calibration_json(args.work / "calibration.json", table, {"target": "tensorrt"})
    from bench_tune_scale import log_texts  # type: ignore[import-not-found]

    xs = tuple(random.Random(0).sample(log_texts(args.log), args.texts))
    ref = np.zeros((len(xs), 2))
    base = dict(source_model=str(model), calibration_json=str(args.work / "calibration.json"),
                tokenizer=str(args.model), texts=xs, labels=(), reference_logits=ref)
    jobs = [SensitivityJob(keep_nodes=(), mode=ALL_INT8, **base)]  # type: ignore[arg-type]
    jobs += [SensitivityJob(keep_nodes=tuple(x for x in nodes if x != n), mode=ONLY_THIS, node=n, **base)  # type: ignore[arg-type]
             for n in nodes[: args.variants]]
    workers = args.workers or default_workers()
    with ProcessPoolExecutor(workers) as ex:
        for call in ("first call (boards built and loaded)", "second call (sessions reused)"):
            b0, t0 = cpu()
            w0 = time.perf_counter()
            run_on_boards(jobs, ex, lambda i, r: None)
            b1, t1 = cpu()
            print(f"{call}: {len(jobs)} jobs x {len(xs)} texts on {workers} workers in "
                  f"{time.perf_counter() - w0:.1f} s, host CPU {100 * (b1 - b0) / max(t1 - t0, 1):.0f} %", flush=True)


if __name__ == "__main__":
    main()
