"""The model zoo (tests/zoo.py) through calibrate and build: INT8 fidelity per task and INT8 share of linear FLOPs.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_zoo.py [--out /tmp/zoo-bench] [--models bert-cls,bert-encoder]

Builds tiny random-initialised transformers (2 layers, hidden 32) from ``transformers`` configs, exports them
with the legacy exporter, the dynamo exporter and ONNX Runtime's transformer optimizer, calibrates each on 100
seeded pseudo-sentences (mse), builds INT8 in the TensorRT layout (every MatMul/Gemm, attention MatMuls
included: the share reported is the INT8 part of all linear FLOPs) and compares it with FP32 on 120 other texts through
the task calibkit picks for the model (evaluate.tasks). Prints one row per model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from zoo import SPECS, build_zoo, write_texts, zoo_texts  # noqa: E402

from calibkit.calibrate.pipeline import calibrate  # noqa: E402
from calibkit.data.calibset import write_calibration_set  # noqa: E402
from calibkit.data.modeldir import ModelDir  # noqa: E402
from calibkit.data.tokenizer import TextTokenizer  # noqa: E402
from calibkit.engines.build import BuildRequest, build  # noqa: E402
from calibkit.engines.onnxruntime import OnnxRuntimeRunner  # noqa: E402
from calibkit.evaluate.flops import linear_work  # noqa: E402
from calibkit.evaluate.tasks import choose_task, model_outputs  # noqa: E402
from calibkit.types import Method, Precision  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--models", default=",".join(SPECS))
    ap.add_argument("--exclude", action="append", default=[], help="regex of nodes / module paths kept FP32")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="calibkit-zoo-"))
    zoo = build_zoo(root / "models", tuple(args.models.split(",")))
    calib = write_calibration_set(root / "calib", zoo_texts(100, seed=5), None, {})
    eval_texts = zoo_texts(120, seed=9)
    write_texts(root / "eval.jsonl", eval_texts)
    print(f"{'model':24} {'task':22} {'agree':>7} {'cos min':>8} {'extra':28} {'INT8 FLOPs':>10}")
    for name, z in zoo.items():
        work = root / "runs" / name
        md = ModelDir.resolve(z.folder)
        res = calibrate(md, calib, Method.MSE, out_dir=work / "cal", cache_dir=root / "cache",
                        exclude=tuple(args.exclude))
        for p, extra in (("fp32", {}), ("int8", {"calibration": res.out_dir, "target": "tensorrt"})):
            build(BuildRequest(model=z.folder, output=work / f"{p}.onnx", precision=Precision(p), **extra))
        fp32 = onnx.load(str(work / "fp32.onnx"))
        task = choose_task(model_outputs(fp32), json.loads((z.folder / "config.json").read_text()))
        tok = TextTokenizer(z.folder)
        outs = []
        for p in ("fp32", "int8"):
            with OnnxRuntimeRunner((work / f"{p}.onnx").read_bytes(), name=p) as r:
                outs.append(task.predict(r, tok, eval_texts, batch_size=32))
        fid = task.fidelity(outs[0], outs[1])
        ids = np.array([tok.encode([eval_texts[0]]).input_ids[0]])
        feeds = {k: v for k, v in {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                   "token_type_ids": np.zeros_like(ids)}.items()
                 if k in {i.name for i in fp32.graph.input}}
        work_flops = linear_work(fp32, feeds)
        kept = set(res.kept_nodes)
        extra = ", ".join(f"{k} {v:.4f}" for k, v in fid.extra.items() if k != "k")
        print(f"{name:24} {task.kind.value:22} {fid.agreement:7.2%} {fid.cosine_min:8.5f} {extra:28} "
              f"{work_flops.int8_fraction(kept):10.1%}")


if __name__ == "__main__":
    main()
