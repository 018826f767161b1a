"""The demo's sentence embedder under INT8, judged on log texts (issue 19): nearest-neighbour agreement and cosine.

    python benchmarks/bench_embedder.py --assets .cache/test-assets/fast [--calibration-size 256]
        [--traffic-size 1000] [--out DIR]

The assets folder is what `calibkit demo prepare` writes (embedder/, logs.jsonl). A calibration set of
``--calibration-size`` texts is sampled from the log; ``--traffic-size`` other log texts (calibration texts
excluded, `evaluate.traffic`) are the evidence. Variants, all in the TensorRT layout (exact Q/DQ on CPU): every
node INT8 with minmax and mse, the same on the smoothed model (alpha auto), and smoothed minmax with the
attention MatMuls (QK^T, PV) kept in higher precision, then also layer 0. For each: top-1 nearest-neighbour
agreement among the evidence texts, top-10 overlap, mean and min cosine to FP32. Also the FP32 neighbour gaps
(top-1 minus top-2 cosine) that make top-1 agreement demanding, and the cosine at which isotropic noise keeps
95 % of nearest neighbours.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import calibkit as ck  # noqa: E402
from calibkit.data.tokenizer import TextTokenizer  # noqa: E402
from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization  # noqa: E402
from calibkit.evaluate.jobs import load_calibration_table  # noqa: E402
from calibkit.evaluate.predict import predict_outputs  # noqa: E402
from calibkit.evaluate.traffic import TrafficOptions, draw_traffic  # noqa: E402
from calibkit.graph import load_model  # noqa: E402
from calibkit.quantize.placement import plan_placement  # noqa: E402
from calibkit.quantize.qdq import quantize_model  # noqa: E402
from calibkit.tasks import nearest_neighbour_agreement  # noqa: E402

OUTPUT = "sentence_embedding"


def embed(model: str | bytes, tok: TextTokenizer, texts: list[str], optimization: str = "all") -> np.ndarray:
    with OnnxRuntimeRunner(model, optimization=optimization) as r:
        return predict_outputs(r, tok, texts, batch_size=32, output_name=OUTPUT).values


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", type=Path, default=Path(".cache/test-assets/fast"))
    ap.add_argument("--calibration-size", type=int, default=256)
    ap.add_argument("--traffic-size", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-embedder"))
    args = ap.parse_args()
    emb = args.assets / "embedder"
    cset = ck.sample(args.assets / "logs.jsonl", args.out / "cset", size=args.calibration_size, tokenizer=emb)
    traffic = draw_traffic(args.assets / "logs.jsonl", TrafficOptions(size=args.traffic_size, seed=1),
                           calibration_set=cset)
    texts = list(traffic.texts)
    tok = TextTokenizer(emb)
    ref = embed(str(emb / "model.onnx"), tok, texts)
    print(f"{len(texts)} traffic texts ({', '.join(f'{k} {v}' for k, v in traffic.excluded.items() if v)} excluded)")

    u = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    sim = u @ u.T
    np.fill_diagonal(sim, -2.0)
    top = np.sort(sim, axis=1)[:, ::-1]
    gap = top[:, 0] - top[:, 1]
    q = np.quantile(gap, [0.05, 0.1, 0.25, 0.5]).round(4)
    print("FP32 top-1 minus top-2 neighbour cosine, quantiles 5/10/25/50 %:", q)
    rng = np.random.default_rng(0)
    for eps in (0.02, 0.05, 0.07):
        noise = rng.standard_normal(ref.shape)
        cand = u + eps * noise / np.linalg.norm(noise, axis=1, keepdims=True)
        nn = nearest_neighbour_agreement(ref, cand)
        assert nn is not None
        print(f"isotropic noise {eps}: cosine mean {cosine(u, cand).mean():.5f}, NN top-1 {100 * nn.top1:.1f} %")

    smoothed = ck.smooth(emb, cset, args.out / "smoothed")
    models = {"plain": emb, "smoothed": smoothed.out_dir}
    tables = {}
    for name, folder in models.items():
        for method in ("minmax", "mse"):
            res = ck.calibrate(folder, cset, args.out / f"cal-{name}-{method}", method=method)
            tables[name, method] = res.json_path
    variants = [("all INT8 minmax", "plain", "minmax", ()), ("all INT8 mse", "plain", "mse", ()),
                ("smooth + minmax", "smoothed", "minmax", ()), ("smooth + mse", "smoothed", "mse", ()),
                ("smooth + minmax, attention MatMuls kept", "smoothed", "minmax", ("self/MatMul",)),
                ("smooth + minmax, attention MatMuls and layer 0 kept", "smoothed", "minmax",
                 ("self/MatMul", "layer.0/"))]
    for label, name, method, keep in variants:
        fp = load_model(Path(models[name]) / "model.onnx")
        nodes = [n.name for n in plan_placement(fp).nodes]
        kept = tuple(n for n in nodes if any(k in n for k in keep))
        q = quantize_model(fp, load_calibration_table(tables[name, method]), keep_nodes=kept).model
        t = time.perf_counter()
        out = embed(q.SerializeToString(), tok, texts, evaluation_optimization("tensorrt"))
        nn = nearest_neighbour_agreement(ref, out)
        assert nn is not None
        c = cosine(ref, out)
        print(f"{label}: {len(kept)} of {len(nodes)} nodes kept, NN top-1 {100 * nn.top1:.1f} %, top-10 overlap "
              f"{100 * nn.overlap_at_k:.1f} %, cosine mean {c.mean():.4f} min {c.min():.4f} "
              f"({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
