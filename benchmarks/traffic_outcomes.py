"""Per-text agreement outcomes of all-INT8 candidates on traffic texts, for bench_sequential.py --outcomes.

On a demo folder (model/ and logs.jsonl, as `calibkit demo prepare` writes it): samples a calibration set from
the log, draws traffic texts outside it (calibkit.evaluate.traffic), calibrates each --methods table (TensorRT
Q/DQ layout, all MatMul/Gemm inputs in INT8), runs FP32 and INT8 on the traffic texts and writes, per method,
OUT/outcomes-<method>.npy (1: INT8 predicts what FP32 predicts). Prints each flip rate and calibrate's warnings.

    python benchmarks/traffic_outcomes.py .cache/test-assets/fast --out /tmp/outcomes --traffic-size 2000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main() -> None:
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.sample_pipeline import sample_log
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_outputs
    from calibkit.evaluate.traffic import TrafficOptions, draw_default_traffic
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.requests.sample import SampleRequest
    from calibkit.types import Method

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("demo", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calibration-size", type=int, default=512)
    ap.add_argument("--traffic-size", type=int, default=2000)
    ap.add_argument("--methods", default="mse,entropy")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    t0 = time.perf_counter()
    model = a.demo / "model"
    md = ModelDir.resolve(model)
    cset = sample_log(SampleRequest(logs=a.demo / "logs.jsonl", out=a.out / "cset", size=a.calibration_size,
                                    tokenizer=model, clusters=12))
    ev = draw_default_traffic(cset, TrafficOptions(size=a.traffic_size, tokenizer=model))
    print(f"traffic: {len(ev):,} texts of {ev.population:,} distinct outside the calibration set; excluded "
          f"{ev.excluded} ({time.perf_counter() - t0:.1f} s)")
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)

    def logits(path: Path) -> np.ndarray:
        with OnnxRuntimeRunner(path, intra_op_threads=a.threads, output_names=["logits"]) as r:
            return predict_outputs(r, tok, ev.texts, batch_size=32, output_name="logits").values

    ref = logits(md.onnx_path).argmax(axis=1)
    print(f"FP32 done ({time.perf_counter() - t0:.1f} s)")
    for m in a.methods.split(","):
        res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method(m), out=a.out / f"cal-{m}"))
        for w in res.clipping:
            print(f"  calibrate warning ({m}): {w.message}")
        same = logits(res.model_path).argmax(axis=1) == ref
        np.save(a.out / f"outcomes-{m}.npy", same.astype(np.int8))
        print(f"{m}: {int((~same).sum())} flips of {len(same):,} ({1 - same.mean():.2%}) "
              f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
