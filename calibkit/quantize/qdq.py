"""Insert QuantizeLinear/DequantizeLinear (Q/DQ) pairs into an FP32 ONNX model from a CalibrationTable.

Layout (both targets)
- Which nodes: :func:`calibkit.quantize.placement.plan_placement` (MatMul and Gemm by default) minus the
  ``exclude`` regexes and the exact ``keep_nodes`` names. A node is quantized only when every activation input
  has a range with amax > 0; otherwise it is kept in FP32 and reported in ``missing_ranges`` (no range in the
  table) or ``zero_ranges`` (amax 0: an all-zero tensor). NaN, inf, negative, denormal-scale or huge ranges are
  refused with a CalibrationError naming the tensors (``calibkit.quantize.rangecheck``).
- Activations: per-tensor scale ``amax / 127`` from the table, ``Q -> DQ`` right after the producer. A tensor
  read by several quantized nodes gets ONE shared pair (TensorRT fuses it once); consumers that stay in FP32
  keep reading the original tensor.
- Weights: stored pre-quantized as an int8 initializer + DequantizeLinear (no FP32 copy, no Q node): TensorRT
  and ONNX Runtime both accept it and the file is about a quarter of the FP32 weight bytes. Per-output-channel
  scales (MatMul B [K, N]: axis 1 / last; Gemm B: axis 1, or 0 with transB=1), zero point 0, values in
  [-127, 127]. The FP32 initializer is dropped unless a non-quantized node still reads it. Gemm biases stay FP32.
- Names (stable, so other tools can find them; ONNX Runtime's own Q/DQ convention, so
  ``onnxruntime.quantization.qdq_loss_debug`` pairs activations and weights): for an activation ``T``: nodes
  ``T_QuantizeLinear`` and ``T_DequantizeLinear``, tensors ``T_QuantizeLinear_Output`` and
  ``T_DequantizeLinear_Output``, initializers ``T_scale`` and ``T_zero_point``. For a weight ``W``: initializers
  ``W_quantized`` (int8), ``W_scale``, ``W_zero_point``, node ``W_DequantizeLinear`` with output
  ``W_DequantizeLinear_Output``. Original nodes keep their names and output tensor names: only their inputs are
  rewired to DQ outputs.

What differs between the targets
- ``Target.TENSORRT`` (explicit quantization for TensorRT 11 strongly typed networks): int8 activations with
  zero point 0, and every MatMul/Gemm is quantized, including the activation x activation attention MatMuls
  (Q·K^T and probs·V), which TensorRT runs as INT8 GEMMs inside its fused MHA kernels.
- ``Target.ONNXRUNTIME`` (the layout ONNX Runtime's CPU kernels turn into integer GEMMs): activations are
  **uint8**, because U8S8 is MLAS's fast x86 path, on a grid fitted to each tensor: the calibrated [-amax, amax]
  clipped to the extremes calibration observed (:meth:`calibkit.types.TensorRange.uint8_grid`). A one-sided
  tensor (a GELU output, never below -0.17) gets all 256 steps instead of half of them; a tensor seen beyond
  both ends, or a range without observed extremes (one read from a TensorRT cache), gets the symmetric int8
  grid shifted by 128 (zero point 128, the same values). Measured on the demo classifier (all weight MatMuls
  INT8, mse, 3,000 unseen log texts, benchmarks/bench_ort_recipes.py recipes ``ck-sym`` and ``ck``): 69
  predictions changed against FP32 with the symmetric grid, 50 with the fitted one, at the same speed (the
  integer kernels take any zero point). ORT fuses
  ``Q(act) -> DQ(act) + DQ(int8 weight) -> MatMul`` into ``QuantizeLinear + MatMulIntegerToFloat`` (checked on
  the optimized graph via ``SessionOptions.optimized_model_filepath``). Only nodes with a weight input are
  quantized: activation x activation MatMuls stay FP32 (and are listed in ``kept_nodes``): quantizing them
  too was measured slower on CPU and adds error (demo classifier, below: 1.56x vs 2.26x FP32 at batch 1,
  1.40x vs 1.71x at batch 32, 97.07 vs 97.46 % agreement with FP32).
  Measured on MiniLM-L6 (benchmarks/bench_ort_int8.py): with int8 activations (the TensorRT layout) ORT
  fused only 24 of the 36 weight MatMuls (the other DQs stay as float DequantizeLinear + MatMul) and ran at
  0.8-1.1x FP32 at batch 1; with this layout all 36 become MatMulIntegerToFloat.
  Measured on the demo classifier (6 layers, hidden 384; benchmarks/bench_ort_recipes.py, ORT 1.32, 2 shared
  cores with AMX/VNNI, real log texts, interleaved; benchmarks/results/ort-recipes-2026-12-07/): 2.26-2.35x
  FP32 at batch 1 and 1.71-1.74x at batch 32 (8 length-sorted batches, one of 256 tokens; 1.97-2.01x over the
  batches of <= 128 tokens), at least as fast as ``quantize_dynamic`` per-channel in the same runs (1.00-2.16x
  and 1.34-1.65x; with a 32 x 512 batch both are 1.5x, FP32 attention being most of that batch) and
  97.5-98.1 % agreement with FP32 on 512 log texts (quantize_dynamic: 98.2-98.4 %). Fusing
  Add+Add+LayerNormalization into SkipLayerNormalization, folding the bias Adds into MatMulIntegerToFloat,
  7-bit weights and MultiHeadAttention (also with a 512-token batch) measured no faster: the layout stays Q/DQ.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import TensorProto, helper, numpy_helper

from calibkit._io import atomic_open
from calibkit.errors import ModelError, UsageError
from calibkit.names import node_labels
from calibkit.quantize.placement import DEFAULT_OP_TYPES, Placement, plan_placement
from calibkit.quantize.rangecheck import check_ranges
from calibkit.quantize.weights import REDUCED_WEIGHT_MAX, QuantizedWeight, quantize_weight, weight_axis
from calibkit.types import INT8_MAX, CalibrationTable

MIN_OPSET = 13  # per-axis DequantizeLinear
# tensor suffixes of ONNX Runtime's quantizer (onnxruntime.quantization.quant_utils), which qdq_loss_debug matches
QUANT_OUTPUT = "_QuantizeLinear_Output"
DEQUANT_OUTPUT = "_DequantizeLinear_Output"


class Target(str, enum.Enum):
    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"


@dataclass(frozen=True)
class QuantizeResult:
    model: onnx.ModelProto
    quantized_nodes: tuple[str, ...]
    kept_nodes: tuple[str, ...]  # nodes of the quantized op types left in FP32 (excluded, kept, target rule, no range)
    missing_ranges: tuple[str, ...]  # activation tensors with no range in the table
    zero_ranges: tuple[str, ...] = ()  # activation tensors whose amax is 0 or not finite


def _default_opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return 0


def quantize_model(
    model: onnx.ModelProto,
    table: CalibrationTable,
    *,
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
    exclude: Sequence[str] = (),
    target: Target = Target.TENSORRT,
    keep_nodes: Sequence[str] = (),
    reduce_range: bool = False,
) -> QuantizeResult:
    """A Q/DQ INT8 copy of ``model`` (the input model is not modified). See the module docstring for the layout.
    ``reduce_range``: 7-bit weights for ONNX Runtime on CPUs without VNNI (calibkit.quantize.weights)

    Steps: check the inputs, plan placement and check the ranges, choose the nodes, then one
    :class:`_QdqWriter` over a copy of the model adds their Q/DQ pairs, rewires and orders the graph."""
    target = Target(target)
    _check_request(model, exclude, target, reduce_range)
    placement = plan_placement(model, op_types, exclude)
    amax = table.amax()
    # scale guard: an inf, 0 or denormal float32 scale would write a model that runs and is silently wrong
    check_ranges(((t, amax[t]) for t in placement.activations if t in amax), source="calibration table",
                 hint="recalibrate (`calibkit calibrate`) or fix the table's ranges; calibkit never writes these",
                 representable_only=True)
    choice = _choose_nodes(placement, set(keep_nodes), amax, target)
    writer = _QdqWriter(model, activation_grids(table, target), target,
                        REDUCED_WEIGHT_MAX if reduce_range else INT8_MAX)
    quantized = writer.quantize(choice.chosen)
    return QuantizeResult(
        model=writer.finish(),
        quantized_nodes=tuple(quantized),
        kept_nodes=tuple(choice.kept),
        missing_ranges=tuple(choice.missing),
        zero_ranges=tuple(choice.zero),
    )


def activation_grids(table: CalibrationTable, target: Target) -> dict[str, tuple[float, int]]:
    """(scale, zero point) of every activation's grid in ``target``'s layout: TensorRT's symmetric int8 (amax /
    127, zero point 0); the onnxruntime layout's uint8 grid fitted to what calibration observed
    (:meth:`TensorRange.uint8_grid`)."""
    if Target(target) is Target.ONNXRUNTIME:
        return {r.tensor: r.uint8_grid() for r in table.ranges}
    return {r.tensor: (r.amax / INT8_MAX, 0) for r in table.ranges}


def _check_request(model: onnx.ModelProto, exclude: Sequence[str], target: Target, reduce_range: bool) -> None:
    """UsageError/ModelError for what quantize_model cannot do: 7-bit weights outside the onnxruntime layout,
    an opset without per-channel Q/DQ, an --exclude that is not a regular expression."""
    if reduce_range and target is not Target.ONNXRUNTIME:
        raise UsageError("--reduce-range applies to the onnxruntime layout only",
                         hint="TensorRT's int8 GEMMs accumulate in int32 and never saturate: drop --reduce-range")
    if _default_opset(model) < MIN_OPSET:
        raise ModelError(
            f"the model uses ONNX opset {_default_opset(model)}; per-channel Q/DQ needs opset >= {MIN_OPSET}",
            hint="re-export the model with opset 13 or newer (e.g. torch.onnx.export(..., opset_version=17))",
        )
    for p in exclude:
        try:
            re.compile(p)
        except re.error as exc:
            raise UsageError(f"--exclude {p!r} is not a valid regular expression ({exc})") from exc


@dataclass(frozen=True)
class _Choice:
    chosen: tuple[Any, ...]  # placement nodes to quantize, in graph order
    kept: tuple[str, ...]
    missing: tuple[str, ...]
    zero: tuple[str, ...]


def _choose_nodes(placement: Placement, keep: set[str], amax: Mapping[str, float], target: Target) -> _Choice:
    """Which placed nodes get quantized: not kept, quantizable in the layout (onnxruntime: weight MatMuls
    only), and every activation input with a non-zero range."""
    kept: list[str] = list(placement.excluded)
    missing: dict[str, None] = {}
    zero: dict[str, None] = {}
    chosen = []
    for qn in placement.nodes:
        if qn.name in keep or (target is Target.ONNXRUNTIME and not qn.weight_inputs):
            kept.append(qn.name)
            continue
        ok = True
        for t in qn.activation_inputs:
            a = amax.get(t)
            if a is None:
                missing.setdefault(t, None)
                ok = False
            elif a == 0:
                zero.setdefault(t, None)
                ok = False
        if ok:
            chosen.append(qn)
        else:
            kept.append(qn.name)
    return _Choice(tuple(chosen), tuple(kept), tuple(missing), tuple(zero))


class _QdqWriter:
    """Edits one deep copy of the model (initializers copied once, at the end): Q/DQ pairs for activations
    (one per tensor, shared by its quantized readers), int8 weights with a DequantizeLinear, the readers
    rewired, the nodes ordered topologically, FP32 weights nothing reads any more dropped."""

    def __init__(self, model: onnx.ModelProto, grids: Mapping[str, tuple[float, int]], target: Target,
                 weight_qmax: int) -> None:
        self.source = model
        self.grids = grids
        self.weight_qmax = weight_qmax
        self.act_dtype = TensorProto.UINT8 if target is Target.ONNXRUNTIME else TensorProto.INT8
        self.out = _copy_without_initializers(model)
        g = self.g = self.out.graph
        self.init_by_name = {i.name: i for i in model.graph.initializer}  # read from the source
        self.const_by_output = {o: n for n in g.node if n.op_type == "Constant" for o in n.output}
        self.taken = set(self.init_by_name) | {o for n in g.node for o in n.output} | {i.name for i in g.input}
        self.taken |= {n.name for n in g.node if n.name}
        self.new_inits: list[onnx.TensorProto] = []
        self.act_dq: dict[str, str] = {}  # activation tensor -> DQ output
        self.act_nodes: dict[str, list[onnx.NodeProto]] = {}  # activation tensor -> [Q, DQ]
        self.weight_dq: dict[tuple[str, int | None], str] = {}
        self.weight_nodes: list[onnx.NodeProto] = []
        self.rewire: dict[tuple[int, int], str] = {}  # (node index, input index) -> new input name
        self.quantized_weights: dict[tuple[str, int | None], Any] = {}

    def fresh(self, name: str) -> str:
        cand, k = name, 1
        while cand in self.taken:
            cand, k = f"{name}_{k}", k + 1
        self.taken.add(cand)
        return cand

    def quantize(self, chosen: Sequence[Any]) -> list[str]:
        """Plan every chosen node's new inputs (names handed out in graph order, as ever); returns their names.
        The weights to quantize are found first, then made int8 on all CPUs at once (quantize_weight is numpy
        on whole matrices, which releases the GIL)."""
        g = self.g
        index_by_name = {label: i for i, label in enumerate(node_labels(g))}
        weight_keys: dict[tuple[int, int], tuple[str, int | None] | None] = {}
        for qn in chosen:
            idx = index_by_name[qn.name]
            node = g.node[idx]
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            for k, t in enumerate(node.input[:2]):
                if t and t not in qn.activation_inputs and t in qn.weight_inputs:
                    weight_keys[(idx, k)] = self.weight_key(t, node.op_type, k, trans_b)
        self.quantized_weights = _quantize_weights(
            list(dict.fromkeys(key for key in weight_keys.values() if key is not None)), self.weight_value,
            self.weight_qmax,
        )
        quantized: list[str] = []
        for qn in chosen:
            idx = index_by_name[qn.name]
            for k, t in enumerate(g.node[idx].input[:2]):
                if not t:
                    continue
                if t in qn.activation_inputs:
                    self.rewire[(idx, k)] = self.activation_pair(t)
                elif t in qn.weight_inputs:
                    key = weight_keys[(idx, k)]
                    if key is not None:
                        self.rewire[(idx, k)] = self.weight_pair(key)
            quantized.append(qn.name)
        return quantized

    def activation_pair(self, t: str) -> str:
        if t in self.act_dq:
            return self.act_dq[t]
        fresh = self.fresh
        scale = fresh(f"{t}_scale")
        zp = fresh(f"{t}_zero_point")
        step, zero = self.grids[t]
        self.new_inits.append(numpy_helper.from_array(np.asarray(step, dtype=np.float32), scale))
        self.new_inits.append(helper.make_tensor(zp, self.act_dtype, [], [zero]))
        q_out, dq_out = fresh(f"{t}{QUANT_OUTPUT}"), fresh(f"{t}{DEQUANT_OUTPUT}")
        self.act_nodes[t] = [
            helper.make_node("QuantizeLinear", [t, scale, zp], [q_out], name=fresh(f"{t}_QuantizeLinear")),
            helper.make_node("DequantizeLinear", [q_out, scale, zp], [dq_out], name=fresh(f"{t}_DequantizeLinear")),
        ]
        self.act_dq[t] = dq_out
        return dq_out

    def weight_tensor(self, w: str) -> onnx.TensorProto:
        if w in self.init_by_name:
            return self.init_by_name[w]
        node = self.const_by_output[w]
        for a in node.attribute:
            if a.name == "value":
                return a.t
        raise ModelError(f"weight {w!r} is a Constant without a tensor value; cannot quantize it")

    def weight_value(self, w: str) -> np.ndarray:
        return numpy_helper.to_array(self.weight_tensor(w))

    def weight_key(self, w: str, op_type: str, index: int, trans_b: bool) -> tuple[str, int | None] | None:
        t = self.weight_tensor(w)  # dtype and rank from the proto: the values are converted once, when quantized
        if t.data_type != TensorProto.FLOAT:
            return None
        return w, weight_axis(op_type, index, len(t.dims), trans_b)

    def weight_pair(self, key: tuple[str, int | None]) -> str:
        w, axis = key
        if key in self.weight_dq:
            return self.weight_dq[key]
        fresh = self.fresh
        qw = self.quantized_weights.pop(key)
        qname, sname, zname = fresh(f"{w}_quantized"), fresh(f"{w}_scale"), fresh(f"{w}_zero_point")
        self.new_inits.append(numpy_helper.from_array(qw.values, qname))
        self.new_inits.append(numpy_helper.from_array(qw.scale, sname))
        self.new_inits.append(numpy_helper.from_array(np.zeros(qw.scale.shape, dtype=np.int8), zname))
        dq_out = fresh(f"{w}{DEQUANT_OUTPUT}")
        dq_name = fresh(f"{w}_DequantizeLinear")
        node = helper.make_node("DequantizeLinear", [qname, sname, zname], [dq_out], name=dq_name)
        if axis is not None:
            node.attribute.append(helper.make_attribute("axis", axis))
        self.weight_nodes.append(node)
        self.weight_dq[key] = dq_out
        return dq_out

    def finish(self) -> onnx.ModelProto:
        """Rewire the inputs, rebuild the node list in topological order (weight DQs and pairs of graph inputs
        first, every other pair right after its producer), drop FP32 weights nothing reads any more and copy
        the initializers."""
        g = self.g
        for (idx, k), new in self.rewire.items():
            g.node[idx].input[k] = new
        graph_inputs = {i.name for i in g.input} | set(self.init_by_name)
        head: list[onnx.NodeProto] = list(self.weight_nodes)
        for t, pair in self.act_nodes.items():
            if t in graph_inputs:
                head.extend(pair)
        if self.rewire:
            nodes: list[onnx.NodeProto] = list(head)
            for node in g.node:
                nodes.append(node)
                for o in node.output:
                    if o in self.act_nodes and o not in graph_inputs:
                        nodes.extend(self.act_nodes[o])
            del g.node[:]
            g.node.extend(nodes)
        still_read = {x for n in g.node for x in n.input} | {o.name for o in g.output}
        drop = {w for (w, _axis) in self.weight_dq if w not in still_read}
        if drop:
            for n in [n for n in g.node if n.op_type == "Constant" and n.output[0] in drop]:
                g.node.remove(n)
        g.initializer.extend(i for i in self.source.graph.initializer if i.name not in drop)
        g.initializer.extend(self.new_inits)
        return self.out


def _quantize_weights(keys: list, value_of: Callable[[str], np.ndarray], qmax: int = INT8_MAX) -> dict:
    """``quantize_weight`` of every (weight, axis) key, on up to one thread per CPU (the results are the same
    arrays as one after another: each weight's arithmetic is unchanged)."""

    def one(key: tuple[str, int | None]) -> QuantizedWeight:
        return quantize_weight(value_of(key[0]), key[1], qmax)

    workers = min(len(keys), _cpus())
    if workers <= 1:
        return {key: one(key) for key in keys}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="calibkit-weights") as pool:
        return dict(zip(keys, pool.map(one, keys), strict=True))


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _copy_field(dst: Message, fd: Any, value: Any) -> None:
    if hasattr(value, "extend"):  # repeated field
        getattr(dst, fd.name).extend(value)
    elif isinstance(value, Message):
        getattr(dst, fd.name).CopyFrom(value)
    else:
        setattr(dst, fd.name, value)


