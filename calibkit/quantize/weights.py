"""Symmetric INT8 weight quantization: per-output-channel scales, zero point 0, values in [-127, 127]."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibkit.types import INT8_MAX


@dataclass(frozen=True)
class QuantizedWeight:
    values: np.ndarray  # int8, same shape as the weight
    scale: np.ndarray  # float32, one per channel along ``axis`` (0-d when per-tensor)
    axis: int | None  # None: per-tensor


def weight_axis(op_type: str, input_index: int, rank: int, trans_b: bool = False) -> int | None:
    """The output-channel axis of a weight input, or None for per-tensor.

    MatMul B is [..., K, N]: channels on the last axis. Gemm B is [K, N] (axis 1), or [N, K] with transB=1
    (axis 0). A weight on the left side (input 0) is quantized per tensor: its rows are not output channels
    of a single GEMM that TensorRT or ONNX Runtime can scale per column.
    """
    if input_index != 1 or rank < 1:
        return None
    if op_type == "Gemm":
        return 0 if trans_b else 1
    return rank - 1 if rank >= 2 else None


def quantize_weight(w: np.ndarray, axis: int | None) -> QuantizedWeight:
    """Round ``w / scale`` to int8 with ``scale = max|w| / 127`` per channel (channels of zeros get scale 1)."""
    w = np.asarray(w, dtype=np.float32)
    if axis is None:
        amax = np.asarray(np.max(np.abs(w)) if w.size else 0.0, dtype=np.float32)
    else:
        other = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w), axis=other).astype(np.float32)
    scale = (amax / np.float32(INT8_MAX)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    bshape = scale.shape if axis is None else tuple(-1 if i == axis else 1 for i in range(w.ndim))
    q = np.rint(w / scale.reshape(bshape))
    np.clip(q, -INT8_MAX, INT8_MAX, out=q)
    return QuantizedWeight(values=q.astype(np.int8), scale=scale, axis=axis)


def fake_quantize_weight(w: np.ndarray, axis: int | None) -> np.ndarray:
    """What the DequantizeLinear of :func:`quantize_weight` gives back (for references and error estimates)."""
    qw = quantize_weight(w, axis)
    bshape = qw.scale.shape if axis is None else tuple(-1 if i == axis else 1 for i in range(np.ndim(w)))
    return qw.values.astype(np.float32) * qw.scale.reshape(bshape)
