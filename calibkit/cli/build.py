"""`calibkit build`: an FP32 ONNX model -> an FP32 / FP16 / INT8 engine for ONNX Runtime or TensorRT."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import typer

from calibkit.cli._common import RichProgress, count, guard_out_file, out, say, warn
from calibkit.cli._requests import cli_paths, request_command
from calibkit.requests.build import BuildRequest
from calibkit.requests.resources import ResourceOptions
from calibkit.types import request_path

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.building import BuildResult

HELP = """Build an engine from an FP32 ONNX model: FP32, FP16 or INT8, for ONNX Runtime or TensorRT.

ONNX Runtime engines are .onnx files: the FP32 model, its FP16 conversion (LayerNorm statistics, Softmax,
Erf and the attention-mask path stay FP32; logits stay float32), or the INT8 Q/DQ model built from a
calibration.json. TensorRT engines (.engine) are strongly typed TensorRT 11 builds of the same ONNX, with an
optimization profile whose sequence lengths come from the calibration set (min 1, opt = median, max = p99
rounded up to 8); a timing cache and the per-layer JSON are written beside the engine.

Each engine gets a sidecar ENGINE.calibkit.json (precision, backend, source model + sha256, calibration
table, tokenizer folder, nodes kept in higher precision) that `calibkit compare` and `tune` read.

-o is never an input, and an existing file there is replaced only if it is an engine calibkit built (it has
its sidecar). --precision fp32 validates the ONNX file and carries external-data weights along (written
beside the engine as ENGINE.data, e.g. fp32.onnx.data). INT8 ranges are validated by tensor name before
anything is written.

INT8 Q/DQ layouts (--target): tensorrt = int8 activations, every MatMul/Gemm quantized (what TensorRT fuses;
also runs in ONNX Runtime to preview TensorRT's numerics on CPU); onnxruntime = uint8 activations (zero point
128, same values) on weight MatMuls only, the layout ONNX Runtime's CPU integer kernels fuse (the fast one
on CPU). Default: the layout calibration.json records (`calibrate --target`, `tune --target`: the INT8 model
they wrote and measured), so what is built is what was measured; another --target builds a different INT8 model,
with a warning (measure it with `calibkit compare`). TensorRT builds only its own layout.

Examples:

  calibkit build demo_assets/model --precision fp32 -o engines/model.fp32.onnx

  calibkit build demo_assets/model --precision fp16 -o engines/model.fp16.onnx

  calibkit build demo_assets/model --precision int8 --calibration runs/entropy/calibration.json -o engines/int8.onnx

  calibkit build demo_assets/model --precision int8 --calibration runs/entropy/calibration.json \\
      --target tensorrt --exclude '/classifier/' -o engines/int8-trt-layout.onnx

  calibkit build demo_assets/model --precision int8 --qdq runs/entropy/model.int8.onnx -o engines/int8.onnx

  calibkit build demo_assets/model --precision int8 --calibration runs/entropy/calibration.json \\
      --backend tensorrt --max-seq 128 -o engines/model.int8.engine
"""


def register(app: typer.Typer) -> None:
    app.command("build", help=HELP,
                short_help="Build an FP32, FP16 or INT8 engine (ONNX Runtime, TensorRT).", no_args_is_help=True)(build)


RESOURCES: tuple[str, ...] = ()  # a build runs no batches: no worker, executor or memory option
PRESENTATION: tuple[inspect.Parameter, ...] = ()


def run_build(request: BuildRequest, resources: ResourceOptions) -> None:
    """Check the request and the output file, make one ``calibkit.api.run`` call, print what was built; without
    TensorRT, print the same build as trtexec commands before the error."""
    from calibkit.api import run
    from calibkit.enginefiles.artifact import sidecar_path
    from calibkit.errors import MissingDependencyError
    from calibkit.types import Backend

    inputs = cli_paths(request.model, request.calibration, request.qdq, request.tokenizer, request.calibration_set)
    output = request_path(request.output)
    guard_out_file(output, inputs=inputs, option="--output", owned=lambda p: sidecar_path(p).is_file())
    try:
        with RichProgress() as progress:
            res = run(request, resources, progress)
    except MissingDependencyError:
        if request.backend is Backend.TENSORRT:
            _print_trtexec(request)
        raise
    _summary(res)


build = request_command(BuildRequest, run_build, resources=RESOURCES, extra=PRESENTATION)


def _summary(res: BuildResult) -> None:
    art = res.artifact
    layout = art.extra.target  # the Q/DQ layout of an INT8 build, which need not be the backend's own
    say(f"wrote {art.path} ({art.precision.value}" + (f", {layout} Q/DQ layout" if layout else "")
        + f", {art.backend_name} backend)")
    if res.quantized_nodes:
        say(f"  {count(len(res.quantized_nodes), 'node')} quantized, {len(art.kept_higher_precision)} kept in "
            f"higher precision, {count(len(res.missing_ranges), 'tensor')} without a range")
    elif art.kept_higher_precision:
        say(f"  {count(len(art.kept_higher_precision), 'node')} kept in higher precision")
    zero = list(art.extra.zero_ranges or ())
    if zero:
        warn(f"{len(zero)} tensors have amax 0 (all zero during calibration), so their nodes stay FP32: "
             f"{', '.join(map(str, zero[:5]))}")
    for extra in res.files[1:]:
        say(f"  + {extra}")
    for w in res.warnings:
        warn(w)


def _print_trtexec(req: BuildRequest) -> None:
    """Without TensorRT here: the same build as commands to run where TensorRT is (stdout), before the error."""
    from calibkit.errors import CalibkitError

    try:
        from calibkit.deploy.trtexec import build_equivalent

        lines = build_equivalent(req)
    except CalibkitError as exc:
        warn(f"the equivalent trtexec command could not be written: {exc.message}")
        return
    out.print("TensorRT is not installed here. The same build, to run on the serving GPU (TensorRT 10/11's trtexec):",
              soft_wrap=True)
    for line in lines:
        out.print(line, soft_wrap=True)  # commands stay copyable: no wrapping at the terminal's width
