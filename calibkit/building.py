"""`calibkit build` as a library call: an FP32 ONNX model -> an engine artifact with its sidecar.

ONNX Runtime engines are ONNX files (FP32 copy, FP16 conversion, or Q/DQ INT8); TensorRT engines are built
from the same ONNX by :mod:`calibkit.engines.tensorrt.builder`. Every artifact gets the
``PATH.calibkit.json`` sidecar (:class:`EngineArtifact`).

Tokenizer: the sidecar *references* the model's tokenizer folder (stored relative to the engine's folder when
they are close, at most two ``..`` apart, absolute otherwise) instead of copying it: the FP32 source model is referenced
the same way (``source_model``, needed by sensitivity re-builds), so an engine is always used next to its model.

Nothing half-written: all checks run before any output is written; outputs are written atomically and, if a
later file fails, the ones already written by this build are removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibkit._io import native_path, sha256_file, utf8_path
from calibkit._version import __version__
from calibkit.consistency import check_table_model, labels_sha256, tokenizer_sha256
from calibkit.enginefiles.artifact import EngineArtifact, sidecar_path
from calibkit.errors import CalibrationError, ModelError, UsageError
from calibkit.outdirs import umask
from calibkit.progress import ProgressCallback, ProgressEvent
from calibkit.requests.build import BuildRequest
from calibkit.types import Backend, Precision, request_path

log = logging.getLogger("calibkit.building")

if TYPE_CHECKING:
    import onnx

    from calibkit.data.modeldir import ModelDir
    from calibkit.quantize.keptweights import KeptServing
    from calibkit.results.files import EngineBuildFacts

_STEPS = 4  # progress: load, quantize or convert, write, done


@dataclass(frozen=True)
class BuildResult:
    artifact: EngineArtifact
    sidecar: Path
    files: tuple[Path, ...]  # everything written, the engine first
    quantized_nodes: tuple[str, ...] = ()
    missing_ranges: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # e.g. a layout other than the one the calibration recorded (measured)


def _emit(progress: ProgressCallback | None, done: int, total: int, message: str) -> None:
    if progress is not None:
        progress(ProgressEvent(task="build", done=done, total=total, message=message))


def _rel(target: Path, base: Path) -> str:
    """Relative to ``base`` when the two are close (at most two ``..``: a project's engines/ beside its
    model folder), so moving the project keeps the sidecar valid; absolute otherwise."""
    target, base = target.resolve(), base.resolve()
    try:
        rel = os.path.relpath(target, base)
    except ValueError:  # another drive on Windows
        return str(target)
    return rel if Path(rel).parts[:3].count("..") <= 2 else str(target)


def _versions() -> dict[str, str]:
    import onnx

    v = {"calibkit": __version__, "onnx": onnx.__version__}
    with contextlib.suppress(ImportError):
        import onnxruntime

        v["onnxruntime"] = onnxruntime.__version__
    return v


def validate(req: BuildRequest) -> None:
    """Every check before any work: the request's own (:meth:`BuildRequest.validate`), then what needs the
    file system or TensorRT, so bad arguments fail before anything is computed or written."""
    output = request_path(req.output)
    if output.is_dir():
        raise UsageError(f"-o {output} is a folder; give the engine's file name")
    if os.path.lexists(output) and not (output.is_file() and sidecar_path(output).is_file()):
        # the command line refuses this too (cli/build.py); a library call wrote over any file
        raise UsageError(f"-o {output} exists and was not written by `calibkit build` (no "
                         f"{sidecar_path(output).name} beside it); it will not be overwritten",
                         hint="pass a new file name to -o, or move the file away first")
    if req.backend is Backend.TENSORRT:
        _check_tensorrt_parsable(req)
        from calibkit.engines.tensorrt import load_tensorrt, require_cuda

        load_tensorrt()
        require_cuda()


@dataclass(frozen=True)
class LayoutChoice:
    """The INT8 Q/DQ layout a build writes, the one its calibration recorded (what ``calibrate`` and ``tune``
    measured), and what to say when they differ."""

    built: str
    measured: str
    warning: str | None = None

    @property
    def measured_here(self) -> bool:
        return self.built == self.measured


def choose_layout(recorded: str, requested: str | None, backend: Backend) -> LayoutChoice:
    """The layout to build from a calibration that records ``recorded``: ``requested`` when given, else the
    recorded one (TensorRT can only build its own). A layout other than the recorded one is built with a
    warning that names both and what to do: it is a model nothing measured."""
    from calibkit.quantize.qdq import Target

    built = requested or (Target.TENSORRT.value if backend is Backend.TENSORRT else recorded)
    if built == recorded:
        return LayoutChoice(built, recorded)
    warning = (f"the calibration records the {recorded} Q/DQ layout (the INT8 model calibrate and tune measured); "
               f"this builds the {built} layout, a different INT8 model that nothing measured: measure it with "
               f"`calibkit compare` before serving it, or pass --target {recorded} for the measured one")
    return LayoutChoice(built, recorded, warning)


@dataclass(frozen=True)
class _Model:
    """What a build writes before the engine step: the model (``data``, or a file to copy as it is) and what
    the sidecar records of it."""

    data: bytes | None = None
    copy_from: Path | None = None
    calibration_json: Path | None = None
    calibration_sha: str | None = None
    kept: tuple[str, ...] = ()
    quantized: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict)
    calibration_set: Path | None = None
    warnings: tuple[str, ...] = ()


def build(req: BuildRequest, progress: ProgressCallback | None = None) -> BuildResult:
    """Build the engine ``req`` describes. Raises a CalibkitError (nothing written) when it cannot."""
    from calibkit.data.modeldir import ModelDir

    validate(req)
    precision, output = Precision(req.precision), request_path(req.output)
    md = ModelDir.resolve(req.model, req.tokenizer)
    src = md.onnx_path
    if output.resolve() == src.resolve():
        raise UsageError(f"-o {output} is the source model itself; choose another file name")
    _emit(progress, 0, _STEPS, f"loading {src.name}")
    from calibkit.consistency import model_sha256

    src_sha = model_sha256(src)  # the model's identity: its external-data files included
    if precision is Precision.INT8 and req.qdq is not None:
        made = _from_qdq(req, src, src_sha)
    elif precision is Precision.INT8:
        made = _from_calibration(req, src, src_sha, progress)
    elif precision is Precision.FP16:
        made = _fp16(req, src, progress)
    else:
        made = _Model(copy_from=src)
    if made.copy_from is not None:
        check_onnx_file(made.copy_from, float_source=made.copy_from == src)
    extra = {**_smoothing(src), **made.extra}
    written: list[Path] = []
    try:
        _emit(progress, 2, _STEPS, f"writing {output.name}")
        extra.update(_write_engine(req, md, made, written, progress))
        sc = _sidecar(req, md, src_sha, made, extra).save()
        written.append(sc)
    except BaseException:
        for p in written:
            with contextlib.suppress(OSError):
                p.unlink()
        if output in written:  # the engine it described is gone: an old sidecar must not outlive it
            with contextlib.suppress(OSError):
                sidecar_path(output).unlink()
        raise
    _emit(progress, _STEPS, _STEPS, "done")
    # what a reader of the sidecar sees: paths resolved against the engine's folder
    return BuildResult(EngineArtifact.load(output), sc, tuple(written), made.quantized, made.missing,
                       made.warnings)


def _smoothing(src: Path) -> dict[str, object]:
    from calibkit.graph import metadata_props
    from calibkit.quantize.smooth import smoothed_from

    try:
        origin = smoothed_from(metadata_props(src))
    except ModelError:  # not readable: the build says what is wrong with it
        return {}
    # FP32-equivalent to that model: compare accepts engines of either
    return {"smoothed_from_sha256": origin} if origin is not None else {}


def _check_qdq_scales(qm: onnx.ModelProto, qdq: Path) -> None:
    """ModelError naming the tensors of ``qdq`` whose Q/DQ scale is NaN, infinite, zero or negative: calibkit
    never writes one (a range is refused before it becomes such a scale), and a model copied with one divides
    by it in every QuantizeLinear, exit 0 and a wrong model."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    inits = {i.name: i for i in qm.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL}
    bad: dict[str, str] = {}
    for n in qm.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(n.input) < 2 or n.input[1] not in inits:
            continue
        scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64).ravel()
        wrong = scale[~(np.isfinite(scale) & (scale > 0))]
        if wrong.size:
            bad.setdefault(n.input[1], f"{n.input[1]} ({wrong[0]:g})")
    if bad:
        shown = ", ".join(list(bad.values())[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ModelError(f"{qdq}: {len(bad)} Q/DQ scale(s) are not finite positive numbers: {shown}",
                         hint="pass the model.int8.onnx `calibkit calibrate` wrote, unedited, or build from "
                              "--calibration (re-run `calibkit calibrate` if its calibration.json is gone)")


def _from_qdq(req: BuildRequest, src: Path, src_sha: str) -> _Model:
    import onnx

    from calibkit.graph import load_model, qdq_layout

    qdq = request_path(req.qdq)
    assert qdq is not None  # the caller's branch
    qm = load_model(qdq, load_external_data=False)
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qm.graph.node):
        raise ModelError(
            f"{qdq} has no QuantizeLinear/DequantizeLinear nodes: it is not a Q/DQ INT8 model",
            hint="pass the model.int8.onnx written by `calibkit calibrate`, or build from --calibration",
        )
    _check_qdq_scales(qm, qdq)
    calibration_json: Path | None = None
    calibration_sha: str | None = None
    kept: tuple[str, ...] = ()
    with contextlib.suppress(ModelError, KeyError, ValueError):
        prev = EngineArtifact.load(qdq)
        calibration_json = Path(prev.calibration_json) if prev.calibration_json else None
        calibration_sha = prev.calibration_sha256
        kept = prev.kept_higher_precision
    if calibration_json is None and (qdq.parent / "calibration.json").is_file():
        calibration_json = qdq.parent / "calibration.json"
        calibration_sha = sha256_file(calibration_json)
    if calibration_json is not None and calibration_json.is_file():  # the Q/DQ model's table: this model's?
        check_table_model(calibration_json, src_sha, model_label=str(src))
    extra: dict[str, object] = {"qdq_source": _rel(qdq, request_path(req.output).resolve().parent)}
    layout = qdq_layout(qm)
    if layout:  # recorded as the registry would read it from the file, so build can say which it copied
        extra["target"] = layout
    if Backend(req.backend) is not Backend.TENSORRT:
        served, warnings = _kept_served(req, qdq, qm, layout, extra)
        return _Model(data=served, copy_from=None if served else qdq, calibration_json=calibration_json,
                      calibration_sha=calibration_sha, kept=kept, extra=extra,
                      calibration_set=request_path(req.calibration_set), warnings=warnings)
    if any(z.data_type == onnx.TensorProto.UINT8 for z in qm.graph.initializer if z.name.endswith("zero_point")):
        raise ModelError(
            f"{qdq} uses uint8 activations (the --target onnxruntime layout); TensorRT needs int8",
            hint="build the TensorRT engine from --calibration, or calibrate with --target tensorrt",
        )
    return _Model(data=qm.SerializeToString(), copy_from=None, calibration_json=calibration_json,
                  calibration_sha=calibration_sha, kept=kept, extra=extra,
                  calibration_set=request_path(req.calibration_set))


def _from_calibration(req: BuildRequest, src: Path, src_sha: str, progress: ProgressCallback | None) -> _Model:
    from calibkit.graph import check_float_source, load_model
    from calibkit.quantize.qdq import Target, quantize_model
    from calibkit.quantize.tablefile import load_calibration_json

    assert req.calibration is not None  # checked by validate()
    cf = load_calibration_json(req.calibration)
    check_table_model(cf.path, src_sha, model_label=str(src), table_sha256=cf.table.model_sha256)
    # a warning rides in BuildResult.warnings
    layout = choose_layout(cf.target, str(req.target) if req.target else None, Backend(req.backend))
    target = Target(layout.built)
    reduce = _reduce_range(req, target)
    _emit(progress, 1, _STEPS, f"inserting Q/DQ ({target.value} layout{', 7-bit weights' if reduce else ''})")
    res = quantize_model(
        check_float_source(load_model(src), src), cf.table, exclude=tuple(cf.exclude) + req.exclude, target=target,
        keep_nodes=req.keep_nodes, reduce_range=reduce,
    )
    if not res.quantized_nodes:
        raise CalibrationError(
            f"no node of {src.name} could be quantized with {cf.path.name} "
            f"({len(res.missing_ranges)} tensors have no range)",
            hint="the calibration table does not match this model: re-run `calibkit calibrate`",
        )
    if res.missing_ranges:
        log.warning("%d tensors have no range and stay FP32: %s", len(res.missing_ranges), res.missing_ranges[:5])
    calib_set = request_path(req.calibration_set)
    cs = cf.raw.get("calibration_set")
    if calib_set is None and isinstance(cs, dict) and cs.get("path") and Path(cs["path"]).exists():
        calib_set = Path(cs["path"])
    extra: dict[str, object] = {
        "target": target.value, "measured_layout": layout.measured, "quantized_nodes": len(res.quantized_nodes),
        "missing_ranges": list(res.missing_ranges), "zero_ranges": list(res.zero_ranges),
        "weight_bits": 7 if reduce else 8}
    model = res.model
    warnings: tuple[str, ...] = (layout.warning,) if layout.warning else ()
    if Backend(req.backend) is Backend.ONNXRUNTIME and target is Target.ONNXRUNTIME:
        ks = _serve_kept(req, model, extra)
        model, warnings = ks.model, warnings + ((ks.note,) if ks.note else ())
    return _Model(data=model.SerializeToString(), calibration_json=cf.path, calibration_sha=sha256_file(cf.path),
                  kept=res.kept_nodes, quantized=res.quantized_nodes, missing=res.missing_ranges, extra=extra,
                  calibration_set=calib_set, warnings=warnings)


def _serve_kept(req: BuildRequest, model: onnx.ModelProto, extra: dict[str, object]) -> KeptServing:
    """``model`` with its FP32 weight MatMuls served as ``req.kept_weights`` says; the sidecar's facts of it
    added to ``extra``."""
    from calibkit.quantize.keptweights import serve_kept

    ks = serve_kept(model, req.kept_weights)
    extra["kept_weights"] = "fp32" if ks.note else str(req.kept_weights)  # a note: this ONNX Runtime cannot
    extra["blockwise_nodes"] = list(ks.blockwise)
    return ks


def _kept_served(req: BuildRequest, qdq: Path, qm: onnx.ModelProto, layout: str | None,
                 extra: dict[str, object]) -> tuple[bytes | None, tuple[str, ...]]:
    """A ready onnxruntime-layout Q/DQ model with its kept weight MatMuls served blockwise (its bytes), or None
    where it is copied as it is (another layout, ``--kept-weights fp32``, nothing kept)."""
    from calibkit.graph import load_model
    from calibkit.quantize.keptweights import eligible
    from calibkit.requests.choices import KeptWeights

    if layout != "onnxruntime":
        return None, ()
    if req.kept_weights is KeptWeights.BLOCKWISE and eligible(qm):
        qm = load_model(qdq)  # the weights themselves this time
    ks = _serve_kept(req, qm, extra)
    return (ks.model.SerializeToString() if ks.blockwise else None), ((ks.note,) if ks.note else ())


def _fp16(req: BuildRequest, src: Path, progress: ProgressCallback | None) -> _Model:
    from calibkit.graph import check_float_source, load_model
    from calibkit.names import compile_patterns, node_names
    from calibkit.quantize.fp16 import convert_to_fp16

    _emit(progress, 1, _STEPS, "converting to FP16")
    fmodel = check_float_source(load_model(src), src)
    patterns = compile_patterns(req.exclude)
    regex_kept = [n.node for n in node_names(fmodel).values() if any(n.matches(p) for p in patterns)]
    fres = convert_to_fp16(fmodel, keep_nodes=tuple(req.keep_nodes) + tuple(regex_kept))
    return _Model(data=fres.model.SerializeToString(), kept=fres.kept_fp32, extra={"fp16_nodes": len(fres.fp16_nodes)},
                  calibration_set=request_path(req.calibration_set))


def _write_engine(req: BuildRequest, md: ModelDir, made: _Model, written: list[Path],
                  progress: ProgressCallback | None) -> dict[str, object]:
    """The engine file (appended to ``written`` as each file lands); returns what the sidecar adds of it."""
    output = request_path(req.output)
    if Backend(req.backend) is Backend.ONNXRUNTIME:
        if made.copy_from is not None:
            written += _copy_onnx(made.copy_from, output)
        else:
            assert made.data is not None
            from calibkit._io import write_bytes

            write_bytes(output, made.data)
            written.append(output)
        return {}
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.tensorrt.builder import build_engine
    from calibkit.engines.tensorrt.profile import profile_from_lengths

    lengths = None
    if made.calibration_set is not None:
        cset = load_calibration_set(made.calibration_set)
        lengths = TextTokenizer(md.tokenizer_path).token_lengths(cset.texts)
    profile = profile_from_lengths(
        lengths, model_max=md.max_length, min_seq=req.min_seq, opt_seq=req.opt_seq, max_seq=req.max_seq
    )
    data = made.data if made.data is not None else md.onnx_path.read_bytes()
    tres = build_engine(data, output, profile, workspace_bytes=req.workspace_mib << 20, progress=progress)
    written += [tres.engine, tres.timing_cache, tres.layers_json]
    return {"profile": profile.to_dict(), "timing_cache": tres.timing_cache.name,
            "layers_json": tres.layers_json.name, "tensorrt_version": tres.tensorrt_version}


def _sidecar(req: BuildRequest, md: ModelDir, src_sha: str, made: _Model, extra: dict[str, object]
             ) -> EngineArtifact:
    output = request_path(req.output)
    engine_dir = output.resolve().parent
    cal = made.calibration_json
    return EngineArtifact(
        path=output,
        precision=Precision(req.precision),
        backend=Backend(req.backend),
        source_model_sha256=src_sha,
        calibration_sha256=made.calibration_sha,
        tokenizer=_rel(md.tokenizer_path, engine_dir),
        kept_higher_precision=tuple(made.kept),
        source_model=_rel(md.onnx_path, engine_dir),
        calibration_json=_rel(cal, engine_dir) if cal else None,
        tokenizer_sha256=tokenizer_sha256(md.tokenizer_path),
        labels_sha256=labels_sha256(md.tokenizer_path),
        versions=_versions() | ({"tensorrt": str(extra.get("tensorrt_version"))} if "profile" in extra else {}),
        extra=_facts(extra),
    )


def _facts(extra: Mapping[str, object]) -> EngineBuildFacts:
    """What the build steps gathered, as the sidecar's typed facts (a key it does not declare is a bug here)."""
    from calibkit.results.files import EngineBuildFacts

    # each value of its own field's type; Any because EngineBuildFacts(**facts) is checked against every field
    facts: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in extra.items()}
    return EngineBuildFacts(**facts)


