"""Closed sets of words options take, shared by several requests."""

from __future__ import annotations

from calibkit.requests.options import Choice


class Target(Choice):
    """The Q/DQ layout: ``tensorrt`` (int8 activations on every MatMul/Gemm input) or ``onnxruntime`` (uint8
    activations on weight MatMuls, what ONNX Runtime's CPU kernels fuse)."""

    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"
