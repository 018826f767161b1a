"""Calibration at BERT scale: plain FP32 inference (the floor) vs calibkit's first method vs ORT MinMax.

    python benchmarks/bench_scale.py --shapes base --texts 512,2048 [--log demo_assets/logs.jsonl]
        [--tokenizer demo_assets/model] [--samples DIR] [--work DIR] [--no-ort] [--ort-lengths 128,longest]
        [--profile] [--kernels] [--variant sort|views|overwrite|no-overlap] [--memory-budget 1G] [--also-budget 256M]
        [--max-batch-tokens N]
        [--threads N]

Models are random-initialised BERT shapes built from a `transformers` config (nothing is downloaded) and exported
with torch's legacy exporter (opset 17, dynamic batch and sequence): mini = 6x384 (MiniLM-L6), base = 12x768,
large = 24x1024. Texts are sampled from the demo log with `calibkit sample` (real lengths up to 512 tokens), or
taken from `--samples DIR/n<N>/texts.jsonl` (what the GPU machine's host gets: the samples, not the log).

Each measurement runs in its own subprocess, one after another (peak RSS from wait4, so peaks do not mix):
- floor: FP32 ONNX Runtime inference over the same texts, length-sorted batches of 32 (`predict_logits`);
- calibkit: `calibrate` end to end with the default method (mse), fresh statistics, default budget unless given;
- ORT quantize_static MinMax, QDQ, one text per batch (variable lengths fail there), in two rows
  (``--ort-lengths``): each text truncated and padded to 128 tokens (the peer's usual setting: it runs fewer
  tokens than calibkit and the floor, whose texts keep up to 512), and ``longest``: no text truncated, every text
  padded to the longest text of the set (512 tokens for the log-sampled sets), like for like in what is seen
  (ORT then also runs, and takes ranges over, the padding, which calibkit masks).
``--kernels`` first measures the histogram kernels alone (calibkit.calibrate.histogram.BinCounter) on 1 thread and
on every CPU; ``--variant sort|bincount|add_at`` also runs calibkit with that kernel forced (by default the
collector counts with bincount below 6 statistics threads and with the GIL-free sort kernel from 6 on);
``--variant no-overlap`` runs it with inference and statistics taking turns (calibkit.calibrate.collect.OVERLAP).

Where the bytes went before the budget (measured on the old collector, MiniLM-L6 shape, the 512 log-sampled
texts, 2 cores, batch 32; RSS sampled every 10 ms, numpy's allocations by tracemalloc):
- peak RSS 6.06 GB for a model of 90 MB. The longest batch (32 texts padded to 512 tokens) alone returned
  3.93 GB of tapped outputs (50 tensors), 2.87 GB of it the 24 four-dimensional attention tensors (Q, K^T, V,
  probabilities: [32, 12, 512, 64|512]); the overlap thread kept batch k's outputs alive while batch k+1 ran, so
  the two longest batches were alive together;
- numpy's own allocations peaked at only 0.28 GB: `valid_values`' boolean broadcast masks and boolean-index
  copies (one tensor's real entries at a time). The histogram was already chunked (64K float32/intp buffers):
  no float64 or int64 copies of whole tensors;
- the model three times: loaded proto 0.09 GB, `add_outputs`' full copy plus its serialized bytes (kept by the
  runner) +0.13 GB, ONNX Runtime's session +0.14 GB (BERT-large: 1.34 GB per copy).
So the peak is set by batch x sequence^2 x tapped tensors, and by the longest texts, not by the statistics.
The collector now (calibkit/calibrate/collect.py): batches formed by a byte budget on the tapped outputs
(priced by the layout probe, sequence^2 for attention; with the overlap of batch k+1's inference and batch k's
statistics each batch gets half the budget, so the two alive fit it), outputs read as views
of the real tokens (or in place, padding overwritten, for short texts) in 256K-element chunks and released when
done, the model tapped without serializing it again (the taps are a protobuf suffix appended to the file's
bytes) and its bytes dropped after loading, statistics on all cores between
inference runs. Same shape and texts after: peak 1.93 GB, largest
batch 0.98 GB of outputs, numpy's allocations 0.10 GB (`--profile` prints these).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _ort_reader import padded_reader

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SHAPES = {  # layers, hidden, heads, intermediate
    "mini": (6, 384, 12, 1536),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def read_texts(folder: Path) -> list[str]:
    with open(folder / "texts.jsonl", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


# -- workers (run in subprocesses) -----------------------------------------------------------------------------
def bert_shape(shape: str):  # noqa: ANN201
    """A random-initialised BERT classifier of ``shape`` (seed 0; nothing downloaded)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    layers, hidden, heads, inter = SHAPES[shape]
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=inter, max_position_embeddings=512, num_labels=2,
                     id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    torch.manual_seed(0)
    return BertForSequenceClassification(cfg).eval()


