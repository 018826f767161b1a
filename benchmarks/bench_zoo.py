"""The model zoo (tests/zoo.py) through calibrate, build and tune: INT8 fidelity per task, with 95 % intervals,
and the INT8 share of linear FLOPs.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_zoo.py [--out /tmp/zoo-bench] [--models bert-cls,bert-encoder]
        [--eval-size 600] [--no-tune] [--min-agreement 99] [--max-drop 0.5] [--decompose]

Builds tiny random-initialised transformers (2 layers, hidden 32) from ``transformers`` configs, exports them
with the legacy exporter, the dynamo exporter and ONNX Runtime's transformer optimizer, calibrates each on 100
seeded pseudo-sentences (mse), builds INT8 in the TensorRT layout (every MatMul/Gemm, attention MatMuls
included: the share reported is the INT8 part of all linear FLOPs) and compares it with FP32 on ``--eval-size``
other texts through the task calibkit picks for the model (calibkit.tasks).

For the classifiers it then runs ``calibkit tune --min-agreement 99 --max-drop 0.5`` (the CLI, as a user would)
on the same texts labelled with FP32's own predictions (so accuracy = agreement with FP32), and reports the
tuned plan's agreement with FP32 on tune's *holdout* split (texts the search never saw) with its 95 % Wilson
interval, and the plan's INT8 share of all linear FLOPs.

Columns: ``all-INT8 [95 % CI]``: agreement of the all-INT8 (mse) model with FP32 on all eval texts, run by
ONNX Runtime (CPU, default graph optimizations: the Q/DQ pairs are fused into its integer kernels);
``all-INT8, exact Q/DQ``: the same model with ONNX Runtime's graph optimizations off, so every DequantizeLinear
feeds a float MatMul: exactly the arithmetic the Q/DQ graph specifies (what TensorRT computes, up to
accumulation order). On CPUs without VNNI (AVX2) ONNX Runtime's s8 x s8 kernels lose far more than the Q/DQ
graph does;
``ORT layout, N-bit weights``: what ``calibkit build --precision int8`` writes for ONNX Runtime (uint8
activations, weight MatMuls only, 7-bit weights on CPUs without VNNI), run by ORT's kernels;
``tuned holdout [95 % CI]``: the tuned plan on the holdout split; ``tuned FLOPs``: its INT8 share of linear
FLOPs; ``target``: whether the 99 % agreement target is met on the holdout (``yes`` only when the interval's
lower end is at least 99 %, ``estimate`` when only the point estimate is, ``no`` otherwise).

``--smooth`` (without ``--decompose``) also prints, per classifier, the exact Q/DQ all-INT8 agreement of the model
smoothed by ``calibkit smooth`` (alpha auto), calibrated with mse and with minmax.
``--decompose`` also prints, per classifier, where the all-INT8 model's flips come from: the same exact Q/DQ
model with only its weights quantized (every activation Q/DQ pair removed), with only its activations quantized
(every weight DequantizeLinear replaced by the FP32 weight), and the FP16 build's agreement (how much any
rounding of this model's arithmetic moves its predictions).
``--peers`` also prints, per classifier, ONNX Runtime's own ``quantize_static`` on the same FP32 model and the
same 100 calibration texts (QDQ, per-channel int8 weights, MatMul/Gemm; MinMax, Percentile, Entropy; int8
symmetric activations as TensorRT needs them and uint8 asymmetric ones, ORT's default), run as exact Q/DQ.
ORT's histogram calibrators fail on texts of different lengths, so its calibration texts are padded to the
zoo's 64 tokens (the padding masked), which it needs; the unpadded MinMax run is shown too.
``--floor`` also prints, per classifier, the ``FLOOR_TENSORS`` tensors whose quantization alone flips the most
predictions, each alone in INT8 (everything else FP32) with its scale swept over x0.05..x2 of the calibrated
one (x1 included), and the fewest flips of the sweep. The sweep is judged on the eval texts themselves, so it
is a lower bound: if one activation alone, at its best per-tensor scale, flips more than 1 % of the texts, no
calibration method can bring the all-INT8 model to 99 %. It also prints the median logit error of the
exact Q/DQ all-INT8 model against the logits' spread, and the share of texts whose FP32 top-2 margin is under
0.1 of that spread (the near ties that any error flips).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from zoo import MAX_TOKENS, SPECS, build_zoo, write_texts, zoo_texts  # noqa: E402

from calibkit.building import BuildRequest, build  # noqa: E402
from calibkit.calibrate.pipeline import calibrate  # noqa: E402
from calibkit.data.calibset import write_calibration_set  # noqa: E402
from calibkit.data.modeldir import ModelDir  # noqa: E402
from calibkit.data.tokenizer import TextTokenizer  # noqa: E402
from calibkit.engines.base import FunctionRunner  # noqa: E402
from calibkit.engines.cpu import int8_gemm_saturates  # noqa: E402
from calibkit.engines.onnxruntime import OnnxRuntimeRunner  # noqa: E402
from calibkit.evaluate.flops import linear_work  # noqa: E402
from calibkit.evidence.intervals import Interval, proportion  # noqa: E402
from calibkit.requests.calibrate import CalibrateRequest  # noqa: E402
from calibkit.tasks import choose_task, model_outputs  # noqa: E402
from calibkit.types import Method, Precision, TensorSpec  # noqa: E402

TARGET = 0.99


def ci(iv: Interval | None) -> str:
    if iv is None:
        return "—"
    return f"{100 * iv.estimate:.2f} % [{100 * iv.low:.1f}, {100 * iv.high:.1f}]"


def verdict(iv: Interval | None) -> str:
    if iv is None:
        return "—"
    return "yes" if iv.low >= TARGET else ("estimate" if iv.estimate >= TARGET - 1e-12 else "no")


def exact_qdq_runner(path: Path) -> FunctionRunner:
    """ONNX Runtime with graph optimizations off: DequantizeLinear -> float MatMul, no integer kernels."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    specs = [TensorSpec(i.name, "int64", tuple(i.shape)) for i in sess.get_inputs()]
    return FunctionRunner(lambda feeds: dict(zip(names, sess.run(names, feeds))), specs, names, name="exact-qdq")


