"""Calibration cost and accuracy: calibkit vs plain FP32 inference (the floor) vs ONNX Runtime quantize_static.

    .venv/bin/python benchmarks/bench_calibrate.py [--model .cache/test-assets/fast/model] \
        [--data .cache/test-assets/fast/data] [--texts 512] [--no-peers] [--accuracy] [--test-texts 2114] \
        [--exclude /classifier/]

Each measurement runs in its own subprocess (peak RSS from wait4), one after the other:
- floor: FP32 ONNX Runtime inference over the calibration texts (length-bucketed batches of 32),
- calibkit: `calibrate` end to end (fresh statistics: the cache is a temporary folder), entropy, then the other
  methods reusing the statistics,
- ORT quantize_static, Entropy and MinMax, QDQ, every text padded to 64 tokens (variable lengths fail there,
  REFERENCES.md §5),
- ModelOpt ONNX PTQ: not measured here (needs torch + nvidia-modelopt in a separate venv); see REFERENCES §5.
With --accuracy every INT8 model is run by ONNX Runtime on the held-out test set (test.jsonl) against FP32.
Timings are noisy on shared machines: read the ratios measured within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _ort_reader import padded_reader

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def read_jsonl(path: Path, n: int | None = None) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(json.loads(line))
            if n is not None and len(out) >= n:
                break
    return out


# -- workers (run in subprocesses) -----------------------------------------------------------------------------
def worker_floor(args: argparse.Namespace) -> dict:
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    texts = [r["text"] for r in read_jsonl(Path(args.calib) / "texts.jsonl")]
    t0 = time.perf_counter()
    tok = TextTokenizer(args.model)
    with OnnxRuntimeRunner(Path(args.model) / "model.onnx") as runner:
        predict_logits(runner, tok, texts, batch_size=32)
    return {"seconds": time.perf_counter() - t0}


def worker_calibkit(args: argparse.Namespace) -> dict:
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.types import Method

    t0 = time.perf_counter()
    res = calibrate(CalibrateRequest(model=ModelDir.resolve(args.model),
                                     calibration_set=load_calibration_set(args.calib), method=Method(args.method),
                                     out=Path(args.out), cache_dir=Path(args.cache_dir), target=args.target,
                                     exclude=[args.exclude] if args.exclude else ()))
    return {"seconds": time.perf_counter() - t0, "reused": res.reused_stats, "timings": res.timings}


def worker_ort(args: argparse.Namespace) -> dict:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from calibkit.data.tokenizer import TextTokenizer

    texts = [r["text"] for r in read_jsonl(Path(args.calib) / "texts.jsonl")]
    tok = TextTokenizer(args.model)


    excluded = []
    if args.exclude:
        import re

        import onnx

        graph = onnx.load(str(Path(args.model) / "model.onnx"), load_external_data=False).graph
        excluded = [n.name for n in graph.node if re.search(args.exclude, n.name)]
    t0 = time.perf_counter()
    try:
        quantize_static(
            str(Path(args.model) / "model.onnx"), args.out, padded_reader(tok, texts, 64), quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul", "Gemm"], calibrate_method=getattr(CalibrationMethod, args.method),
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True}, nodes_to_exclude=excluded,
        )
        ok, err = True, ""
    except Exception as exc:  # peers fail in their own ways; the failure is the measurement
        ok, err = False, f"{type(exc).__name__}: {str(exc)[:160]}"
    return {"seconds": time.perf_counter() - t0, "ok": ok, "error": err}


def worker_accuracy(args: argparse.Namespace) -> dict:
    import numpy as np

    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    md = ModelDir.resolve(args.model)
    rows = read_jsonl(Path(args.data) / "test.jsonl", args.test_texts)
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    label2id = md.label2id
    y = np.array([label2id[r["label"]] for r in rows])
    with OnnxRuntimeRunner(args.onnx) as runner:
        logits = predict_logits(runner, tok, [r["text"] for r in rows], batch_size=64)
    return {"accuracy": float((logits.argmax(1) == y).mean() * 100)}


WORKERS = {"floor": worker_floor, "calibkit": worker_calibkit, "ort": worker_ort, "accuracy": worker_accuracy}


# -- driver ----------------------------------------------------------------------------------------------------
def spawn(kind: str, **kw: object) -> dict:
    cmd = [PY, __file__, "--worker", kind]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stdout, stderr = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        return {"ok": False, "error": stderr.strip().splitlines()[-1][:200] if stderr.strip() else "crashed",
                "peak_rss_gb": usage.ru_maxrss / 1e6, "wall": wall}
    out = json.loads(stdout.strip().splitlines()[-1])
    out.update(peak_rss_gb=usage.ru_maxrss / 1e6, wall=wall)  # ru_maxrss is in KiB on Linux
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=sorted(WORKERS))
    ap.add_argument("--model", default=str(ROOT / ".cache/test-assets/fast/model"))
    ap.add_argument("--data", default=str(ROOT / ".cache/test-assets/fast/data"))
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--test-texts", type=int, default=None)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--calib", default="")
    ap.add_argument("--method", default="entropy")
    ap.add_argument("--out", default="")
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--target", default="tensorrt")
    ap.add_argument("--onnx", default="")
    ap.add_argument("--exclude", default="", help="a node-name regex kept FP32 (calibkit and ORT), e.g. /classifier/")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return

    from calibkit.data.calibset import write_calibration_set

    tmp = Path(tempfile.mkdtemp(prefix="bench-calib-"))
    rows = read_jsonl(Path(args.data) / "train.jsonl", args.texts)
    calib = tmp / "calib"
    write_calibration_set(calib, [r["text"] for r in rows], None, {"source": "bench"})
    common = {"model": args.model, "calib": calib}
    res: dict[str, dict] = {}
    res["floor"] = spawn("floor", **common)
    cache = tmp / "stats-cache"
    ex = {"exclude": args.exclude} if args.exclude else {}
    res["calibkit entropy"] = spawn("calibkit", **common, method="entropy", out=tmp / "ck-entropy", cache_dir=cache,
                                    **ex)
    for m in ("minmax", "percentile", "mse"):
        res[f"calibkit {m} (reused)"] = spawn("calibkit", **common, method=m, out=tmp / f"ck-{m}", cache_dir=cache,
                                              **ex)
    if not args.no_peers:
        for m in ("Entropy", "MinMax"):
            res[f"ORT quantize_static {m} pad64"] = spawn("ort", **common, method=m, out=tmp / f"ort-{m}.onnx", **ex)
    floor = res["floor"].get("seconds") or float("nan")
    ck = res["calibkit entropy"].get("seconds") or float("nan")
    print(f"{len(rows)} calibration texts; model {args.model}; noisy shared CPU: read ratios within this run")
    print(f"{'what':38s} {'seconds':>8s} {'x floor':>8s} {'peak GB':>8s}  note")
    for k, v in res.items():
        s = v.get("seconds")
        note = "" if v.get("ok", True) else f"FAILED {v.get('error', '')}"
        if k.startswith("ORT") and s and v.get("ok", True):
            note = f"calibkit is {s / ck:.1f}x faster"
        print(f"{k:38s} {s if s else float('nan'):8.2f} {(s or float('nan')) / floor:8.2f} "
              f"{v['peak_rss_gb']:8.2f}  {note}")
    print("ModelOpt ONNX PTQ: not measured (torch + nvidia-modelopt not installed); REFERENCES §5 quotes 31-58 s, "
          "1.7 GB for 128-256 texts")
    if args.accuracy:
        tt = {} if args.test_texts is None else {"test_texts": args.test_texts}
        acc = {"FP32": spawn("accuracy", model=args.model, data=args.data, onnx=Path(args.model) / "model.onnx", **tt)}
        for m in ("entropy", "minmax", "percentile", "mse"):
            acc[f"calibkit {m}"] = spawn("accuracy", model=args.model, data=args.data,
                                         onnx=tmp / f"ck-{m}" / "model.int8.onnx", **tt)
        if not args.no_peers:
            for m in ("Entropy", "MinMax"):
                p = tmp / f"ort-{m}.onnx"
                if p.is_file():
                    acc[f"ORT {m} pad64"] = spawn("accuracy", model=args.model, data=args.data, onnx=p, **tt)
        base = acc["FP32"].get("accuracy", float("nan"))
        print(f"\n{'held-out accuracy (ORT CPU)':38s} {'acc %':>8s} {'vs FP32':>8s}")
        for k, v in acc.items():
            a = v.get("accuracy", float("nan"))
            print(f"{k:38s} {a:8.2f} {a - base:+8.2f}")
    print(f"(artifacts in {tmp})")


if __name__ == "__main__":
    main()
