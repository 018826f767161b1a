"""One model for every plan and every table: the *switchboard*, so a candidate costs no graph edit and no session.

tune and compare evaluate hundreds of variants of one FP32 model: a table per method, one node quantized alone,
a prefix of the ranking kept in FP32. Built one by one, each variant pays a fixed cost before it reads a text
(quantize the weights, serialize, start an ONNX Runtime session: 40 s on BERT-base, more than a 1,000-text
evaluation). The switchboard is the FP32 model with, for every quantized node, both paths wired in:

- per activation tensor ``t``: a uint8 ``Q(t) -> DQ`` with its scale and zero point read from the graph inputs
  :data:`SCALES` and :data:`ZEROS` (``Gather`` at the tensor's position), one pair shared by every reader, as
  :mod:`calibkit.quantize.qdq` does (TensorRT's symmetric int8 grid is the uint8 one with zero point 128: the
  same values);
- per weight: the int8 weight and its per-channel ``DequantizeLinear``, exactly as ``quantize_model`` writes it;
- per quantized node and input: ``Where(switch, dequantized, original)`` with the switch read from the graph
  input :data:`SWITCHES` (``Gather`` at the node's position).

A plan is then a boolean vector and a table a float vector, fed with the texts: one session per process serves
every candidate of a run, so work units can be as small as load balancing wants (a chunk of texts) and every
core works. ``Where`` selects, it does not compute, so a node switched on reads bit for bit the values the
Q/DQ model of ``quantize_model`` gives its MatMul, and one switched off reads the FP32 tensor; the engine runs
with graph optimizations off, as the exact Q/DQ evaluation of the TensorRT layout does
(``engines.onnxruntime.evaluation_optimization``). The onnxruntime layout is served too, its activation x
activation MatMuls switched off and its fitted uint8 grids fed (:func:`setting`): exact Q/DQ arithmetic of what
ONNX Runtime's fused integer kernels compute up to float rounding (int32 accumulation, one scale). That gap is
measured, not assumed: tune runs the plan's served model on holdout texts and records how many texts it
changes (``evaluate.served``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibkit.errors import ModelError
from calibkit.names import node_labels
from calibkit.quantize.placement import Placement
from calibkit.quantize.rangecheck import check_ranges
from calibkit.quantize.weights import quantize_weight, weight_axis
from calibkit.types import UINT8_SYMMETRIC_ZERO, CalibrationTable

SWITCHES = "calibkit_switchboard_int8"  # bool [nodes]: node i runs INT8
SCALES = "calibkit_switchboard_scales"  # float32 [tensors]: activation scale of tensor j
ZEROS = "calibkit_switchboard_zero_points"  # uint8 [tensors]: zero point of tensor j's uint8 grid
_PREFIX = "calibkit_switchboard/"


@dataclass(frozen=True)
class Board:
    """The switchboard of one FP32 model: its serialized bytes, and what position of each feed vector means."""

    model: bytes
    nodes: tuple[str, ...]  # SWITCHES[i] turns nodes[i] to INT8
    tensors: tuple[str, ...]  # SCALES[j] is the scale of tensors[j]
    node_inputs: tuple[tuple[str, ...], ...]  # per node: its activation inputs (those that need a range)
    weighted: tuple[bool, ...] = ()  # per node: whether it reads a weight (the onnxruntime layout quantizes those)

    def __repr__(self) -> str:
        return f"Board({len(self.nodes)} nodes, {len(self.tensors)} tensors, {len(self.model) >> 20} MiB)"


@dataclass(frozen=True)
class Setting:
    """A plan under a table, as the feeds of a :class:`Board`: which nodes run INT8 and every tensor's grid."""

    switches: np.ndarray  # bool [nodes]
    scales: np.ndarray  # float32 [tensors]
    zeros: np.ndarray  # uint8 [tensors]

    def feeds(self) -> dict[str, np.ndarray]:
        return {SWITCHES: self.switches, SCALES: self.scales, ZEROS: self.zeros}


