"""The weight MatMuls a plan keeps out of static INT8, served on ONNX Runtime as 8-bit blockwise MatMulNBits
(quantize.keptweights): which nodes, their names kept, the build's sidecar, --kept-weights fp32, the requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_engine_build import _calibration, model_dir  # noqa: F401  (the fixture)
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.errors import UsageError
from calibkit.quantize.keptweights import eligible, serve_kept
from calibkit.requests.build import BuildRequest
from calibkit.requests.choices import KeptWeights
from calibkit.requests.deploy import DeployRequest

RNG = np.random.default_rng(5)
X = RNG.standard_normal((2, 5, 256)).astype(np.float32)


def _two_matmuls(dequantized_first: bool) -> onnx.ModelProto:
    """x -> MatMul(W1) -> MatMul(W2): W1 through a DequantizeLinear (a Q/DQ'd weight) or as it is."""
    w1 = (RNG.standard_normal((256, 64)) * 0.1).astype(np.float32)
    w2 = (RNG.standard_normal((64, 32)) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w2, "W2")]
    nodes = []
    if dequantized_first:
        scale = np.float32(np.abs(w1).max() / 127)
        inits += [numpy_helper.from_array(np.round(w1 / scale).astype(np.int8), "W1_q"),
                  numpy_helper.from_array(np.array(scale, np.float32), "W1_s")]
        nodes.append(helper.make_node("DequantizeLinear", ["W1_q", "W1_s"], ["W1"], name="W1_dq"))
    else:
        inits.append(numpy_helper.from_array(w1, "W1"))
    nodes += [helper.make_node("MatMul", ["x", "W1"], ["h"], name="/l1/MatMul"),
              helper.make_node("MatMul", ["h", "W2"], ["y"], name="/l2/MatMul")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 32])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def test_only_the_matmuls_with_an_fp32_weight_are_served_blockwise_under_their_own_names() -> None:
    model = _two_matmuls(dequantized_first=True)
    assert eligible(model) == ("/l2/MatMul",)
    served = serve_kept(model, KeptWeights.BLOCKWISE)
    assert served.blockwise == ("/l2/MatMul",) and not served.note
    ops = {n.name: n.op_type for n in served.model.graph.node}
    assert ops == {"W1_dq": "DequantizeLinear", "/l1/MatMul": "MatMul", "/l2/MatMul": "MatMulNBits"}
    ref, got = _run(model), _run(served.model)
    assert not np.array_equal(ref, got)  # 8-bit weights and activations: close, not the same
    np.testing.assert_allclose(got, ref, atol=0.03 * np.abs(ref).max())
    assert model.graph.node[2].op_type == "MatMul"  # the model given is left as it was


def test_fp32_or_nothing_kept_leaves_the_model_as_it_is() -> None:
    model = _two_matmuls(dequantized_first=False)
    same = serve_kept(model, "fp32")
    assert same.blockwise == () and same.model is model
    assert serve_kept(onnx.ModelProto(), KeptWeights.BLOCKWISE).blockwise == ()


def _ops(path: Path) -> dict[str, str]:
    return {n.name: n.op_type for n in onnx.load(str(path)).graph.node}


def _build_kept_classifier(folder: Path, cal: Path, out: Path, *extra: str) -> EngineArtifact:
    """`build -p int8 --calibration CAL -x classifier -o OUT EXTRA...`, which must succeed: its sidecar."""
    res = CliRunner().invoke(app, ["build", str(folder), "-p", "int8", "--calibration", str(cal), "-x",
                                   "classifier", "-o", str(out), *extra])
    assert res.exit_code == 0, res.output
    return EngineArtifact.load(out)


