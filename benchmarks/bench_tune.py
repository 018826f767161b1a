"""Mixed-precision tuning on the demo model against the best peer settings of REFERENCES.md §5, in one run.

    .venv/bin/python benchmarks/bench_tune.py [--model demo_assets/model] [--data demo_assets/data]
        [--logs demo_assets/logs.jsonl] [--max-drop 0.5] [--no-peers]

1. a 512-text calibration set sampled from the production log (`calibkit sample`);
2. `calibkit tune --max-drop 0.5` (method auto): FP32, all-INT8 and the plan on its search and holdout splits,
   and the INT8 share of MatMul/Gemm FLOPs;
3. the peers on the same calibration texts: ONNX Runtime quantize_static Entropy and MinMax (QDQ, symmetric
   int8, per-channel weights, every text padded to 64 tokens since variable lengths fail there), evaluated on
   the same holdout split and on the whole test split.
Targets (issue 5): plan <= 0.5 point below FP32 on the holdout split with >= 85 % of the FLOPs in INT8.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CLI = [PY, "-m", "calibkit"]


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def accuracy(model_dir: Path, onnx_path: Path, texts: list[str], y) -> float:  # noqa: ANN001
    import numpy as np

    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    tok = TextTokenizer(model_dir)
    with OnnxRuntimeRunner(onnx_path) as r:
        logits = predict_logits(r, tok, texts, batch_size=64)
    return float(np.mean(logits.argmax(1) == y))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "demo_assets/model"))
    ap.add_argument("--data", default=str(ROOT / "demo_assets/data"))
    ap.add_argument("--logs", default=str(ROOT / "demo_assets/logs.jsonl"))
    ap.add_argument("--max-drop", type=float, default=0.5)
    ap.add_argument("--method", default="auto")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()

    from calibkit.data.evalset import label_ids, load_eval_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.evaluate.tune import split_eval
    from calibkit.requests.tune import TuneRequest

    tmp = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    md = ModelDir.resolve(args.model)
    cset = tmp / "calib"
    t_sample = run([*CLI, "sample", args.logs, "--size", "512", "--tokenizer", args.model, "--out", str(cset)])
    t_tune = run([*CLI, "tune", args.model, "-c", str(cset), "-e", str(Path(args.data) / "test.jsonl"),
                  "--max-drop", str(args.max_drop), "--method", args.method, "--out", str(tmp / "tune"),
                  "--no-report"])
    doc = json.loads((tmp / "tune" / "tune.json").read_text())
    ev = load_eval_set(Path(args.data) / "test.jsonl")
    y = label_ids(ev, md.id2label, len(md.id2label))
    cfg = TuneRequest(model=md, calibration_set=cset)
    _, hold = split_eval(y, cfg.holdout_fraction, cfg.seed, texts=ev.texts)
    hold_texts = [ev.texts[i] for i in hold]

    rows = [
        ("FP32", doc["target"]["fp32_accuracy_holdout"], None, 0.0),
        ("calibkit all-INT8 (" + doc["methods"]["chosen"] + ")", doc["final"]["all_int8_accuracy_holdout"], None,
         1.0),
        (f"calibkit tuned plan ({len(doc['final']['kept_nodes'])} kept)", doc["final"]["accuracy_holdout"], None,
         doc["final"]["int8_flops_fraction"]),
    ]
    if not args.no_peers:
        bench_calib = str(ROOT / "benchmarks" / "bench_calibrate.py")
        for m in ("Entropy", "MinMax"):
            out = tmp / f"ort-{m}.onnx"
            proc = subprocess.run([PY, bench_calib, "--worker", "ort", "--model", args.model, "--calib", str(cset),
                                   "--method", m, "--out", str(out)], capture_output=True, text=True)
            res = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"ok": False}
            if res.get("ok") and out.is_file():
                rows.append((f"ORT quantize_static {m} pad64", accuracy(Path(args.model), out, hold_texts, y[hold]),
                             accuracy(Path(args.model), out, list(ev.texts), y), None))
            else:
                rows.append((f"ORT quantize_static {m} pad64 (FAILED)", float("nan"), None, None))
    fp32 = rows[0][1]
    print(f"holdout split: {len(hold)} of {len(ev)} test texts; tune took {t_tune:.0f} s (sample {t_sample:.0f} s)")
    print(f"{'what':44s} {'holdout %':>9s} {'vs FP32':>8s} {'INT8 FLOPs':>10s} {'all test %':>10s}")
    for name, acc, acc_all, frac in rows:
        a = float("nan") if acc is None else 100 * acc
        fr = "" if frac is None else f"{100 * frac:9.1f}%"
        al = "" if acc_all is None else f"{100 * acc_all:10.2f}"
        print(f"{name:44s} {a:9.2f} {a - 100 * fp32:+8.2f} {fr:>10s} {al:>10s}")
    met = doc["final"]["accuracy_holdout"] >= fp32 - args.max_drop / 100 and doc["final"]["int8_flops_fraction"] >= 0.85
    print(f"target (<= {args.max_drop} point below FP32 on holdout, >= 85 % FLOPs INT8): {'met' if met else 'NOT met'}")
    print(f"(artifacts in {tmp})")


if __name__ == "__main__":
    main()
