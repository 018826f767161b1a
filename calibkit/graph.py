"""ONNX graph helpers shared by calibration, quantization and comparison."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError

from calibkit._io import utf8_path
from calibkit.errors import ModelError


def load_model(path: str | os.PathLike[str], load_external_data: bool = True) -> onnx.ModelProto:
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"ONNX model not found: {p}")
    try:
        with open(p, "rb") as fh:  # opened here: a name that is not UTF-8 is fine for Python's open
            model = onnx.load(fh, load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {p}: {exc}") from exc
    check_not_empty(model, p)
    if load_external_data:
        load_external_weights(model, p)
    return model


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The external-data files an ONNX model's initializers name (each once, in order)."""
    locs: list[str] = []
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in init.external_data if e.key == "location"), None)
            if loc is not None and loc not in locs:
                locs.append(loc)
    return locs


def check_external_data(model: onnx.ModelProto, path: Path) -> list[str]:
    """Every external-data file a model names must be a regular file inside the model's folder, named by a
    relative path and not through a symbolic link (what onnx itself requires, said as one error with a hint
    instead of onnx's ValidationError). Returns the locations."""
    locs = external_locations(model)
    folder = path.parent.resolve()
    for loc in locs:
        data = path.parent / loc
        if not loc or Path(loc).is_absolute():
            problem = f"names its weights file by an absolute path ({loc})" if loc else "names no weights file"
        elif ".." in Path(loc).parts or not _within(Path(os.path.realpath(data.parent)), folder):
            problem = f"keeps its weights in {loc}, outside the model's folder"
        elif data.is_symlink():
            problem = f"keeps its weights in {loc}, a symbolic link (onnx reads only regular files there)"
        elif not data.is_file():
            problem = f"keeps its weights in {loc}, which is missing beside it"
        else:
            continue
        raise ModelError(
            f"{path} {problem}",
            hint=f"put the external-data file as a regular file next to {path.name} under the relative name the "
                 "model records (external-data files travel with the model), or re-export the model with its "
                 "weights inline",
        )
    return locs


def _read_external_data(model: onnx.ModelProto, folder: Path) -> None:
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        with open(folder / info["location"], "rb") as fh:
            fh.seek(int(info.get("offset", 0)))
            t.raw_data = fh.read(int(info["length"])) if "length" in info else fh.read()
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT


def _within(p: Path, folder: Path) -> bool:
    return p == folder or folder in p.parents


def load_external_weights(model: onnx.ModelProto, path: Path) -> None:
    """Load a model's external-data weights in place (checked first: :func:`check_external_data`)."""
    from onnx.external_data_helper import load_external_data_for_model

    if not check_external_data(model, path):
        return
    try:
        if utf8_path(path):
            load_external_data_for_model(model, str(path.parent))
        else:  # onnx's loader takes UTF-8 paths only: read the (already checked) files here
            _read_external_data(model, path.parent)
    except Exception as exc:  # noqa: BLE001 - onnx raises ValidationError, OSError and plain errors alike
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot read the external-data weights of {path}: {first}",
                         hint=f"copy the weights files that came with {path.name} next to it, whole") from None


