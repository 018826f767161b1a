"""ONNX graph helpers shared by calibration, quantization and comparison."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import onnx

from calibkit._io import sha256_file
from calibkit.errors import ModelError


def load_model(path: str | os.PathLike[str], load_external_data: bool = True) -> onnx.ModelProto:
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"ONNX model not found: {p}")
    try:
        return onnx.load(str(p), load_external_data=load_external_data)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {p}: {exc}") from exc


def model_sha256(path: str | os.PathLike[str]) -> str:
    return sha256_file(path)


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
    """The quantize Target a Q/DQ model was built for (uint8 activations with zero point 128: ``onnxruntime``;
    int8: ``tensorrt``), or None when it has no QuantizeLinear with a zero point."""
    inits = {i.name: i.data_type for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            return "onnxruntime" if inits[n.input[2]] == onnx.TensorProto.UINT8 else "tensorrt"
    return None
