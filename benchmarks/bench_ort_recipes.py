"""ONNX Runtime CPU INT8 recipes against FP32, measured in one process on the same batches, interleaved.

    .venv/bin/python benchmarks/bench_ort_recipes.py --model demo_assets/model --log demo_assets/logs.jsonl \
        --calibration /tmp/recipe/mse [--calibration-set /tmp/recipe/cset] [--threads 2] [--rounds 5] \
        [--recipes fp32,ck,dyn-pc,...] [--out results.json]

What is timed: real log texts (a seeded sample of the log's readable lines, the calibration set's texts left
out), batch 1 over ``--texts1`` texts and batch 32 over ``--batches32`` batches of length-sorted texts (each
batch padded to its longest member, texts cut at the model's maximum length). Every round runs, for each
batch, every model in an order rotated by round and batch, so drift and neighbours' load fall on all models
alike; round 0 is a warm-up and is not counted. Per model: the median of its round totals; speedup = FP32's
median / the model's median; spread = min..max of the per-round ratios. Sessions: graph optimization ALL,
``--threads`` intra-op threads, one inter-op thread, CPU provider.

Fidelity: argmax agreement with FP32 on ``--agree`` log texts (batch 32, length-sorted) and the max |logit|
difference to the current calibkit layout (recipe ``ck``) on the same texts.

Recipes (``--recipes``, comma-separated; fp32 is always run):
  fp32          the FP32 model
  fp32-ortopt   FP32 through onnxruntime.transformers.optimizer (fused Attention, SkipLayerNorm, BiasGelu)
  ck            calibkit's Target.ONNXRUNTIME layout, as quantize_model writes it (the reference of the max
                |logit| difference)
  ck-rr         ``ck`` with 7-bit weights (reduce_range)
  ck-skipln     ``ck``'s Q/DQ pairs with each MatMul->Add(bias)->Add(residual)->LayerNormalization chain fused
                into SkipLayerNormalization (benchmarks/_ort_skipln.py; every MatMul node and tensor kept)
  ck-skipln-ortopt  the same fusion done by onnxruntime.transformers.optimizer (attention fusion off) on the FP32
                graph before calibkit's Q/DQ
  ck-mha        calibkit's Q/DQ on the graph with the attention core (Q·K^T, softmax, probs·V) fused into
                MultiHeadAttention (weight MatMuls kept, Q/K/V bias inside the op) plus SkipLayerNorm/BiasGelu
  ck-attn-int8  calibkit's layout with the activation x activation attention MatMuls quantized too (uint8)
  ck-biasfused  ``ck`` after ONNX Runtime's own Q/DQ fusion (level EXTENDED), with every bias Add folded into
                MatMulIntegerToFloat's bias input: the upper bound of what bias fusion could give
  ck-nospin     ``ck`` with session.intra_op.allow_spinning=0
  ck-sym        ``ck`` with the symmetric uint8 grid (zero point 128) for every activation: the layout before
                calibkit fitted each grid to the extremes calibration observed (``ck`` is fitted when the
                calibration.json records them, as calibkit's since then do)
  ck-exact      ``ck`` with graph optimizations off: the exact Q/DQ arithmetic calibkit evaluates (fidelity only,
                not timed)
  dyn-pc        onnxruntime.quantization.quantize_dynamic, int8 per-channel weights
  dyn-pt        the same, per-tensor weights
  dyn-pc-skipln quantize_dynamic per-channel on the ck-skipln FP32 graph
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from calibkit.data.tokenizer import TextTokenizer
from calibkit.graph import load_model
from calibkit.quantize.qdq import Target, quantize_model, save_model
from calibkit.quantize.tablefile import load_calibration_json

DEFAULT_RECIPES = "fp32,fp32-ortopt,ck,ck-exact,ck-skipln,ck-mha,ck-attn-int8,ck-biasfused,ck-rr,dyn-pc,dyn-pt"


# ---------------------------------------------------------------------------------------------- environment
def cpu_info() -> dict:
    name, flags = platform.processor() or "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("?", "", "x86_64"):
                name = value.strip()
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = {f: f in flags for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")}
    return {"cpu": name, "isa": isa, "cores_visible": len(os.sched_getaffinity(0)),
            "onnxruntime": ort.__version__, "onnx": onnx.__version__, "python": sys.version.split()[0]}


# --------------------------------------------------------------------------------------------------- texts
def read_log_texts(path: Path) -> list[str]:
    """Every readable line's non-empty string ``text`` (broken lines, bad UTF-8, other types skipped)."""
    out = []
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                t = json.loads(raw.decode("utf-8")).get("text")
            except (ValueError, AttributeError):
                continue
            if isinstance(t, str) and t.strip():
                out.append(t)
    return out


