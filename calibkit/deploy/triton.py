"""Triton Inference Server ``config.pbtxt``: protobuf text of ``inference.ModelConfig`` (model_config.proto).

Fields written (names as in model_config.proto; the tests parse every file with Triton's own
``model_config_pb2`` and ``google.protobuf.text_format``):

- ``name``, ``platform`` (``onnxruntime_onnx`` | ``tensorrt_plan``), ``max_batch_size`` (> 0: the batch axis is
  implicit and ``dims`` leave it out; ``-1`` is a variable axis);
- ``input``/``output`` with ``data_type`` and ``dims``; ``label_filename`` on a classification output whose
  last axis has one entry per label (``labels.txt``, one label a line in class-id order: Triton's
  classification extension returns the names);
- ``dynamic_batching { preferred_batch_size, max_queue_delay_microseconds }``;
- ``instance_group { kind: KIND_CPU | KIND_GPU, count }``; for TensorRT ``profile: ["0", ...]`` lists every
  optimization profile (an instance uses only profile 0 when the list is empty);
- ONNX Runtime: ``parameters { key: "intra_op_thread_count" }`` when a thread count is chosen (a parameter of
  Triton's onnxruntime backend).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from calibkit.deploy.modelio import ModelIO, TensorIO
from calibkit.types import Backend

PLATFORMS = {Backend.ONNXRUNTIME: "onnxruntime_onnx", Backend.TENSORRT: "tensorrt_plan"}
MODEL_FILES = {Backend.ONNXRUNTIME: "model.onnx", Backend.TENSORRT: "model.plan"}
LABELS_FILE = "labels.txt"


@dataclass(frozen=True)
class TritonModelConfig:
    name: str
    backend: Backend
    io: ModelIO
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    queue_delay_us: int
    instances: int = 1
    profiles: int = 1  # TensorRT optimization profiles in the plan
    intra_op_threads: int | None = None
    label_output: str | None = None  # the output that gets label_filename

    def render(self) -> str:
        return render_config(self)


def _q(s: str) -> str:
    return json.dumps(s)  # a protobuf text string literal: double quotes, backslash escapes


def _dims(d: Sequence[int]) -> str:
    return "[ " + ", ".join(str(int(x)) for x in d) + " ]"


def _tensor(t: TensorIO, label: bool) -> list[str]:
    lines = ["  {", f"    name: {_q(t.name)}", f"    data_type: {t.triton_type}", f"    dims: {_dims(t.dims)}"]
    if t.scalar:
        lines.append("    reshape: { shape: [ ] }")
    if label:
        lines.append(f"    label_filename: {_q(LABELS_FILE)}")
    return lines + ["  }"]


def _block(key: str, tensors: Sequence[TensorIO], label_output: str | None) -> list[str]:
    lines = [f"{key} ["]
    for i, t in enumerate(tensors):
        body = _tensor(t, t.name == label_output)
        if i < len(tensors) - 1:
            body[-1] += ","
        lines += body
    return lines + ["]"]


def render_config(c: TritonModelConfig) -> str:
    lines = [f"name: {_q(c.name)}", f"platform: {_q(PLATFORMS[c.backend])}",
             f"max_batch_size: {c.max_batch_size}"]
    if c.backend is Backend.TENSORRT:
        lines.append(f"default_model_filename: {_q(MODEL_FILES[c.backend])}")
    lines += _block("input", c.io.inputs, None)
    lines += _block("output", c.io.outputs, c.label_output)
    lines += ["dynamic_batching {",
              f"  preferred_batch_size: {_dims(c.preferred_batch_sizes)}",
              f"  max_queue_delay_microseconds: {c.queue_delay_us}",
              "}"]
    kind = "KIND_GPU" if c.backend is Backend.TENSORRT else "KIND_CPU"
    lines += ["instance_group [", "  {", f"    count: {c.instances}", f"    kind: {kind}"]
    if c.backend is Backend.TENSORRT:
        lines.append("    profile: [ " + ", ".join(_q(str(i)) for i in range(c.profiles)) + " ]")
    lines += ["  }", "]"]
    if c.backend is Backend.ONNXRUNTIME and c.intra_op_threads:
        lines += ["parameters {", '  key: "intra_op_thread_count"',
                  f"  value: {{ string_value: {_q(str(c.intra_op_threads))} }}", "}"]
    return "\n".join(lines) + "\n"


def label_output(io: ModelIO, id2label: dict[int, str]) -> str | None:
    """The output to label: the only output whose dims are ``[len(id2label)]``."""
    if not id2label or set(id2label) != set(range(len(id2label))):
        return None
    if any("\n" in v or "\r" in v for v in id2label.values()):
        return None  # labels.txt holds one label a line
    hits = [t.name for t in io.outputs if t.dims == (len(id2label),)]
    return hits[0] if len(hits) == 1 else None


def labels_text(id2label: dict[int, str]) -> str:
    """labels.txt: one label a line, line i = class id i (ids must run 0..n-1)."""
    return "".join(f"{id2label[i]}\n" for i in range(len(id2label)))