def build_board(model: onnx.ModelProto, placement: Placement) -> Board:
    """The switchboard of ``model`` for the nodes of ``placement`` (see the module docstring)."""
    g = model.graph
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in g.initializer}
    consts = {o: n for n in g.node if n.op_type == "Constant" for o in n.output}
    nodes = tuple(qn.name for qn in placement.nodes)
    tensors = placement.activations
    graph.input.append(helper.make_tensor_value_info(SWITCHES, TensorProto.BOOL, [len(nodes)]))
    graph.input.append(helper.make_tensor_value_info(SCALES, TensorProto.FLOAT, [len(tensors)]))
    graph.input.append(helper.make_tensor_value_info(ZEROS, TensorProto.UINT8, [len(tensors)]))
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []

    def index(name: str, i: int) -> str:
        t = numpy_helper.from_array(np.asarray(i, dtype=np.int64), _PREFIX + f"{name}_index_{i}")
        new_inits.append(t)
        return t.name

    dq_of: dict[str, str] = {}
    for j, t in enumerate(tensors):
        scale = _PREFIX + f"scale/{t}"
        q, dq = _PREFIX + f"q/{t}", _PREFIX + f"dq/{t}"
        zp = _PREFIX + f"zero_point/{t}"
        position = index("scale", j)
        new_nodes += [
            helper.make_node("Gather", [SCALES, position], [scale], name=scale),
            helper.make_node("Gather", [ZEROS, position], [zp], name=zp),
            helper.make_node("QuantizeLinear", [t, scale, zp], [q], name=q),
            helper.make_node("DequantizeLinear", [q, scale, zp], [dq], name=dq),
        ]
        dq_of[t] = dq
    weight_dq: dict[tuple[str, int | None], str] = {}
    by_name = dict(zip(node_labels(graph), graph.node, strict=True))
    for i, qn in enumerate(placement.nodes):
        node = by_name.get(qn.name)
        if node is None:
            raise ModelError(f"the placement names node {qn.name!r}, which the model does not have")
        switch = _PREFIX + f"switch/{qn.name}"
        new_nodes.append(helper.make_node("Gather", [SWITCHES, index("switch", i)], [switch], name=switch))
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        for k, x in enumerate(node.input[:2]):
            if not x:
                continue
            if x in qn.activation_inputs:
                source = dq_of[x]
            elif x in qn.weight_inputs:
                w = inits.get(x)
                w = w if w is not None else _constant_value(consts.get(x), x)
                if w.data_type != TensorProto.FLOAT:
                    continue
                key = (x, weight_axis(node.op_type, k, len(w.dims), trans_b))
                if key not in weight_dq:
                    weight_dq[key] = _weight_pair(w, key[1], new_inits, new_nodes, len(weight_dq))
                source = weight_dq[key]
            else:
                continue
            chosen = _PREFIX + f"where/{qn.name}/{k}"
            new_nodes.append(helper.make_node("Where", [switch, source, x], [chosen], name=chosen))
            node.input[k] = chosen
    graph.initializer.extend(new_inits)
    all_nodes = list(graph.node) + new_nodes
    del graph.node[:]
    graph.node.extend(_topological(all_nodes, {i.name for i in graph.input} | {i.name for i in graph.initializer}))
    data = out.SerializeToString()
    node_inputs = tuple(tuple(qn.activation_inputs) for qn in placement.nodes)
    return Board(data, nodes, tensors, node_inputs, tuple(bool(qn.weight_inputs) for qn in placement.nodes))


def _constant_value(node: onnx.NodeProto | None, name: str) -> onnx.TensorProto:
    for a in node.attribute if node is not None else ():
        if a.name == "value":
            return a.t
    raise ModelError(f"weight {name!r} is a Constant without a tensor value; cannot quantize it")


