"""Calibration at BERT scale: plain FP32 inference (the floor) vs calibkit's first method vs ORT MinMax.

    python benchmarks/bench_scale.py --shapes base --texts 512,2048 [--log demo_assets/logs.jsonl]
        [--tokenizer demo_assets/model] [--samples DIR] [--work DIR] [--no-ort] [--profile]
        [--memory-budget 1G] [--max-batch-tokens N] [--threads N]

Models are random-initialised BERT shapes built from a `transformers` config (nothing is downloaded) and exported
with torch's legacy exporter (opset 17, dynamic batch and sequence): mini = 6x384 (MiniLM-L6), base = 12x768,
large = 24x1024. Texts are sampled from the demo log with `calibkit sample` (real lengths up to 512 tokens), or
taken from `--samples DIR/n<N>/texts.jsonl` (what the GPU machine's host gets: the samples, not the log).

Each measurement runs in its own subprocess, one after another (peak RSS from wait4, so peaks do not mix):
- floor: FP32 ONNX Runtime inference over the same texts, length-sorted batches of 32 (`predict_logits`);
- calibkit: `calibrate` end to end with the default method (mse), fresh statistics, default budget unless given;
- ORT quantize_static MinMax, QDQ, each text padded to 128 tokens (variable lengths fail there).

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
(priced by the layout probe, sequence^2 for attention), one batch alive (no overlap), outputs read as views
of the real tokens (or in place, padding overwritten, for short texts) in 256K-element chunks and released when
done, the model tapped without a copy and its bytes dropped after loading, statistics on all cores between
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
def worker_build(args: argparse.Namespace) -> dict:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    layers, hidden, heads, inter = SHAPES[args.shape]
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=inter, max_position_embeddings=512, num_labels=2,
                     id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.ones((2, 16), dtype=torch.long)
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
           "token_type_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}}
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(out / "model.onnx"),
                          input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                          dynamic_axes=dyn, opset_version=17, dynamo=False)
    cfg.to_json_file(str(out / "config.json"))
    for name in TOKENIZER_FILES:
        if (Path(args.tokenizer) / name).is_file():
            shutil.copy(Path(args.tokenizer) / name, out / name)
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
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.modeldir import ModelDir

    if args.variant in ("views", "overwrite"):  # A/B of the statistics path: always views / always overwrite
        import calibkit.calibrate.collect as collect

        collect._VIEWS_FROM = 0 if args.variant == "views" else 1 << 62
    t0 = time.perf_counter()
    res = calibrate(ModelDir.resolve(args.model), load_calibration_set(args.calib), out_dir=Path(args.out),
                    cache_dir=Path(args.cache_dir), budget=_budget(args), threads=args.threads or None)
    meta = json.loads((Path(args.out) / "calibration.json").read_text())["statistics"] \
        if (Path(args.out) / "calibration.json").is_file() else {}
    keep = ("batches", "inference_seconds", "statistics_seconds", "statistics_cpu_seconds", "statistics_threads",
            "largest_batch_tapped_bytes", "padding_fraction")
    return {"seconds": time.perf_counter() - t0, "timings": res.timings, **{k: meta.get(k) for k in keep}}


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
    tok = TextTokenizer(args.model, max_length=128)


    t0 = time.perf_counter()
    try:
        quantize_static(str(Path(args.model) / "model.onnx"), args.out, padded_reader(tok, texts, 128),
                        quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                        op_types_to_quantize=["MatMul", "Gemm"], calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
        ok, err = True, ""
    except Exception as exc:  # the peer's failure is the measurement
        ok, err = False, f"{type(exc).__name__}: {str(exc)[:160]}"
    return {"seconds": time.perf_counter() - t0, "ok": ok, "error": err}


WORKERS = {"build": worker_build, "floor": worker_floor, "calibkit": worker_calibkit, "ort": worker_ort,
           "profile": worker_profile}


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
    ap.add_argument("--profile", action="store_true", help="also profile statistics collection (RSS, tracemalloc)")
    ap.add_argument("--memory-budget", default="")
    ap.add_argument("--max-batch-tokens", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--variant", default="", help="views | overwrite: also run calibkit with that path forced")
    ap.add_argument("--model", default="")
    ap.add_argument("--calib", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--json", default="", help="also write the results here")
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
            if args.variant:
                with tempfile.TemporaryDirectory(prefix="ck-", dir=work) as tmp:
                    row[f"calibkit-{args.variant}"] = spawn("calibkit", model=model, calib=calib, out=Path(tmp) / "o",
                                                            cache_dir=Path(tmp) / "c", variant=args.variant, **opts)
            if args.profile:
                row["profile"] = spawn("profile", model=model, calib=calib, **opts)
            if not args.no_ort and n in ort_counts:
                row["ort"] = spawn("ort", model=model, calib=calib, out=work / f"ort-{shape}-{n}.onnx")
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.json:  # after every row: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"{os.cpu_count()} CPUs; noisy shared machines: read the ratios within one run")
    print(f"{'shape':6s} {'texts':>5s} | {'floor s':>7s} {'GB':>5s} | {'calibkit s':>10s} {'GB':>5s} "
          f"{'x time':>6s} {'x mem':>6s} | {'ORT MinMax s':>12s} {'GB':>5s} {'ORT/ck':>6s}")
    for r in rows:
        f, c, o = r["floor"], r["calibkit"], r.get("ort")
        fs, cs = f.get("seconds", float("nan")), c.get("seconds", float("nan"))
        line = (f"{r['shape']:6s} {r['texts']:5d} | {fs:7.1f} {f['peak_rss_gb']:5.2f} | {cs:10.1f} "
                f"{c['peak_rss_gb']:5.2f} {cs / fs:6.2f} {c['peak_rss_gb'] / f['peak_rss_gb']:6.2f} |")
        if o and o.get("ok", True):
            line += f" {o['seconds']:12.1f} {o['peak_rss_gb']:5.2f} {o['seconds'] / cs:6.2f}"
        elif o:
            line += f" FAILED {o.get('error', '')}"
        if not c.get("ok", True):
            line += f"  calibkit FAILED {c.get('error')}"
        print(line)


if __name__ == "__main__":
    main()