def _reduce_range(req: BuildRequest, target: object) -> bool:
    from calibkit.engines.cpu import int8_gemm_saturates
    from calibkit.quantize.qdq import Target

    if req.reduce_range is not None:  # as asked; quantize_model refuses it for the tensorrt layout
        return req.reduce_range
    if target is Target.ONNXRUNTIME and int8_gemm_saturates():
        log.warning("this CPU has no VNNI: ONNX Runtime's int8 GEMM would saturate with 8-bit weights, so the "
                    "weights get 7 bits (--reduce-range); pass --no-reduce-range for a model served on VNNI CPUs")
        return True
    return False


def _check_tensorrt_parsable(req: BuildRequest) -> None:
    """TensorRT's ONNX parser reads the standard domain only: ORT-fused graphs (com.microsoft ops) fail there."""
    from calibkit.data.modeldir import ModelDir
    from calibkit.graph import load_model
    from calibkit.quantize.fused import contrib_nodes

    src = request_path(req.qdq) or ModelDir.resolve(req.model, req.tokenizer).onnx_path
    contrib = contrib_nodes(load_model(src, load_external_data=False))
    if contrib:
        ops = ", ".join(sorted({f"{n.domain}.{n.op_type}" for n in contrib}))
        raise ModelError(
            f"{src.name} holds {len(contrib)} nodes TensorRT's ONNX parser cannot read ({ops}): it was optimized "
            "for ONNX Runtime (onnxruntime.transformers.optimizer)",
            hint="build TensorRT engines from the unfused export (torch.onnx.export or optimum-cli export onnx "
                 "without ORT optimization); this file serves with --backend onnxruntime",
        )


