"""Readable layer names: the module path (``bert.encoder.layer.4.output.dense``) of each ONNX node.

Where the path comes from, by exporter:
- ``torch.onnx.export(dynamo=True)`` names nodes ``node_MatMul_238`` but stores the module hierarchy in the
  node's ``pkg.torch.onnx.name_scopes`` metadata: the module scopes outermost first, then the FX node the op
  came from (``['', 'bert', 'bert.encoder', ..., 'bert.encoder.layer.4.output.dense', 'linear_11']``): the module
  is the last entry before the FX node.
- The legacy (TorchScript) exporter and Optimum name nodes by scope: ``/bert/encoder/layer.4/output/dense/MatMul``
  (module path = every component but the last, joined with dots).
- Anything else (ORT-fused ``Attention_0``, hand-built graphs): no module path; the node name stands for itself.

A user's ``--exclude`` regex is matched against the node name, the module path and the legacy-style name
``/<module path with slashes>/<op>``, so ``layer\\.4/``, ``layer\\.4\\.`` and ``encoder.layer.4.output.dense``
select the same nodes whichever exporter wrote the file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_LEGACY = re.compile(r"^/(?:[^/]+/)+[^/]+$")


@dataclass(frozen=True)
class NodeName:
    """One node's names: ``node`` (in the ONNX file), ``module`` (empty when unknown), ``legacy`` (slash form)."""

    node: str
    op_type: str
    module: str
    legacy: str

    @property
    def forms(self) -> tuple[str, ...]:
        """Every spelling an ``--exclude`` pattern may be written against."""
        return tuple(dict.fromkeys(x for x in (self.node, self.module, self.legacy) if x))

    def matches(self, pattern: re.Pattern[str]) -> bool:
        return any(pattern.search(f) for f in self.forms)


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The name calibkit uses for a node on its own (its ONNX name, or ``<op>_<index>`` when it has none); where
    the whole graph is at hand use :func:`node_labels`, which keeps the names unique."""
    return node.name or f"{node.op_type}_{index}"


def node_labels(graph: onnx.GraphProto) -> list[str]:
    """The name calibkit uses for each node of ``graph``, in order: its ONNX name, or ``<op>_<index>`` when it
    has none, made unique against every name in the graph (``_2``, ``_3``… appended): an unnamed MatMul beside
    a node really named ``MatMul_1`` used to share its name, and ONNX Runtime refused the model calibkit built
    from both."""
    taken = {n.name for n in graph.node if n.name}
    out: list[str] = []
    for i, n in enumerate(graph.node):
        if n.name:
            out.append(n.name)
            continue
        base = cand = f"{n.op_type}_{i}"
        k = 2
        while cand in taken:
            cand, k = f"{base}_{k}", k + 1
        taken.add(cand)
        out.append(cand)
    return out


def _scopes(node: onnx.NodeProto) -> list[str]:
    for p in node.metadata_props:
        if p.key == NAME_SCOPES_KEY:
            try:
                value = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return []
            return [str(x) for x in value] if isinstance(value, (list, tuple)) else []
    return []


def _legacy_module(name: str) -> str:
    if not _LEGACY.match(name):
        return ""
    return ".".join(name.strip("/").split("/")[:-1])


def _slash_form(module: str, op_type: str) -> str:
    """``bert.encoder.layer.4.output.dense`` -> ``/bert/encoder/layer.4/output/dense/MatMul`` (list indices stay
    attached to their list, as the legacy exporter writes them)."""
    parts: list[str] = []
    for p in module.split("."):
        if p.isdigit() and parts:
            parts[-1] = f"{parts[-1]}.{p}"
        else:
            parts.append(p)
    return "/" + "/".join([*parts, op_type])


def node_name(node: onnx.NodeProto, index: int, label: str | None = None) -> NodeName:
    """The names of one node; ``label``: its calibkit name from :func:`node_labels` (default: :func:`node_label`)."""
    label = label if label is not None else node_label(node, index)
    scopes = [s for s in _scopes(node)[:-1] if s]  # the last entry is the FX node, not a module
    if scopes:
        module = scopes[-1]
        return NodeName(label, node.op_type, module, _slash_form(module, node.op_type))
    module = _legacy_module(label)
    return NodeName(label, node.op_type, module, label if module else "")


def node_names(model: onnx.ModelProto, op_types: Iterable[str] | None = None) -> dict[str, NodeName]:
    """NodeName of every node (of ``op_types`` when given), keyed by the node's calibkit name, in graph order."""
    wanted = set(op_types) if op_types is not None else None
    out: dict[str, NodeName] = {}
    labels = node_labels(model.graph)
    for i, n in enumerate(model.graph.node):
        if wanted is None or n.op_type in wanted:
            nn = node_name(n, i, labels[i])
            out[nn.node] = nn
    return out


