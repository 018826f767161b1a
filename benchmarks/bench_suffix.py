"""Does running only the changed suffix of a variant pay on CPU? (issue 19, "pay for the decision")

A sensitivity variant that quantizes one node (every other node kept in FP32) computes exactly what FP32
computes up to that node. This benchmark caches FP32's values of the tensors that cross into the changed part
(the *frontier*) once per batch, cuts the variant down to the nodes downstream of its first change, and runs
only that suffix from the cache. It measures, for every quantizable node:

- ``full``:   build the variant, open an ONNX Runtime session, run it over the texts (what tune does today);
- ``suffix``: build the variant, cut its suffix, open a session, run the suffix from the cached frontier;

plus the one-off cost of the FP32 run that fills the cache, the cache's size, and whether the suffix's outputs
equal the full run's (they must, bit for bit, or the strategy is not kept).

    python benchmarks/bench_suffix.py --model .cache/test-assets/fast/model --table runs/minmax/calibration.json \
        --texts-from .cache/test-assets/fast/logs.jsonl --texts 256

Prints one line per node and a summary; ``--json PATH`` writes the measurements.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibkit.data.tokenizer import TextTokenizer  # noqa: E402
from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization  # noqa: E402
from calibkit.evaluate.predict import length_batches  # noqa: E402
from calibkit.evaluate.sensitivity import load_calibration_table  # noqa: E402
from calibkit.graph import add_outputs, load_model  # noqa: E402
from calibkit.quantize.placement import plan_placement  # noqa: E402
from calibkit.quantize.qdq import quantize_model  # noqa: E402


def _signature(node: onnx.NodeProto) -> bytes:
    return node.SerializeToString(deterministic=True)


def changed_suffix(fp32: onnx.ModelProto, variant: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[str]]:
    """The variant's nodes that compute something FP32 does not (a new node, or one reading a changed tensor),
    in graph order, and the frontier: the non-constant tensors those nodes read that FP32 computes as well."""
    same = {o: _signature(n) for n in fp32.graph.node for o in n.output}
    inits = {i.name for i in variant.graph.initializer}
    changed_t: set[str] = set()
    suffix: list[onnx.NodeProto] = []
    for n in variant.graph.node:
        new = any(same.get(o) != _signature(n) for o in n.output) or any(i in changed_t for i in n.input)
        if new and n.op_type != "Constant":
            suffix.append(n)
            changed_t.update(n.output)
    consts = {o: n for n in variant.graph.node if n.op_type == "Constant" for o in n.output}
    needed = [i for n in suffix for i in n.input if i and i not in changed_t and i not in inits]
    frontier = list(dict.fromkeys(i for i in needed if i not in consts))
    const_nodes = list({id(consts[i]): consts[i] for i in needed if i in consts}.values())
    return const_nodes + suffix, frontier


def suffix_model(variant: onnx.ModelProto, nodes: list[onnx.NodeProto], frontier: list[str],
                 dtypes: dict[str, tuple[int, int]]) -> bytes:
    used = {i for n in nodes for i in n.input}
    graph = onnx.helper.make_graph(
        nodes, "suffix",
        [onnx.helper.make_tensor_value_info(t, dtypes[t][0], [f"{t}_d{k}" for k in range(dtypes[t][1])])
         for t in frontier],
        list(variant.graph.output),
        [i for i in variant.graph.initializer if i.name in used],
    )
    m = onnx.helper.make_model(graph, opset_imports=list(variant.opset_import), ir_version=variant.ir_version)
    return m.SerializeToString()


_NP2ONNX = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.int64): onnx.TensorProto.INT64,
            np.dtype(np.int32): onnx.TensorProto.INT32, np.dtype(np.bool_): onnx.TensorProto.BOOL,
            np.dtype(np.float16): onnx.TensorProto.FLOAT16}


def read_texts(path: Path, n: int, seed: int) -> list[str]:
    rows = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            t = d.get("text") if isinstance(d, dict) else None
            if isinstance(t, str) and t.strip():
                rows.append(t)
    rng = np.random.default_rng(seed)
    return [rows[i] for i in rng.choice(len(rows), size=min(n, len(rows)), replace=False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="model folder (model.onnx + tokenizer)")
    ap.add_argument("--table", type=Path, required=True, help="calibration.json")
    ap.add_argument("--texts-from", type=Path, required=True, help="JSON Lines with a text field")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--nodes", type=int, default=0, help="measure only every k-th node (0: all)")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per session (tune uses 1)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    fp32 = load_model(args.model / "model.onnx")
    table = load_calibration_table(args.table)
    tok = TextTokenizer(args.model, max_length=None)
    texts = read_texts(args.texts_from, args.texts, 0)
    names = [i.name for i in fp32.graph.input if i.name not in {x.name for x in fp32.graph.initializer}]
    out_name = fp32.graph.output[0].name
    lengths = np.minimum(tok.token_lengths(texts), tok.max_length)
    batches = length_batches(lengths, args.batch_size, input_names=names)
    encs = [tok.encode([texts[i] for i in idx]).feeds(names) for idx in batches]
    opt = evaluation_optimization("tensorrt")
    all_nodes = [n.name for n in plan_placement(fp32).nodes]
    nodes = all_nodes[:: args.nodes] if args.nodes else all_nodes

    # the frontier of every variant, then one tapped FP32 run that caches them all
    t0 = time.perf_counter()
    variants, cuts = {}, {}
    for n in nodes:
        variants[n] = quantize_model(fp32, table, keep_nodes=tuple(x for x in all_nodes if x != n)).model
        cuts[n] = changed_suffix(fp32, variants[n])
    t_plan = time.perf_counter() - t0
    union = sorted({t for _, fr in cuts.values() for t in fr} - set(names))
    t0 = time.perf_counter()
    cache: list[dict[str, np.ndarray]] = []
    with OnnxRuntimeRunner(add_outputs(fp32, union).SerializeToString(), intra_op_threads=args.threads,
                           optimization=opt) as r:
        for feeds in encs:
            outs = r.infer(feeds)
            cache.append({**feeds, **{t: outs[t] for t in union}})
    t_cache = time.perf_counter() - t0
    cache_bytes = sum(a.nbytes for c in cache for a in c.values())
    dtypes = {t: (_NP2ONNX[a.dtype], a.ndim) for t, a in cache[0].items()}

    rows = []
    for n in nodes:
        t0 = time.perf_counter()
        v = quantize_model(fp32, table, keep_nodes=tuple(x for x in all_nodes if x != n)).model
        with OnnxRuntimeRunner(v.SerializeToString(), intra_op_threads=args.threads, optimization=opt) as r:
            full = [r.infer(f)[out_name] for f in encs]
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        v = quantize_model(fp32, table, keep_nodes=tuple(x for x in all_nodes if x != n)).model
        snodes, frontier = changed_suffix(fp32, v)
        sm = suffix_model(v, snodes, frontier, dtypes)
        with OnnxRuntimeRunner(sm, intra_op_threads=args.threads, optimization=opt) as r:
            part = [r.infer({t: c[t] for t in frontier})[out_name] for c in cache]
        t_suffix = time.perf_counter() - t0
        equal = all(np.array_equal(a, b) for a, b in zip(full, part))
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(full, part))
        share = len(snodes) / len(v.graph.node)
        rows.append({"node": n, "full_s": t_full, "suffix_s": t_suffix, "suffix_node_share": share,
                     "equal": equal, "max_abs_diff": diff, "frontier": len(frontier)})
        print(f"{n}: full {t_full:.3f} s, suffix {t_suffix:.3f} s ({t_full / t_suffix:.2f}x), "
              f"{100 * share:.0f} % of nodes, frontier {len(frontier)} tensors, equal {equal} (max diff {diff:.2g})",
              flush=True)
    full_total = sum(r["full_s"] for r in rows)
    suffix_total = sum(r["suffix_s"] for r in rows) + t_cache
    summary = {"model": str(args.model), "texts": len(texts), "nodes": len(rows), "threads": args.threads,
               "full_total_s": full_total, "suffix_total_s_with_cache": suffix_total, "cache_fill_s": t_cache,
               "cache_mb": cache_bytes / 2**20, "plan_s": t_plan, "all_equal": all(r["equal"] for r in rows),
               "speedup": full_total / suffix_total}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