def _atomic_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_onnx_file(path: Path, float_source: bool = False) -> list[str]:
    """Refuse a file that is not a usable ONNX model (a text file named model.onnx, a truncated download,
    a graph without outputs or with external-data files missing), and with ``float_source`` one that is not an
    FP32 model; return its external-data locations."""
    import onnx

    from calibkit.graph import check_external_data, check_float_source, load_model

    hint = "pass a valid ONNX model file (e.g. exported with torch.onnx.export or optimum-cli export onnx)"
    try:
        model = load_model(path, load_external_data=False)  # also refuses a graph without nodes or outputs
    except ModelError as exc:
        if exc.hint:  # already says what the file is and what to do
            raise
        raise ModelError(f"{path} is not an ONNX model ({exc.message})", hint=hint) from None
    if not model.opset_import:
        raise ModelError(f"{path} is not an ONNX model (no operator set)", hint=hint)
    if float_source:
        check_float_source(model, path)
    locs = check_external_data(model, path)
    try:
        # by path: external data is checked beside the model (a name that is not UTF-8: in memory)
        onnx.checker.check_model(str(path) if utf8_path(path) else load_model(path))
    except Exception as exc:  # noqa: BLE001 - onnx raises ValidationError and plain errors alike
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path} is not a valid ONNX model: {first}", hint=hint) from None
    return locs


def _copy_onnx(src: Path, dst: Path) -> list[Path]:
    """Copy an ONNX model atomically; external-data weights are carried along as ``DST.data``."""
    if not check_onnx_file(src):
        _atomic_copy(src, dst)
        return [dst]
    import onnx

    from calibkit.graph import load_model

    model = load_model(src, load_external_data=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    data_name = f"{dst.name}.data"
    with tempfile.TemporaryDirectory(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent) as tmp:
        onnx.save_model(model, native_path(Path(tmp) / dst.name), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
        written = [dst]
        if (Path(tmp) / data_name).is_file():
            os.replace(Path(tmp) / data_name, dst.parent / data_name)
            written.append(dst.parent / data_name)
        os.replace(Path(tmp) / dst.name, dst)
    return written
