"""The served INT8 model beside FP32 and ONNX Runtime's own quantizer, measured as calibkit measures speed.

    python benchmarks/bench_served_speed.py --model demo_assets/model --log demo_assets/logs.jsonl \
        --work /tmp/served --threads 2 [--threads 16] [--int8 runs/tune-ort/model.int8.onnx]

One process, one measurement (calibkit.evaluate.speed.measure_speed: every graph optimization, the same batches
of log texts at batch 1 and 32, interleaved rounds, warm-up excluded, the ratio of medians with the lowest and
highest round) of: FP32; calibkit's onnxruntime layout (``--int8``, else all-INT8 from a minmax table on 256
log texts, calibrated here); ONNX Runtime's ``quantize_dynamic`` per-channel and per-tensor. Agreement of each
with FP32 (argmax) on ``--agreement-texts`` other log texts. Each thread count is one entry of
``WORK/served-speed.json``, kept between runs: a rerun measures only what is missing (a machine lent for a few
minutes finishes over several runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def log_texts(path: Path) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                t = json.loads(line).get("text")
            except (ValueError, AttributeError):
                continue
            if isinstance(t, str) and t.strip() and t not in seen:
                seen.add(t)
                out.append(t)
    return out


def models(model_dir: Path, texts: list[str], work: Path, int8: Path | None) -> dict[str, Path]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import calibkit as ck

    fp32 = model_dir / "model.onnx"
    out = {"FP32": fp32}
    if int8 is None:
        int8 = work / "calibrate" / "model.int8.onnx"
        if not int8.is_file():
            from calibkit.data.calibset import write_calibration_set

            cset = work / "cset"
            if not (cset / "manifest.json").is_file():
                write_calibration_set(cset, texts[:256], None, {"source": "bench_served_speed: the log's first 256"})
            ck.calibrate(model_dir, cset, out=work / "calibrate", method="minmax", target="onnxruntime")
    out["calibkit onnxruntime layout"] = int8
    for name, per_channel in (("quantize_dynamic per-channel", True), ("quantize_dynamic per-tensor", False)):
        path = work / f"qd-{'pc' if per_channel else 'pt'}.onnx"
        if not path.is_file():
            quantize_dynamic(str(fp32), str(path), per_channel=per_channel, weight_type=QuantType.QInt8)
        out[name] = path
    return out


def agreement(paths: dict[str, Path], model_dir: Path, texts: list[str], threads: int) -> dict[str, float]:
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner
    from calibkit.evaluate.predict import predict_logits

    tok = TextTokenizer(model_dir)
    preds = {}
    for name, p in paths.items():
        with model_runner(p, threads=threads) as r:
            preds[name] = predict_logits(r, tok, texts, batch_size=32).argmax(1)
    return {n: float(np.mean(p == preds["FP32"])) for n, p in preds.items() if n != "FP32"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--threads", type=int, action="append", required=True)
    ap.add_argument("--int8", type=Path, default=None, help="calibkit's served model (default: all-INT8 minmax)")
    ap.add_argument("--agreement-texts", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0, help="time budget of the counted rounds")
    args = ap.parse_args(argv)
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner
    from calibkit.evaluate.speed import cpu_description, measure_speed, text_batches
    from calibkit.graph import load_model, model_input_names

    args.work.mkdir(parents=True, exist_ok=True)
    texts = log_texts(args.log)
    calib, rest = texts[:256], texts[256:]
    paths = models(args.model, calib, args.work, args.int8)
    state_path = args.work / "served-speed.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    cpu, isa = cpu_description()
    state["host"] = {"cpu": cpu, "isa": isa, "cores": os.cpu_count(), "python": platform.python_version(),
                     "onnxruntime": __import__("onnxruntime").__version__}
    if "agreement" not in state:
        state["agreement"] = agreement(paths, args.model, rest[-args.agreement_texts:], max(args.threads))
        state_path.write_text(json.dumps(state, indent=1))
    tok = TextTokenizer(args.model)
    names = model_input_names(load_model(args.model / "model.onnx", load_external_data=False))
    batches = text_batches(tok, names, rest[:-args.agreement_texts], seed=0)
    for t in args.threads:
        key = f"threads={t}"
        if key in state:
            continue
        speeds = measure_speed({n: p for n, p in paths.items()}, "FP32", batches, make_runner=model_runner,
                               threads=t, seconds=args.seconds)
        state[key] = {n: {"words": s.words, "at": [b.__dict__ for b in s.at], "rounds": s.rounds}
                      for n, s in speeds.items()}
        state_path.write_text(json.dumps(state, indent=1))
    for key, v in state.items():
        if key.startswith("threads="):
            print(key)
            for n, s in v.items():
                print(f"  {n}: {s['words']} (agreement with FP32 {100 * state['agreement'][n]:.2f} %)")
    print(json.dumps(state["host"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
