"""Contrib (com.microsoft) ops that hide linear work, as ``onnxruntime.transformers.optimizer`` writes them.

An ORT-optimized BERT computes its Q/K/V projections and both attention MatMuls inside ``Attention`` nodes, and
may fold MatMul+transpose into ``FusedMatMul`` or Gemm+GELU into ``GemmFastGelu``. calibkit places Q/DQ on plain
MatMul/Gemm only, so these stay FP32: ONNX Runtime's CPU ``Attention`` kernel takes float weights (a
DequantizeLinear in front of them only makes the FP32 kernel read rounded weights, no integer GEMM), and
TensorRT's ONNX parser cannot read com.microsoft ops at all. They are reported, and their FLOPs counted as FP32
work (:mod:`calibkit.evaluate.flops`), so INT8 coverage is not overstated. Ops already quantized by ONNX Runtime
(``QAttention``, ``MatMulIntegerToFloat``, ...) count as INT8 work.

``SkipLayerNormalization``, ``BiasGelu``, ``FastGelu`` and ``EmbedLayerNormalization`` hide no MatMul (add +
normalization, activation, embedding gathers); they are listed as fused but carry no linear FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from calibkit.names import node_label

MS_DOMAIN = "com.microsoft"

# op type -> (what linear work it hides, already integer)
LINEAR_CONTRIB_OPS: dict[str, tuple[str, bool]] = {
    "Attention": ("Q/K/V projections and the attention MatMuls", False),
    "MultiHeadAttention": ("the attention MatMuls (Q·K^T, probs·V)", False),
    "PackedAttention": ("Q/K/V projections and the attention MatMuls", False),
    "PackedMultiHeadAttention": ("the attention MatMuls (Q·K^T, probs·V)", False),
    "GroupQueryAttention": ("the attention MatMuls (Q·K^T, probs·V)", False),
    "FusedMatMul": ("a MatMul with transposed inputs", False),
    "FusedGemm": ("a Gemm with an activation", False),
    "GemmFastGelu": ("a MatMul followed by GELU", False),
    "QAttention": ("INT8 Q/K/V projections and attention MatMuls", True),
    "QOrderedAttention": ("INT8 Q/K/V projections and attention MatMuls", True),
    "MatMulIntegerToFloat": ("an INT8 MatMul", True),
    "DynamicQuantizeMatMul": ("an INT8 MatMul", True),
    "QGemm": ("an INT8 Gemm", True),
    "MatMulNBits": ("a MatMul with low-bit weights", True),
}
NON_LINEAR_CONTRIB_OPS = frozenset({
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Gelu",
    "EmbedLayerNormalization", "BiasAdd", "BiasSplitGelu", "QuickGelu", "RotaryEmbedding",
    "SimplifiedLayerNormalization",
})


@dataclass(frozen=True)
class FusedNode:
    name: str
    op_type: str
    domain: str
    hides: str  # the linear work inside, empty for ops that hide none
    integer: bool  # already quantized by the tool that fused it

    @property
    def linear(self) -> bool:
        return bool(self.hides)


def contrib_nodes(model: onnx.ModelProto) -> tuple[FusedNode, ...]:
    """Every node of a non-standard domain (com.microsoft and others), in graph order."""
    out = []
    for i, n in enumerate(model.graph.node):
        if n.domain in ("", "ai.onnx"):
            continue
        hides, integer = LINEAR_CONTRIB_OPS.get(n.op_type, ("", False))
        out.append(FusedNode(node_label(n, i), n.op_type, n.domain, hides, integer))
    return tuple(out)


def fused_fp32_linear(model: onnx.ModelProto) -> tuple[FusedNode, ...]:
    """Fused float ops with linear work inside: what an INT8 plan of MatMul/Gemm Q/DQ leaves in FP32."""
    return tuple(n for n in contrib_nodes(model) if n.linear and not n.integer)


def fused_summary(nodes: tuple[FusedNode, ...]) -> str:
    """``2 Attention (Q/K/V projections and the attention MatMuls), 1 FusedMatMul (...)``."""
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return ", ".join(f"{c} {op} ({LINEAR_CONTRIB_OPS[op][0]})" for op, c in counts.items())


def fused_warning(model: onnx.ModelProto) -> str | None:
    """The message calibrate/build print for an ORT-fused graph, or None when the graph has no such op."""
    nodes = fused_fp32_linear(model)
    if not nodes:
        return None
    return (
        f"{len(nodes)} fused com.microsoft ops hide linear work and stay FP32: {fused_summary(nodes)}; "
        "for INT8 there, quantize the unfused export (the model before onnxruntime.transformers.optimizer)"
    )
