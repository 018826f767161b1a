"""Sensitivity sweep and sharded calibration of a BERT-base shape on a local Dask cluster: 1 worker vs N.

    python benchmarks/bench_distributed.py [--workers 16] [--jobs-per-worker 4] [--texts 32]
        [--layers 12 --hidden 768 --heads 12 --intermediate 3072] [--json out.json]

1. a random-initialised BertForSequenceClassification (transformers config, eager attention, seed 0) exported
   with the legacy exporter at opset 17, dynamic batch and sequence; a word-level tokenizer over a synthetic
   30,522-word vocabulary; seeded random texts of 16-64 words;
2. calibration statistics of every MatMul/Gemm input over ``--calib-texts`` texts: once in this process
   (ONNX Runtime, all cores) and merged from ``--workers`` shards computed on the cluster's workers
   (one thread each); the merged statistics must be bit-identical (counts, ranges, min/max, NaN/inf counts);
3. the sensitivity sweep (one keep-this-node-in-higher-precision variant per quantized node, each a full pass
   over ``--texts`` eval texts, minmax table, TensorRT Q/DQ layout) on a LocalCluster of 1 worker and of
   ``--workers`` workers (one process, one thread, ORT intra-op threads 1 each). Every unit does the same work
   (same texts, one node kept), so the 1-worker run measures ``--jobs-per-worker`` units and the speed-up is
   the ratio of units per second; the N-worker run covers ``workers x jobs-per-worker`` units.
Target (issue 12): >= 10x with 16 workers on a 16-core host.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def export_bert(folder: Path, layers: int, hidden: int, heads: int, intermediate: int) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification

    folder.mkdir(parents=True, exist_ok=True)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     intermediate_size=intermediate, num_labels=2, attn_implementation="eager")
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).eval()
    ids = torch.randint(5, cfg.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    tt = torch.zeros_like(ids)
    axes = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask, tt), str(folder / "model.onnx"), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "logits": {0: "batch"}})
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    vocab.update({f"w{i}": i + 5 for i in range(cfg.vocab_size - 5)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 128,
                                                    "id2label": {"0": "negative", "1": "positive"}}))


def make_texts(n: int, seed: int, vocab: int = 30517) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(f"w{w}" for w in rng.integers(0, vocab, int(rng.integers(16, 65)))) for _ in range(n)]


def stats_identical(a, b) -> tuple[bool, int]:  # noqa: ANN001
    import numpy as np

    bad = 0
    for t in a:
        x, y = a[t], b[t]
        same = ((x.count, x.nan_count, x.posinf_count, x.neginf_count, x.min, x.max, x.histogram.upper)
                == (y.count, y.nan_count, y.posinf_count, y.neginf_count, y.min, y.max, y.histogram.upper)
                and np.array_equal(x.histogram.counts, y.histogram.counts))
        bad += not same
    return bad == 0 and list(a) == list(b), bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--jobs-per-worker", type=int, default=4)
    ap.add_argument("--texts", type=int, default=32, help="eval texts per sensitivity unit")
    ap.add_argument("--calib-texts", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import numpy as np

    from calibkit.calibrate.collect import collect_stats
    from calibkit.calibrate.methods import compute_table
    from calibkit.calibrate.sharded import collect_stats_sharded
    from calibkit.data.encode import bucketed_batches
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits
    from calibkit.evaluate.sensitivity import ALL_BUT_THIS, SensitivityJob, run_jobs
    from calibkit.executors.dask import DaskExecutor
    from calibkit.graph import load_model
    from calibkit.quantize.placement import plan_placement
    from calibkit.quantize.tablefile import write_calibration_json
    from calibkit.types import Method

    res: dict = {"cpus": os.cpu_count(), "workers": args.workers}
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        folder = Path(tmp) / "bert"
        t0 = time.perf_counter()
        export_bert(folder, args.layers, args.hidden, args.heads, args.intermediate)
        model_path = folder / "model.onnx"
        proto = load_model(model_path)
        placement = plan_placement(proto)
        nodes = [n.name for n in placement.nodes]
        tensors = list(placement.activations)
        res.update(model_mb=round(model_path.stat().st_size / 2**20, 1), quantized_nodes=len(nodes),
                   tensors=len(tensors), export_s=round(time.perf_counter() - t0, 1))
        print(f"exported {res['model_mb']} MB, {len(nodes)} quantized nodes, {len(tensors)} tensors "
              f"in {res['export_s']} s", flush=True)
        tok = TextTokenizer(folder)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        batches = bucketed_batches(tok, make_texts(args.calib_texts, seed=1), names, batch_size=8)
        model_bytes = model_path.read_bytes()

        t0 = time.perf_counter()
        single = collect_stats(model_bytes, batches, tensors)
        res["calibration_single_s"] = round(time.perf_counter() - t0, 1)
        table = compute_table(single, Method.MINMAX, tensors=tensors)
        write_calibration_json(folder / "calibration.json", table, {"target": "tensorrt"})

        texts = tuple(make_texts(args.texts, seed=2))
        with OnnxRuntimeRunner(model_path) as r:
            ref = predict_logits(r, tok, texts)
        labels = tuple(int(v) for v in np.random.default_rng(3).integers(0, 2, len(texts)))
        ref_t = tuple(tuple(float(v) for v in row) for row in ref)

        def jobs(n: int) -> list[SensitivityJob]:
            return [SensitivityJob(source_model=str(model_path), calibration_json=str(folder / "calibration.json"),
                                   tokenizer=str(folder), texts=texts, labels=labels, reference_logits=ref_t,
                                   keep_nodes=(nodes[i % len(nodes)],), mode=ALL_BUT_THIS,
                                   node=nodes[i % len(nodes)], threads=1, max_length=128)
                    for i in range(n)]

        for w in (1, args.workers):
            t0 = time.perf_counter()
            with DaskExecutor(local_workers=w) as ex:
                start_s = time.perf_counter() - t0
                if w == args.workers:
                    t1 = time.perf_counter()
                    sharded = collect_stats_sharded(model_bytes, batches, tensors, ex)
                    res["calibration_sharded_s"] = round(time.perf_counter() - t1, 1)
                    ok, bad = stats_identical(single, sharded)
                    res["shards"] = sharded.meta.get("shards")
                    res["stats_bit_identical"] = ok
                    res["stats_tensors_differing"] = bad
                    print(f"sharded statistics ({res['shards']} shards) bit-identical to one process: {ok} "
                          f"({bad} of {len(tensors)} tensors differ); single {res['calibration_single_s']} s, "
                          f"sharded {res['calibration_sharded_s']} s", flush=True)
                n = w * args.jobs_per_worker
                run_jobs(jobs(w), executor=ex)  # warm-up round: share model/table/data, imports on every worker
                t1 = time.perf_counter()
                out = run_jobs(jobs(n), executor=ex)
                wall = time.perf_counter() - t1
            errors = [r.error for r in out if r.error]
            per = sorted(r.seconds for r in out)
            res[f"sweep_{w}"] = {"units": n, "wall_s": round(wall, 1), "units_per_s": n / wall,
                                 "median_unit_s": round(per[len(per) // 2], 2), "cluster_start_s": round(start_s, 1),
                                 "errors": len(errors)}
            print(f"{w:>2} workers: {n} units in {wall:.1f} s ({n / wall:.3f} units/s, median unit "
                  f"{per[len(per) // 2]:.1f} s, {len(errors)} errors{': ' + errors[0] if errors else ''})",
                  flush=True)
        speedup = res[f"sweep_{args.workers}"]["units_per_s"] / res["sweep_1"]["units_per_s"]
        res["speedup"] = round(speedup, 2)
        print(f"speed-up {args.workers} workers vs 1: {speedup:.2f}x (target >= 10x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
