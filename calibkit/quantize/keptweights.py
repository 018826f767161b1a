"""The weight MatMuls a plan keeps out of static INT8, served blockwise on ONNX Runtime.

A plan keeps a layer in FP32 because its activations do not fit one static scale: in BERT-like models the
FFN output projections of the first layers carry one channel many times larger than the rest at the [CLS]
token. ONNX Runtime's ``MatMulNBits`` with 8-bit weights quantizes its *activations* per block of 128 input
channels as each request runs (``accuracy_level`` 4: int8 products, float scales per block), so that channel
costs only its own block's resolution, and the product runs on the same integer kernels as the rest of the
model instead of an FP32 GEMM. Measured on the demo's tuned plan: its two kept layers cost 13 % of all-INT8's
batch-1 speed in FP32 and 6 % blockwise, with the same agreement with FP32 on 3,000 traffic texts (20 and 22 texts
changed). This is not the arithmetic tune certifies (that keeps these layers in FP32); tune's served check
measures the gap on holdout traffic and the verdict carries it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from calibkit.requests.choices import KeptWeights

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

BLOCK_SIZE = 128
WEIGHT_BITS = 8
ACCURACY_LEVEL = 4  # int8 products with per-block activation scales (0-3 compute in float)
MIN_ORT = (1, 20)  # the first ONNX Runtime whose CPU MatMulNBits runs 8-bit weights


@dataclass(frozen=True)
class KeptServing:
    """The model as served and which kept nodes it serves blockwise (``note`` says why none, where none)."""

    model: onnx.ModelProto
    blockwise: tuple[str, ...]
    note: str = ""


def _ort_version() -> tuple[int, int]:
    import onnxruntime as ort

    parts = ort.__version__.split(".")
    return int(parts[0]), int(parts[1])


def eligible(model: onnx.ModelProto) -> tuple[str, ...]:
    """The weight MatMuls a Q/DQ model keeps in FP32, which ``MatMulNBits`` can serve: named MatMuls whose second
    input is a 2-D float initializer (a quantized weight comes out of a DequantizeLinear instead)."""
    import onnx

    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if not node.name or node.op_type != "MatMul" or len(node.input) != 2:
            continue
        w = inits.get(node.input[1])
        if w is not None and len(w.dims) == 2 and w.data_type == onnx.TensorProto.FLOAT:
            out.append(node.name)
    return tuple(out)


def serve_kept(model: onnx.ModelProto, how: KeptWeights | str) -> KeptServing:
    """The onnxruntime-layout Q/DQ ``model`` with the weight MatMuls it keeps in FP32 as 8-bit blockwise
    ``MatMulNBits`` (``how`` blockwise), or as it is (``how`` fp32, nothing kept, or an ONNX Runtime too old to
    run them, which ``note`` says)."""
    nodes = eligible(model) if KeptWeights(how) is KeptWeights.BLOCKWISE else ()
    if not nodes:
        return KeptServing(model, ())
    if _ort_version() < MIN_ORT:
        return KeptServing(model, (), note=f"kept layers stay FP32: ONNX Runtime before "
                                           f"{'.'.join(map(str, MIN_ORT))} has no 8-bit MatMulNBits")
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    wanted = set(nodes)
    others = [n.name for n in copy.graph.node if n.name not in wanted]  # "" among them: unnamed nodes stay
    q = MatMulNBitsQuantizer(copy, bits=WEIGHT_BITS, block_size=BLOCK_SIZE, is_symmetric=True,
                             accuracy_level=ACCURACY_LEVEL, nodes_to_exclude=others, op_types_to_quantize=("MatMul",))
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        q.process()
    finally:
        quiet.setLevel(level)
    served: onnx.ModelProto = q.model.model
    by_output = {n.output[0]: n.name for n in model.graph.node if n.name in wanted}
    done = set()
    for node in served.graph.node:  # the quantizer renames a node NAME_Q8: the plan and sidecar name NAME
        if node.op_type == "MatMulNBits" and node.output[0] in by_output:
            node.name = by_output[node.output[0]]
            done.add(node.name)
    return KeptServing(served, tuple(n for n in nodes if n in done))
