"""An experiment kept for its negative result: GPTQ rounding of a Q/DQ model's INT8 weights.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_gptq.py --fp32 FP32.onnx --int8 INT8.onnx --model-dir DIR \
        --calib TEXTS.jsonl --eval TEXTS.jsonl

Rounds every 2-D weight of INT8.onnx (a Q/DQ model whose tensors carry FP32.onnx's names, as ``calibkit
calibrate`` and ``build`` write them) again with GPTQ (Frantar et al., 2022): columns in order of decreasing
activation energy, each rounding error fed forward through the inverse of the damped X^T X of the FP32 inputs
over the calibration texts' real tokens; the per-channel scales stay. Prints the weights' proxy output error
trace(dW^T X^T X dW) before and after, then flips of FP32's predictions and KL divergence for the original and
the re-rounded model, both run as exact Q/DQ (ONNX Runtime, graph optimizations off). For a classifier.

The zoo's files come from ``benchmarks/bench_zoo.py --out DIR``: ``DIR/runs/NAME/{fp32,int8}.onnx``,
``DIR/models/NAME``, ``DIR/calib/texts.jsonl``, ``DIR/eval.jsonl``. For the demo model: ``demo_assets/runs/
smoothed-model/model.onnx`` with ``demo_assets/runs/calibrate-minmax-smoothed/model.int8.onnx``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_zoo import exact_qdq_runner  # noqa: E402

from calibkit.data.tokenizer import TextTokenizer  # noqa: E402
from calibkit.engines.onnxruntime import OnnxRuntimeRunner  # noqa: E402
from calibkit.tasks import choose_task, model_outputs  # noqa: E402

DAMP = 0.01


def read_texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def weight_jobs(int8: onnx.ModelProto) -> list[tuple[str, str, bool]]:
    """(FP32 activation name, weight name, Gemm transB) of every MatMul/Gemm whose B is a dequantized weight."""
    inits = {i.name for i in int8.graph.initializer}
    dq = {n.output[0]: n for n in int8.graph.node if n.op_type == "DequantizeLinear"}
    jobs = []
    for n in int8.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or n.input[1] not in dq or dq[n.input[1]].input[0] not in inits:
            continue
        weight = dq[n.input[1]].input[0][: -len("_quantized")]
        act = n.input[0].removesuffix("_DequantizeLinear_Output")
        trans = n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute)
        jobs.append((act, weight, trans))
    return jobs


def hessians(fp32_path: Path, tok: TextTokenizer, texts: list[str], acts: list[str]) -> dict[str, np.ndarray]:
    """X^T X / rows of each activation over the texts' real tokens (padding masked)."""
    m = onnx.load(str(fp32_path))
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(a) for a in acts if a not in have)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    sums: dict[str, np.ndarray] = {}
    rows = dict.fromkeys(acts, 0)
    for start in range(0, len(texts), 32):
        enc = tok.encode(texts[start : start + 32])
        feeds = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
                 "token_type_ids": np.zeros_like(enc.input_ids)}
        mask = enc.attention_mask.astype(bool)
        for a, x in zip(acts, sess.run(acts, {k: v for k, v in feeds.items() if k in names})):
            x = x[mask] if x.ndim == 3 and x.shape[:2] == mask.shape else x.reshape(-1, x.shape[-1])
            x = x.astype(np.float64)
            sums[a] = sums.get(a, 0) + x.T @ x
            rows[a] += len(x)
    return {a: sums[a] / rows[a] for a in acts}


def gptq(w: np.ndarray, scale: np.ndarray, h: np.ndarray) -> np.ndarray:
    """int8 codes of ``w`` [K, N] (per-column ``scale``) rounded in order of decreasing diag(h), errors fed forward."""
    k = w.shape[0]
    wt = w.T.astype(np.float64).copy()
    h = h.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    wt[:, dead] = 0
    order = np.argsort(-np.diag(h))
    wt, h = wt[:, order], h[order][:, order]
    h += DAMP * np.mean(np.diag(h)) * np.eye(k)
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    q = np.zeros_like(wt)
    s = scale.astype(np.float64)
    for i in range(k):
        q[:, i] = np.clip(np.rint(wt[:, i] / s), -127, 127)
        err = (wt[:, i] - q[:, i] * s) / u[i, i]
        wt[:, i + 1 :] -= np.outer(err, u[i, i + 1 :])
    return q[:, np.argsort(order)].T


def proxy_error(codes: np.ndarray, scale: np.ndarray, w: np.ndarray, h: np.ndarray) -> float:
    """trace(dW^T H dW): the mean squared output error the rounding adds, over the calibration tokens."""
    d = codes * scale - w
    return float(np.trace(d.T @ h @ d))


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=-1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=-1, keepdims=True)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--fp32", "--int8", "--model-dir", "--calib", "--eval"):
        ap.add_argument(flag, type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None, help="the re-rounded model (default: in a new temp folder)")
    args = ap.parse_args()
    fp32, int8 = onnx.load(str(args.fp32)), onnx.load(str(args.int8))
    task = choose_task(model_outputs(fp32), json.loads((args.model_dir / "config.json").read_text()))
    tok = TextTokenizer(args.model_dir)
    jobs = weight_jobs(int8)
    h = hessians(args.fp32, tok, read_texts(args.calib), sorted({a for a, _, _ in jobs}))
    fp32_w = {i.name: i for i in fp32.graph.initializer}
    inits = {i.name: i for i in int8.graph.initializer}
    before = after = 0.0
    for act, name, trans in jobs:
        w = numpy_helper.to_array(fp32_w[name]).astype(np.float32)
        if w.ndim != 2:
            continue
        w = w.T if trans else w
        scale = numpy_helper.to_array(inits[f"{name}_scale"]).astype(np.float32)
        scale = np.full(w.shape[1], float(scale)) if scale.ndim == 0 else scale
        q = gptq(w, scale, h[act])
        before += proxy_error(np.clip(np.rint(w / scale), -127, 127), scale, w, h[act])
        after += proxy_error(q, scale, w, h[act])
        inits[f"{name}_quantized"].CopyFrom(numpy_helper.from_array((q.T if trans else q).astype(np.int8),
                                                                     f"{name}_quantized"))
    out = args.out or Path(tempfile.mkdtemp(prefix="calibkit-gptq-")) / "model.gptq.onnx"
    onnx.save(int8, str(out))
    print(f"{len(jobs)} weights; proxy output error {before:.4g} -> {after:.4g} ({after / before:.3f}x)")
    texts = read_texts(args.eval)
    with OnnxRuntimeRunner(args.fp32.read_bytes(), name="fp32") as r:
        ref = task.predict(r, tok, texts, batch_size=32)
    for label, path in (("max rounding", args.int8), ("gptq", out)):
        with exact_qdq_runner(path) as r:
            got = task.predict(r, tok, texts, batch_size=32)
        flips = int((task.predictions(got) != task.predictions(ref)).sum())
        print(f"{label}: {flips} of {len(texts)} flipped, KL {kl(ref.values, got.values):.5f}")


if __name__ == "__main__":
    main()