def only_tensors(int8: onnx.ModelProto, fp32: onnx.ModelProto, keep: set[str]) -> onnx.ModelProto:
    """The Q/DQ model with only the tensors in ``keep`` (activation or weight names) quantized."""
    m = onnx.ModelProto()
    m.CopyFrom(int8)
    fp32_inits = {i.name: i for i in fp32.graph.initializer}
    rename: dict[str, str] = {}
    nodes = []
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0].endswith("_DequantizeLinear_Output"):
            base = n.output[0][: -len("_DequantizeLinear_Output")]
            if base not in keep:
                rename[n.output[0]] = base
                continue
        if n.op_type == "QuantizeLinear" and n.input[0] not in keep:
            continue
        nodes.append(n)
    for n in nodes:
        n.input[:] = [rename.get(x, x) for x in n.input]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    have = {i.name for i in m.graph.initializer}
    m.graph.initializer.extend(fp32_inits[b] for b in sorted(set(rename.values()) & set(fp32_inits)) if b not in have)
    return m


def only_part(int8: onnx.ModelProto, fp32: onnx.ModelProto, keep: str) -> onnx.ModelProto:
    """The Q/DQ model with only its weights (``keep="weights"``) or only its activations (``"activations"``)
    quantized: removed activation pairs feed the FP32 tensor on, removed weight DQs the FP32 initializer."""
    weights = {i.name[: -len("_quantized")] for i in int8.graph.initializer if i.name.endswith("_quantized")}
    tensors = {n.output[0][: -len("_DequantizeLinear_Output")] for n in int8.graph.node
               if n.op_type == "DequantizeLinear" and n.output[0].endswith("_DequantizeLinear_Output")}
    return only_tensors(int8, fp32, tensors & weights if keep == "weights" else tensors - weights)


