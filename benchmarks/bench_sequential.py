"""How many traffic texts a candidate costs under each decision rule of calibkit.evidence.sequential.

For the constraint "agreement with FP32 >= 99 %" at a given confidence, each candidate is a stream of per-text
outcomes (1: same prediction as FP32). The stream is either simulated (flips drawn at a true flip rate) or, with
``--outcomes FILE.npy``, a real candidate's per-text outcomes on traffic texts, resampled in random orders.
For each rule the script reports the texts evaluated per candidate (median, mean), how often the candidate was
certified (meets), rejected (misses) or left undecided, and the share of wrong decisions.

    python benchmarks/bench_sequential.py                      # simulation, split of 2,800 texts
    python benchmarks/bench_sequential.py --split 5000 --runs 2000
    python benchmarks/bench_sequential.py --outcomes same.npy  # a real candidate's outcomes
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calibkit.evidence.sequential import ConfidenceSequenceRule, Constraint, WholeSplit, run_rule


def simulate(rule, draws: list[np.ndarray], runs: int, split: int, target: float, true_rate: float) -> dict[str, float]:
    c = Constraint.agreement(target)
    used, verdicts = [], []
    for r in range(runs):
        vals = draws[r]
        out = run_rule(rule, [c], split, lambda a, b, v=vals: {"agreement": v[a:b]})
        used.append(out.evaluated)
        verdicts.append(out.verdict)
    v = np.asarray([x.value for x in verdicts])
    wrong = (v == "meets") if true_rate < target else (v == "misses") if true_rate > target else np.zeros(runs, bool)
    return {"median": float(np.median(used)), "mean": float(np.mean(used)), "meets": float((v == "meets").mean()),
            "misses": float((v == "misses").mean()), "undecided": float((v == "undecided").mean()),
            "wrong": float(wrong.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", type=int, default=2800, help="texts in the search split (default 2,800: 4,000 "
                    "traffic texts, 30 %% held out)")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--flips", default="0.001,0.005,0.0075,0.01,0.0125,0.015,0.03,0.05",
                    help="true flip rates to simulate (comma-separated)")
    ap.add_argument("--confidence", default="0.9,0.95")
    ap.add_argument("--outcomes", default=None, help=".npy of a real candidate's per-text 0/1 outcomes")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    print(f"agreement >= {a.target:.2%}; search split {a.split:,} texts; {a.runs:,} runs per row; "
          + ("outcomes resampled from " + a.outcomes if a.outcomes else "simulated Bernoulli flips"))
    print(f"{'flips':>6} {'conf':>5} | {'rule':<20} {'median':>7} {'mean':>7} {'meets':>6} {'misses':>6} "
          f"{'undec':>6} {'wrong':>6}")
    real = np.load(a.outcomes).astype(np.float64).ravel() if a.outcomes else None
    rates = [1.0 - float(real.mean())] if real is not None else [float(x) for x in a.flips.split(",")]
    for flip in rates:
        for conf in (float(x) for x in a.confidence.split(",")):
            rng = np.random.default_rng(a.seed)
            if real is not None:
                draws = [rng.choice(real, size=a.split, replace=len(real) < a.split) for _ in range(a.runs)]
            else:
                draws = [(rng.random(a.split) >= flip).astype(np.float64) for _ in range(a.runs)]
            for rule in (WholeSplit(conf), ConfidenceSequenceRule(conf)):
                s = simulate(rule, draws, a.runs, a.split, a.target, 1.0 - flip)
                print(f"{flip:>6.2%} {conf:>5.2f} | {rule.name:<20} {s['median']:>7,.0f} {s['mean']:>7,.0f} "
                      f"{s['meets']:>6.1%} {s['misses']:>6.1%} {s['undecided']:>6.1%} {s['wrong']:>6.1%}")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