def _copy_fields(src: Message, dst: Message, skip: str) -> None:
    for fd, value in src.ListFields():
        if fd.name != skip:
            _copy_field(dst, fd, value)


def _copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of everything but the graph's initializers (the weights are copied once, selectively)."""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip="graph")
    _copy_fields(model.graph, out.graph, skip="initializer")
    return out


def weightless_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every initializer reduced to its name, type and shape (no data): enough to plan taps and
    name graph inputs, a few KB where the weights are hundreds of MB."""
    out = _copy_without_initializers(model)
    out.graph.initializer.extend(
        onnx.TensorProto(name=i.name, data_type=i.data_type, dims=i.dims) for i in model.graph.initializer
    )
    return out


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Write ``model`` atomically as one file (models over protobuf's 2 GB limit are not supported).

    The file holds exactly the bytes of ``model.SerializeToString()``, but the graph's initializers are encoded
    here, each tensor's raw data written straight from its buffer, instead of protobuf copying every weight
    into one serialized message first (for BERT-large that serialization alone took seconds)."""
    head_lo, head_hi = _split(model, _MODEL_GRAPH)
    graph_lo, graph_hi = _split(model.graph, _GRAPH_INITIALIZER)
    inits = [_tensor_parts(t) for t in model.graph.initializer]
    graph_len = len(graph_lo) + len(graph_hi) + sum(_field_len(_GRAPH_INITIALIZER, sum(map(len, p))) for p in inits)
    if len(head_lo) + len(head_hi) + _field_len(_MODEL_GRAPH, graph_len) >= 2**31:
        raise ModelError(f"cannot serialize the model for {path}: it is over 2 GB",
                         hint="models over 2 GB are not supported")
    with atomic_open(path, "wb") as fh:
        fh.write(head_lo)
        fh.write(_key(_MODEL_GRAPH) + _varint(graph_len))
        fh.write(graph_lo)
        for parts in inits:
            fh.write(_key(_GRAPH_INITIALIZER) + _varint(sum(map(len, parts))))
            for part in parts:
                fh.write(part)
        fh.write(graph_hi)
        fh.write(head_hi)