def _weight_pair(w: onnx.TensorProto, axis: int | None, inits: list[onnx.TensorProto],
                 nodes: list[onnx.NodeProto], k: int) -> str:
    """The int8 weight and its DequantizeLinear, as quantize_model writes them; returns the dequantized name."""
    qw = quantize_weight(numpy_helper.to_array(w), axis)
    base = _PREFIX + f"weight_{k}/{w.name}"
    inits.append(numpy_helper.from_array(qw.values, base + "/quantized"))
    inits.append(numpy_helper.from_array(qw.scale, base + "/scale"))
    inits.append(numpy_helper.from_array(np.zeros(qw.scale.shape, dtype=np.int8), base + "/zero_point"))
    node = helper.make_node("DequantizeLinear", [base + "/quantized", base + "/scale", base + "/zero_point"],
                            [base + "/dq"], name=base + "/dq")
    if axis is not None:
        node.attribute.append(helper.make_attribute("axis", axis))
    nodes.append(node)
    return base + "/dq"


def _topological(nodes: Sequence[onnx.NodeProto], available: Iterable[str]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where every input is produced before it is read (stable: the original order
    wherever it already is one)."""
    ready = set(available) | {""}
    producers: dict[str, int] = {o: i for i, n in enumerate(nodes) for o in n.output}
    waiting = {i: {x for x in n.input if x not in ready and x in producers} for i, n in enumerate(nodes)}
    readers: dict[str, list[int]] = {}
    for i, deps in waiting.items():
        for x in deps:
            readers.setdefault(x, []).append(i)
    heap = [i for i, deps in waiting.items() if not deps]
    heapq.heapify(heap)
    order: list[onnx.NodeProto] = []
    while heap:
        i = heapq.heappop(heap)
        order.append(nodes[i])
        for o in nodes[i].output:
            for r in readers.pop(o, ()):
                waiting[r].discard(o)
                if not waiting[r]:
                    heapq.heappush(heap, r)
    if len(order) != len(nodes):
        raise ModelError("the model's graph has a cycle or reads a tensor nothing produces",
                         hint="check the model with onnx.checker.check_model")
    return order


def setting(board: Board, table: CalibrationTable, keep: Iterable[str], *, weights_only: bool = False) -> Setting:
    """The feeds that make ``board`` compute ``quantize_model(model, table, keep_nodes=keep)`` as exact Q/DQ
    arithmetic: a node runs INT8 unless it is kept or one of its activation inputs has no range or a zero range;
    ranges are checked as ``quantize_model`` checks them. ``weights_only``: the onnxruntime layout, whose
    activation x activation MatMuls stay FP32, and whose activations are on uint8 grids fitted to the observed
    extremes (``quantize_model`` writes the same ones; TensorRT's int8 grid is fed as zero point 128)."""
    amax: Mapping[str, float] = table.amax()
    check_ranges(((t, amax[t]) for t in board.tensors if t in amax), source="calibration table",
                 hint="recalibrate (`calibkit calibrate`) or fix the table's ranges; calibkit never writes these",
                 representable_only=True)
    kept = set(keep)
    weighted = board.weighted or (True,) * len(board.nodes)
    switches = np.asarray([n not in kept and all(amax.get(t) for t in inputs) and (w or not weights_only)
                           for n, inputs, w in zip(board.nodes, board.node_inputs, weighted)], dtype=bool)
    # the board's pairs are uint8: TensorRT's int8 grid is fed as its shifted copy (zero point 128)
    grids = {r.tensor: r.uint8_grid(fitted=weights_only) for r in table.ranges}
    grid = [grids[t] if amax.get(t) else (1.0, UINT8_SYMMETRIC_ZERO) for t in board.tensors]
    scales = np.asarray([np.float32(step) for step, _ in grid], dtype=np.float32)
    zeros = np.asarray([zero for _, zero in grid], dtype=np.uint8)
    return Setting(switches, scales, zeros)
