"""FP16 conversion on a tiny encoder-like graph: decomposed LayerNorm, attention mask of -3.4e38, Softmax."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from calibkit.quantize.fp16 import convert_to_fp16

RNG = np.random.default_rng(3)
D = 8
W = (RNG.standard_normal((D, D)) * 0.5).astype(np.float32)
WO = (RNG.standard_normal((D, 3)) * 0.5).astype(np.float32)


def encoder_like() -> onnx.ModelProto:
    c = numpy_helper.from_array
    inits = [
        c(W, "W"), c(WO, "WO"), c(np.array(2.0, np.float32), "two"),
        c(np.array(1e-12, np.float32), "eps"), c(np.ones(D, np.float32) * 1.5, "gamma"),
        c(np.full(D, 0.1, np.float32), "beta"), c(np.array(1.0, np.float32), "one"),
        c(np.array(-3.4028234663852886e38, np.float32), "neg"), c(np.array([1], np.int64), "ax1"),
    ]
    mk = helper.make_node
    nodes = [
        mk("ReduceMean", ["x"], ["mu"], name="ln/mean", axes=[-1]),
        mk("Sub", ["x", "mu"], ["xc"], name="ln/sub"),
        mk("Pow", ["xc", "two"], ["sq"], name="ln/pow"),
        mk("ReduceMean", ["sq"], ["var"], name="ln/var", axes=[-1]),
        mk("Add", ["var", "eps"], ["ve"], name="ln/add_eps"),
        mk("Sqrt", ["ve"], ["sd"], name="ln/sqrt"),
        mk("Div", ["xc", "sd"], ["xn"], name="ln/div"),
        mk("Mul", ["xn", "gamma"], ["xg"], name="ln/mul"),
        mk("Add", ["xg", "beta"], ["ln"], name="ln/add"),
        mk("MatMul", ["ln", "W"], ["h"], name="proj/MatMul"),
        mk("Transpose", ["h"], ["ht"], name="tr", perm=[0, 2, 1]),
        mk("MatMul", ["h", "ht"], ["scores"], name="qk/MatMul"),
        mk("Cast", ["mask"], ["maskf"], name="mask/cast", to=TensorProto.FLOAT),
        mk("Sub", ["one", "maskf"], ["inv"], name="mask/sub"),
        mk("Mul", ["inv", "neg"], ["bias"], name="mask/mul"),
        mk("Unsqueeze", ["bias", "ax1"], ["bias3"], name="mask/unsqueeze"),
        mk("Add", ["scores", "bias3"], ["masked"], name="mask/add"),
        mk("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        mk("MatMul", ["probs", "h"], ["ctx"], name="pv/MatMul"),
        mk("ReduceMean", ["ctx"], ["pooled"], name="pool", axes=[1], keepdims=0),
        mk("MatMul", ["pooled", "WO"], ["logits"], name="head/MatMul"),
    ]
    g = helper.make_graph(
        nodes, "enc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", D]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 3])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(["logits"], feeds)[0]


def feeds() -> dict[str, np.ndarray]:
    mask = np.ones((2, 5), np.int64)
    mask[1, 3:] = 0
    return {"x": (RNG.standard_normal((2, 5, D)) * 3).astype(np.float32), "mask": mask}


def test_fp16_close_to_fp32_and_rules() -> None:
    m = encoder_like()
    res = convert_to_fp16(m)
    onnx.checker.check_model(res.model, full_check=True)
    f = feeds()
    ref, got = run(m, f), run(res.model, f)
    assert got.dtype == np.float32
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)
    kept = set(res.kept_fp32)
    # statistics, Softmax, the epsilon Add, the mask path and the output producer stay FP32
    assert {"ln/mean", "ln/pow", "ln/var", "ln/add_eps", "ln/sqrt", "softmax"} <= kept
    assert {"mask/mul", "mask/unsqueeze", "mask/add", "head/MatMul"} <= kept
    assert {"proj/MatMul", "qk/MatMul", "pv/MatMul", "ln/div", "ln/mul"} <= set(res.fp16_nodes)
    inits = {i.name: i.data_type for i in res.model.graph.initializer}
    assert inits["W"] == TensorProto.FLOAT16 and inits["WO"] == TensorProto.FLOAT
    assert inits["neg"] == TensorProto.FLOAT and inits["eps"] == TensorProto.FLOAT
    # original names and outputs preserved; inputs untouched
    orig = {(n.name, tuple(n.output)) for n in m.graph.node}
    assert orig <= {(n.name, tuple(n.output)) for n in res.model.graph.node}
    assert [i.type.tensor_type.elem_type for i in res.model.graph.input] == [TensorProto.FLOAT, TensorProto.INT64]
    assert any(n.name == "x_cast_fp16" for n in res.model.graph.node)
