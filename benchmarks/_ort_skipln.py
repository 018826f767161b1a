"""The SkipLayerNormalization fusion bench_ort_recipes.py measures as recipe ``ck-skipln`` (measured, not adopted:
it was not faster than calibkit's plain onnxruntime layout; see benchmarks/results/ort-recipes-2026-12-07/).

ONNX Runtime's CPU optimizer fuses the onnxruntime layout's Q/DQ pairs into ``QuantizeLinear +
MatMulIntegerToFloat`` and bias Add + erf GELU into ``BiasGelu``, but leaves ``MatMul -> Add(bias) ->
Add(residual) -> LayerNormalization`` as three nodes. This writes each such chain as one com.microsoft
``SkipLayerNormalization`` with the bias as its fifth input (the form onnxruntime.transformers.optimizer writes).
It never touches MatMul/Gemm nodes, the Q/DQ pairs, or any tensor a Q/DQ pair or graph output reads (the
LayerNormalization's output keeps its name; the two Adds' outputs are fused only when nothing else reads them).

A chain is fused only when it is exactly: a LayerNormalization over the last axis with constant 1-D scale and
bias, fed by an Add whose two inputs have the same rank (2 or 3, from ONNX shape inference) and last dimension,
one of them an ``Add(x, b)`` with ``b`` a 1-D float constant of that length; Mean and InvStdDev unused.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from calibkit.quantize.qdq import weightless_copy

MS_DOMAIN = "com.microsoft"
SKIP_LN = "SkipLayerNormalization"


def _attr(node: onnx.NodeProto, name: str, default):  # noqa: ANN001, ANN202
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """Tensor name -> dims (int or symbol name or None) from ONNX shape inference on a weightless copy."""
    light = weightless_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    except Exception:  # noqa: BLE001 - no shapes: nothing is fused
        return {}
    out: dict[str, tuple] = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return out


def _const_len(name: str, consts: Mapping[str, onnx.TensorProto]) -> int | None:
    t = consts.get(name)
    if t is None or len(t.dims) != 1 or t.data_type != onnx.TensorProto.FLOAT:
        return None
    return int(t.dims[0])


def fuse_skip_layer_norm(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each ``Add(Add(x, b), r) -> LayerNormalization`` chain (see the module docstring)
    into one ``SkipLayerNormalization(x, r, gamma, beta, b)``; returns how many were fused."""
    g = model.graph
    consts: dict[str, onnx.TensorProto] = {i.name: i for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.output:
            v = _attr(n, "value", None)
            if isinstance(v, onnx.TensorProto):
                consts[n.output[0]] = v
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    graph_outputs = {o.name for o in g.output}
    shapes: dict[str, tuple] | None = None

    def only_read_once(t: str) -> bool:
        return readers.get(t, 0) == 1 and t not in graph_outputs

    plans: list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto, list[str]]] = []
    for ln in g.node:
        if ln.op_type != "LayerNormalization" or ln.domain not in ("", "ai.onnx") or len(ln.input) < 3:
            continue
        if any(o for o in ln.output[1:]) or _attr(ln, "axis", -1) != -1 or _attr(ln, "stash_type", 1) != 1:
            continue
        x, gamma, beta = ln.input[0], ln.input[1], ln.input[2]
        hidden = _const_len(gamma, consts)
        if hidden is None or _const_len(beta, consts) != hidden:
            continue
        add2 = producer.get(x)
        if add2 is None or add2.op_type != "Add" or add2.domain not in ("", "ai.onnx") or not only_read_once(x):
            continue
        found = None
        for i in (0, 1):
            add1 = producer.get(add2.input[i])
            if add1 is None or add1.op_type != "Add" or not only_read_once(add2.input[i]):
                continue
            for j in (0, 1):
                b, inner = add1.input[j], add1.input[1 - j]
                if _const_len(b, consts) == hidden and inner not in consts:
                    found = (add1, inner, add2.input[1 - i], b)
                    break
            if found:
                break
        if found is None:
            continue
        add1, inner, residual, bias = found
        if residual in consts:
            continue
        if shapes is None:
            shapes = _shapes(model)
        si, sr = shapes.get(inner), shapes.get(residual)
        if si is None or sr is None or len(si) != len(sr) or len(si) not in (2, 3) or si[-1] != hidden \
                or sr[-1] != hidden or any(isinstance(a, int) and isinstance(c, int) and a != c
                                           for a, c in zip(si, sr)):
            continue
        plans.append((add1, add2, ln, [inner, residual, gamma, beta, bias]))
    if not plans:
        return 0
    fused_at: dict[int, onnx.NodeProto] = {}
    drop: set[int] = set()
    for add1, add2, ln, inputs in plans:
        node = helper.make_node(SKIP_LN, inputs, [ln.output[0]], name=ln.name or None, domain=MS_DOMAIN,
                                epsilon=float(_attr(ln, "epsilon", 1e-5)))
        fused_at[id(ln)] = node
        drop.update((id(add1), id(add2)))
    nodes = [fused_at.get(id(n), n) for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(nodes)
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(plans)
