"""`calibkit build`: an FP32 ONNX model -> an FP32 / FP16 / INT8 engine for ONNX Runtime or TensorRT."""

from __future__ import annotations

from pathlib import Path

import typer

from calibkit.cli._common import INTEGER, TOKENIZER, RichProgress, count, guard_out_file, handle_errors, out, say, warn

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


def _split(values: list[str] | None) -> tuple[str, ...]:
    return tuple(p.strip() for v in values or [] for p in v.split(",") if p.strip())


def build(
    model: Path = typer.Argument(..., help="Model folder (model.onnx + tokenizer + config.json) or an .onnx file."),
    output: Path = typer.Option(..., "--output", "-o", help="Engine file to write: .onnx (onnxruntime) or .engine."),
    precision: str = typer.Option("fp32", "--precision", "-p", help="fp32 | fp16 | int8."),
    calibration: Path | None = typer.Option(
        None, "--calibration", help="calibration.json from `calibkit calibrate` (or its folder), for int8."
    ),
    qdq: Path | None = typer.Option(None, "--qdq", help="A ready Q/DQ INT8 .onnx to use as it is, for int8."),
    backend: str = typer.Option("onnxruntime", "--backend", "-b", help="onnxruntime | tensorrt."),
    target: str | None = typer.Option(
        None, "--target", help="INT8 Q/DQ layout: tensorrt | onnxruntime [default: the one calibration.json records]."
    ),
    exclude: list[str] = typer.Option(
        [], "--exclude", "-x", help="Regex of node names or module paths kept in FP32 for int8/fp16 (repeatable), e.g. "
        "'/classifier/' or 'classifier'."
    ),
    tokenizer: Path | None = TOKENIZER,
    calibration_set: Path | None = typer.Option(
        None, "--calibration-set", "-c", help="Texts whose token lengths set the TensorRT profile."
    ),
    min_seq: int | None = typer.Option(None, "--min-seq", parser=INTEGER,
        help="TensorRT profile: shortest sequence [1]."),
    opt_seq: int | None = typer.Option(None, "--opt-seq", parser=INTEGER,
        help="TensorRT profile: tuned-for sequence [median]."),
    max_seq: int | None = typer.Option(None, "--max-seq", parser=INTEGER,
        help="TensorRT profile: longest sequence [p99, to 8]."),
    workspace_mib: int = typer.Option(4096, "--workspace-mib", parser=INTEGER,
        help="TensorRT builder workspace limit (MiB)."),
    reduce_range: bool | None = typer.Option(
        None, "--reduce-range/--no-reduce-range",
        help="7-bit weights for the onnxruntime layout: ONNX Runtime's int8 GEMM saturates with 8-bit weights on "
        "x86 CPUs without VNNI [default: on where this machine's CPU lacks VNNI].",
    ),
) -> None:
    with handle_errors():
        from calibkit.api import build as run_build
        from calibkit.enginefiles.artifact import sidecar_path

        guard_out_file(output, inputs=[model, calibration, qdq, tokenizer, calibration_set], option="--output",
                       owned=lambda p: sidecar_path(p).is_file())
        with RichProgress() as progress:
            res = run_build(
                model, output, precision=precision, backend=backend, calibration=calibration, qdq=qdq, target=target,
                exclude=_split(exclude), tokenizer=tokenizer, calibration_set=calibration_set, min_seq=min_seq,
                opt_seq=opt_seq, max_seq=max_seq, workspace_mib=workspace_mib, reduce_range=reduce_range,
                progress=progress, on_missing_tensorrt=_print_trtexec,
            )
        art = res.artifact
        layout = art.extra.get("target")  # the Q/DQ layout of an INT8 build, which need not be the backend's own
        say(f"wrote {art.path} ({art.precision.value}" + (f", {layout} Q/DQ layout" if layout else "")
            + f", {art.backend.value} backend)")
        if res.quantized_nodes:
            say(f"  {count(len(res.quantized_nodes), 'node')} quantized, {len(art.kept_higher_precision)} kept in "
                      f"higher precision, {count(len(res.missing_ranges), 'tensor')} without a range")
        elif art.kept_higher_precision:
            say(f"  {count(len(art.kept_higher_precision), 'node')} kept in higher precision")
        zero = list(art.extra.get("zero_ranges") or [])
        if zero:
            warn(f"{len(zero)} tensors have amax 0 (all zero during calibration), so their nodes stay FP32: "
                 f"{', '.join(map(str, zero[:5]))}")
        for extra in res.files[1:]:
            say(f"  + {extra}")
        for w in res.warnings:
            warn(w)


def _print_trtexec(req) -> None:  # noqa: ANN001
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