def decompose(task, work: Path, folder: Path, tok, texts, ref) -> str:  # type: ignore[no-untyped-def]
    fp32, int8 = onnx.load(str(work / "fp32.onnx")), onnx.load(str(work / "int8.onnx"))
    cells = []
    for keep in ("weights", "activations"):
        path = work / f"int8-{keep}-only.onnx"
        onnx.save(only_part(int8, fp32, keep), str(path))
        with exact_qdq_runner(path) as r:
            cells.append(ci(agreement(task, ref, task.predict(r, tok, texts, batch_size=32))))
    build(BuildRequest(model=folder, output=work / "fp16.onnx", precision=Precision.FP16))
    with OnnxRuntimeRunner((work / "fp16.onnx").read_bytes(), name="fp16") as r:
        cells.append(ci(agreement(task, ref, task.predict(r, tok, texts, batch_size=32))))
    return " | ".join(cells)


def smoothed(task, work: Path, md: ModelDir, calib, tok, texts, ref) -> str:  # type: ignore[no-untyped-def]
    """Exact Q/DQ all-INT8 agreement with FP32 of the smoothed model, mse and minmax."""
    from calibkit.calibrate.smoothing import smooth
    from calibkit.requests.smooth import SmoothRequest

    res = smooth(SmoothRequest(model=md, calibration_set=calib, out=work / "smoothed"))
    smd = ModelDir.resolve(res.out_dir)
    cells = []
    for m in (Method.MSE, Method.MINMAX):
        cal = calibrate(CalibrateRequest(model=smd, calibration_set=calib, method=m,
                                         out=work / f"cal-smoothed-{m.value}"))
        with exact_qdq_runner(cal.model_path) as r:
            cells.append(f"{m.value} {ci(agreement(task, ref, task.predict(r, tok, texts, batch_size=32)))}")
    return " | ".join(cells) + f" | {len(res.smoothed)} of {res.groups}"


FLOOR_TENSORS = 4
FLOOR_GRID = np.union1d(np.geomspace(0.05, 2.0, 24), [1.0])  # x1: the calibrated scale


def floor(task, work: Path, tok, texts, ref) -> list[str]:  # type: ignore[no-untyped-def]
    """Rows: the tensors that alone flip the most predictions, at the calibrated scale and at the sweep's best."""
    from onnx import numpy_helper

    fp32, int8 = onnx.load(str(work / "fp32.onnx")), onnx.load(str(work / "int8.onnx"))
    weights = {i.name[: -len("_quantized")] for i in int8.graph.initializer if i.name.endswith("_quantized")}
    tensors = [n.output[0][: -len("_DequantizeLinear_Output")] for n in int8.graph.node
               if n.op_type == "DequantizeLinear" and n.output[0].endswith("_DequantizeLinear_Output")]
    base = task.predictions(ref)
    path = work / "int8-one-tensor.onnx"

    def flips(m: onnx.ModelProto) -> int:
        onnx.save(m, str(path))
        with exact_qdq_runner(path) as r:
            return int((task.predictions(task.predict(r, tok, texts, batch_size=32)) != base).sum())

    alone = sorted(((flips(only_tensors(int8, fp32, {t})), t) for t in tensors), key=lambda ft: -ft[0])
    rows = []
    for f0, t in alone[:FLOOR_TENSORS]:
        m = only_tensors(int8, fp32, {t})
        scale = next(i for i in m.graph.initializer if i.name == f"{t}_scale")
        s0 = numpy_helper.to_array(scale).copy()
        sweep = []
        for g in FLOOR_GRID:
            scale.CopyFrom(numpy_helper.from_array((s0 * g).astype(np.float32), scale.name))
            sweep.append(flips(m))
        best = int(np.argmin(sweep))
        kind = "weight" if t in weights else "activation"
        rows.append(f"{t} ({kind}) | {f0} ({100 * f0 / len(texts):.2f} %) | {sweep[best]} "
                    f"({100 * sweep[best] / len(texts):.2f} %) at x{FLOOR_GRID[best]:.2f}")
    return rows


def ties(fp32: np.ndarray, int8: np.ndarray) -> str:
    """How large INT8's logit error is against the logits' spread, and how many texts sit near a tie."""
    spread = float(fp32.std())
    top2 = np.sort(fp32, axis=-1)[:, -2:]
    near = float(np.mean((top2[:, 1] - top2[:, 0]) < 0.1 * spread))
    err = float(np.median(np.abs(int8 - fp32)))
    return (f"logit std {spread:.3f}, median |INT8 - FP32| {err:.4f} ({100 * err / spread:.1f} % of it); "
            f"{100 * near:.1f} % of texts have a top-2 margin under 0.1 logit std")


