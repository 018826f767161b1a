"""The exact ``trtexec`` command that builds a strongly typed engine with one optimization profile per bucket.

Every flag written comes from :data:`FLAGS`, a table of trtexec's documented build flags (TensorRT 10/11):
its name, whether it takes a value, whether it may repeat, and what it does. Source: ``trtexec --help``
(``BuildOptions::help`` / ``ModelOptions::help`` in ``samples/common/sampleOptions.cpp`` of
github.com/NVIDIA/TensorRT) and "Command-Line Programs" of the TensorRT documentation
(docs.nvidia.com/deeplearning/tensorrt/latest/reference/command-line-programs.html). TensorRT 11 removed the
weak-typing flags ``--int8``, ``--fp16``, ``--best`` and ``--calib`` (REFERENCES §1): they are listed in
:data:`REMOVED` and never written; precision comes from the Q/DQ ONNX graph (``--stronglyTyped``).

Shapes are ``name:BxS`` (batch x sequence, batch axis included) joined by commas, one entry per input; the
``--minShapes/--optShapes/--maxShapes`` triple is repeated once per profile, in profile order.
``--memPoolSize=workspace:N`` takes MiB without a suffix (written with the ``M`` suffix to be explicit).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from calibkit.errors import UsageError


@dataclass(frozen=True)
class Flag:
    name: str
    takes_value: bool
    repeatable: bool
    meaning: str


FLAGS: dict[str, Flag] = {f.name: f for f in (
    Flag("--onnx", True, False, "ONNX model to parse"),
    Flag("--saveEngine", True, False, "save the serialized engine (the plan) to this file"),
    Flag("--stronglyTyped", False, False, "create a strongly typed network: tensor types from the graph (Q/DQ)"),
    Flag("--minShapes", True, True, "build a profile with these min shapes (name:dims, comma-separated)"),
    Flag("--optShapes", True, True, "build a profile with these opt shapes"),
    Flag("--maxShapes", True, True, "build a profile with these max shapes"),
    Flag("--timingCacheFile", True, False, "load and save the serialized global timing cache"),
    Flag("--memPoolSize", True, False, "memory pool limits, e.g. workspace:4096M (MiB without a suffix)"),
    Flag("--profilingVerbosity", True, False, "layer_names_only | detailed | none (detailed: layer JSON)"),
    Flag("--exportLayerInfo", True, False, "write the engine's layer information (JSON) to this file"),
    Flag("--skipInference", False, False, "exit after building the engine, without measuring inference"),
    Flag("--builderOptimizationLevel", True, False, "builder optimization level 0-5 (default 3)"),
    Flag("--verbose", False, False, "verbose logging"),
)}

REMOVED = frozenset({"--int8", "--fp16", "--best", "--calib", "--workspace", "--maxBatch", "--explicitBatch"})


@dataclass(frozen=True)
class ShapeProfile:
    """min/opt/max (batch, sequence) of every token input, for one optimization profile."""

    min_shape: tuple[int, int]
    opt_shape: tuple[int, int]
    max_shape: tuple[int, int]

    def __post_init__(self) -> None:
        for axis in (0, 1):
            lo, mid, hi = self.min_shape[axis], self.opt_shape[axis], self.max_shape[axis]
            if not 1 <= lo <= mid <= hi:
                raise UsageError(f"profile shapes must satisfy 1 <= min <= opt <= max on every axis "
                                 f"(got {self.min_shape}, {self.opt_shape}, {self.max_shape})")


def shape_spec(inputs: Sequence[str], shape: tuple[int, int]) -> str:
    for name in inputs:
        if any(c in name for c in ",:'= \t\n"):
            raise UsageError(f"input name {name!r} cannot be written in a trtexec shape spec",
                             hint="rename the graph input (letters, digits, _ . / -)")
    return ",".join(f"{name}:{shape[0]}x{shape[1]}" for name in inputs)


def trtexec_command(onnx: str, engine: str, inputs: Sequence[str], profiles: Sequence[ShapeProfile], *,
                    timing_cache: str, workspace_mib: int = 4096, layer_info: str | None = None,
                    trtexec: str = "trtexec") -> list[str]:
    """argv of the build (strongly typed, every profile, timing cache, no inference run)."""
    if not profiles:
        raise UsageError("at least one optimization profile is needed")
    if workspace_mib < 1:
        raise UsageError(f"the workspace must be at least 1 MiB (got {workspace_mib})")
    argv = [trtexec, f"--onnx={onnx}", f"--saveEngine={engine}", "--stronglyTyped"]
    for p in profiles:
        argv += [f"--minShapes={shape_spec(inputs, p.min_shape)}", f"--optShapes={shape_spec(inputs, p.opt_shape)}",
                 f"--maxShapes={shape_spec(inputs, p.max_shape)}"]
    argv += [f"--timingCacheFile={timing_cache}", f"--memPoolSize=workspace:{workspace_mib}M"]
    if layer_info:
        argv += ["--profilingVerbosity=detailed", f"--exportLayerInfo={layer_info}"]
    argv.append("--skipInference")
    check_command(argv)
    return argv


def check_command(argv: Sequence[str]) -> None:
    """Every flag is in :data:`FLAGS`, carries a value exactly when it takes one, repeats only when allowed,
    and the shape triples come in complete sets; raises UsageError naming the first fault."""
    seen: dict[str, int] = {}
    for arg in argv[1:]:
        name, eq, value = arg.partition("=")
        if name in REMOVED:
            raise UsageError(f"trtexec flag {name} does not exist for strongly typed TensorRT 11 builds")
        flag = FLAGS.get(name)
        if flag is None:
            raise UsageError(f"{name} is not a documented trtexec build flag")
        if flag.takes_value != bool(eq) or (flag.takes_value and not value):
            raise UsageError(f"trtexec flag {name} {'needs' if flag.takes_value else 'takes no'} a value ({arg!r})")
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1 and not flag.repeatable:
            raise UsageError(f"trtexec flag {name} is given {seen[name]} times")
    counts = {seen.get(n, 0) for n in ("--minShapes", "--optShapes", "--maxShapes")}
    if len(counts) != 1:
        raise UsageError("--minShapes, --optShapes and --maxShapes must come in complete triples, one per profile")


def render(argv: Sequence[str]) -> str:
    """The command as one shell line, each flag on its own continued line."""
    return " \\\n    ".join(shlex.quote(a) for a in argv)


def build_equivalent(req: object) -> list[str]:
    """The shell lines that make what ``calibkit build --backend tensorrt`` (``req``: a BuildRequest) would:
    the Q/DQ or FP16 ONNX first when it is not a file yet, then trtexec with the same profile (from the
    calibration set's token lengths, as build computes it), timing cache and layer JSON paths. For a machine
    without TensorRT: the build is run where TensorRT is."""
    from pathlib import Path

    from calibkit.building import BuildRequest
    from calibkit.data.modeldir import ModelDir
    from calibkit.engines.tensorrt.builder import layers_json_path, timing_cache_path
    from calibkit.engines.tensorrt.profile import profile_from_lengths
    from calibkit.graph import load_model
    from calibkit.quantize.tablefile import load_calibration_json
    from calibkit.types import Precision

    assert isinstance(req, BuildRequest)
    md = ModelDir.resolve(req.model, req.tokenizer)
    lines: list[str] = []
    engine = Path(req.output)
    onnx: Path
    calib_set = req.calibration_set
    prefix = ["calibkit", "build", str(req.model)] + (["--tokenizer", str(req.tokenizer)] if req.tokenizer else [])
    excl = [a for p in req.exclude for a in ("--exclude", p)]
    if req.precision is Precision.INT8 and req.qdq is not None:
        from calibkit.deploy.source import _uint8_activations
        from calibkit.errors import ModelError

        onnx = Path(req.qdq)
        if _uint8_activations(onnx):
            raise ModelError(f"{onnx} uses uint8 activations (the onnxruntime layout); TensorRT needs int8",
                             hint="build from --calibration with --target tensorrt")
    elif req.precision is Precision.INT8:
        assert req.calibration is not None  # checked by BuildRequest.validate(): int8 without --qdq needs it
        cf = load_calibration_json(req.calibration)
        ready = cf.file("model")
        if ready is not None and ready.is_file() and cf.target == "tensorrt" and not req.exclude and not req.keep_nodes:
            onnx = ready
        else:
            onnx = engine.with_suffix(".int8.onnx")
            lines.append(shlex.join([*prefix, "--precision", "int8", "--calibration", str(cf.path), "--target",
                                     "tensorrt", *excl, "-o", str(onnx)]))
        cs = cf.raw.get("calibration_set")
        if calib_set is None and isinstance(cs, dict) and cs.get("path") and Path(cs["path"]).exists():
            calib_set = Path(cs["path"])
    elif req.precision is Precision.FP16:
        onnx = engine.with_suffix(".fp16.onnx")
        lines.append(shlex.join([*prefix, "--precision", "fp16", *excl, "-o", str(onnx)]))
    else:
        onnx = md.onnx_path
    lengths = None
    if calib_set is not None:
        from calibkit.data.calibset import load_calibration_set
        from calibkit.data.tokenizer import TextTokenizer

        lengths = TextTokenizer(md.tokenizer_path).token_lengths(load_calibration_set(calib_set).texts)
    prof = profile_from_lengths(lengths, model_max=md.max_length, min_seq=req.min_seq, opt_seq=req.opt_seq,
                                max_seq=req.max_seq)
    model = load_model(md.onnx_path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    mn, op, mx = prof.shapes()
    argv = trtexec_command(str(onnx), str(engine), names, [ShapeProfile(mn, op, mx)],
                           timing_cache=str(timing_cache_path(engine)), workspace_mib=req.workspace_mib,
                           layer_info=str(layers_json_path(engine)))
    lines.append(render(argv))
    return lines