def calibration_texts(cset: Path | None) -> set[str]:
    if cset is None or not (cset / "texts.jsonl").is_file():
        return set()
    return {json.loads(line)["text"].strip() for line in (cset / "texts.jsonl").open(encoding="utf-8") if line.strip()}


# ------------------------------------------------------------------------------------------------- recipes
def session_options(threads: int, optimized: str | None = None,
                    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                    config: dict[str, str] | None = None) -> ort.SessionOptions:
    o = ort.SessionOptions()
    o.graph_optimization_level = level
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.log_severity_level = 3
    if optimized:
        o.optimized_model_filepath = optimized
    for k, v in (config or {}).items():
        o.add_session_config_entry(k, v)
    return o


def transformer_fused(src: str, dst: str, *, attention: bool, mha: bool = False) -> None:
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    fo = FusionOptions("bert")
    fo.enable_attention = attention
    fo.use_multi_head_attention = mha
    fo.enable_embed_layer_norm = False  # it renames the embeddings' LayerNorm output, a calibrated tensor
    cfg = json.loads((Path(src).parent / "config.json").read_text())
    om = optimizer.optimize_model(src, model_type="bert", num_heads=cfg["num_attention_heads"],
                                  hidden_size=cfg["hidden_size"], optimization_options=fo, opt_level=0,
                                  use_gpu=False)
    om.save_model_to_file(dst)


def quantize_all_matmuls(model: onnx.ModelProto, table) -> onnx.ModelProto:
    """calibkit's onnxruntime layout (uint8 activations) with every MatMul quantized, activation x
    activation included (an experiment: quantize_model's onnxruntime target keeps those FP32)."""
    from calibkit.quantize import qdq
    from calibkit.quantize.placement import plan_placement
    from calibkit.types import INT8_MAX

    placement = plan_placement(model)
    amax = table.amax()
    chosen = [qn for qn in placement.nodes if all(amax.get(t, 0) > 0 for t in qn.activation_inputs)]
    w = qdq._QdqWriter(model, qdq.activation_grids(table, Target.ONNXRUNTIME), Target.ONNXRUNTIME, INT8_MAX)
    w.quantize(chosen)
    return w.finish()


def qdq_only(model: onnx.ModelProto, table) -> onnx.ModelProto:
    """What quantize_model writes for Target.ONNXRUNTIME (no keep_nodes, 8-bit weights), through its private
    writer so that the other recipes can add their rewrites to the same graph."""
    from calibkit.quantize import qdq
    from calibkit.quantize.placement import plan_placement
    from calibkit.types import INT8_MAX

    placement = plan_placement(model)
    choice = qdq._choose_nodes(placement, set(), table.amax(), Target.ONNXRUNTIME)
    w = qdq._QdqWriter(model, qdq.activation_grids(table, Target.ONNXRUNTIME), Target.ONNXRUNTIME, INT8_MAX)
    w.quantize(choice.chosen)
    return w.finish()


