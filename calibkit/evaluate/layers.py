"""Which layers a Q/DQ model quantizes and with which clipping range, read from the model itself.

Works for any Q/DQ ONNX (calibkit's, ORT ``quantize_static``, ModelOpt): a layer is a compute node one of
whose inputs comes from DequantizeLinear(QuantizeLinear(t)) with ``t`` an activation (weights have no
QuantizeLinear in front of their DequantizeLinear). Layouts: int8 with zero point 0 and uint8 with zero point
128 are symmetric, amax = 127 x scale; any other zero point gives the asymmetric range it encodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from calibkit.names import attention_products, node_labels, with_product
from calibkit.names import node_name as _names
from calibkit.quantize.placement import plan_placement

log = logging.getLogger("calibkit.evaluate.layers")

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_PASS_THROUGH = ("Cast", "Identity")


@dataclass(frozen=True)
class Quantizer:
    """What a QuantizeLinear does: q = clip(round(x / scale) + zero_point, qmin, qmax)."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        q = np.clip(np.rint(x / self.scale) + self.zero_point, self.qmin, self.qmax)
        return (q - self.zero_point) * self.scale


@dataclass(frozen=True)
class LayerSpec:
    """One quantized activation input of one node."""

    index: int  # position in the layer list (graph order)
    node: str
    op_type: str
    tensor: str  # the higher-precision tensor the QuantizeLinear reads (name in the FP model)
    output: str  # the node's first output (tapped in both models for SQNR)
    amax: float | None  # None when the model carries no Q/DQ for this input
    clip_low: float | None
    clip_high: float | None
    quantizer: Quantizer | None = None
    module: str = ""  # the node's module path (calibkit.names), e.g. bert.encoder.layer.4.output.dense

    @property
    def label(self) -> str:
        """What a reader sees: the module path with the ONNX node name, or the node name alone."""
        return f"{self.module} ({self.node})" if self.module and self.module not in self.node else self.node


def _const_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    values[n.output[0]] = numpy_helper.to_array(a.t)
    return values


def node_name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def module_path(node: onnx.NodeProto, index: int) -> str:
    return _names(node, index).module


def _clip_range(q: onnx.NodeProto, consts: dict[str, np.ndarray]) -> tuple[float, float, float, Quantizer] | None:
    """(amax, low, high, quantizer) a QuantizeLinear encodes, or None when its scale is not a constant."""
    scale = consts.get(q.input[1]) if len(q.input) > 1 else None
    if scale is None:
        return None
    s = float(np.max(np.abs(scale.astype(np.float64))))
    zp_arr = consts.get(q.input[2]) if len(q.input) > 2 and q.input[2] else None
    if zp_arr is not None:
        dtype = zp_arr.dtype
        zp = int(np.asarray(zp_arr).reshape(-1)[0])
    else:
        to = next((a.i for a in q.attribute if a.name == "output_dtype"), 0)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to)) if to else np.dtype(np.uint8)
        zp = 0
    if not np.issubdtype(dtype, np.integer):  # fp8 and friends: no integer grid to read
        return None
    info = np.iinfo(dtype)
    quant = Quantizer(s, zp, int(info.min), int(info.max))
    if (dtype == np.int8 and zp == 0) or (dtype == np.uint8 and zp == 128):
        amax = 127.0 * s
        return amax, -amax, amax, quant
    low, high = (info.min - zp) * s, (info.max - zp) * s
    return max(abs(low), abs(high)), low, high, quant


