"""Closed sets of words options take, shared by several requests."""

from __future__ import annotations

from calibkit.requests.options import Choice


class Target(Choice):
    """The Q/DQ layout: ``tensorrt`` (int8 activations on every MatMul/Gemm input) or ``onnxruntime`` (uint8
    activations on weight MatMuls, what ONNX Runtime's CPU kernels fuse)."""

    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"


class KeptWeights(Choice):
    """How ONNX Runtime serves the weight MatMuls a plan keeps out of static INT8: ``blockwise`` (8-bit weights in
    blocks of 128 along the input dimension, activations quantized per block as each request runs: ONNX
    Runtime's ``MatMulNBits``) or ``fp32`` (as the certified arithmetic computes them)."""

    BLOCKWISE = "blockwise"
    FP32 = "fp32"
