"""Q/DQ insertion on tiny graphs, checked against a numpy fake-quant reference of the same graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibkit.errors import CalibrationError
from calibkit.quantize.qdq import Target, quantize_model, save_model
from calibkit.quantize.weights import fake_quantize_weight, quantize_weight
from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange

RNG = np.random.default_rng(7)
W1 = (RNG.standard_normal((8, 16)) * 0.3).astype(np.float32)
W2 = (RNG.standard_normal((4, 16)) * 0.3).astype(np.float32)  # Gemm transB=1: [N, K]
B2 = RNG.standard_normal(4).astype(np.float32)


def tiny_model() -> onnx.ModelProto:
    """x[2,8] -> MatMul(W1) -> h -> Relu -> r ; attention-like a = MatMul(h, h^T) ; Gemm(r, W2^T) + B2 -> y."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Transpose", ["h"], ["ht"], name="tr", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "ht"], ["a"], name="attn"),
        helper.make_node("Gemm", ["r", "W2", "B2"], ["y"], name="gemm", transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", "n"]),
        ],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(W2, "W2"), numpy_helper.from_array(B2, "B2")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def table_for(x: np.ndarray, drop: tuple[str, ...] = (), zero: tuple[str, ...] = ()) -> CalibrationTable:
    h = x @ W1
    r = np.maximum(h, 0)
    amax = {"x": float(np.abs(x).max()), "h": float(np.abs(h).max()), "r": float(np.abs(r).max())}
    amax["ht"] = amax["h"] * 0.5  # deliberately clipped: the reference must clip the same way
    for z in zero:
        amax[z] = 0.0
    ranges = tuple(TensorRange(t, a, Method.MINMAX) for t, a in amax.items() if t not in drop)
    return CalibrationTable("sha", "set", Method.MINMAX, MethodParams(), ranges)


def fq(v: np.ndarray, amax: float) -> np.ndarray:
    s = np.float32(amax / 127)
    return (np.clip(np.rint(v / s), -128, 127) * s).astype(np.float32)


