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

Valid by construction: :class:`TritonModelConfig` refuses a value outside its field's range in the schema
(``max_batch_size``, ``preferred_batch_size``, ``count``: int32; ``max_queue_delay_microseconds``: uint64;
``dims``: int64), every string is written as an ASCII protobuf text literal (quotes, backslashes and every byte
outside printable ASCII escaped as octal UTF-8 bytes: JSON's ``\\ud83d\\ude00`` surrogate pairs are not protobuf
text), and label names with a line break are refused (``labels.txt`` holds one name a line).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calibkit.deploy.modelio import ModelIO, TensorIO
from calibkit.errors import ModelError, UsageError
from calibkit.types import Backend

PLATFORMS = {Backend.ONNXRUNTIME: "onnxruntime_onnx", Backend.TENSORRT: "tensorrt_plan"}
MODEL_FILES = {Backend.ONNXRUNTIME: "model.onnx", Backend.TENSORRT: "model.plan"}
LABELS_FILE = "labels.txt"
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # every character str.splitlines splits at


def check_range(option: str, value: int, lo: int, hi: int, field: str) -> None:
    """A UsageError naming ``option`` when ``value`` is outside ``lo..hi`` (the range of config.pbtxt's ``field``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise UsageError(f"{option} must be an integer in {lo}..{hi} (got {value!r}): Triton's {field} cannot "
                         "hold it", hint=f"pass {option} between {lo} and {hi}")


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

    def __post_init__(self) -> None:
        check_range("--max-batch", self.max_batch_size, 1, INT32_MAX, "max_batch_size (int32)")
        for b in self.preferred_batch_sizes:
            check_range("--max-batch", b, 1, self.max_batch_size, "preferred_batch_size (at most max_batch_size)")
        check_range("--queue-delay-us", self.queue_delay_us, 0, UINT64_MAX, "max_queue_delay_microseconds (uint64)")
        check_range("--instances", self.instances, 1, INT32_MAX, "instance_group count (int32)")
        check_range("--profiles", self.profiles, 1, INT32_MAX, "instance_group profile")
        if self.intra_op_threads is not None:
            check_range("--threads", self.intra_op_threads, 1, INT32_MAX, "intra_op_thread_count")
        for t in (*self.io.inputs, *self.io.outputs):
            for d in t.dims:
                if d != -1 and not 1 <= d <= INT64_MAX:
                    raise ModelError(f"tensor {t.name!r} has a dimension {d} that config.pbtxt's dims (int64, -1 "
                                     "for a variable axis) cannot hold", hint="export the model with valid shapes")

    def render(self) -> str:
        return render_config(self)


def _q(s: str) -> str:
    """A protobuf text string literal in printable ASCII: double quotes; a quote or backslash escaped, every
    other character outside printable ASCII written as the octal escapes of its UTF-8 bytes (protobuf text has
    no surrogate pairs: JSON's escapes of a character outside the Basic Multilingual Plane do not parse)."""
    try:
        data = s.encode("utf-8")
    except UnicodeEncodeError:
        raise ModelError(f"the name {s!r} is not valid Unicode (a lone surrogate) and cannot be written to "
                         "config.pbtxt", hint="rename it to valid UTF-8 text") from None
    out = []
    for b in data:
        c = chr(b)
        out.append("\\" + c if c in '"\\' else c if 0x20 <= b < 0x7F else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


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


def check_label_names(id2label: Mapping[int, str]) -> None:
    """Refuse label names with a line break: ``labels.txt`` holds one name a line, so such a name would shift
    every later class's name (it used to drop labels.txt without a word)."""
    bad = {i: v for i, v in id2label.items() if any(c in LINE_BREAKS for c in v)}
    if bad:
        i, v = min(bad.items())
        raise ModelError(f"label name {i} ({v!r}) of config.json id2label holds a line break; Triton's {LABELS_FILE} "
                         "holds one name a line", hint="rename the labels in the model folder's config.json "
                                                       "(id2label) without line breaks")


def label_output(io: ModelIO, id2label: Mapping[int, str]) -> str | None:
    """The output to label: the only output whose dims are ``[len(id2label)]``; label names with a line break
    are refused (:func:`check_label_names`)."""
    if not id2label or set(id2label) != set(range(len(id2label))):
        return None
    check_label_names(id2label)
    hits = [t.name for t in io.outputs if t.dims == (len(id2label),)]
    return hits[0] if len(hits) == 1 else None


def labels_text(id2label: Mapping[int, str]) -> str:
    """labels.txt: one label a line, line i = class id i (ids must run 0..n-1)."""
    check_label_names(id2label)
    return "".join(f"{id2label[i]}\n" for i in range(len(id2label)))