# ops that only appear in models that are already quantized (ONNX Q/DQ and QLinear*, ORT's integer contrib ops)
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul",
    "QLinearConv", "QLinearAdd", "QLinearMul", "QGemm", "QAttention", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "MatMulNBits", "QOrderedMatMul", "QOrderedAttention",
})
_HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def check_float_source(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Refuse a model that is not the FP32 export calibkit quantizes: one that is already quantized (its Q/DQ or
    integer ops would be quantized again into a model ONNX Runtime cannot load) or whose weights are FP16."""
    quantized = sorted({n.op_type for n in model.graph.node if n.op_type in QUANTIZED_OPS})
    if quantized:
        raise ModelError(
            f"{path} is already quantized (it holds {', '.join(quantized)} nodes); calibkit quantizes FP32 models",
            hint="pass the FP32 export the quantized model was made from",
        )
    inits = {i.name: i.data_type for i in model.graph.initializer}
    half = sorted({x for n in model.graph.node for x in n.input if inits.get(x) in _HALF_TYPES})
    if half:
        raise ModelError(
            f"{path} holds FP16/BF16 weights ({len(half)} tensors, e.g. {half[0]}); calibkit calibrates and builds "
            "from the FP32 model",
            hint="export in FP32 (no model.half() or float16 conversion); `calibkit build --precision fp16` makes "
                 "the FP16 engine from it",
        )
    return model


def check_not_empty(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Refuse what protobuf happily parses as an empty model: a 0-byte file (an interrupted export or download)
    or any other bytes without a graph."""
    if not model.graph.node or not model.graph.output:
        size = path.stat().st_size if path.is_file() else 0
        raise ModelError(
            f"{path} is not an ONNX model: it holds no graph ({size} bytes"
            + (", an empty file" if size == 0 else "") + ")",
            hint="pass the exported model file (torch.onnx.export, optimum-cli export onnx); an empty one is "
                 "usually an interrupted export or download",
        )
    return model


_MODEL_METADATA_PROPS = 14  # ModelProto.metadata_props


def _read_varint(fh: BinaryIO) -> int | None:
    shift = value = 0
    while True:
        b = fh.read(1)
        if not b:
            if shift:
                raise ValueError("truncated varint")
            return None
        value |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return value
        shift += 7


def metadata_props(path: str | os.PathLike[str]) -> dict[str, str]:
    """``ModelProto.metadata_props`` of an ONNX file, read by walking its top-level fields and seeking past the
    others (the graph and its weights are neither read nor parsed). A file that is not a ModelProto raises
    ModelError."""
    p = Path(path)
    out: dict[str, str] = {}
    try:
        with open(p, "rb") as fh:
            while (key := _read_varint(fh)) is not None:
                field, wire = key >> 3, key & 7
                if wire == 0:
                    _read_varint(fh)
                elif wire == 2:
                    n = _read_varint(fh)
                    if n is None:
                        raise ValueError("truncated field")
                    if field == _MODEL_METADATA_PROPS:
                        entry = onnx.StringStringEntryProto()
                        entry.ParseFromString(fh.read(n))
                        out[entry.key] = entry.value
                    else:
                        fh.seek(n, os.SEEK_CUR)
                elif wire in (1, 5):
                    fh.seek(8 if wire == 1 else 4, os.SEEK_CUR)
                else:
                    raise ValueError(f"wire type {wire}")
    except (OSError, ValueError, DecodeError) as exc:
        raise ModelError(f"cannot read ONNX model {p}: {exc}") from exc
    return out


def model_sha256(path: str | os.PathLike[str]) -> str:
    """The model's identity: the sha256 of its file, covering its external-data files where it has any
    (:func:`calibkit.consistency.model_sha256`)."""
    from calibkit.consistency import model_sha256 as identity

    return identity(path)


def model_input_names(model: onnx.ModelProto) -> tuple[str, ...]:
    """The inputs a caller feeds: the graph's inputs that no initializer provides."""
    inits = {x.name for x in model.graph.initializer}
    return tuple(i.name for i in model.graph.input if i.name not in inits)


def tensor_producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Map each tensor name to the node that produces it."""
    return {o: n for n in model.graph.node for o in n.output if o}


def add_outputs(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns ``tensors`` as graph outputs (the taps for statistics).

    Output types are left unspecified so ONNX Runtime infers them; graph inputs and initializers that are
    asked for are passed through an Identity so they can be outputs too.
    """
    tapped = onnx.ModelProto()
    tapped.CopyFrom(model)
    g = tapped.graph
    existing = {o.name for o in g.output}
    produced = {o for n in g.node for o in n.output}
    passthrough = {i.name for i in g.input} | {i.name for i in g.initializer}
    for t in tensors:
        if t in existing:
            continue
        if t not in produced:
            if t not in passthrough:
                raise ModelError(f"tensor {t!r} is not in the model")
            alias = f"{t}__calibkit_tap"
            g.node.append(onnx.helper.make_node("Identity", [t], [alias], name=f"{alias}_Identity"))
            g.output.append(onnx.ValueInfoProto(name=alias))
            continue
        g.output.append(onnx.ValueInfoProto(name=t))
        existing.add(t)
    return tapped


def tap_name(tensor: str, model: onnx.ModelProto) -> str:
    """The output name under which ``add_outputs`` exposes ``tensor``."""
    produced = {o for n in model.graph.node for o in n.output}
    return tensor if tensor in produced or tensor in {o.name for o in model.graph.output} else f"{tensor}__calibkit_tap"


def qdq_layout(model: onnx.ModelProto) -> str | None:
    """The quantize Target a Q/DQ model was built for (uint8 activations: ``onnxruntime``;
    int8: ``tensorrt``), or None when it has no QuantizeLinear with a zero point."""
    inits = {i.name: i.data_type for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            return "onnxruntime" if inits[n.input[2]] == onnx.TensorProto.UINT8 else "tensorrt"
    return None