def test_build_serves_a_kept_layer_blockwise_and_its_sidecar_says_so(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    cal = _calibration(model_dir, tmp_path / "calibration.json", target="onnxruntime")
    out = tmp_path / "a.onnx"
    art = _build_kept_classifier(model_dir, cal, out)
    assert art.kept_higher_precision == ("/classifier/MatMul",)
    assert art.extra.kept_weights == "blockwise" and art.extra.blockwise_nodes == ("/classifier/MatMul",)
    assert _ops(out)["/classifier/MatMul"] == "MatMulNBits"

    exact = tmp_path / "b.onnx"
    exact_art = _build_kept_classifier(model_dir, cal, exact, "--kept-weights", "fp32")
    assert exact_art.extra.kept_weights == "fp32" and exact_art.extra.blockwise_nodes == ()
    assert _ops(exact)["/classifier/MatMul"] == "MatMul"

    again = tmp_path / "c.onnx"  # a ready Q/DQ model with an FP32 layer, as tune writes its plan's
    res = CliRunner().invoke(app, ["build", str(model_dir), "-p", "int8", "--qdq", str(exact), "-o", str(again)])
    assert res.exit_code == 0, res.output
    assert _ops(again)["/classifier/MatMul"] == "MatMulNBits"
    assert EngineArtifact.load(again).extra.blockwise_nodes == ("/classifier/MatMul",)


def test_the_tensorrt_layout_keeps_its_layers_as_they_are(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    cal = _calibration(model_dir, tmp_path / "calibration.json", target="tensorrt")
    out = tmp_path / "t.onnx"
    assert _build_kept_classifier(model_dir, cal, out).extra.kept_weights is None
    assert _ops(out)["/classifier/MatMul"] == "MatMul"


def test_an_unknown_kept_weights_is_refused_by_every_request(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown --kept-weights"):
        BuildRequest(model=tmp_path, output=tmp_path / "m.onnx", precision="int8", qdq=tmp_path / "q.onnx",
                     kept_weights="int4")
    with pytest.raises(UsageError, match="unknown --kept-weights"):
        DeployRequest(source=tmp_path, out=tmp_path / "repo", kept_weights="int4")
    assert DeployRequest(source=tmp_path, out=tmp_path / "repo", kept_weights="FP32").kept_weights is KeptWeights.FP32
    from calibkit.requests.tune import TuneRequest

    with pytest.raises(UsageError, match="unknown --kept-weights"):
        TuneRequest(model="m", calibration_set="c", kept_weights="int4")
    assert TuneRequest(model="m", calibration_set="c").kept_weights is KeptWeights.BLOCKWISE


@pytest.mark.parametrize(("asked", "timed", "built"), [
    (None, "fp32", "fp32"), (None, None, "blockwise"), ("blockwise", "fp32", "blockwise"), (None, "blockwise",
                                                                                           "blockwise")])
def test_deploy_builds_the_kept_layers_as_tune_timed_them_unless_told(tmp_path: Path, asked: str | None,
                                                                      timed: str | None, built: str) -> None:
    from types import SimpleNamespace

    from calibkit.deploy.pipeline import _build_request
    from calibkit.deploy.source import DeploySource
    from calibkit.types import Precision

    qdq = tmp_path / "model.int8.onnx"
    src = DeploySource(path=tmp_path, kind="tune", model=tmp_path / "model.onnx", tokenizer=tmp_path,
                       precision=Precision.INT8, qdq_model=qdq, qdq_target="onnxruntime", kept_weights=timed)
    served = SimpleNamespace(src=src, layout=SimpleNamespace(shipped="onnxruntime"))
    req = _build_request(served, tmp_path / "repo" / "model.onnx",  # type: ignore[arg-type]
                         DeployRequest(source=tmp_path, out=tmp_path / "repo", kept_weights=asked))
    assert req.qdq == qdq and req.kept_weights == built


def test_deploy_refuses_a_document_naming_a_serving_calibkit_never_writes(tmp_path: Path) -> None:
    from calibkit.deploy.source import _kept_weights
    from calibkit.errors import ModelError

    assert _kept_weights("fp32", tmp_path / "tune.json") == "fp32" and _kept_weights(None, tmp_path) is None
    with pytest.raises(ModelError, match="'int4', which calibkit never writes"):
        _kept_weights("int4", tmp_path / "tune.json")
