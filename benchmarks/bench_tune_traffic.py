"""tune with and without traffic evidence and smoothing, side by side on the same inputs (issue 19).

    python benchmarks/bench_tune_traffic.py --assets .cache/test-assets/fast [--limit 600] [--traffic-size 1000]
        [--method minmax] [--sensitivity-layers 6] [--max-evaluations 12] [--workers 2] [--out DIR]
        [--strategies new-seq,new-whole,old] [--holdout 0.3]

Both runs use the same model folder (as `demo prepare` writes it, not smoothed), calibration set (sampled from
the assets' log) and labelled eval rows (``--limit`` of data/test.jsonl):

- ``old``: the eval set alone, the model as given (``--no-smooth``): today's strategy before traffic evidence;
- ``new-seq``: ``--traffic auto`` (log texts not in the calibration set), smoothing tried by tune itself, and
  each candidate judged on as many chunks of the search split as its decision needs (``--decision-rule
  sequential``, the default);
- ``new-whole``: the same with every candidate on the whole search split (``--decision-rule whole-split``).

The runs go in the order given (default new-seq, new-whole, old), each with its own ledger; the first one pays
for the statistics the others reuse (``stats reused`` says so), which favours the later runs.

For each it prints the INT8 share of the linear FLOPs, the holdout agreement with FP32 with its 95 % interval and
the number of texts it rests on, the labelled holdout accuracy change, whether the target was met, the wall time,
and the texts of the search split evaluated per candidate plan (median) and over all candidates (TuneResult's
evidence_cost). ``--json PATH`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import calibkit as ck  # noqa: E402


class _Progress:
    """One line to stderr when the task changes or every 30 s, so a long run shows where it is in a log."""

    def __init__(self, name: str) -> None:
        self.name, self.task, self.last, self.t0 = name, "", 0.0, time.perf_counter()

    def __call__(self, e: ck.ProgressEvent) -> None:
        now = time.perf_counter()
        if e.task != self.task or now - self.last > 30:
            self.task, self.last = e.task, now
            total = f"/{e.total}" if e.total else ""
            print(f"  [{self.name} {now - self.t0:6.0f} s] {e.task} {e.done}{total} {e.message}", file=sys.stderr,
                  flush=True)


def run(name: str, assets: Path, cset, out: Path, args: argparse.Namespace, **kw) -> dict:  # noqa: ANN001
    t0 = time.perf_counter()
    res = ck.tune(assets / "model", cset, assets / "data" / "test.jsonl", out / f"tune-{name}", max_drop=0.5,
                  min_agreement=99.0, method=args.method, limit=args.limit, seed=0, workers=args.workers,
                  holdout=args.holdout, progress=_Progress(name),
                  sensitivity_layers=args.sensitivity_layers or None, max_evaluations=args.max_evaluations, **kw).result
    seconds = time.perf_counter() - t0
    f = res.final
    hold = f.holdout_evidence
    cost = res.evidence_cost
    return {
        "strategy": name, "seconds": round(seconds, 1), "met_target": res.met_target,
        "int8_flops_fraction": f.int8_flops_fraction, "kept": len(f.kept_nodes), "method": res.methods.chosen,
        "smoothed": bool(res.smoothing and res.smoothing.chosen),
        "agreement_holdout": f.agreement_holdout,
        "agreement_holdout_low": hold.agreement.low if hold else None,
        "agreement_holdout_high": hold.agreement.high if hold else None,
        "agreement_texts_holdout": (hold.agreement_n or hold.n) if hold else 0,
        "accuracy_change_holdout": hold.accuracy_minus_fp32.estimate if hold else None,
        "labelled_holdout": hold.n if hold else 0,
        "candidates": len(res.candidates),
        "decision_rule": cost.rule if cost else None, "search_texts": res.eval_set.search,
        "texts_per_candidate": cost.texts_median if cost else None,
        "texts_over_candidates": cost.texts_total if cost else None,
        "completion_texts": cost.completion_texts if cost else 0,
        "statistics_reused": res.statistics_reused,
        "verdict": f.holdout_verdict.text if f.holdout_verdict else None,
        **_confirmation(res),
    }


def _confirmation(res) -> dict:  # noqa: ANN001
    """What the holdout confirmation (tune --confirm) did: the candidates it tested, the one it chose and the
    search's own choice, by INT8 share."""
    cf = res.confirmation
    if cf is None:
        return {"confirmed": None}
    share = {c.id: c.int8_flops_fraction for c in res.candidates}
    return {"confirmed": cf.chosen is not None, "confirm_tested": len(cf.steps),
            "confirm_texts": res.evidence_cost.confirm_texts if res.evidence_cost else None,
            "confirmed_share": share.get(cf.chosen), "search_choice_share": share.get(cf.search_choice),
            "anchors": [round(c.int8_flops_fraction, 4) for c in res.candidates if c.stage == "anchor"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", type=Path, default=Path(".cache/test-assets/fast"))
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--traffic-size", type=int, default=1000)
    ap.add_argument("--calibration-size", type=int, default=512)
    ap.add_argument("--method", default="minmax")
    ap.add_argument("--sensitivity-layers", type=int, default=6, help="0: every layer (tune's default)")
    ap.add_argument("--max-evaluations", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-tune-traffic"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--strategies", default="new-seq,new-whole,old")
    ap.add_argument("--holdout", type=float, default=0.3,
                    help="share of the eval set and of the traffic held out (0.5 with --traffic-size 10000 keeps "
                         "5,000 traffic texts the search never sees)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cset = ck.sample(args.assets / "logs.jsonl", args.out / "cset", size=args.calibration_size,
                     tokenizer=args.assets / "model")
    kinds = {
        "old": {"smooth": False, "traffic": None, "decision_rule": "whole-split"},
        "new-whole": {"smooth": True, "traffic": "auto", "traffic_size": args.traffic_size,
                      "decision_rule": "whole-split"},
        "new-seq": {"smooth": True, "traffic": "auto", "traffic_size": args.traffic_size,
                    "decision_rule": "sequential"},
    }
    rows = []
    for name in args.strategies.split(","):
        rows.append(run(name, args.assets, cset, args.out, args, **kinds[name]))
        _print(rows[-1])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _print(r: dict) -> None:
    low, high = r["agreement_holdout_low"], r["agreement_holdout_high"]
    print(f"{r['strategy']}: {100 * r['int8_flops_fraction']:.1f} % INT8 ({r['kept']} kept, {r['method']}), "
          f"holdout agreement {100 * (r['agreement_holdout'] or 0):.2f} % "
          f"[{100 * (low or 0):.2f}, {100 * (high or 0):.2f}] on {r['agreement_texts_holdout']} texts, "
          f"accuracy {100 * (r['accuracy_change_holdout'] or 0):+.2f} points on {r['labelled_holdout']} labelled, "
          f"met {r['met_target']}, {r['seconds']} s (stats reused {r['statistics_reused']}), "
          f"{r['decision_rule']}: {r['candidates']} candidates, texts per candidate median "
          f"{r['texts_per_candidate']} of {r['search_texts']}, total {r['texts_over_candidates']} "
          f"(+{r['completion_texts']} to complete the plan)", flush=True)
    if r.get("confirmed") is not None:
        chosen = r["confirmed_share"]
        print(f"  confirmation: {r['confirm_tested']} tested on {r['confirm_texts']} holdout texts, "
              f"{'chose ' + format(100 * chosen, '.1f') + ' % INT8' if chosen is not None else 'confirmed none'}; "
              f"search's choice {100 * (r['search_choice_share'] or 0):.1f} %, anchors "
              f"{[round(100 * a, 1) for a in r['anchors']]} % INT8", flush=True)


if __name__ == "__main__":
    main()
