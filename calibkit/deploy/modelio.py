"""The inputs and outputs a served model declares, read from its ONNX graph (no weights loaded).

Triton with ``max_batch_size > 0`` adds the batch axis itself: ``dims`` leave it out and a variable axis is
``-1``. calibkit serves ``[batch, sequence]`` token inputs, so a model whose batch or sequence axis is fixed
cannot be deployed with dynamic batching and length buckets: that is refused with the axis named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calibkit.errors import ModelError

# ONNX TensorProto element type -> Triton DataType name (model_config.proto)
TRITON_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 5: "TYPE_INT16", 6: "TYPE_INT32",
                7: "TYPE_INT64", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 16: "TYPE_BF16"}


@dataclass(frozen=True)
class TensorIO:
    name: str
    triton_type: str
    dims: tuple[int, ...]  # without the batch axis; -1 for a variable axis
    scalar: bool = False  # [batch] in the model: Triton declares dims [1] with reshape { shape: [] }


@dataclass(frozen=True)
class ModelIO:
    inputs: tuple[TensorIO, ...]
    outputs: tuple[TensorIO, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)


def _dims(vi: object) -> list[int | None]:
    shape = vi.type.tensor_type.shape  # type: ignore[attr-defined]
    return [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]


def _type(vi: object, path: Path) -> str:
    elem = vi.type.tensor_type.elem_type  # type: ignore[attr-defined]
    if elem not in TRITON_TYPES:
        raise ModelError(f"{path}: tensor {vi.name!r} has ONNX element type {elem}, which Triton cannot serve",  # type: ignore[attr-defined]
                         hint="export the model with int64/int32 token inputs and float outputs")
    return TRITON_TYPES[elem]


def read_model_io(path: Path) -> ModelIO:
    """Inputs and outputs of the ONNX model at ``path``; refuses fixed batch or sequence axes."""
    from calibkit.graph import load_model

    model = load_model(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    hint = ("re-export with dynamic axes, e.g. torch.onnx.export(..., dynamic_axes={'input_ids': {0: 'batch', "
            "1: 'sequence'}, ...}) or optimum-cli export onnx (dynamic by default)")
    inputs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = _dims(vi)
        if len(dims) != 2:
            raise ModelError(f"{path}: input {vi.name!r} has rank {len(dims)}; calibkit deploys [batch, sequence] "
                             "token inputs", hint=hint)
        fixed = [axis for axis, d in zip(("batch", "sequence"), dims) if d is not None]
        if fixed:
            raise ModelError(
                f"{path}: input {vi.name!r} has a fixed {' and '.join(fixed)} axis (shape {dims}); serving with "
                "dynamic batching and length buckets needs both axes dynamic", hint=hint)
        inputs.append(TensorIO(vi.name, _type(vi, path), (-1,)))
    if not inputs:
        raise ModelError(f"{path}: the model has no inputs", hint=hint)
    outputs = []
    for vi in model.graph.output:
        dims = _dims(vi)
        if not dims or dims[0] is not None:
            raise ModelError(f"{path}: output {vi.name!r} has no dynamic batch axis (shape {dims})", hint=hint)
        rest = tuple(-1 if d is None else int(d) for d in dims[1:])
        outputs.append(TensorIO(vi.name, _type(vi, path), rest or (1,), scalar=not rest))
    return ModelIO(tuple(inputs), tuple(outputs))