def export_bert(model, out: Path, tokenizer: Path) -> None:  # noqa: ANN001
    """``model`` as a calibkit model folder: model.onnx (dynamic batch and sequence), config.json, tokenizer."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    ids = torch.ones((2, 16), dtype=torch.long)
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
           "token_type_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(out / "model.onnx"),
                          input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                          dynamic_axes=dyn, opset_version=17, dynamo=False)
    model.config.to_json_file(str(out / "config.json"))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, out / name)


def worker_build(args: argparse.Namespace) -> dict:
    model = bert_shape(args.shape)
    t0 = time.perf_counter()
    export_bert(model, Path(args.out), Path(args.tokenizer))
    return {"seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in model.parameters())}


def worker_floor(args: argparse.Namespace) -> dict:
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    texts = read_texts(Path(args.calib))
    t0 = time.perf_counter()
    tok = TextTokenizer(args.model, max_length=512)
    with OnnxRuntimeRunner(Path(args.model) / "model.onnx") as runner:
        predict_logits(runner, tok, texts, batch_size=32)
    return {"seconds": time.perf_counter() - t0}


def _budget(args: argparse.Namespace):  # noqa: ANN202
    from calibkit.data.encode import DEFAULT_MEMORY_BUDGET, TokenBudget, parse_size

    mem = parse_size(args.memory_budget) if args.memory_budget else DEFAULT_MEMORY_BUDGET
    return TokenBudget(max_batch_tokens=args.max_batch_tokens or None, memory_bytes=mem)


def worker_calibkit(args: argparse.Namespace) -> dict:
    import calibkit.calibrate.collect as collect
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.resources import Resources

    if args.variant in ("views", "overwrite"):  # A/B of the statistics path: always views / always overwrite
        collect._VIEWS_FROM = 0 if args.variant == "views" else 1 << 62
    elif args.variant in ("sort", "bincount", "add_at"):  # A/B of the histogram kernel
        collect.KERNEL = args.variant
    elif args.variant == "no-overlap":  # A/B of inference overlapped with the previous batch's statistics
        collect.OVERLAP = False
    t0 = time.perf_counter()
    res = calibrate(CalibrateRequest(model=ModelDir.resolve(args.model),
                                     calibration_set=load_calibration_set(args.calib), out=Path(args.out),
                                     cache_dir=Path(args.cache_dir),
                                     threads=args.threads or None), Resources(budget=_budget(args)))
    meta = json.loads((Path(args.out) / "calibration.json").read_text())["statistics"] \
        if (Path(args.out) / "calibration.json").is_file() else {}
    keep = ("batches", "session_seconds", "probe_seconds", "inference_seconds", "statistics_seconds",
            "statistics_cpu_seconds", "statistics_threads", "largest_batch_tapped_bytes", "padding_fraction")
    return {"seconds": time.perf_counter() - t0, "timings": res.timings, **{k: meta.get(k) for k in keep}}


def worker_smooth(args: argparse.Namespace) -> dict:
    """`calibkit smooth` (alpha auto): the per-channel pass, the alpha search and the equivalence check."""
    from calibkit.calibrate.smoothing import smooth
    from calibkit.requests.smooth import SmoothRequest
    from calibkit.resources import Resources

    t0 = time.perf_counter()
    res = smooth(SmoothRequest(model=args.model, calibration_set=args.calib, out=Path(args.out)),
                 Resources(budget=_budget(args)))
    return {"seconds": time.perf_counter() - t0, "timings": res.timings, "smoothed": len(res.smoothed),
            "groups": res.groups, "max_deviation": res.max_deviation}


def worker_profile(args: argparse.Namespace) -> dict:
    """RSS over time (sampled every 20 ms) and numpy's tracemalloc peak while collecting statistics."""
    import threading
    import tracemalloc

    import psutil

    from calibkit.calibrate.collect import collect_stats
    from calibkit.data.encode import bucketed_batches
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.graph import load_model
    from calibkit.quantize.placement import plan_placement

    proc = psutil.Process()
    marks: dict[str, float] = {"start": proc.memory_info().rss / 1e9}
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], proc.memory_info().rss / 1e9)

    threading.Thread(target=sample, daemon=True).start()
    proto = load_model(Path(args.model) / "model.onnx")
    marks["model loaded"] = proc.memory_info().rss / 1e9
    tensors = list(plan_placement(proto).activations)
    tok = TextTokenizer(args.model, max_length=512)
    names = [i.name for i in proto.graph.input]
    batches = bucketed_batches(tok, read_texts(Path(args.calib)), names, batch_size=32, budget=_budget(args))
    tracemalloc.start()
    t0 = time.perf_counter()
    store = collect_stats(proto, batches, tensors, threads=args.threads or None)
    seconds = time.perf_counter() - t0
    _, traced = tracemalloc.get_traced_memory()
    stop.set()
    marks["after collect"] = proc.memory_info().rss / 1e9
    return {"seconds": seconds, "tensors": len(tensors), "rss_gb": marks, "peak_rss_sampled_gb": peak[0],
            "tracemalloc_peak_gb": traced / 1e9, **{k: store.meta.get(k) for k in (
                "batches", "largest_batch_tapped_bytes", "inference_seconds", "statistics_seconds")}}


