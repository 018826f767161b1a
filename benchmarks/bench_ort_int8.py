"""ONNX Runtime CPU speed: FP32 vs INT8 (Target.ONNXRUNTIME layout) vs INT8 (Target.TENSORRT layout).

    .venv/bin/python benchmarks/bench_ort_int8.py [--model .cache/test-assets/fast/model] \
        [--data .cache/test-assets/fast/data/test.jsonl] [--texts 256] [--threads 2]

Sequence lengths are the real ones of test-set texts (each batch padded to its longest member, texts in file
order, not sorted). The table is a quick max|x| (minmax) table from 64 training texts, so this script does not
depend on `calibkit calibrate`. It prints texts/s per variant and batch size, the ratio to FP32 measured in the
same run, how many MatMuls ONNX Runtime fused into integer kernels, and argmax agreement with FP32.
Timings are noisy on shared machines: compare ratios from one run, not absolute numbers across runs.

On the fast demo variant pass ``--exclude /classifier/``: its logistic-regression head has weights up to 3.6e31
(folded standardisation of near-constant features) that per-channel INT8 cannot represent, so with the head
quantized every INT8 variant predicts nearly one class (agreement ~35-65 %); speed is unaffected.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from calibkit.data.tokenizer import TextTokenizer
from calibkit.graph import add_outputs, load_model, tap_name
from calibkit.quantize.placement import plan_placement
from calibkit.quantize.qdq import Target, quantize_model
from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange

ROOT = Path(__file__).resolve().parents[1]


def read_texts(path: Path, n: int) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(json.loads(line)["text"])
            if len(out) >= n:
                break
    return out


def session(model: onnx.ModelProto | bytes, threads: int, optimized_path: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if optimized_path:
        opts.optimized_model_filepath = optimized_path
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def minmax_table(model: onnx.ModelProto, tok: TextTokenizer, texts: list[str], threads: int) -> CalibrationTable:
    acts = plan_placement(model).activations
    tapped = add_outputs(model, acts)
    sess = session(tapped, threads)
    names = [i.name for i in sess.get_inputs()]
    outs = [tap_name(t, model) for t in acts]
    amax = dict.fromkeys(acts, 0.0)
    for i in range(0, len(texts), 16):
        vals = sess.run(outs, tok.encode(texts[i : i + 16]).feeds(names))
        for t, v in zip(acts, vals):
            amax[t] = max(amax[t], float(np.abs(v).max()))
    return CalibrationTable("", "bench", Method.MINMAX, MethodParams(),
                            tuple(TensorRange(t, a, Method.MINMAX) for t, a in amax.items()))


def fused_ops(model: onnx.ModelProto, threads: int) -> Counter[str]:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "opt.onnx")
        session(model, threads, p)
        return Counter(n.op_type for n in onnx.load(p).graph.node)


def bench(sess: ort.InferenceSession, batches: list[dict[str, np.ndarray]], repeat: int) -> tuple[float, np.ndarray]:
    sess.run(["logits"], batches[0])
    best = float("inf")
    preds = np.zeros(0)
    for _ in range(repeat):
        t0 = time.perf_counter()
        preds_l = [sess.run(["logits"], b)[0].argmax(-1) for b in batches]
        best = min(best, time.perf_counter() - t0)
        preds = np.concatenate(preds_l)
    return best, preds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / ".cache/test-assets/fast/model"))
    ap.add_argument("--data", default=str(ROOT / ".cache/test-assets/fast/data/test.jsonl"))
    ap.add_argument("--calib", default=str(ROOT / ".cache/test-assets/fast/data/train.jsonl"))
    ap.add_argument("--texts", type=int, default=256, help="texts timed at batch 16 (batch 1 times a quarter)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="best of N passes")
    ap.add_argument("--exclude", action="append", default=[], help="node-name regex kept FP32 (repeatable)")
    args = ap.parse_args()

    model_dir = Path(args.model)
    fp32 = load_model(model_dir / "model.onnx")
    tok = TextTokenizer(model_dir)
    t0 = time.perf_counter()
    table = minmax_table(fp32, tok, read_texts(Path(args.calib), 64), args.threads)
    print(f"minmax table: {len(table.ranges)} tensors in {time.perf_counter() - t0:.1f} s")
    variants: dict[str, onnx.ModelProto] = {"fp32": fp32}
    for target in (Target.ONNXRUNTIME, Target.TENSORRT):
        t0 = time.perf_counter()
        res = quantize_model(fp32, table, target=target, exclude=args.exclude)
        dt = time.perf_counter() - t0
        variants[f"int8-{target.value}"] = res.model
        ops = fused_ops(res.model, args.threads)
        print(f"int8-{target.value}: quantize_model {dt * 1000:.0f} ms, {len(res.quantized_nodes)} nodes quantized; "
              f"optimized graph: MatMulIntegerToFloat={ops['MatMulIntegerToFloat']} "
              f"QLinearMatMul={ops['QLinearMatMul']} MatMul={ops['MatMul']} "
              f"QuantizeLinear={ops['QuantizeLinear']} DequantizeLinear={ops['DequantizeLinear']}")

    texts = read_texts(Path(args.data), args.texts)
    lengths = tok.token_lengths(texts)
    print(f"{len(texts)} test texts, token length p50 {int(np.median(lengths))}, max {int(lengths.max())}")
    sessions = {k: session(m, args.threads) for k, m in variants.items()}
    names = [i.name for i in sessions["fp32"].get_inputs()]
    for bs in (1, 16):
        use = texts[: max(16, len(texts) // 4)] if bs == 1 else texts
        batches = [tok.encode(use[i : i + bs]).feeds(names) for i in range(0, len(use), bs)]
        base, base_pred = bench(sessions["fp32"], batches, args.repeat)
        for k, s in sessions.items():
            t, pred = (base, base_pred) if k == "fp32" else bench(s, batches, args.repeat)
            print(f"batch {bs:2d} {k:18s} {len(use) / t:8.1f} texts/s  x{base / t:4.2f} vs fp32  "
                  f"argmax agreement {float((pred == base_pred).mean()) * 100:5.1f} %")


if __name__ == "__main__":
    main()