_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_PLAIN_TENSOR_FIELDS = {1, 2, 8, 9}  # TensorProto dims, data_type, name, raw_data
_TENSOR_RAW_DATA = 9


def _split(msg: Message, number: int) -> tuple[bytes, bytes]:
    """``msg``'s encoding of the fields numbered below and above ``number`` (protobuf writes fields in number
    order, so the encoding of field ``number`` goes between the two)."""
    lo, hi = type(msg)(), type(msg)()
    for fd, value in msg.ListFields():
        if fd.number == number:
            continue
        _copy_field(lo if fd.number < number else hi, fd, value)
    return lo.SerializeToString(), hi.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _key(field: int) -> bytes:
    return _varint(field << 3 | 2)  # wire type 2: length-delimited


def _field_len(field: int, n: int) -> int:
    return len(_key(field)) + len(_varint(n)) + n


def _tensor_parts(t: onnx.TensorProto) -> list[bytes]:
    """The encoding of ``t`` as pieces to write one after another; its raw data (the last field written) is a
    piece of its own, not copied into a bigger message."""
    numbers = {fd.number for fd, _ in t.ListFields()}
    if _TENSOR_RAW_DATA not in numbers or not numbers <= _PLAIN_TENSOR_FIELDS:
        return [t.SerializeToString()]
    rest = onnx.TensorProto()
    rest.dims.extend(t.dims)
    if t.HasField("data_type"):
        rest.data_type = t.data_type
    if t.HasField("name"):
        rest.name = t.name
    raw = t.raw_data
    return [rest.SerializeToString(), _key(_TENSOR_RAW_DATA) + _varint(len(raw)), raw]