def worker_ort(args: argparse.Namespace) -> dict:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from calibkit.data.tokenizer import TextTokenizer

    texts = read_texts(Path(args.calib))
    if args.ort_length == "longest":  # no truncation: every text padded to the longest of the set
        longest = TextTokenizer(args.model, max_length=512)
        length = max(int(longest.encode([t]).attention_mask.sum()) for t in texts)
    else:
        length = int(args.ort_length or 128)
    tok = TextTokenizer(args.model, max_length=length)
    t0 = time.perf_counter()
    try:
        quantize_static(str(Path(args.model) / "model.onnx"), args.out, padded_reader(tok, texts, length),
                        quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                        op_types_to_quantize=["MatMul", "Gemm"], calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
        ok, err = True, ""
    except Exception as exc:  # the peer's failure is the measurement
        ok, err = False, f"{type(exc).__name__}: {str(exc)[:160]}"
    return {"seconds": time.perf_counter() - t0, "ok": ok, "error": err, "length": length}


def worker_kernels(args: argparse.Namespace) -> dict:
    """Seconds per 1e9 values of each histogram kernel, on 1 thread and on every CPU (one tensor per thread,
    256K-element chunks, as the collector runs them): the parallel speed-up shows how much holds the GIL."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from calibkit.calibrate.collect import default_threads
    from calibkit.calibrate.histogram import KERNELS
    from calibkit.calibrate.stats import StatsAccumulator

    n = default_threads()
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(1 << 23, dtype=np.float32) * 3 for _ in range(2 * n)]  # 32 MB per tensor
    out: dict = {"threads": n}
    for kernel in KERNELS:
        def run(x: np.ndarray, kernel: str = kernel) -> None:
            StatsAccumulator("t", 2048, kernel=kernel).observe(x)

        t0 = time.perf_counter()
        for x in data[:2]:
            run(x)
        one = (time.perf_counter() - t0) / (2 * data[0].size) * 1e9
        with ThreadPoolExecutor(n) as pool:
            t0 = time.perf_counter()
            list(pool.map(run, data))
            many = (time.perf_counter() - t0) / (len(data) * data[0].size) * 1e9
        out[kernel] = {"ns_per_value_1_thread": round(one, 3), f"ns_per_value_{n}_threads": round(many, 3),
                       "speedup": round(one / many, 2)}
    return out


WORKERS = {"build": worker_build, "floor": worker_floor, "calibkit": worker_calibkit, "ort": worker_ort,
           "profile": worker_profile, "kernels": worker_kernels, "smooth": worker_smooth}


# -- driver ----------------------------------------------------------------------------------------------------
def spawn(kind: str, **kw: object) -> dict:
    """Run one worker in a fresh subprocess; its own peak RSS comes from wait4."""
    cmd = [PY, __file__, "--worker", kind]
    for k, v in kw.items():
        if v not in (None, ""):
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    peak = usage.ru_maxrss / 1e6  # KiB on Linux -> GB
    if proc.returncode != 0:
        tail = stderr.strip().splitlines()[-1][:300] if stderr.strip() else f"exit {proc.returncode}"
        return {"ok": False, "error": tail, "peak_rss_gb": peak, "wall": wall}
    res = json.loads(stdout.strip().splitlines()[-1])
    res.update(peak_rss_gb=peak, wall=wall)
    return res


def sample(log: Path, tokenizer: Path, n: int, out: Path) -> Path:
    if not (out / "texts.jsonl").is_file():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([PY, "-m", "calibkit", "sample", str(log), "--size", str(n), "--tokenizer", str(tokenizer),
                        "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=sorted(WORKERS))
    ap.add_argument("--shapes", default="base", help="comma-separated: mini, base, large")
    ap.add_argument("--shape", default="base")
    ap.add_argument("--texts", default="512,2048")
    ap.add_argument("--log", default=str(ROOT / "demo_assets/logs.jsonl"))
    ap.add_argument("--tokenizer", default=str(ROOT / "demo_assets/model"))
    ap.add_argument("--samples", default="", help="folder with n<N>/texts.jsonl (instead of sampling the log)")
    ap.add_argument("--work", default="", help="where models and samples are kept between runs")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--ort-texts", default="512", help="text counts at which ORT MinMax runs")
    ap.add_argument("--ort-lengths", default="128,longest",
                    help="ORT MinMax rows: pad/truncate to N tokens, or 'longest' (no truncation)")
    ap.add_argument("--ort-shapes", default="", help="shapes at which ORT MinMax runs (default: all)")
    ap.add_argument("--ort-length", default="", help=argparse.SUPPRESS)
    ap.add_argument("--kernels", action="store_true", help="first measure the histogram kernels alone")
    ap.add_argument("--profile", action="store_true", help="also profile statistics collection (RSS, tracemalloc)")
    ap.add_argument("--memory-budget", default="")
    ap.add_argument("--also-budget", default="", help="also run calibkit with this --memory-budget (e.g. 256M)")
    ap.add_argument("--max-batch-tokens", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--variant", default="", help="views | overwrite | sort | bincount | add_at | no-overlap: "
                    "also run calibkit with that statistics path or histogram kernel forced, or without overlap")
    ap.add_argument("--model", default="")
    ap.add_argument("--calib", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--smooth", action="store_true", help="also time `calibkit smooth` (alpha auto): s, peak RSS")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    tok = Path(args.tokenizer)
    counts = [int(n) for n in args.texts.split(",")]
    ort_counts = {int(n) for n in args.ort_texts.split(",") if n}
    opts = {"memory_budget": args.memory_budget, "max_batch_tokens": args.max_batch_tokens or None,
            "threads": args.threads or None}
    rows = []
    if args.kernels:
        k = spawn("kernels")
        print(json.dumps({"kernels": k}), file=sys.stderr, flush=True)
        rows.append({"kernels": k})
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    ort_shapes = set(args.ort_shapes.split(",")) if args.ort_shapes else None
    for shape in args.shapes.split(","):
        model = work / f"bert-{shape}"
        if not (model / "model.onnx").is_file():
            r = spawn("build", shape=shape, out=model, tokenizer=tok)
            if not r.get("ok", True):
                raise SystemExit(f"building {shape} failed: {r['error']}")
        for n in counts:
            calib = Path(args.samples) / f"n{n}" if args.samples else sample(Path(args.log), tok, n, work / f"n{n}")
            row: dict = {"shape": shape, "texts": n}
            row["floor"] = spawn("floor", model=model, calib=calib)
            with tempfile.TemporaryDirectory(prefix="ck-", dir=work) as tmp:
                row["calibkit"] = spawn("calibkit", model=model, calib=calib, out=Path(tmp) / "out",
                                        cache_dir=Path(tmp) / "cache", **opts)
            if args.also_budget:  # the same run under a smaller budget: less memory for more, smaller batches
                with tempfile.TemporaryDirectory(prefix="ck-", dir=work) as tmp:
                    row[f"calibkit-budget-{args.also_budget}"] = spawn(
                        "calibkit", model=model, calib=calib, out=Path(tmp) / "o", cache_dir=Path(tmp) / "c",
                        **{**opts, "memory_budget": args.also_budget})
            if args.variant:
                with tempfile.TemporaryDirectory(prefix="ck-", dir=work) as tmp:
                    row[f"calibkit-{args.variant}"] = spawn("calibkit", model=model, calib=calib, out=Path(tmp) / "o",
                                                            cache_dir=Path(tmp) / "c", variant=args.variant, **opts)
            if args.smooth:
                with tempfile.TemporaryDirectory(prefix="ck-", dir=work) as tmp:
                    row["smooth"] = spawn("smooth", model=model, calib=calib, out=Path(tmp) / "s",
                                          memory_budget=args.memory_budget)
            if args.profile:
                row["profile"] = spawn("profile", model=model, calib=calib, **opts)
            if not args.no_ort and n in ort_counts and (ort_shapes is None or shape in ort_shapes):
                for length in [x for x in args.ort_lengths.split(",") if x]:
                    row[f"ort-{length}"] = spawn("ort", model=model, calib=calib, ort_length=length,
                                                 out=work / f"ort-{shape}-{n}-{length}.onnx")
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.json:  # after every row: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows)


def report(rows: list[dict]) -> None:
    print(f"{os.cpu_count()} CPUs; noisy shared machines: read the ratios within one run")
    for r in rows:
        if "kernels" in r:
            print("histogram kernels:", json.dumps(r["kernels"]))
    print(f"{'shape':6s} {'texts':>5s} | {'floor s':>7s} {'GB':>5s} | {'calibkit s':>10s} {'GB':>5s} "
          f"{'x time':>6s} {'x mem':>6s} | ORT MinMax: s, GB, ORT/calibkit time")
    for r in rows:
        if "kernels" in r:
            continue
        f, c = r["floor"], r["calibkit"]
        fs, cs = f.get("seconds", float("nan")), c.get("seconds", float("nan"))
        line = (f"{r['shape']:6s} {r['texts']:5d} | {fs:7.1f} {f['peak_rss_gb']:5.2f} | {cs:10.1f} "
                f"{c['peak_rss_gb']:5.2f} {cs / fs:6.2f} {c['peak_rss_gb'] / f['peak_rss_gb']:6.2f} |")
        for key in sorted(k for k in r if k.startswith("ort-")):
            o = r[key]
            if o.get("ok", True):
                line += (f" padded to {o.get('length')}: {o['seconds']:.1f} s, {o['peak_rss_gb']:.2f} GB, "
                         f"{o['seconds'] / cs:.2f}x;")
            else:
                line += f" {key} FAILED {o.get('error', '')};"
        if not c.get("ok", True):
            line += f"  calibkit FAILED {c.get('error')}"
        print(line)
        if "smooth" in r:
            sm = r["smooth"]
            print(f"    smooth: {sm.get('seconds', float('nan')):.1f} s ({sm.get('timings')}), peak "
                  f"{sm['peak_rss_gb']:.2f} GB, {sm.get('smoothed')} of {sm.get('groups')} smoothed, FP32 "
                  f"deviation {sm.get('max_deviation')}" if sm.get("ok", True) else f"    smooth FAILED {sm}")
        for key in [k for k in r if k.startswith("calibkit")]:
            c = r[key]
            if c.get("ok", True):
                t = c.get("timings", {})
                print(f"    {key}: {c['seconds']:.1f} s = placement+load {t.get('placement', 0):.1f}, statistics "
                      f"{t.get('statistics', 0):.1f} (session {c.get('session_seconds')}, probe "
                      f"{c.get('probe_seconds')}, inference {c.get('inference_seconds')}, statistics "
                      f"{c.get('statistics_seconds')} wall / "
                      f"{c.get('statistics_cpu_seconds')} CPU s on {c.get('statistics_threads')} threads, "
                      f"{c.get('batches')} batches), method {t.get('method', 0):.1f}, Q/DQ {t.get('quantize', 0):.1f}, "
                      f"write {t.get('write', 0):.1f}; peak {c['peak_rss_gb']:.2f} GB")


if __name__ == "__main__":
    main()
