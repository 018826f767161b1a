"""MatMul/Gemm work per node, to measure how much of the model's compute a plan keeps in INT8.

Shapes come from one real run (ONNX Runtime, batch 1, a typical sequence length) with every input of every
MatMul/Gemm tapped, so attention MatMuls (whose cost grows with the square of the sequence length) are counted
at the length production traffic actually has.

Linear work hidden in fused contrib ops (:mod:`calibkit.quantize.fused`: ORT ``Attention`` holds the Q/K/V
projections and both attention MatMuls) is counted too (:func:`linear_work`): it stays FP32 under a plan of
MatMul/Gemm Q/DQ, so the INT8 share is taken over all linear FLOPs, fused or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from calibkit.enginefiles.registry import model_runner
from calibkit.graph import add_outputs, tap_name
from calibkit.names import node_labels
from calibkit.quantize.fused import LINEAR_CONTRIB_OPS, contrib_nodes
from calibkit.quantize.placement import DEFAULT_OP_TYPES, plan_placement


@dataclass(frozen=True)
class NodeFlops:
    node: str
    op_type: str
    flops: float  # multiply-adds x 2, for one sequence of ``seq_len`` tokens
    fused: bool = False  # a contrib op (FP32 under calibkit's plans unless ``integer``)
    integer: bool = False  # already an integer op (QAttention, MatMulIntegerToFloat, ...)


@dataclass(frozen=True)
class LinearWork:
    """All linear FLOPs of a model: the MatMul/Gemm nodes a plan chooses among, and the fused ops."""

    plain: tuple[NodeFlops, ...]
    fused: tuple[NodeFlops, ...]
    uncounted: tuple[str, ...] = ()  # fused ops whose FLOPs calibkit cannot derive (named, not guessed)

    @property
    def total(self) -> float:
        return sum(f.flops for f in self.plain) + sum(f.flops for f in self.fused)

    @property
    def plain_share(self) -> float:
        """The fraction of all linear FLOPs in the plain MatMul/Gemm nodes (1.0 for an unfused model)."""
        total = self.total
        return sum(f.flops for f in self.plain) / total if total > 0 else 1.0

    def int8_fraction(self, fp_nodes: set[str] | frozenset[str] | tuple[str, ...] = ()) -> float:
        """INT8 share of all linear FLOPs when every plain node but ``fp_nodes`` is INT8."""
        total = self.total
        if total <= 0:
            return 0.0
        kept = set(fp_nodes)
        int8 = sum(f.flops for f in self.plain if f.node not in kept) + sum(f.flops for f in self.fused if f.integer)
        return int8 / total


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
    """FLOPs of every ``op_types`` node for the given example feeds (use batch 1); fused ops: :func:`linear_work`."""
    return _node_and_fused_flops(model, feeds, op_types, include_fused=False)[0]


def _node_and_fused_flops(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    op_types: Sequence[str],
    include_fused: bool = True,
) -> tuple[tuple[NodeFlops, ...], list[str]]:
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
    fused_inputs = [x for n in model.graph.node if n.domain not in ("", "ai.onnx")
                    and n.op_type in LINEAR_CONTRIB_OPS for x in n.input[:4] if x]
    acts = list(dict.fromkeys([*placement.activations, *fused_inputs]))
    acts = [t for t in acts if t not in inits and t not in const_shapes]
    tapped = add_outputs(model, acts)
    names = [tap_name(t, model) for t in acts]
    with model_runner(tapped.SerializeToString(), output_names=names, name="flops") as runner:
        values = runner.infer(feeds)
    shapes = {t: tuple(values[n].shape) for t, n in zip(acts, names)}
    shapes.update(inits)
    shapes.update(const_shapes)
    by_name = dict(zip(node_labels(model.graph), model.graph.node, strict=True))
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
    fused, uncounted = _fused_flops(model, shapes)
    return (*result, *fused) if include_fused else tuple(result), uncounted


def _attention(x: tuple[int, ...], w: tuple[int, ...] | None, qkv: list[int] | None) -> float:
    """ORT Attention / QAttention: X [B, S, H] x W [H, Hq+Hk+Hv], then Q·K^T and probs·V per head."""
    b, s_, h = (x[0], x[1], x[2]) if len(x) == 3 else (1, x[0], x[-1])
    width = w[-1] if w else 3 * h
    hq, _hk, hv = qkv if qkv and len(qkv) == 3 else (width // 3, width // 3, width // 3)
    return float(2 * b * s_ * h * width + 2 * b * s_ * s_ * hq + 2 * b * s_ * s_ * hv)


def _mha(q: tuple[int, ...], k: tuple[int, ...] | None) -> float:
    if len(q) == 5:  # packed QKV [B, S, N, 3, h]
        b, s_, hq = q[0], q[1], q[2] * q[4]
    else:
        b, s_, hq = q[0], q[1], q[-1]
    skv = s_ if not k else (k[1] if len(k) == 3 else k[2] if len(k) == 4 else s_)
    return float(4 * b * s_ * skv * hq)


def _fused_flops(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> tuple[list[NodeFlops], list[str]]:
    by_name = dict(zip(node_labels(model.graph), model.graph.node, strict=True))
    out: list[NodeFlops] = []
    uncounted: list[str] = []
    for fn in contrib_nodes(model):
        if not fn.linear:
            continue
        node = by_name[fn.name]
        ins = [shapes.get(x) if x else None for x in node.input]
        ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        f: float | None = None
        try:
            if fn.op_type in ("Attention", "QAttention") and ins[0]:
                qkv = next((list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"), None)
                f = _attention(ins[0], ins[1] if len(ins) > 1 else None, qkv)
            elif fn.op_type == "MultiHeadAttention" and ins[0]:
                f = _mha(ins[0], ins[1] if len(ins) > 1 else None)
            elif fn.op_type == "FusedMatMul" and ins[0] and ins[1]:
                left, right = list(ins[0]), list(ins[1])
                if ints.get("transA"):
                    left[-2:] = left[-1], left[-2]
                if ints.get("transB"):
                    right[-2:] = right[-1], right[-2]
                f = matmul_flops(left, right)
            elif fn.op_type in ("FusedGemm", "QGemm"):
                a, b = (ins[0], ins[3]) if fn.op_type == "QGemm" and len(ins) > 3 else (ins[0], ins[1])
                if a and b:
                    f = gemm_flops(a, b, ints.get("transA", 0), ints.get("transB", 0))
            elif fn.op_type in ("GemmFastGelu", "MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeMatMul"):
                if ins[0] and ins[1]:
                    f = matmul_flops(ins[0], ins[1])
            elif fn.op_type == "MatMulNBits" and ins[0] and "K" in ints and "N" in ints:
                f = float(2 * int(np.prod(ins[0][:-1], dtype=np.int64)) * ints["K"] * ints["N"])
        except (IndexError, ValueError):
            f = None
        if f is None:
            uncounted.append(fn.name)
            continue
        out.append(NodeFlops(fn.name, fn.op_type, f, fused=True, integer=fn.integer))
    return out, uncounted


def linear_work(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
) -> LinearWork:
    """Every linear FLOP of ``model`` for the example feeds: plain ``op_types`` nodes and fused contrib ops."""
    flops, uncounted = _node_and_fused_flops(model, feeds, op_types)
    return LinearWork(tuple(f for f in flops if not f.fused), tuple(f for f in flops if f.fused), tuple(uncounted))
