"""calibkit deploy on the real (fast) demo model and its 20,000-line production log: the repository's ONNX Runtime
model, fed bucket-padded traffic texts at several batch sizes, gives calibkit's engine's outputs for the same
texts (calibkit's own batches, padded only to their longest text): padding to the buckets changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from calib_helpers import sample_record
from deploy_helpers import model_config_pb2, parse_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(demo_assets_fast: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.calibset import write_calibration_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.deploy import DeployRequest, deploy
    from calibkit.deploy.traffic import read_traffic
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.types import Method

    root = tmp_path_factory.mktemp("deploy-demo")
    log = demo_assets_fast / "logs.jsonl"
    md = ModelDir.resolve(demo_assets_fast / "model")
    texts = read_traffic(log, max_texts=64, seed=5).texts
    cset = write_calibration_set(root / "calibration_sets" / "demo-n64", texts, None,
                                 sample_record(root / "drawn", str(log)))
    cal = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX, out=root / "cal"))
    res = deploy(DeployRequest(source=cal.out_dir, out=root / "serving", perf_requests=64, max_texts=4000,
                               measure_texts=200))
    return {"root": root, "md": md, "cal": cal, "res": res, "log": log}


def test_config_and_declared_io(repo: dict) -> None:
    import onnxruntime as ort

    pb = model_config_pb2()
    res = repo["res"]
    c = parse_config(res.config_path)
    assert c.platform == "onnxruntime_onnx" and c.max_batch_size == res.batching.max_batch_size
    assert res.traffic.path == str(repo["log"])  # the default: the calibration set's log
    sess = ort.InferenceSession(str(res.model_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == [i.name for i in c.input]
    assert all(i.data_type == pb.TYPE_INT64 and list(i.dims) == [-1] for i in c.input)
    assert [o.name for o in sess.get_outputs()] == [o.name for o in c.output] == ["logits"]
    assert list(c.output[0].dims) == [2] and c.output[0].label_filename == "labels.txt"
    # buckets from the real log: several profiles, each cheaper than one 1-512 profile
    base = res.profiles.baseline
    assert base.max_seq == 512 and res.choice.padded_tokens < base.padded_tokens_padded_to_max
    assert all(b * n <= res.batching.batch_tokens for b, n in zip(res.batching.per_bucket,
                                                                 [b.hi for b in res.choice.buckets]))


def test_outputs_equal_calibkits_engine(repo: dict, tmp_path: Path) -> None:
    import onnxruntime as ort

    from calibkit.building import BuildRequest, build
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.deploy.perfdata import padded_feeds
    from calibkit.deploy.traffic import read_traffic
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits
    from calibkit.types import Precision

    res, md = repo["res"], repo["md"]
    eng = build(BuildRequest(model=md.onnx_path.parent, output=tmp_path / "int8.onnx", precision=Precision.INT8,
                             calibration=repo["cal"].json_path)).artifact
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    texts = list(read_traffic(repo["log"], max_texts=48, seed=11).texts)
    with OnnxRuntimeRunner(eng.path) as r:
        want = predict_logits(r, tok, texts, batch_size=16)
    sess = ort.InferenceSession(str(res.model_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    lengths = tok.token_lengths(texts)
    for bs in (1, 4, 16):
        got = []
        for s in range(0, len(texts), bs):
            idx = range(s, min(s + bs, len(texts)))
            width = max(res.choice.bucket_of(int(lengths[i])).hi for i in idx)
            feeds = [padded_feeds(tok, texts[i], width, res.choice.max_seq, names) for i in idx]
            got.append(sess.run(["logits"], {n: np.concatenate([f[n] for f in feeds]) for n in names})[0])
        out = np.concatenate(got)
        # measured: at most 1.9e-6 apart (batch 1) and bit-equal at batch 4 and 16, 200 texts of the demo log
        np.testing.assert_allclose(out, want, atol=1e-4 * float(np.abs(want).max()), rtol=0)
        assert (out.argmax(1) == want.argmax(1)).all(), bs
    # perf_analyzer's requests are real traffic texts, tokenized by the model's tokenizer
    entry = json.loads(res.perf_data.read_text())["data"][0]
    n = sum(entry["attention_mask"]["content"])
    ids = entry["input_ids"]["content"][:n]
    assert ids[0] == tok.encode(["x"]).input_ids[0, 0] and len(ids) == n  # starts with [CLS]