def display_names(names: Sequence[NodeName]) -> dict[str, str]:
    """node -> what a report shows: the module path when it names one node alone, else ``module (node)``."""
    count: dict[str, int] = {}
    for n in names:
        if n.module:
            count[n.module] = count.get(n.module, 0) + 1
    return {n.node: (n.module if count.get(n.module) == 1 else f"{n.module} ({n.node})") if n.module else n.node
            for n in names}


def compile_patterns(patterns: Sequence[str]) -> list[re.Pattern[str]]:
    """Compile ``--exclude`` regexes (callers validate them first and raise UsageError on a bad one)."""
    return [re.compile(p) for p in patterns]


def unmatched_patterns(patterns: Sequence[str], names: Iterable[NodeName]) -> tuple[str, ...]:
    """The patterns that select no node: a typo, or a name form this model's exporter does not write."""
    pool = list(names)
    return tuple(p for p, rx in zip(patterns, compile_patterns(patterns)) if not any(n.matches(rx) for n in pool))


# The two products of attention are MatMuls of two activations in one module: a module path alone names both.
_BACK = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Identity", "Dropout", "Transpose"})
_TO_SOFTMAX = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Identity", "Div", "Mul", "Add", "Sub", "Where",
                         "Reshape"})
SCORES, CONTEXT = "attention scores QK^T", "attention context PV"


def attention_products(model: onnx.ModelProto) -> dict[str, str]:
    """node -> which attention product it computes, for MatMuls of two activations (no weight behind either
    input, seen through Q/DQ and casts): ``CONTEXT`` when one input comes from a Softmax, ``SCORES`` when its
    output flows into one through elementwise ops (scaling, masking)."""
    graph = model.graph
    consts = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def back(t: str) -> tuple[bool, bool]:  # (a weight, a Softmax output)
        for _ in range(6):
            if t in consts:
                return True, False
            p = producer.get(t)
            if p is None or p.op_type not in _BACK:
                return False, p is not None and p.op_type == "Softmax"
            t = p.input[0]
        return False, False

    def to_softmax(t: str, depth: int = 5) -> bool:
        nexts = consumers.get(t, [])
        if any(c.op_type == "Softmax" for c in nexts):
            return True
        return depth > 0 and any(to_softmax(c.output[0], depth - 1) for c in nexts
                                 if c.op_type in _TO_SOFTMAX and c.output)

    out: dict[str, str] = {}
    for i, n in enumerate(graph.node):
        if n.op_type != "MatMul" or len(n.input) < 2:
            continue
        seen = [back(t) for t in n.input[:2]]
        if any(weight for weight, _ in seen):
            continue
        if any(soft for _, soft in seen):
            out[node_label(n, i)] = CONTEXT
        elif n.output and to_softmax(n.output[0]):
            out[node_label(n, i)] = SCORES
    return out


def with_product(module: str, product: str | None) -> str:
    """A module path with the attention product its node computes: one name per layer."""
    return f"{module}: {product}" if module and product else module