def fold_bias_into_mmitf(src: str, dst: str, threads: int) -> int:
    """ONNX Runtime's EXTENDED-level graph of ``src`` (Q/DQ fused into MatMulIntegerToFloat) with each
    ``Add(bias, MatMulIntegerToFloat(...))`` folded into the op's bias input. Returns how many were folded."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "ext.onnx")
        ort.InferenceSession(src, session_options(threads, p, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
                             providers=["CPUExecutionProvider"])
        m = onnx.load(p)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    drop, folded = [], 0
    for n in g.node:
        if n.op_type != "MatMulIntegerToFloat" or (len(n.input) > 6 and n.input[6]):
            continue
        users = consumers.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add":
            continue
        add = users[0]
        other = [x for x in add.input if x != n.output[0]]
        if len(other) != 1 or other[0] not in inits or len(inits[other[0]].dims) != 1:
            continue
        while len(n.input) < 6:
            n.input.append("")
        n.input.append(other[0])
        n.output[0] = add.output[0]
        drop.append(add)
        folded += 1
    for a in drop:
        g.node.remove(a)
    onnx.save(m, dst)
    return folded


def build_recipes(names: list[str], model_dir: Path, calib: Path, work: Path, threads: int) -> dict[str, dict]:
    src = str(model_dir / "model.onnx")
    fp32 = load_model(src)
    table = load_calibration_json(calib).table
    out: dict[str, dict] = {}
    cache: dict[str, str] = {}

    def fused(kind: str) -> str:
        if kind not in cache:
            p = str(work / f"fp32-{kind}.onnx")
            if kind == "skipln":
                transformer_fused(src, p, attention=False)
            elif kind == "mha":
                transformer_fused(src, p, attention=True, mha=True)
            else:
                transformer_fused(src, p, attention=True)
            cache[kind] = p
        return cache[kind]

    def ck(model: onnx.ModelProto, path: str, **kw) -> dict:
        r = quantize_model(model, table, target=Target.ONNXRUNTIME, **kw)
        save_model(r.model, path)
        return {"quantized_nodes": len(r.quantized_nodes), "missing_ranges": list(r.missing_ranges)}

    def skipln(model: onnx.ModelProto, path: str) -> dict:
        from _ort_skipln import fuse_skip_layer_norm

        q = qdq_only(model, table)
        n = fuse_skip_layer_norm(q)
        save_model(q, path)
        return {"skip_layer_norms": n}

    def dyn(path_in: str, path: str, per_channel: bool) -> dict:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(path_in, path, per_channel=per_channel, weight_type=QuantType.QInt8)
        return {}

    def symmetric(path: str) -> dict:
        sym = replace(table, ranges=tuple(replace(r, observed_min=None, observed_max=None) for r in table.ranges))
        save_model(qdq_only(fp32, sym), path)
        return {}

    builders: dict[str, Callable[[str], dict]] = {
        "fp32": lambda p: {"path": src},
        "fp32-ortopt": lambda p: {"path": fused("attention")},
        "ck": lambda p: (save_model(qdq_only(fp32, table), p), {})[1],
        "ck-rr": lambda p: ck(fp32, p, reduce_range=True),
        "ck-skipln": lambda p: skipln(fp32, p),
        "ck-skipln-ortopt": lambda p: ck(onnx.load(fused("skipln")), p),
        "ck-mha": lambda p: ck(onnx.load(fused("mha")), p),
        "ck-attn-int8": lambda p: (save_model(quantize_all_matmuls(fp32, table), p), {})[1],
        "ck-biasfused": lambda p: {"bias_adds_folded": fold_bias_into_mmitf(str(work / "ck.onnx"), p, threads)},
        "ck-nospin": lambda p: {"path": str(work / "ck.onnx"), "config": {"session.intra_op.allow_spinning": "0"}},
        "ck-sym": symmetric,
        "ck-exact": lambda p: {"path": str(work / "ck.onnx"), "level": "none", "timed": False},
        "dyn-pc": lambda p: dyn(src, p, True),
        "dyn-pt": lambda p: dyn(src, p, False),
        "dyn-pc-skipln": lambda p: dyn(fused("skipln"), p, True),
    }
    order = ["fp32"] + [n for n in names if n != "fp32"]
    if any(n in ("ck-biasfused", "ck-nospin", "ck-exact") for n in order) and "ck" not in order:
        order.insert(1, "ck")
    for name in order:
        if name not in builders:
            raise SystemExit(f"unknown recipe {name!r}; known: {', '.join(builders)}")
        p = str(work / f"{name}.onnx")
        t0 = time.perf_counter()
        info = builders[name](p) or {}
        info.setdefault("path", p)
        info["build_s"] = round(time.perf_counter() - t0, 2)
        out[name] = info
    return out


def optimized_ops(path: str, threads: int, config: dict[str, str] | None) -> Counter:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "opt.onnx")
        ort.InferenceSession(path, session_options(threads, p, config=config), providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(p).graph.node)


# ------------------------------------------------------------------------------------------------- measure
def timed_rounds(sessions: dict[str, ort.InferenceSession], batches: list[dict], rounds: int) -> tuple[dict, dict]:
    """Per model: the total of each timed round, and each round's per-batch times."""
    names = list(sessions)
    per = {k: [[0.0] * len(batches) for _ in range(rounds + 1)] for k in names}
    for r in range(rounds + 1):
        for b, feeds in enumerate(batches):
            k0 = (r + b) % len(names)
            for k in names[k0:] + names[:k0]:
                t0 = time.perf_counter()
                sessions[k].run(None, feeds)
                per[k][r][b] = time.perf_counter() - t0
    # round 0 is the warm-up
    return {k: [sum(x) for x in v[1:]] for k, v in per.items()}, {k: v[1:] for k, v in per.items()}


