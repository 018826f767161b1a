"""Which tensors get Q/DQ: the activation and weight inputs of the quantized op types.

Rule (TensorRT 11 explicit quantization for transformers): put a Q/DQ pair on every *input* of a quantized
op (MatMul, Gemm by default), so TensorRT fuses DQ->MatMul into an INT8 GEMM. Inputs that are initializers are
weights (per-output-channel scales); all others are activations (per-tensor scales from calibration). Both
inputs of an activation x activation MatMul (attention QK^T and probs·V) are activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from calibkit.names import compile_patterns, node_labels, node_name

DEFAULT_OP_TYPES: tuple[str, ...] = ("MatMul", "Gemm")


@dataclass(frozen=True)
class QuantizedNode:
    name: str
    op_type: str
    activation_inputs: tuple[str, ...]
    weight_inputs: tuple[str, ...]
    module: str = ""  # module path (calibkit.names), empty when the exporter left none


@dataclass(frozen=True)
class Placement:
    nodes: tuple[QuantizedNode, ...]
    excluded: tuple[str, ...]  # node names kept in higher precision by --exclude
    unmatched: tuple[str, ...] = ()  # --exclude patterns that select no node of the quantized op types

    @property
    def activations(self) -> tuple[str, ...]:
        """Activation tensors that need statistics, in graph order, each once."""
        seen: dict[str, None] = {}
        for n in self.nodes:
            for t in n.activation_inputs:
                seen.setdefault(t, None)
        return tuple(seen)


def _constant_outputs(graph: onnx.GraphProto) -> set[str]:
    return {o for n in graph.node if n.op_type == "Constant" for o in n.output}


def plan_placement(
    model: onnx.ModelProto,
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
    exclude: Sequence[str] = (),
) -> Placement:
    """Nodes whose op type is in ``op_types`` and whose names match no ``exclude`` regex.

    A pattern may be written against the ONNX node name or the module path (see :mod:`calibkit.names`).
    """
    graph = model.graph
    inits = {i.name for i in graph.initializer} | _constant_outputs(graph)
    patterns = compile_patterns(exclude)
    hits = [False] * len(patterns)
    nodes: list[QuantizedNode] = []
    excluded: list[str] = []
    wanted = set(op_types)
    labels = node_labels(graph)
    for i, node in enumerate(graph.node):
        if node.op_type not in wanted:
            continue
        names = node_name(node, i, labels[i])
        name = names.node
        matched = [k for k, p in enumerate(patterns) if names.matches(p)]
        if matched:
            for k in matched:
                hits[k] = True
            excluded.append(name)
            continue
        # Gemm's third input (bias) stays in higher precision.
        data_inputs = [x for x in node.input[:2] if x]
        nodes.append(
            QuantizedNode(
                name=name,
                op_type=node.op_type,
                activation_inputs=tuple(x for x in data_inputs if x not in inits),
                weight_inputs=tuple(x for x in data_inputs if x in inits),
                module=names.module,
            )
        )
    unmatched = tuple(p for p, hit in zip(exclude, hits) if not hit)
    return Placement(nodes=tuple(nodes), excluded=tuple(excluded), unmatched=unmatched)
