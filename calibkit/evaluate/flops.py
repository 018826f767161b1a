"""MatMul/Gemm work per node, to measure how much of the model's compute a plan keeps in INT8.

Shapes come from one real run (ONNX Runtime, batch 1, a typical sequence length) with every input of every
MatMul/Gemm tapped, so attention MatMuls (whose cost grows with the square of the sequence length) are counted
at the length production traffic actually has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from calibkit.engines.onnxruntime import OnnxRuntimeRunner
from calibkit.graph import add_outputs, tap_name
from calibkit.quantize.placement import DEFAULT_OP_TYPES, plan_placement


@dataclass(frozen=True)
class NodeFlops:
    node: str
    op_type: str
    flops: float  # multiply-adds x 2, for one sequence of ``seq_len`` tokens


def matmul_flops(a_shape: Sequence[int], b_shape: Sequence[int]) -> float:
    """2·M·K·N times the broadcast batch dimensions (numpy matmul semantics)."""
    a = list(a_shape) if len(a_shape) > 1 else [1, *a_shape]
    b = list(b_shape) if len(b_shape) > 1 else [*b_shape, 1]
    m, k = a[-2], a[-1]
    n = b[-1]
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return float(2 * m * k * n * int(np.prod(batch, dtype=np.int64)))


def gemm_flops(a_shape: Sequence[int], b_shape: Sequence[int], trans_a: int, trans_b: int) -> float:
    m, k = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    n = b_shape[0] if trans_b else b_shape[1]
    return float(2 * m * k * n)


def node_flops(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
) -> tuple[NodeFlops, ...]:
    """FLOPs of every ``op_types`` node for the given example feeds (use batch 1)."""
    placement = plan_placement(model, op_types)
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    const_shapes = {
        o: tuple(a.t.dims)
        for n in model.graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
        for o in n.output
    }
    acts = list(placement.activations)
    tapped = add_outputs(model, acts)
    names = [tap_name(t, model) for t in acts]
    with OnnxRuntimeRunner(tapped.SerializeToString(), output_names=names, name="flops") as runner:
        values = runner.infer(feeds)
    shapes = {t: tuple(values[n].shape) for t, n in zip(acts, names)}
    shapes.update(inits)
    shapes.update(const_shapes)
    by_name = {(n.name or f"{n.op_type}_{i}"): n for i, n in enumerate(model.graph.node)}
    result = []
    for qn in placement.nodes:
        node = by_name[qn.name]
        a, b = shapes[node.input[0]], shapes[node.input[1]]
        if node.op_type == "Gemm":
            attrs = {x.name: x.i for x in node.attribute}
            f = gemm_flops(a, b, attrs.get("transA", 0), attrs.get("transB", 0))
        else:
            f = matmul_flops(a, b)
        result.append(NodeFlops(qn.name, qn.op_type, f))
    return tuple(result)