def summarize(totals: dict[str, list[float]]) -> dict[str, dict]:
    base = totals["fp32"]
    out = {}
    for k, v in totals.items():
        ratios = [b / t for b, t in zip(base, v)]
        out[k] = {"median_s": statistics.median(v), "speedup": statistics.median(base) / statistics.median(v),
                  "spread": [min(ratios), max(ratios)], "rounds_s": v}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model folder (model.onnx + tokenizer + config.json)")
    ap.add_argument("--log", required=True, help="JSON Lines log with a text field")
    ap.add_argument("--calibration", required=True, help="calibration.json (or its folder) for calibkit recipes")
    ap.add_argument("--calibration-set", default=None, help="calibration set folder whose texts are left out")
    ap.add_argument("--recipes", default=DEFAULT_RECIPES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (plus one warm-up round)")
    ap.add_argument("--texts1", type=int, default=64)
    ap.add_argument("--batches32", type=int, default=8)
    ap.add_argument("--agree", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-length", type=int, default=256,
                    help="timed batches are cut at this many tokens (all sessions stay open at once: a 32 x 512 "
                         "batch grows every FP32-attention session's arena by GBs); agreement uses the model's own "
                         "maximum, one session at a time")
    ap.add_argument("--work", default=None, help="folder for the built models (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    env = cpu_info()
    isa = " ".join(f for f, on in env["isa"].items() if on)
    print(f"CPU: {env['cpu']} ({env['cores_visible']} cores visible); ISA: {isa}")
    print(f"onnxruntime {env['onnxruntime']}, onnx {env['onnx']}, python {env['python']}; threads {args.threads}")

    model_dir = Path(args.model)
    tok = TextTokenizer(model_dir)
    exclude = calibration_texts(Path(args.calibration_set) if args.calibration_set else None)
    pool = [t for t in dict.fromkeys(read_log_texts(Path(args.log))) if t.strip() not in exclude]
    rng = random.Random(args.seed)
    n32 = 32 * args.batches32
    pick = rng.sample(pool, args.texts1 + n32 + args.agree)
    t1, t32, tagree = pick[: args.texts1], pick[args.texts1 : args.texts1 + n32], pick[args.texts1 + n32 :]
    print(f"log: {len(pool)} distinct texts ({len(exclude)} calibration texts left out); seed {args.seed}")

    work_ctx = tempfile.TemporaryDirectory() if args.work is None else None
    work = Path(args.work or work_ctx.name)
    work.mkdir(parents=True, exist_ok=True)
    recipes = build_recipes([r.strip() for r in args.recipes.split(",") if r.strip()], model_dir,
                            Path(args.calibration), work, args.threads)
    levels = {"none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    sessions = {k: ort.InferenceSession(v["path"], session_options(args.threads, level=levels[v.get("level", "all")],
                                                                   config=v.get("config")),
                                        providers=["CPUExecutionProvider"]) for k, v in recipes.items()}
    timed = {k: s for k, s in sessions.items() if recipes[k].get("timed", True)}
    names = [i.name for i in sessions["fp32"].get_inputs()]
    out_name = sessions["fp32"].get_outputs()[0].name
    ops = {}
    for k, v in recipes.items():
        c = optimized_ops(v["path"], args.threads, v.get("config")) if v.get("level", "all") == "all" else Counter()
        ops[k] = dict(sorted(c.items()))
        key = ("MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMul", "FusedMatMul", "QuantizeLinear",
               "DynamicQuantizeLinear", "DequantizeLinear", "Add", "SkipLayerNormalization", "LayerNormalization",
               "BiasGelu", "Gelu", "Attention", "MultiHeadAttention")
        print(f"  {k:14s} built {v['build_s']:5.1f} s; optimized graph {sum(c.values())} nodes: "
              + " ".join(f"{o}={c[o]}" for o in key if c[o])
              + (f"  missing ranges: {v['missing_ranges']}" if v.get("missing_ranges") else ""))

    def encode(texts: list[str], max_length: int | None = args.max_length) -> dict:
        return tok.encode(texts, max_length=max_length).feeds(names)

    b1 = [encode([t]) for t in t1]
    s32 = sorted(t32, key=lambda t: len(t))
    lens = np.minimum(tok.token_lengths(s32), args.max_length)
    order = np.argsort(lens, kind="stable")
    s32 = [s32[i] for i in order]
    b32 = [encode(s32[i : i + 32]) for i in range(0, n32, 32)]
    shapes32 = [list(b["input_ids"].shape) for b in b32]
    lens1 = [b["input_ids"].shape[1] for b in b1]
    print(f"batch 1: {len(b1)} texts, tokens median {int(np.median(lens1))} max {max(lens1)}; "
          f"batch 32: {len(b32)} batches, shapes {[s[1] for s in shapes32]}")

    results: dict = {"env": env, "args": vars(args), "recipes": {}}
    t0 = time.perf_counter()
    tim1 = summarize(timed_rounds(timed, b1, args.rounds)[0])
    tot32, per32 = timed_rounds(timed, b32, args.rounds)
    tim32 = summarize(tot32)
    short = [i for i, s in enumerate(shapes32) if s[1] <= 128]
    tim32s = summarize({k: [sum(r[i] for i in short) for r in v] for k, v in per32.items()}) if short else {}
    print(f"timing: {time.perf_counter() - t0:.0f} s")

    # fidelity
    ag_lens = tok.token_lengths(tagree)
    ag = [tagree[i] for i in np.argsort(ag_lens, kind="stable")]
    del timed
    logits = {}
    for k in list(sessions):
        cfg = recipes[k]
        del sessions[k]  # frees its arena: one session at a time for the full-length texts
        s = ort.InferenceSession(cfg["path"], session_options(args.threads, level=levels[cfg.get("level", "all")],
                                                              config=cfg.get("config")),
                                 providers=["CPUExecutionProvider"])
        logits[k] = np.concatenate([s.run([out_name], encode(ag[i : i + 32], None))[0] for i in range(0, len(ag), 32)])
        del s
    ref = logits["fp32"].argmax(-1)
    cur, exact = logits.get("ck"), logits.get("ck-exact")

    def col(t: dict | None) -> str:
        if t is None:
            return f"{'(not timed)':>28s}"
        return f"{t['speedup']:5.2f}x [{t['spread'][0]:4.2f}-{t['spread'][1]:4.2f}] {t['median_s'] * 1000:7.0f} ms"

    print(f"\nspeedup vs fp32 = ratio of medians [min-max per-round ratio], median round total; "
          f"batch 32 short = the {len(short)} batches of <= 128 tokens")
    print(f"{'recipe':14s} {'batch 1':>28s} {'batch 32':>28s} {'batch 32 short':>28s} {'agree fp32':>10s} "
          f"{'max|dl| vs ck':>13s} {'vs ck-exact':>11s}")
    for k in recipes:
        agree = float((logits[k].argmax(-1) == ref).mean()) * 100
        dmax = float(np.abs(logits[k] - cur).max()) if cur is not None else float("nan")
        dex = float(np.abs(logits[k] - exact).max()) if exact is not None else float("nan")
        a, b, c = tim1.get(k), tim32.get(k), tim32s.get(k)
        print(f"{k:14s} {col(a)} {col(b)} {col(c)} {agree:9.2f}% {dmax:13.2e} {dex:11.2e}")
        results["recipes"][k] = {"batch1": a, "batch32": b, "batch32_short": c, "agreement_pct": agree,
                                 "agree_texts": len(ag), "max_abs_logit_diff_vs_ck": dmax,
                                 "max_abs_logit_diff_vs_ck_exact": dex, "optimized_ops": ops[k],
                                 **{x: y for x, y in recipes[k].items() if x not in ("path",)}}
    results["batch1_tokens"] = lens1
    results["batch32_shapes"] = shapes32
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    if work_ctx is not None:
        work_ctx.cleanup()


if __name__ == "__main__":
    main()
