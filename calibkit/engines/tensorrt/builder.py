"""Build a strongly typed TensorRT engine from an ONNX model (FP32, FP16 or Q/DQ INT8).

Files written beside ``ENGINE`` (all atomically): ``ENGINE`` (the serialized plan), ``ENGINE.timing.cache``
(reused and extended by the next build of any model on the same GPU and TensorRT version) and
``ENGINE.layers.json`` (the engine inspector's per-layer JSON; built with ProfilingVerbosity.DETAILED).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calibkit._io import write_bytes, write_text
from calibkit.engines.tensorrt import load_tensorrt
from calibkit.engines.tensorrt.profile import SeqProfile
from calibkit.errors import BackendError
from calibkit.progress import ProgressCallback, ProgressEvent

log = logging.getLogger("calibkit.engines.tensorrt")


@dataclass(frozen=True)
class TrtBuildResult:
    engine: Path
    timing_cache: Path
    layers_json: Path
    tensorrt_version: str


def timing_cache_path(engine: Path) -> Path:
    return engine.with_name(engine.name + ".timing.cache")


def layers_json_path(engine: Path) -> Path:
    return engine.with_name(engine.name + ".layers.json")


def _emit(progress: ProgressCallback | None, done: int, message: str) -> None:
    if progress is not None:
        progress(ProgressEvent(task="tensorrt build", done=done, total=4, message=message))


def build_engine(
    onnx_bytes: bytes,
    engine_path: Path,
    profile: SeqProfile | Sequence[SeqProfile],
    *,
    workspace_bytes: int = 4 << 30,
    progress: ProgressCallback | None = None,
) -> TrtBuildResult:
    """Parse ``onnx_bytes`` into a strongly typed network, build it with ``profile`` on every 2-D input.

    Several profiles (``calibkit deploy``'s length buckets) become one optimization profile each, in order."""
    profiles = [profile] if isinstance(profile, SeqProfile) else list(profile)
    if not profiles:
        raise BackendError("at least one optimization profile is needed")
    load_tensorrt()  # a clear MissingDependencyError instead of an ImportError
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    _emit(progress, 0, "parsing ONNX")
    if not parser.parse(onnx_bytes):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BackendError(
            "TensorRT could not parse the ONNX model: " + "; ".join(errors[:3]),
            hint="check it with onnx.checker; Q/DQ models for TensorRT need int8 zero point 0 (--target tensorrt)",
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    for prof in profiles:
        opt_profile = builder.create_optimization_profile()
        mn, op, mx = prof.shapes()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            if len(tensor.shape) != 2:
                raise BackendError(
                    f"input {tensor.name!r} has rank {len(tensor.shape)}; calibkit builds [batch, sequence] token "
                    "inputs"
                )
            opt_profile.set_shape(tensor.name, trt.Dims(list(mn)), trt.Dims(list(op)), trt.Dims(list(mx)))
        config.add_optimization_profile(opt_profile)

    cache_file = timing_cache_path(engine_path)
    old = cache_file.read_bytes() if cache_file.is_file() else b""
    cache = config.create_timing_cache(old)
    config.set_timing_cache(cache, False)

    seqs = ", ".join(f"{p.min_seq}/{p.opt_seq}/{p.max_seq}" for p in profiles)
    _emit(progress, 1, f"building (seq {seqs})")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError("TensorRT failed to build the engine (see the TensorRT log above)")
    data = bytes(memoryview(plan))
    _emit(progress, 2, "inspecting layers")
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise BackendError("TensorRT built an engine it cannot load back (see the TensorRT log above)")
    layers = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    timing = bytes(memoryview(config.get_timing_cache().serialize()))

    _emit(progress, 3, "writing engine")
    written: list[Path] = []
    try:
        for path, payload in ((engine_path, data), (cache_file, timing), (layers_json_path(engine_path), layers)):
            if isinstance(payload, str):
                write_text(path, payload)
            else:
                write_bytes(path, payload)
            written.append(path)
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        raise
    _emit(progress, 4, "done")
    log.info("built %s (%d bytes) with TensorRT %s", engine_path, len(data), trt.__version__)
    return TrtBuildResult(engine_path, cache_file, layers_json_path(engine_path), str(trt.__version__))