def peers(task, work: Path, tok, calib_texts: list[str], texts, ref) -> str:  # type: ignore[no-untyped-def]
    """ONNX Runtime's quantize_static on the same model and calibration texts: flips of FP32's predictions."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    fp32_path = work / "fp32.onnx"
    names = {i.name for i in onnx.load(str(fp32_path), load_external_data=False).graph.input}
    base = task.predictions(ref)

    class Reader(CalibrationDataReader):
        def __init__(self, pad_to: int | None) -> None:
            self.texts, self.pad_to = iter(calib_texts), pad_to

        def get_next(self) -> dict[str, np.ndarray] | None:
            t = next(self.texts, None)
            if t is None:
                return None
            enc = tok.encode([t])
            n = enc.input_ids.shape[1]
            width = self.pad_to or n
            ids = np.full((1, width), tok.pad_id, dtype=np.int64)
            ids[0, :n] = enc.input_ids[0]
            mask = np.zeros((1, width), dtype=np.int64)
            mask[0, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            return {k: v for k, v in feeds.items() if k in names}

    cells = []
    runs = [(CalibrationMethod.MinMax, None)] + [(m, MAX_TOKENS) for m in
                                                 (CalibrationMethod.MinMax, CalibrationMethod.Percentile,
                                                  CalibrationMethod.Entropy)]
    for method, pad_to in runs:
        for act, symmetric in ((QuantType.QInt8, True), (QuantType.QUInt8, False)):
            out = work / f"ort-{method.name.lower()}-{act.name.lower()}{'-padded' if pad_to else ''}.onnx"
            try:
                quantize_static(str(fp32_path), str(out), Reader(pad_to), quant_format=QuantFormat.QDQ,
                                per_channel=True, activation_type=act, weight_type=QuantType.QInt8,
                                op_types_to_quantize=["MatMul", "Gemm"], calibrate_method=method,
                                extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})
            except Exception as exc:  # a peer's failure is a result here
                cells.append(f"fails: {type(exc).__name__}")
                continue
            with exact_qdq_runner(out) as r:
                agree = proportion(task.predictions(task.predict(r, tok, texts, batch_size=32)) == base)
            cells.append(ci(agree))
    return " | ".join(cells)


def agreement(task, a, b) -> Interval | None:  # type: ignore[no-untyped-def]
    """Same prediction per text (classification) or per real token (token classification), Wilson 95 %."""
    if task.kind == "classification":
        return proportion(task.predictions(a) == task.predictions(b))
    if task.kind == "token-classification":
        return proportion((a.values.argmax(-1) == b.values.argmax(-1))[a.mask])
    return None


def run_tune(z, calib: Path, eval_path: Path, out: Path, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    """`calibkit tune` through the CLI; returns tune.json."""
    cmd = [sys.executable, "-m", "calibkit", "tune", str(z.folder), "-c", str(calib), "-e", str(eval_path),
           "--min-agreement", str(args.min_agreement), "--max-drop", str(args.max_drop), "--out", str(out),
           "--no-report", "--workers", str(args.workers), "--force"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return json.loads((out / "tune.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--models", default=",".join(SPECS))
    ap.add_argument("--exclude", action="append", default=[], help="regex of nodes / module paths kept FP32")
    ap.add_argument("--eval-size", type=int, default=600, help="eval texts (zoo_texts(n, seed=9))")
    ap.add_argument("--no-tune", action="store_true", help="skip `calibkit tune` on the classifiers")
    ap.add_argument("--min-agreement", type=float, default=99.0)
    ap.add_argument("--max-drop", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--decompose", action="store_true", help="also: weights-only / activations-only INT8, FP16")
    ap.add_argument("--smooth", action="store_true",
                    help="also: all-INT8 (exact Q/DQ) of the model smoothed by `calibkit smooth` (alpha auto)")
    ap.add_argument("--peers", action="store_true",
                    help="also: ONNX Runtime's quantize_static (MinMax, Percentile, Entropy) on the classifiers")
    ap.add_argument("--floor", action="store_true",
                    help="also: the tensors that alone flip the most predictions, at their best scale")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="calibkit-zoo-"))
    zoo = build_zoo(root / "models", tuple(args.models.split(",")))
    calib_texts = zoo_texts(100, seed=5)
    calib = write_calibration_set(root / "calib", calib_texts, None, {})
    eval_texts = zoo_texts(args.eval_size, seed=9)
    write_texts(root / "eval.jsonl", eval_texts)
    print(f"eval texts: {len(eval_texts)}; tune: "
          + ("off" if args.no_tune else f"calibkit tune --min-agreement {args.min_agreement:g} "
             f"--max-drop {args.max_drop:g} (holdout 30 %)"), flush=True)
    bits = 7 if int8_gemm_saturates() else 8
    print(f"CPU: {'no VNNI' if bits == 7 else 'VNNI or not x86'}; build's onnxruntime layout uses {bits}-bit weights",
          flush=True)
    header = ("| model | task | all-INT8 agreement [95 % CI] | all-INT8, exact Q/DQ [95 % CI] | "
              f"ORT layout, {bits}-bit weights, ORT kernels [95 % CI] | other fidelity "
              "(ORT kernels; exact Q/DQ) | all-INT8 FLOPs | tuned holdout agreement [95 % CI] | tuned FLOPs | kept "
              "| 99 % on holdout |")
    rows = []
    parts: list[str] = []
    peer_rows: list[str] = []
    floor_rows: list[str] = []
    for name, z in zoo.items():
        work = root / "runs" / name
        md = ModelDir.resolve(z.folder)
        res = calibrate(CalibrateRequest(model=md, calibration_set=calib, method=Method.MSE, out=work / "cal",
                                         cache_dir=root / "cache", exclude=tuple(args.exclude)))
        for p, extra in (("fp32", {}), ("int8", {"calibration": res.out_dir, "target": "tensorrt"})):
            build(BuildRequest(model=z.folder, output=work / f"{p}.onnx", precision=Precision(p), **extra))
        # build's own default for ONNX Runtime: the onnxruntime layout, 7-bit weights where this CPU lacks VNNI
        build(BuildRequest(model=z.folder, output=work / "int8-ort.onnx", precision=Precision.INT8,
                           calibration=res.out_dir, target="onnxruntime"))
        fp32 = onnx.load(str(work / "fp32.onnx"))
        task = choose_task(model_outputs(fp32), json.loads((z.folder / "config.json").read_text()))
        tok = TextTokenizer(z.folder)
        outs = []
        for p in ("fp32", "int8"):
            with OnnxRuntimeRunner((work / f"{p}.onnx").read_bytes(), name=p) as r:
                outs.append(task.predict(r, tok, eval_texts, batch_size=32))
        fid = task.fidelity(outs[0], outs[1])
        with exact_qdq_runner(work / "int8.onnx") as r:
            exact = task.predict(r, tok, eval_texts, batch_size=32)
        fid_exact = task.fidelity(outs[0], exact)
        with OnnxRuntimeRunner((work / "int8-ort.onnx").read_bytes(), name="int8-ort") as r:
            ort_layout = task.predict(r, tok, eval_texts, batch_size=32)
        ort_iv = agreement(task, outs[0], ort_layout)
        ort_cell = ci(ort_iv) if ort_iv is not None else \
            f"cosine min {task.fidelity(outs[0], ort_layout).cosine_min:.5f}"
        ids = np.array([tok.encode([eval_texts[0]]).input_ids[0]])
        feeds = {k: v for k, v in {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                   "token_type_ids": np.zeros_like(ids)}.items()
                 if k in {i.name for i in fp32.graph.input}}
        share = linear_work(fp32, feeds).int8_fraction(set(res.kept_nodes))
        all_iv, exact_iv = agreement(task, outs[0], outs[1]), agreement(task, outs[0], exact)
        other = ""
        if task.kind == "token-classification":
            other = (f"of tokens; entity F1 {fid.extra.get('entity_f1', float('nan')):.3f}; "
                     f"{fid_exact.extra.get('entity_f1', float('nan')):.3f}")
        elif task.kind == "embedding":
            other = "; ".join(f"top-1 neighbour {f.agreement:.2%}, cosine min {f.cosine_min:.5f}, top-"
                              f"{int(f.extra['k'])} overlap {f.extra['retrieval_overlap_at_k']:.3f}"
                              for f in (fid, fid_exact))
        tuned = "—"
        tuned_share = "—"
        kept = "—"
        target = verdict(all_iv) if all_iv is not None else (
            "cosine ≥ 0.999: " + ("yes" if fid.cosine_min >= 0.999 else "no") + "; exact Q/DQ: "
            + ("yes" if fid_exact.cosine_min >= 0.999 else "no"))
        if args.smooth and not args.decompose and task.kind == "classification":
            parts.append(f"| {name} | {ci(exact_iv)} | {smoothed(task, work, md, calib, tok, eval_texts, outs[0])} |")
            print(parts[-1], flush=True)
        if args.decompose and task.kind == "classification":
            parts.append(f"| {name} | {ci(exact_iv)} | {decompose(task, work, z.folder, tok, eval_texts, outs[0])} |")
            print(parts[-1], flush=True)
        if args.peers and task.kind == "classification":
            peer = peers(task, work, tok, calib_texts, eval_texts, outs[0])
            peer_rows.append(f"| {name} | {ci(exact_iv)} | {peer} |")
            print(peer_rows[-1], flush=True)
        if args.floor and task.kind == "classification":
            print(f"{name}: {ties(outs[0].values, exact.values)}", flush=True)
            floor_rows.extend(f"| {name} | {row} |" for row in floor(task, work, tok, eval_texts, outs[0]))
            print("\n".join(floor_rows[-FLOOR_TENSORS:]), flush=True)
        if task.kind == "classification" and not args.no_tune:
            labels = [task.labels[int(i)] for i in task.predictions(outs[0])]
            labelled = write_texts(work / "labelled.jsonl", eval_texts, labels)
            doc = run_tune(z, calib.path, labelled, work / "tune", args)
            final = doc["final"]
            hold = (final.get("holdout_evidence") or {}).get("agreement")
            h_iv = Interval(hold["estimate"], hold["low"], hold["high"]) if hold else None
            tuned = ci(h_iv) + f" (n={final['holdout_evidence']['n']}, {doc['methods']['chosen']})" if hold else "—"
            tuned_share = f"{100 * final['int8_flops_fraction']:.1f} %"
            kept = str(len(final["kept_nodes"]))
            target = verdict(h_iv)
        rows.append(f"| {name} | {task.kind} | {ci(all_iv)} | {ci(exact_iv)} | {ort_cell} | {other} "
                    f"| {100 * share:.1f} % "
                    f"| {tuned} | {tuned_share} | {kept} | {target} |")
        print(rows[-1], flush=True)
    print()
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    print("\n".join(rows))
    if parts:
        print()
        if args.decompose:
            print("| model | all-INT8, exact Q/DQ | weights only INT8 (exact) | activations only INT8 (exact) | FP16 |")
            print("|---|---|---|---|---|")
        else:
            print("| model | all-INT8, exact Q/DQ | smoothed, mse (exact) | smoothed, minmax (exact) | smoothed |")
            print("|---|---|---|---|---|")
        print("\n".join(parts))
    if peer_rows:
        print()
        print("| model | calibkit mse, exact Q/DQ | ORT MinMax s8 sym | ORT MinMax u8 asym | ORT MinMax s8 sym, padded "
              "| ORT MinMax u8 asym, padded | ORT Percentile s8 sym, padded | ORT Percentile u8 asym, padded "
              "| ORT Entropy s8 sym, padded | ORT Entropy u8 asym, padded |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(peer_rows))
    if floor_rows:
        print()
        print("| model | tensor alone in INT8 | flips at the calibrated scale | fewest flips over scales x0.05..x2 |")
        print("|---|---|---|---|")
        print("\n".join(floor_rows))


if __name__ == "__main__":
    main()
