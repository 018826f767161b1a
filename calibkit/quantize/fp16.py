"""FP32 -> FP16 ONNX conversion (no onnxconverter-common), with FP32 islands where FP16 is not safe.

Rules (each node is either an FP16 node or an FP32 node; Casts are inserted on the edges between them):
1. Nodes of ``FP32_OP_TYPES`` stay FP32: normalisation statistics (LayerNormalization, ReduceMean, Pow, Sqrt,
   Reciprocal), Softmax, and exponential / error functions (Exp, Log, Erf: Erf-based GELU loses its tail).
2. A node with a float constant input (initializer or Constant) whose values do not fit FP16 (any |v| > 65504;
   or, for small constants of <= 16 values, a non-zero |v| below FP16's smallest subnormal 2**-24, like a
   LayerNorm epsilon of 1e-12: tiny entries of big weight tensors may flush to 0 harmlessly) stays FP32, and so
   do the elementwise nodes downstream of it up to the next rule-1 node: this keeps the attention-mask path
   ((1 - mask) * -3.4e38, then + scores) in FP32 all the way into the Softmax instead of turning into -inf/NaN.
3. Nodes that produce a float graph output stay FP32, so the outputs (``logits``) keep dtype float32 and their
   names (no renaming, no extra Cast at the end).
4. ``keep_nodes`` (exact names) stay FP32.
5. Nodes of other domains (com.microsoft ``Attention``, ``SkipLayerNormalization``, ``BiasGelu`` ... of an
   ORT-optimized graph) stay FP32: several of their CPU kernels are float-only, and ONNX shape inference cannot
   type them, so their outputs are typed from their inputs (:func:`_tensor_types`) to put Casts on every edge.
Everything else that computes on float32 tensors becomes FP16; integer graph inputs (token ids) are untouched.
Float initializers read only by FP16 nodes are stored as FP16 (halving the file); one read by both kinds stays
FP32 and FP16 readers get a Cast. Inserted Casts are named ``<tensor>_cast_fp16`` / ``<tensor>_cast_fp32``
(node and output); original node names and output tensor names are preserved, so taps line up with FP32/INT8.

ONNX Runtime CPU has FP16 kernels for the ops of BERT-like encoders (MatMul, Gemm, Add, Mul, Div, Sub, Tanh,
Erf, Softmax, Transpose, LayerNormalization; checked with ORT 1.32); where an op has none, ORT's own
InsertCastTransformer runs it in FP32, so no extra rule is needed for CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibkit.names import node_labels

FP32_OP_TYPES: tuple[str, ...] = (
    "LayerNormalization",
    "ReduceMean",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "Softmax",
    "LogSoftmax",
    "Exp",
    "Log",
    "Erf",
)
# ops through which rule 2 propagates (elementwise or pure data movement)
_PROPAGATE = {"Add", "Sub", "Mul", "Div", "Where", "Min", "Max", "Neg", "Expand", "Unsqueeze", "Reshape", "Cast"}
# inputs that must keep their float32 type whatever the node's precision
_FIXED_FLOAT_INPUTS = {"Resize": {1, 2}, "Upsample": {1}}
FP16_MAX = 65504.0
FP16_TINY = 2.0**-24


@dataclass(frozen=True)
class Fp16Result:
    model: onnx.ModelProto
    fp16_nodes: tuple[str, ...]
    kept_fp32: tuple[str, ...]  # float nodes left in FP32 by the rules above


SMALL_CONSTANT = 16  # elements: epsilons and scalars, where an underflow to 0 changes the result


def _fits_fp16(a: np.ndarray) -> bool:
    """False when FP16 would overflow a value, or flush a small constant (an epsilon) to zero.

    Tiny entries of large weight tensors are not a reason: rounding them to 0 changes nothing measurable.
    """
    if a.size == 0:
        return True
    v = np.abs(a[np.isfinite(a)].astype(np.float64))
    if v.size and v.max() > FP16_MAX:
        return False
    if a.size <= SMALL_CONSTANT:
        nz = v[v > 0]
        return bool(nz.size == 0 or nz.min() >= FP16_TINY)
    return True


def _collect_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    types: dict[str, int] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for i in model.graph.initializer:
        types[i.name] = i.data_type
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    return types


def _contrib_output_type(node: onnx.NodeProto, k: int, types: dict[str, int]) -> int | None:
    """Element type of output ``k`` of a non-standard-domain node, which ONNX shape inference cannot type."""
    if node.op_type == "EmbedLayerNormalization" and k == 1:
        return TensorProto.INT32  # mask_index
    return next((types[x] for x in node.input if x and types.get(x) in (TensorProto.FLOAT, TensorProto.FLOAT16)),
                None)


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """dtype of every tensor. ONNX shape inference stops at contrib ops (com.microsoft ``Attention``,
    ``SkipLayerNormalization`` ...), so their outputs are typed from their float inputs and inference runs again
    until nothing new is learnt: without this, nodes behind a fused op look untyped and get no Cast."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    types = _collect_types(work)
    contrib = [n for n in work.graph.node if n.domain not in ("", "ai.onnx")]
    for _ in range(len(contrib) + 1):
        added = False
        for n in contrib:
            for k, o in enumerate(n.output):
                if o and o not in types:
                    t = _contrib_output_type(n, k, types)
                    if t is not None:
                        work.graph.value_info.append(helper.make_tensor_value_info(o, t, None))
                        types[o] = t
                        added = True
        if not added:
            break
        types = {**types, **_collect_types(work)}
    return types