def run(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    """Exact Q/DQ arithmetic (graph optimizations off): ORT's fused int8 kernels saturate with 8-bit weights on
    x86 CPUs without VNNI (calibkit.engines.cpu), which is the CPU's arithmetic, not the model's."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))


X = RNG.standard_normal((5, 8)).astype(np.float32)


def reference(x: np.ndarray, t: CalibrationTable, quantize_attention: bool) -> dict[str, np.ndarray]:
    a = t.amax()
    h = fq(x, a["x"]) @ fake_quantize_weight(W1, 1)
    r = np.maximum(h, 0)
    y = fq(r, a["r"]) @ fake_quantize_weight(W2, 0).T + B2
    att = fq(h, a["h"]) @ fq(h.T, a["ht"]) if quantize_attention else h @ h.T
    return {"y": y, "a": att}


@pytest.mark.parametrize("target", [Target.TENSORRT, Target.ONNXRUNTIME])
def test_matches_numpy_fake_quant(target: Target) -> None:
    t = table_for(X)
    res = quantize_model(tiny_model(), t, target=target)
    onnx.checker.check_model(res.model, full_check=True)
    got = run(res.model, X)
    want = reference(X, t, quantize_attention=target is Target.TENSORRT)
    for k in ("y", "a"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
    fp32 = run(tiny_model(), X)
    assert np.abs(got["y"] - fp32["y"]).max() < 0.05 * np.abs(fp32["y"]).max()
    assert not np.array_equal(got["y"], fp32["y"])  # it really is quantized


def test_layout_and_names_tensorrt() -> None:
    res = quantize_model(tiny_model(), table_for(X), target=Target.TENSORRT)
    g = res.model.graph
    assert res.quantized_nodes == ("mm1", "attn", "gemm")
    assert res.kept_nodes == () and res.missing_ranges == ()
    names = [n.name for n in g.node]
    # original names and outputs survive
    for n in ("mm1", "relu", "tr", "attn", "gemm"):
        assert n in names
    outs = {o for n in g.node for o in n.output}
    assert {"h", "r", "ht", "a", "y"} <= outs
    assert names.count("h_QuantizeLinear") == 1 and "ht_DequantizeLinear" in names
    attn = next(n for n in g.node if n.name == "attn")
    assert attn.input[0] == "h_DequantizeLinear_Output"
    assert next(n for n in g.node if n.name == "tr").input[0] == "h"  # FP32 consumer keeps the FP32 tensor
    inits = {i.name: i for i in g.initializer}
    assert "W1" not in inits and "W2" not in inits and "B2" in inits
    assert inits["W1_quantized"].data_type == TensorProto.INT8
    assert inits["x_zero_point"].data_type == TensorProto.INT8
    dq_w2 = next(n for n in g.node if n.name == "W2_DequantizeLinear")
    assert helper.get_attribute_value(dq_w2.attribute[0]) == 0  # transB=1 -> output channels on axis 0
    np.testing.assert_array_equal(numpy_helper.to_array(inits["W1_quantized"]), quantize_weight(W1, 1).values)


def test_onnxruntime_target_uses_uint8_and_skips_attention() -> None:
    res = quantize_model(tiny_model(), table_for(X), target=Target.ONNXRUNTIME)
    assert res.quantized_nodes == ("mm1", "gemm")
    assert res.kept_nodes == ("attn",)
    zp = {i.name: numpy_helper.to_array(i) for i in res.model.graph.initializer if i.name.endswith("_zero_point")}
    assert zp["x_zero_point"].dtype == np.uint8 and int(zp["x_zero_point"]) == 128
    assert zp["W1_zero_point"].dtype == np.int8


def test_missing_and_zero_ranges_are_reported_and_left_fp32() -> None:
    res = quantize_model(tiny_model(), table_for(X, drop=("r",), zero=("h",)))
    assert res.missing_ranges == ("r",)  # "ht" has a range; "h" is zero
    assert res.zero_ranges == ("h",)
    assert res.quantized_nodes == ("mm1",)
    assert set(res.kept_nodes) == {"attn", "gemm"}
    inits = {i.name for i in res.model.graph.initializer}
    assert "W2" in inits and "W2_quantized" not in inits
    onnx.checker.check_model(res.model)
    np.testing.assert_allclose(run(res.model, X)["a"], run(tiny_model(), X)["a"], rtol=0.1, atol=0.1)


def test_exclude_and_keep_nodes() -> None:
    res = quantize_model(tiny_model(), table_for(X), exclude=("^gem",), keep_nodes=("attn",))
    assert res.quantized_nodes == ("mm1",)
    assert res.kept_nodes == ("gemm", "attn")


def test_input_model_is_not_modified(tmp_path) -> None:
    m = tiny_model()
    m.producer_name = "unit"
    helper.set_model_props(m, {"k": "v"})
    m.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, ["n", 16]))
    before = m.SerializeToString()
    res = quantize_model(m, table_for(X))
    assert m.SerializeToString() == before
    q = res.model
    assert (q.ir_version, q.producer_name, list(q.opset_import)) == (m.ir_version, "unit", list(m.opset_import))
    assert [(p.key, p.value) for p in q.metadata_props] == [("k", "v")] and q.graph.value_info[0].name == "h"
    assert q.graph.name == m.graph.name and [i.name for i in q.graph.input] == ["x"]
    p = tmp_path / "q.onnx"
    save_model(res.model, p)
    assert onnx.load(str(p)).graph.node[0].op_type in ("DequantizeLinear", "QuantizeLinear")
    assert [f.name for f in tmp_path.iterdir()] == ["q.onnx"]


def test_bad_regex_and_old_opset() -> None:
    from calibkit.errors import ModelError, UsageError

    with pytest.raises(UsageError):
        quantize_model(tiny_model(), table_for(X), exclude=("(",))
    old = tiny_model()
    old.opset_import[0].version = 11
    with pytest.raises(ModelError, match="opset"):
        quantize_model(old, table_for(X))


def _fanout_model() -> onnx.ModelProto:
    """x feeds two weight MatMuls (like Q, K and V reading one LayerNorm output)."""
    w3 = numpy_helper.from_array((W1 * 0.5 + 0.1).astype(np.float32), "W3")
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["q"], name="q/MatMul"),
        helper.make_node("MatMul", ["x", "W3"], ["k"], name="k/MatMul"),
        helper.make_node("Add", ["q", "k"], ["y"], name="add"),
    ]
    g = helper.make_graph(
        nodes, "fan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
        [numpy_helper.from_array(W1, "W1"), w3],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_shared_tensor_gets_one_pair_unless_a_consumer_is_excluded() -> None:
    t = table_for(X)
    res = quantize_model(_fanout_model(), t)
    g = res.model.graph
    assert [n.op_type for n in g.node].count("QuantizeLinear") == 1
    assert all(n.input[0] == "x_DequantizeLinear_Output" for n in g.node if n.op_type == "MatMul")
    w3 = (W1 * 0.5 + 0.1).astype(np.float32)
    want = fq(X, t.amax()["x"]) @ (fake_quantize_weight(W1, 1) + fake_quantize_weight(w3, 1))
    np.testing.assert_allclose(run(res.model, X)["y"], want, rtol=1e-4, atol=1e-4)

    res = quantize_model(_fanout_model(), t, exclude=("^k/",))
    k = next(n for n in res.model.graph.node if n.name == "k/MatMul")
    assert list(k.input) == ["x", "W3"]  # the FP32 consumer reads the FP32 tensor and weight
    assert [n.op_type for n in res.model.graph.node].count("QuantizeLinear") == 1
    want = fq(X, t.amax()["x"]) @ fake_quantize_weight(W1, 1) + X @ w3
    np.testing.assert_allclose(run(res.model, X)["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 1e-300, 1e300, 1e-42, 5e40])
def test_unusable_amax_is_refused_by_name(bad: float) -> None:
    # once kept FP32 without a word (inf, nan, negative) or written as an inf/0 scale (1e300, 1e-300)
    base = table_for(X)
    ranges = tuple(TensorRange(r.tensor, bad if r.tensor == "x" else r.amax, r.method) for r in base.ranges)
    t = CalibrationTable("sha", "set", Method.MINMAX, MethodParams(), ranges)
    with pytest.raises(CalibrationError, match="x: "):
        quantize_model(tiny_model(), t)


def test_onnxruntime_qdq_loss_debug_matches_activations_and_weights(tmp_path) -> None:
    """ONNX Runtime's qdq_loss_debug pairs a tensor with its Q/DQ copy by name (``T_DequantizeLinear_Output``,
    weights ``W_quantized``): on a calibkit Q/DQ model every quantized activation and weight is matched."""
    debug = pytest.importorskip("onnxruntime.quantization.qdq_loss_debug")
    from onnxruntime.quantization import CalibrationDataReader

    fp32, qdq = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(tiny_model(), fp32)
    table = table_for(X)
    res = quantize_model(tiny_model(), table, target=Target.TENSORRT)
    save_model(res.model, qdq)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter([{"x": X}])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.rows, None)

    acts = {}
    for name, path in (("float", fp32), ("qdq", qdq)):
        aug = tmp_path / f"{name}.aug.onnx"
        debug.modify_model_output_intermediate_tensors(str(path), str(aug))
        acts[name] = debug.collect_activations(str(aug), Reader())
    matched = debug.create_activation_matching(acts["qdq"], acts["float"])
    assert set(matched) == {r.tensor for r in table.ranges}
    for t, pair in matched.items():
        assert {"pre_qdq", "post_qdq", "float"} <= set(pair)
        np.testing.assert_allclose(pair["post_qdq"][0], fq(pair["pre_qdq"][0], table.amax()[t]), rtol=1e-6)
    weights = debug.create_weight_matching(str(fp32), str(qdq))
    assert set(weights) == {"W1", "W2"}


def test_onnxruntime_grids_are_fitted_to_the_observed_extremes() -> None:
    """A one-sided tensor (r = Relu(h), never below 0) gets a uint8 grid over [0, amax] with zero point 0: twice
    the symmetric grid's resolution. The model computes that grid's fake-quantization, checked against numpy."""
    h = X @ W1
    r = np.maximum(h, 0)
    observed = {"x": (float(X.min()), float(X.max())), "h": (float(h.min()), float(h.max())),
                "r": (float(r.min()), float(r.max()))}
    base = table_for(X)
    t = CalibrationTable("sha", "set", Method.MINMAX, MethodParams(), tuple(
        TensorRange(e.tensor, e.amax, e.method, *observed.get(e.tensor, (None, None))) for e in base.ranges))
    scale, zero = t.get("r").uint8_grid()
    assert zero == 0 and scale == pytest.approx(t.get("r").amax / 255)
    res = quantize_model(tiny_model(), t, target=Target.ONNXRUNTIME)
    inits = {i.name: numpy_helper.to_array(i) for i in res.model.graph.initializer}
    assert int(inits["r_zero_point"]) == 0 and inits["r_zero_point"].dtype == np.uint8
    assert float(inits["r_scale"]) == pytest.approx(scale)

    def fq_grid(v: np.ndarray, name: str) -> np.ndarray:
        s, z = t.get(name).uint8_grid()
        s = np.float32(s)
        return ((np.clip(np.rint(v / s) + z, 0, 255) - z) * s).astype(np.float32)

    got = run(res.model, X)
    hq = fq_grid(X, "x") @ fake_quantize_weight(W1, 1)
    want_y = fq_grid(np.maximum(hq, 0), "r") @ fake_quantize_weight(W2, 0).T + B2
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-4, atol=1e-4)
    # the same ranges without observed extremes: the symmetric grid, as before
    sym = quantize_model(tiny_model(), base, target=Target.ONNXRUNTIME)
    assert int({i.name: numpy_helper.to_array(i) for i in sym.model.graph.initializer}["r_zero_point"]) == 128
    # and TensorRT's layout never reads them
    a = quantize_model(tiny_model(), t, target=Target.TENSORRT).model.SerializeToString()
    assert a == quantize_model(tiny_model(), base, target=Target.TENSORRT).model.SerializeToString()


def test_tables_keep_their_observed_extremes_and_refuse_impossible_ones() -> None:
    t = CalibrationTable("sha", "set", Method.MSE, MethodParams(),
                         (TensorRange("a", 2.0, Method.MSE, -0.17, 9.5), TensorRange("b", 1.0, Method.MSE)))
    d = t.to_dict()
    assert "observed_min" not in d["ranges"][1]  # a range without them is written as before
    assert CalibrationTable.from_dict(d) == t
    d["ranges"][0]["observed_min"] = 10.0  # above the maximum
    with pytest.raises(ValueError, match="observed_min"):
        CalibrationTable.from_dict(d)
    d["ranges"][0]["observed_min"] = float("nan")
    with pytest.raises(ValueError, match="observed_min"):
        CalibrationTable.from_dict(d)