def find_layers(model: onnx.ModelProto) -> tuple[LayerSpec, ...]:
    """Quantized activation inputs of a Q/DQ model in graph order; for a model without Q/DQ, the inputs
    calibkit's default placement would quantize (MatMul/Gemm), with amax None."""
    graph = model.graph
    producer = {o: (i, n) for i, n in enumerate(graph.node) for o in n.output if o}
    consts = _const_values(model)
    has_qdq = any(n.op_type == "QuantizeLinear" for n in graph.node)
    products = attention_products(model)
    layers: list[LayerSpec] = []
    labels = node_labels(graph)
    if not has_qdq:
        for qn in plan_placement(model).nodes:
            idx, node = next((i, n) for i, n in enumerate(graph.node) if labels[i] == qn.name)
            for t in qn.activation_inputs:
                layers.append(LayerSpec(len(layers), qn.name, qn.op_type, t, node.output[0], None, None, None,
                                        module=with_product(qn.module, products.get(qn.name))))
        return tuple(layers)
    for i, node in enumerate(graph.node):
        if node.op_type in QDQ_OPS or not node.output:
            continue
        for inp in node.input:
            dq = producer.get(inp)
            if dq is None or dq[1].op_type != "DequantizeLinear":
                continue
            q = producer.get(dq[1].input[0])
            if q is None or q[1].op_type != "QuantizeLinear":
                continue  # a weight: DequantizeLinear of an int8 initializer
            rng = _clip_range(q[1], consts)
            tensor = q[1].input[0]
            while tensor in producer and producer[tensor][1].op_type in _PASS_THROUGH:
                tensor = producer[tensor][1].input[0]  # ModelOpt casts to FP16 before Q: name the FP tensor
            if tensor in consts:
                continue  # a weight quantized by QuantizeLinear at run time
            amax, low, high, quant = rng if rng else (None, None, None, None)
            layers.append(
                LayerSpec(len(layers), labels[i], node.op_type, tensor, node.output[0], amax, low, high, quant,
                          module=with_product(module_path(node, i), products.get(labels[i])))
            )
    return tuple(layers)


@dataclass(frozen=True)
class WeightError:
    """A node's INT8 weights against the FP ones. SQNR is energy-weighted, so one huge weight per channel
    hides that every other weight of the channel rounds to zero: ``zeroed_fraction`` shows it."""

    sqnr_db: float
    zeroed_fraction: float  # non-zero FP weights that dequantize to exactly 0


def weight_errors(qdq: onnx.ModelProto, reference: onnx.ModelProto) -> dict[str, WeightError]:
    """Node name -> error of its quantized weight(s) against the reference model's FP weights.

    The weight of node N is input k of N in both models: in ``qdq`` a DequantizeLinear of an integer
    initializer, in ``reference`` the FP initializer. Nodes whose weights are not quantized are left out.
    """
    consts_q = _const_values(qdq)
    consts_r = _const_values(reference)
    producer = {o: n for n in qdq.graph.node for o in n.output if o}
    ref_nodes = dict(zip(node_labels(reference.graph), reference.graph.node, strict=True))
    out: dict[str, WeightError] = {}
    for node, name in zip(qdq.graph.node, node_labels(qdq.graph), strict=True):
        ref = ref_nodes.get(name)
        if ref is None or node.op_type in QDQ_OPS:
            continue
        signal = noise = 0.0
        nonzero = zeroed = 0
        for k, inp in enumerate(node.input):
            dq = producer.get(inp)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in consts_q or k >= len(ref.input):
                continue
            w = consts_r.get(ref.input[k])
            if w is None:
                continue
            deq = _dequantize(dq, consts_q)
            if deq is None or deq.shape != w.shape:
                continue
            w64 = w.astype(np.float64)
            signal += float(np.sum(w64 * w64))
            noise += float(np.sum((w64 - deq) ** 2))
            nonzero += int(np.count_nonzero(w64))
            zeroed += int(np.count_nonzero((w64 != 0) & (deq == 0)))
        if signal > 0:
            sqnr = 200.0 if noise == 0 else min(200.0, 10.0 * float(np.log10(signal / noise)))
            out[name] = WeightError(sqnr, zeroed / nonzero if nonzero else 0.0)
    return out


def _dequantize(dq: onnx.NodeProto, consts: dict[str, np.ndarray]) -> np.ndarray | None:
    q = consts[dq.input[0]].astype(np.float64)
    scale = consts.get(dq.input[1]) if len(dq.input) > 1 else None
    if scale is None:
        return None
    zp = consts.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    s = scale.astype(np.float64)
    z = zp.astype(np.float64) if zp is not None else np.zeros_like(s)
    if s.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (q - z) * s


def graph_tensors(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    return {o for n in g.node for o in n.output if o} | {i.name for i in g.input} | {i.name for i in g.initializer}
