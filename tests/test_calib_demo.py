"""End to end on the fast demo model: calibrate once, reuse the statistics, INT8 agrees with FP32."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_calibrate_demo_model(demo_assets_fast, tmp_path, monkeypatch):
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.calibset import write_calibration_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits
    from calibkit.quantize.tablefile import load_calibration_json
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.types import Method

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(demo_assets_fast / "model")
    rows = [json.loads(x) for x in (demo_assets_fast / "data" / "train.jsonl").read_text().splitlines()[:96]]
    cset = write_calibration_set(tmp_path / "set", [r["text"] for r in rows], None)
    # the fast demo's head is a logistic regression on standardised features: its Gemm input must stay FP32
    # (quantized, every INT8 variant, ONNX Runtime's own included, predicts one class)
    res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp_path / "ent",
                                     exclude=["/classifier/"]))
    assert not res.reused_stats and len(res.quantized_nodes) >= 36  # 6 layers x 6 MatMuls at least
    assert "/classifier/Gemm" in res.kept_nodes
    mm = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX, out=tmp_path / "mm"))
    assert mm.reused_stats
    cf = load_calibration_json(res.json_path)
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    lengths = np.minimum(tok.token_lengths(cset.texts), md.max_length)
    fixed_padding = 1 - lengths.mean() / lengths.max()  # what padding every text to the longest would cost
    assert cf.document is not None and cf.document.statistics is not None
    assert cf.document.statistics.collected["padding_fraction"] < fixed_padding / 2
    softmax = [t for t in cf.tensors if t.endswith("Softmax_output_0")]
    assert softmax and all(cf.tensors[t].max is not None and cf.tensors[t].max <= 1.0 for t in softmax)

    test = [json.loads(x)["text"] for x in (demo_assets_fast / "data" / "test.jsonl").read_text().splitlines()[:160]]
    with OnnxRuntimeRunner(md.onnx_path) as r:
        fp32 = predict_logits(r, tok, test).argmax(1)
    with OnnxRuntimeRunner(res.model_path) as r:
        int8 = predict_logits(r, tok, test).argmax(1)
    assert np.mean(fp32 == int8) >= 0.9
