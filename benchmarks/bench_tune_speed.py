"""tune's time to a verified plan, old code against new on the same host, resumable across runs of this script.

    python benchmarks/bench_tune_speed.py --model DIR --log LOG --work DIR --strategy new [--code DIR]
        [--traffic-size 2000] [--eval-set FILE --limit N] [--max-drop 0.5] [--min-agreement 99]
        [--tune-args JSON] [--budget SECONDS]

A strategy is a copy of the calibkit package (``--code``: the folder that holds ``calibkit/``, e.g. a checkout of
an older commit; default this checkout) running ``calibkit.tune`` with the same model, calibration set and
traffic. Each run of this script gives tune at most ``--budget`` seconds (a host that limits one command to ten
minutes cannot finish the old strategy in one go): tune runs in a child process, is stopped at the budget, and
the next run of this script starts it again on the same output folder, where tune's ledger resumes every
finished evaluation. The child runs in WORK, not in the folder this script was started from: ``python -c`` puts
the current folder first on the import path, so started from a checkout's root the child would import that
checkout's calibkit whatever ``--code`` says; the script stops before tune starts if the child would not import
``--code``'s calibkit. ``WORK/STRATEGY.state.json`` adds up the wall time and the host's CPU time over the runs
(``/proc/stat``: busy / total jiffies of every CPU, so utilisation is that of the whole host, which runs nothing
else) and, once tune has finished, its result: the INT8 share, the holdout agreement and interval, whether the
plan was confirmed, and tune's own phase table. The calibration set is sampled once (512 texts of the log).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import calibkit as ck
a = json.loads(sys.argv[1])
t0, seen = time.perf_counter(), {}


def progress(e):  # the first and last event of each step, and one a minute, with the time since tune started
    last = seen.get(e.task)
    now = time.perf_counter()
    if last is None or e.done == e.total or now - last > 60:
        seen[e.task] = now
        print(f"[{now - t0:7.1f} s] {e.task} {e.done}/{e.total} {e.message or ''}"[:200], flush=True)


kw = dict(traffic="auto", traffic_size=a["traffic_size"], seed=0, progress=progress, **a["tune_args"])
if a.get("min_agreement") is not None:
    kw["min_agreement"] = a["min_agreement"]
if a.get("max_drop") is not None:
    kw["max_drop"] = a["max_drop"]
if a.get("limit") is not None:
    kw["limit"] = a["limit"]
res = ck.tune(a["model"], a["cset"], a.get("eval_set"), a["out"], **kw).result
f, hold = res.final, res.final.holdout_evidence
conf = getattr(res, "confirmation", None)
row = {
    "int8_flops_fraction": f.int8_flops_fraction, "kept": len(f.kept_nodes), "method": res.methods.chosen,
    "met_target": res.met_target, "confirmed": None if conf is None else conf.chosen is not None,
    "claim": getattr(res, "claim", None),
    "agreement_holdout": f.agreement_holdout,
    "agreement_holdout_low": hold.agreement.low if hold and hold.agreement else None,
    "agreement_holdout_high": hold.agreement.high if hold and hold.agreement else None,
    "holdout_agreement_texts": (hold.agreement_n or hold.n) if hold else 0,
    "accuracy_change_holdout": ([hold.accuracy_minus_fp32.estimate, hold.accuracy_minus_fp32.low,
                                 hold.accuracy_minus_fp32.high] if hold and hold.accuracy_minus_fp32 else None),
    "candidates": len(res.candidates),
    "fp32_passes": getattr(res, "fp32_passes", None),
    "phases": [[p.phase, round(p.seconds, 1), p.texts, None if p.utilisation is None else round(p.utilisation, 3)]
               for p in getattr(res, "phases", ())],
    "verdict": f.holdout_verdict.text if f.holdout_verdict else None,
}
print("RESULT " + json.dumps(row), flush=True)
"""


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU of the host so far."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def child_env(code: Path) -> dict[str, str]:
    """The environment tune's child runs in: ``code``'s calibkit first on the import path."""
    return {**os.environ, "PYTHONPATH": str(code.resolve()), "PYTHONUNBUFFERED": "1"}


def imported_calibkit(code: Path, cwd: Path) -> Path:
    """The calibkit package folder a child started as tune's is (this interpreter, ``child_env(code)``, in
    ``cwd``) imports."""
    done = subprocess.run([sys.executable, "-c", "import calibkit; print(calibkit.__file__)"], env=child_env(code),
                          cwd=cwd, capture_output=True, text=True, check=True)
    return Path(done.stdout.strip()).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--strategy", required=True)
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--traffic-size", type=int, default=2000)
    ap.add_argument("--eval-set", type=Path)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--max-drop", type=float)
    ap.add_argument("--min-agreement", type=float)
    ap.add_argument("--tune-args", default="{}", help="JSON of further ck.tune keyword arguments")
    ap.add_argument("--budget", type=float, default=540.0)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve()
    package = imported_calibkit(args.code, work)
    if package != (args.code.resolve() / "calibkit").resolve():
        raise SystemExit(f"--code {args.code}: tune's child would import calibkit from {package}; give the folder "
                         f"that holds the calibkit package to measure, and a --work folder without one")
    state_path = args.work / f"{args.strategy}.state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"seconds": 0.0, "busy": 0, "total": 0,
                                                                             "runs": 0, "result": None}
    if state["result"] is not None:
        print(json.dumps(state, indent=1))
        return
    cset = work / "cset"
    if not (cset / "manifest.json").is_file():
        sys.path.insert(0, str(ROOT))
        import calibkit as ck

        # the log by its absolute path: tune's child, in WORK, finds it through the calibration set's manifest
        ck.sample(args.log.resolve(), cset, size=512, tokenizer=args.model.resolve())
    payload = {"model": str(args.model.resolve()), "cset": str(cset), "out": str(work / f"tune-{args.strategy}"),
               "traffic_size": args.traffic_size, "eval_set": str(args.eval_set.resolve()) if args.eval_set else None,
               "limit": args.limit, "max_drop": args.max_drop, "min_agreement": args.min_agreement,
               "tune_args": json.loads(args.tune_args)}
    b0, t0 = cpu_jiffies()
    w0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(payload)], env=child_env(args.code), cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump() -> None:  # tune's output, echoed as it comes (progress lines of the FP32 pass and statistics aside)
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not line.startswith("RESULT "):
                print(line.rstrip()[:200], flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=args.budget)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.join(10)
    result = next((json.loads(x[len("RESULT "):]) for x in lines if x.startswith("RESULT ")), None)
    b1, t1 = cpu_jiffies()
    state["seconds"] += time.perf_counter() - w0
    state["busy"] += b1 - b0
    state["total"] += t1 - t0
    state["runs"] += 1
    state["utilisation"] = state["busy"] / state["total"] if state["total"] else None
    state["result"] = result
    state_path.write_text(json.dumps(state, indent=1))
    word = "finished" if result is not None else f"stopped at the budget ({proc.returncode}); run again to resume"
    print(f"{args.strategy}: {word} after {state['seconds']:.0f} s over {state['runs']} run(s), host CPU "
          f"utilisation {100 * (state['utilisation'] or 0):.0f} %")
    print(json.dumps(state, indent=1))


if __name__ == "__main__":
    main()
