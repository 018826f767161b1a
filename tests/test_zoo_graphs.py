"""Graph-level behaviour on the zoo: fused ORT graphs (FLOPs, FP16, TensorRT), names across exporters."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from calibkit.evaluate.flops import linear_work
from calibkit.names import node_names
from calibkit.quantize.fp16 import convert_to_fp16
from calibkit.quantize.fused import fused_fp32_linear, fused_warning
from calibkit.quantize.placement import plan_placement


def _feeds(session: ort.InferenceSession, seq: int = 16) -> dict[str, np.ndarray]:
    ids = np.array([[2] + [11 + (i % 20) for i in range(seq - 2)] + [3]], dtype=np.int64)
    table = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {i.name: table[i.name] for i in session.get_inputs()}


def _session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def test_fused_attention_flops_are_counted_as_fp32_work(zoo: dict) -> None:
    legacy = onnx.load(str(zoo["bert-cls-legacy"].onnx_path))
    fused = onnx.load(str(zoo["bert-cls-ort-fused"].onnx_path))
    feeds = _feeds(_session(str(zoo["bert-cls-legacy"].onnx_path)))
    w_legacy, w_fused = linear_work(legacy, feeds), linear_work(fused, feeds)
    # the same model, the same linear work: fusion hides MatMuls, it does not remove them
    assert w_fused.total == pytest.approx(w_legacy.total)
    assert {f.op_type for f in w_fused.fused} == {"Attention"} and not w_fused.uncounted
    assert w_legacy.int8_fraction() == 1.0
    assert 0.5 < w_fused.int8_fraction() < 0.9  # Q/K/V + attention MatMuls stay FP32
    assert w_fused.int8_fraction() == pytest.approx(w_fused.plain_share)


def test_fused_graph_is_reported(zoo: dict) -> None:
    fused = onnx.load(str(zoo["bert-cls-ort-fused"].onnx_path))
    assert [n.op_type for n in fused_fp32_linear(fused)] == ["Attention", "Attention"]
    msg = fused_warning(fused)
    assert msg is not None and "stay FP32" in msg and "unfused export" in msg
    assert fused_warning(onnx.load(str(zoo["bert-cls-legacy"].onnx_path))) is None


def test_fp16_of_a_fused_graph_loads_and_matches(zoo: dict) -> None:
    path = str(zoo["bert-cls-ort-fused"].onnx_path)
    res = convert_to_fp16(onnx.load(path))
    assert any(n.startswith("/bert/encoder/layer.0/") for n in res.fp16_nodes)
    ref, half = _session(path), _session(res.model)
    feeds = _feeds(ref)
    a, b = ref.run(None, feeds)[0], half.run(None, feeds)[0]
    assert b.dtype == np.float32
    np.testing.assert_allclose(b, a, atol=1e-2)


def test_tensorrt_build_of_a_fused_graph_points_to_the_unfused_export(zoo: dict, tmp_path) -> None:
    from calibkit.building import BuildRequest, validate
    from calibkit.errors import ModelError

    req = BuildRequest(model=zoo["bert-cls-ort-fused"].folder, output=tmp_path / "m.engine", precision="fp16",
                       backend="tensorrt")
    with pytest.raises(ModelError) as err:
        validate(req)
    assert "com.microsoft.Attention" in str(err.value) and "unfused" in (err.value.hint or "")


def test_module_paths_agree_between_legacy_and_dynamo(zoo: dict) -> None:
    for name in ("bert-cls", "roberta-cls", "bert-encoder"):
        leg = onnx.load(str(zoo[f"{name}-legacy"].onnx_path))
        dyn = onnx.load(str(zoo[f"{name}-dynamo"].onnx_path))
        mods = [[n.module for n in plan_placement(m).nodes] for m in (leg, dyn)]
        assert all(mods[0]) and sorted(mods[0]) == sorted(mods[1])
        ex = [plan_placement(m, exclude=[r"layer\.1/output"]).excluded for m in (leg, dyn)]
        assert len(ex[0]) == len(ex[1]) == 1
        assert [node_names(dyn)[e].module for e in ex[1]] == [f"{name.split('-')[0]}.encoder.layer.1.output.dense"]