def convert_to_fp16(model: onnx.ModelProto, *, keep_nodes: Sequence[str] = ()) -> Fp16Result:
    """An FP16 copy of ``model`` (see the module docstring for what stays FP32). Steps on one copy
    (:class:`_Fp16Pass`): which float nodes stay FP32, which constants become FP16, the Casts between the
    two, stale value_info dropped."""
    work = _Fp16Pass(model)
    fp32 = work.fp32_nodes(set(keep_nodes))
    half_nodes = [i for i, n in enumerate(work.g.node)
                  if n.op_type != "Constant" and work.is_float_node(n) and i not in fp32]
    half_set = set(half_nodes)
    new_type = work.convert_constants(half_set)
    work.insert_casts(half_set, new_type)
    g = work.g
    # stale float32 value_info would contradict the new types
    keep_vi = [vi for vi in g.value_info if vi.name not in new_type]
    del g.value_info[:]
    g.value_info.extend(keep_vi)

    labels = node_labels(model.graph)
    return Fp16Result(
        model=work.out,
        fp16_nodes=tuple(labels[i] for i in half_nodes),
        kept_fp32=tuple(labels[i] for i in sorted(fp32)),
    )


class _Fp16Pass:
    """One copy of the model converted in place, with what every step reads: the float type of each tensor,
    initializers and Constants by name, graph outputs that stay float32."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.types = _tensor_types(model)
        self.out = onnx.ModelProto()
        self.out.CopyFrom(model)
        g = self.g = self.out.graph
        self.inits = {i.name: i for i in g.initializer}
        self.consts = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
        self.float_outputs = {o.name for o in g.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
        self.fits_cache: dict[str, bool] = {}

    def const_fits(self, t: str) -> bool | None:
        """Whether a float32 constant's values fit FP16; None: not a float32 constant."""
        if t not in self.fits_cache:
            v = self.const_value(t)
            if v is None or v.dtype != np.float32:
                return None
            self.fits_cache[t] = _fits_fp16(v)
        return self.fits_cache[t]

    def const_value(self, t: str) -> np.ndarray | None:
        if t in self.inits:
            return numpy_helper.to_array(self.inits[t])
        if t in self.consts:
            for a in self.consts[t].attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def is_float_node(self, n: onnx.NodeProto) -> bool:
        if n.op_type == "Cast":
            return any(a.name == "to" and a.i == TensorProto.FLOAT for a in n.attribute)
        return any(self.types.get(x) == TensorProto.FLOAT for x in [*n.input, *n.output] if x)

    def fp32_nodes(self, keep: set[str]) -> set[int]:
        """Indices of the float nodes that stay FP32: FP32 op types, other domains, nodes reading a constant
        FP16 cannot hold (and the islands they feed), kept nodes, producers of float32 graph outputs."""
        fp32: set[int] = set()
        range_kept: set[str] = set()  # outputs of rule-2 nodes (propagation seeds)
        labels = node_labels(self.g)
        for i, n in enumerate(self.g.node):
            if n.op_type == "Constant" or not self.is_float_node(n):
                continue
            name = labels[i]
            bad_const = any(self.const_fits(x) is False for x in n.input if x)
            fed_by_island = n.op_type in _PROPAGATE and any(x in range_kept for x in n.input)
            if (
                n.op_type in FP32_OP_TYPES
                or n.domain not in ("", "ai.onnx")
                or bad_const
                or fed_by_island
                or name in keep
                or any(o in self.float_outputs for o in n.output)
            ):
                fp32.add(i)
                if (bad_const or fed_by_island) and n.op_type not in FP32_OP_TYPES:
                    range_kept.update(o for o in n.output if o)
        return fp32

    def convert_constants(self, half_set: set[int]) -> dict[str, int]:
        """The FP16 nodes' float outputs, and the initializers / Constants read only by FP16 nodes (outside
        their fixed-float inputs), become FP16. Returns the new type of each changed tensor."""
        g, inits, consts = self.g, self.inits, self.consts
        new_type: dict[str, int] = {}
        readers: dict[str, list[int]] = {}
        for i, n in enumerate(g.node):
            for x in n.input:
                if x:
                    readers.setdefault(x, []).append(i)
        for i in sorted(half_set):
            for o in g.node[i].output:
                if self.types.get(o) == TensorProto.FLOAT:
                    new_type[o] = TensorProto.FLOAT16
        for t, rs in readers.items():
            if t not in inits and t not in consts:
                continue
            if not all(r in half_set for r in rs) or t in self.float_outputs or not self.const_fits(t):
                continue
            v = self.const_value(t)
            assert v is not None  # const_fits() saw it
            if any(x == t and k in _FIXED_FLOAT_INPUTS.get(g.node[r].op_type, ()) for r in rs
                   for k, x in enumerate(g.node[r].input)):
                continue
            tensor = numpy_helper.from_array(v.astype(np.float16), t)
            if t in inits:
                inits[t].CopyFrom(tensor)
            else:
                for a in consts[t].attribute:
                    if a.name == "value":
                        a.t.CopyFrom(tensor)
            new_type[t] = TensorProto.FLOAT16
        return new_type

    def insert_casts(self, half_set: set[int], new_type: dict[str, int]) -> None:
        """Each float input read in the other precision goes through one shared Cast (inserted before its
        first reader); FP16 nodes' Cast-to-float and ConstantOfShape values become FP16."""
        FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
        g = self.g

        def current(t: str) -> int | None:
            return new_type.get(t, self.types.get(t))

        casts: dict[tuple[str, int], str] = {}
        before: dict[int, list[onnx.NodeProto]] = {}
        taken = {o for n in g.node for o in n.output} | set(self.inits) | {i.name for i in g.input}

        def cast(t: str, to: int, at: int) -> str:
            key = (t, to)
            if key not in casts:
                base = f"{t}_cast_{'fp16' if to == HALF else 'fp32'}"
                name, k = base, 1
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
                taken.add(name)
                casts[key] = name
                before.setdefault(at, []).append(helper.make_node("Cast", [t], [name], name=name, to=to))
            return casts[key]

        for i, n in enumerate(g.node):
            if n.op_type == "Constant" or not self.is_float_node(n):
                continue
            want = HALF if i in half_set else FLOAT
            fixed = _FIXED_FLOAT_INPUTS.get(n.op_type, set())
            for k, x in enumerate(n.input):
                if not x or current(x) not in (FLOAT, HALF):
                    continue
                target = FLOAT if k in fixed else want
                if current(x) != target:
                    n.input[k] = cast(x, target, i)
            if want == HALF:
                for a in n.attribute:
                    if n.op_type == "Cast" and a.name == "to" and a.i == FLOAT:
                        a.i = HALF
                    if n.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type == FLOAT:
                        a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16),
                                                             a.t.name))
        if before:
            nodes: list[onnx.NodeProto] = []
            for i, n in enumerate(g.node):
                nodes.extend(before.get(i, ()))
                nodes.append(n)
            del g.node[:]
            g.node.extend(nodes)
