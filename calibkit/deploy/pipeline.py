"""``calibkit deploy`` as a library call: a :class:`~calibkit.requests.deploy.DeployRequest` and the run's
:class:`~calibkit.resources.Resources` -> a Triton model repository and its :class:`DeployResult`.

1. SOURCE (a tune or calibrate folder, or an engine) becomes a build recipe (:mod:`calibkit.deploy.source`);
   the model's inputs must have dynamic batch and sequence axes (:mod:`calibkit.deploy.modelio`). The INT8
   layout shipped is the one SOURCE records as measured unless ``layout`` asks for another (a loud warning).
2. The traffic log is read like ``sample`` reads logs and tokenized with the model's tokenizer
   (:mod:`calibkit.deploy.traffic`); its lengths choose the buckets (:mod:`calibkit.deploy.profiles`) and a
   token budget the batch sizes (:mod:`calibkit.deploy.batching`).
3. The repository is written at once (:mod:`calibkit.deploy.repository`): the model built by
   :func:`calibkit.building.build` (TensorRT: the Q/DQ ONNX, a ``build_engine.sh`` with the exact trtexec
   command and the same build through calibkit's backend), then, for ONNX Runtime, that model measured against
   FP32 on the traffic (:mod:`calibkit.deploy.measure`), then config.pbtxt, perf_analyzer data and command,
   README and deploy.json (through the codec) with the measurement in them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from calibkit._version import __version__
from calibkit.deploy.source import DeploySource
from calibkit.errors import ModelError
from calibkit.progress import ProgressCallback, ProgressEvent
from calibkit.provenance import RunInputs
from calibkit.requests.deploy import DeployRequest
from calibkit.resources import Resources
from calibkit.results.documents import (
    BatchingPlan,
    DeployResult,
    LayoutRecord,
    LengthSummary,
    PaddingBaseline,
    PerfAnalyzerData,
    ProfileChoice,
    ServedMeasurement,
    ServedModel,
    ServedTensor,
    TensorRTBuild,
    shape_range,
)
from calibkit.types import Backend, Precision, request_path

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.deploy.repository import RepositoryFiles
    from calibkit.requests.build import BuildRequest

if TYPE_CHECKING:
    from calibkit.data.modeldir import ModelDir
    from calibkit.deploy.modelio import ModelIO
    from calibkit.deploy.perfdata import PerfData
    from calibkit.deploy.traffic import Traffic

__all__ = ["DeployRequest", "DeployResult", "default_name", "deploy"]


@dataclass(frozen=True)
class _Served:
    """What SOURCE is served as: the recipe, the model folder, its inputs/outputs, the name and the layout."""

    src: DeploySource
    md: ModelDir
    io: ModelIO
    name: str
    label: str | None
    layout: LayoutRecord | None
    warnings: tuple[str, ...]
    inputs: RunInputs


@dataclass(frozen=True)
class _Shaped:
    """The traffic and what its lengths chose."""

    traffic: Traffic
    calibration_set: Path | None
    lengths: np.ndarray
    profiles: ProfileChoice
    batching: BatchingPlan
    perf: PerfData  # perf_analyzer's requests


def default_name(model: Path, precision: Precision) -> str:
    """MODELFOLDER-PRECISION (a model file not named model.onnx: its stem), in the characters Triton takes."""
    stem = model.parent.name if model.name == "model.onnx" else model.stem
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "model"
    return f"{name}-{precision.value}"[:128]


def _emit(cb: ProgressCallback, done: int, message: str) -> None:
    cb(ProgressEvent("deploy", done, 5, message))


def deploy(request: DeployRequest, resources: Resources = Resources()) -> DeployResult:
    """Write the Triton model repository ``request`` describes (progress to ``resources.progress``, the
    measurement's runners from ``resources.runner_factory``); raises a CalibkitError (nothing written) when it
    cannot."""
    from calibkit.deploy.repository import write_repository
    from calibkit.provenance import run_inputs

    cb = resources.progress
    _emit(cb, 0, "reading SOURCE")
    served = _serve(request)
    _emit(cb, 1, "reading the traffic")
    shaped = _shape(request, served)
    _emit(cb, 2, "choosing profiles and batch sizes")
    result = _plan(request, served, shaped)
    _emit(cb, 3, "building the model")

    def build_and_measure(model_dir: Path) -> RepositoryFiles:
        nonlocal result
        model = _build(request, served, model_dir, result)
        measuring = request.measure_texts and result.backend is Backend.ONNXRUNTIME
        _emit(cb, 4, "measuring the served model against FP32" if measuring else "writing the repository")
        result = dataclasses.replace(result, **_measure(request, served, shaped, model, resources))
        return _files(request, served, shaped, result)

    write_repository(request_path(request.out), served.name, build_and_measure,
                     inputs=run_inputs([*served.inputs.paths, shaped.traffic.path, shaped.calibration_set]))
    _emit(cb, 5, "done")
    return dataclasses.replace(result, out_dir=request_path(request.out))


def _serve(request: DeployRequest) -> _Served:
    from calibkit.data.modeldir import ModelDir
    from calibkit.deploy.modelio import read_model_io
    from calibkit.deploy.repository import check_model_name, guard_repository
    from calibkit.deploy.source import original_model, resolve_source
    from calibkit.deploy.triton import label_output
    from calibkit.provenance import run_inputs

    backend = Backend(request.backend)
    src = resolve_source(request.source)
    inputs = run_inputs([request.source, request.traffic, src.model, src.tokenizer, src.calibration_set])
    guard_repository(request_path(request.out), inputs)  # before any work, as the command line does
    md = ModelDir.resolve(src.model, src.tokenizer)
    io = read_model_io(md.onnx_path)  # before any work: a model without dynamic axes is refused here
    layout, warnings = _layout(src, backend, str(request.layout) if request.layout is not None else None)
    name = request.name or default_name(original_model(src.model), src.precision)  # the user's model, not a copy
    check_model_name(name, "--name" if request.name else "the default name (pass --name)")
    label = label_output(io, md.id2label)  # label names with a line break are refused here, before any work
    if src.tune_claim is not None:
        warnings.insert(0, f"the tune run that wrote {src.path} says: {src.tune_claim}")
    return _Served(src, md, io, name, label, layout, tuple(warnings), inputs)


def _layout(src: DeploySource, backend: Backend, requested: str | None) -> tuple[LayoutRecord | None, list[str]]:
    """The INT8 layout to ship: ``requested``, else the one SOURCE was measured in (TensorRT builds only its
    own). One that differs from the measured one is shipped with a warning; one that cannot be rebuilt (no
    calibration table) is refused."""
    if src.precision is not Precision.INT8:
        return None, []
    measured = src.qdq_target
    shipped = requested or ("tensorrt" if backend is Backend.TENSORRT else measured or "tensorrt")
    if shipped != measured and src.calibration_json is None:
        if backend is Backend.TENSORRT:
            raise ModelError(f"{src.path} is an ONNX Runtime-layout INT8 model (uint8 activations) without its "
                             "calibration table; TensorRT needs the int8 (tensorrt) layout",
                             hint="deploy the calibrate or tune folder it came from with --backend tensorrt")
        raise ModelError(f"{src.path} is a {measured}-layout INT8 model without its calibration table: deploy "
                         f"cannot rebuild it in the {shipped} layout",
                         hint=f"drop --layout to serve it as measured, or deploy the calibrate or tune folder it "
                              f"came from with --layout {shipped}")
    warnings = []
    if backend is Backend.ONNXRUNTIME and shipped == measured == "tensorrt":
        warnings.append("the TensorRT Q/DQ layout is served as measured: ONNX Runtime runs it unfused, slower than "
                        "FP32 on CPUs (deploy's latency measurement says by how much); --layout onnxruntime ships "
                        "ONNX Runtime's fused integer kernels, a different INT8 model that deploy then measures")
    if measured is not None and shipped != measured:
        warnings.append(f"SHIPPING AN UNMEASURED LAYOUT: {src.path} was measured in the {measured} Q/DQ layout; "
                        f"this repository serves the {shipped} layout, a different INT8 model that compare and tune "
                        f"did not measure" + (" (deploy's own measurement of it is in deploy.json); drop --layout to "
                                              "ship the measured one" if requested else
                                              ": TensorRT builds only its own layout; tune or calibrate with "
                                              "--target tensorrt to measure it"))
    return LayoutRecord(shipped=shipped, measured=measured, requested=requested), warnings


def _shape(request: DeployRequest, served: _Served) -> _Shaped:
    import calibkit.deploy.batching as batching
    import calibkit.deploy.profiles as profiles
    from calibkit.deploy.perfdata import build_perf_data

    tr, cset, tok, lengths = _read_traffic(request, served)
    md = served.md
    top = profiles.largest_max(lengths, md.max_length, request.max_seq, request.round_to)
    # k beyond the distinct padded lengths the traffic has adds nothing: those choices are left out
    choices = tuple(c for k in range(1, profiles.MAX_PROFILES + 1)
                    if (c := profiles.choose_buckets(lengths, k, max_seq=top, round_to=request.round_to)).k == k)
    k = request.requested_k
    choice = choices[min(k, len(choices)) - 1] if k is not None else profiles.auto_k(choices)
    plan = batching.plan_batching([b.hi for b in choice.buckets], batch_tokens=request.batch_tokens,
                                  max_batch=request.max_batch, queue_delay_us=request.queue_delay_us)
    chosen = ProfileChoice(chosen_k=choice.k, requested_k=request.requested_k, round_to=request.round_to,
                           choices=choices, baseline=_baseline(lengths, md.max_length, request))
    rng = np.random.default_rng(request.seed)  # perf_analyzer's requests: a seeded sample of the traffic
    pick = np.sort(rng.choice(len(tr.texts), size=min(request.perf_requests, len(tr.texts)), replace=False))
    perf = build_perf_data(tok, [tr.texts[i] for i in pick], [int(lengths[i]) for i in pick], choice,
                           served.io.input_names)
    return _Shaped(tr, cset, lengths, chosen, plan, perf)


def _read_traffic(request: DeployRequest, served: _Served) -> tuple[Any, Path | None, Any, np.ndarray]:
    """The traffic (``--traffic``, else the log a tune folder's run judged agreement on, else the calibration
    set's log, each checked to hold the bytes it had then), the calibration set's folder when known, the
    tokenizer and the texts' token lengths."""
    import calibkit.deploy.traffic as traffic
    from calibkit.data.tokenizer import TextTokenizer

    src, md = served.src, served.md
    cset = src.calibration_set or traffic.find_calibration_set(
        src.calibration_set_id, [Path("calibration_sets"), src.path.parent / "calibration_sets"])
    log, expected = request.traffic, None
    if log is None:  # the log tune judged agreement on, else the calibration set's, as they were then
        default = src.tune_traffic or traffic.default_traffic_log(cset, src.path)
        log, expected = default.path, default.sha256
    tr = traffic.read_traffic(log, text_field=request.text_field, strict=request.strict, redact=request.redact,
                              max_texts=request.max_texts, seed=request.seed, expected_sha256=expected)
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    lengths = np.concatenate([tok.token_lengths(tr.texts[i : i + 4096]) for i in range(0, len(tr.texts), 4096)])
    return tr, cset, tok, lengths


def _plan(request: DeployRequest, served: _Served, shaped: _Shaped) -> DeployResult:
    """deploy.json before the model is built and measured: every choice and the numbers behind it."""
    from calibkit.deploy.perfdata import perf_analyzer_command
    from calibkit.engines.tensorrt import available as trt_available

    src, io, md, plan = served.src, served.io, served.md, shaped.batching
    return DeployResult(
        calibkit_version=__version__, name=served.name, backend=Backend(request.backend), precision=src.precision,
        source=src.record(), traffic=shaped.traffic.record(origin=_origin(request, src)),
        model=ServedModel(tuple(ServedTensor(t.name, t.triton_type, tuple(t.dims)) for t in io.inputs),
                          tuple(ServedTensor(t.name, t.triton_type, tuple(t.dims)) for t in io.outputs),
                          md.max_length, md.max_length_source, served.label),
        lengths=_length_summary(shaped.lengths), profiles=shaped.profiles, batching=plan,
        perf_analyzer=PerfAnalyzerData(shaped.perf.requests, tuple(shaped.perf.per_bucket), tuple(perf_analyzer_command(
            served.name, "perf_data.json", max_batch=plan.max_batch_size))),
        tensorrt=TensorRTBuild(trt_available(), tuple(_trtexec(request, served, shaped)),
                               tuple(shape_range(p) for p in _shape_profiles(shaped))),
        layout=served.layout, warnings=served.warnings,
    )


def _origin(request: DeployRequest, src: DeploySource) -> str:
    if request.traffic is not None:
        return "--traffic"
    return "tune" if src.tune_traffic is not None else "calibration set"


def _shape_profiles(shaped: _Shaped) -> list[Any]:
    import calibkit.deploy.trtexec as trt_cmd

    plan = shaped.batching
    return [trt_cmd.ShapeProfile((1, b.lo), (bs, b.hi), (plan.max_batch_size, b.hi))
            for b, bs in zip(shaped.profiles.chosen.buckets, plan.per_bucket)]


def _trtexec(request: DeployRequest, served: _Served, shaped: _Shaped) -> list[str]:
    import calibkit.deploy.trtexec as trt_cmd

    return trt_cmd.trtexec_command(f"model.{served.src.precision.value}.onnx", "1/model.plan", served.io.input_names,
                                   _shape_profiles(shaped), timing_cache="1/model.plan.timing.cache",
                                   workspace_mib=request.workspace_mib, layer_info="1/model.plan.layers.json")


def _build(request: DeployRequest, served: _Served, model_dir: Path, result: DeployResult) -> Path:
    """The served model, built into ``model_dir``; returns its path."""
    from calibkit.building import build

    target = model_dir / "1" / "model.onnx" if result.backend is Backend.ONNXRUNTIME else \
        model_dir / f"model.{served.src.precision.value}.onnx"
    from calibkit.deploy.repository import ship_sidecar
    from calibkit.enginefiles.artifact import sidecar_path

    build(_build_request(served, target, request))
    ship_sidecar(sidecar_path(target))
    return target


class _BuildPaths(TypedDict):
    """The paths of every BuildRequest deploy makes."""

    model: Path
    tokenizer: Path
    output: Path


def _build_request(served: _Served, target: Path, request: DeployRequest) -> BuildRequest:
    from calibkit.building import BuildRequest
    from calibkit.requests.choices import KeptWeights, Target
    from calibkit.requests.options import coerce

    src, layout = served.src, served.layout
    common: _BuildPaths = {"model": src.model, "tokenizer": src.tokenizer, "output": target}
    if src.precision is not Precision.INT8 or layout is None:
        return BuildRequest(**common, precision=src.precision,
                            keep_nodes=src.keep_nodes if src.precision is Precision.FP16 else ())
    kept = request.kept_weights or KeptWeights(src.kept_weights or KeptWeights.BLOCKWISE)  # as tune timed it
    if src.qdq_model is not None and src.qdq_target == layout.shipped:  # the very file that was measured
        return BuildRequest(**common, precision=Precision.INT8, qdq=src.qdq_model, kept_weights=kept)
    reduce = request.reduce_range
    if reduce is None and src.weight_bits is not None and src.qdq_target == "onnxruntime":
        reduce = src.weight_bits == 7  # as the engine deployed was built
    # the layout's name as BuildRequest reads it (its __post_init__ coerces it so too)
    return BuildRequest(**common, precision=Precision.INT8, calibration=src.calibration_json,
                        target=coerce(Target, layout.shipped),
                        keep_nodes=src.keep_nodes, reduce_range=reduce if layout.shipped == "onnxruntime" else None,
                        kept_weights=kept)


def _measure(request: DeployRequest, served: _Served, shaped: _Shaped, model: Path,
             resources: Resources) -> dict[str, Any]:
    """deploy.json's ``measurement`` (or ``measurement_note``, why there is none)."""
    from calibkit.deploy.measure import measure_served, pick_texts

    if Backend(request.backend) is Backend.TENSORRT:
        return {"measurement_note": "not measured here: a TensorRT engine is built and measured on the serving GPU "
                                    "(build_engine.sh); compare it there with `calibkit compare`"}
    if served.src.precision is Precision.FP32:
        return {"measurement_note": "the served model is the FP32 model: nothing to measure against it"}
    if not request.measure_texts:
        return {"measurement_note": "not measured (--measure-texts 0)"}
    calibration: tuple[str, ...] = ()
    if shaped.calibration_set is not None:
        from calibkit.data.calibset import load_calibration_set

        calibration = tuple(load_calibration_set(shaped.calibration_set).texts)
    picked = pick_texts(shaped.traffic.texts, calibration, request.measure_texts, request.seed)
    if not picked.texts:
        return {"measurement_note": "not measured: every traffic text is a calibration text (pass --traffic with "
                                    "requests the calibration did not see)"}
    busiest = _busiest(shaped)
    batch = request.measure_batch or busiest[0]
    m: ServedMeasurement = measure_served(served.src.model, model, served.md, picked, threads=request.threads,
                                          batch=batch, progress=resources.progress,
                                          make_runner=resources.runner_factory,
                                          bucket=busiest[1] if batch == busiest[0] else None)
    return {"measurement": m}


def _busiest(shaped: _Shaped) -> tuple[int, tuple[int, int]]:
    """The batch size Triton is told to prefer for the bucket most requests fall in, and that bucket's token
    lengths: the batch the served model runs most under load, of the requests it is formed of, so the one its
    speed is measured at besides batch 1."""
    buckets = shaped.profiles.chosen.buckets
    i = max(range(len(buckets)), key=lambda k: buckets[k].requests)
    return shaped.batching.per_bucket[i], (buckets[i].lo, buckets[i].hi)


def _files(request: DeployRequest, served: _Served, shaped: _Shaped, result: DeployResult) -> RepositoryFiles:
    """Everything of the repository but the model: config, scripts, perf data, README and deploy.json."""
    from calibkit.deploy.engine import PROFILES_FILE
    from calibkit.deploy.readme import build_script, perf_script, readme
    from calibkit.deploy.repository import RepositoryFiles, shipped_result
    from calibkit.deploy.triton import TritonModelConfig, labels_text
    from calibkit.results.codec import document_json, to_document
    from calibkit.results.files import TrtProfiles

    result = shipped_result(result, request.out)  # no absolute path of this machine in the repository's files
    name, plan = served.name, result.batching
    config = TritonModelConfig(name=name, backend=result.backend, io=served.io, max_batch_size=plan.max_batch_size,
                               preferred_batch_sizes=plan.preferred, queue_delay_us=plan.queue_delay_us,
                               instances=request.instances, profiles=result.choice.k,
                               intra_op_threads=request.threads, label_output=served.label).render()
    texts = {f"{name}/config.pbtxt": config, "perf_analyzer.sh": perf_script(result),
             "README.md": readme(result, config)}
    json_docs: dict[str, object] = {"deploy.json": to_document(result)}
    executables: tuple[str, ...] = ("perf_analyzer.sh",)
    if served.label is not None:
        texts[f"{name}/labels.txt"] = labels_text(served.md.id2label)
    if result.backend is Backend.TENSORRT:
        texts[f"{name}/build_engine.sh"] = build_script(result)
        json_docs[f"{name}/{PROFILES_FILE}"] = document_json(TrtProfiles(
            f"model.{result.precision.value}.onnx", "1/model.plan", request.workspace_mib,
            tuple({"min_seq": p.min_shape[1], "opt_seq": p.opt_shape[1], "max_seq": p.max_shape[1],
                   "min_batch": p.min_shape[0], "opt_batch": p.opt_shape[0], "max_batch": p.max_shape[0]}
                  for p in result.tensorrt.profiles)))
        executables += (f"{name}/build_engine.sh",)
    return RepositoryFiles(texts, executables, json_docs, {"perf_data.json": shaped.perf.doc})


def _baseline(lengths: np.ndarray, model_max: int, request: DeployRequest) -> PaddingBaseline:
    """One profile 1..model_max: every request padded to model_max (equal shapes, as Triton batches), and the
    same profile with arrival-order batches each padded to its longest request (a server that pads per batch)."""
    from calibkit.deploy.batching import batch_for
    from calibkit.deploy.profiles import padded_by_arrival

    clipped = np.clip(lengths, 1, model_max)
    real = int(clipped.sum())
    batch = batch_for(model_max, request.batch_tokens, request.max_batch)
    arrival = padded_by_arrival(lengths, batch, model_max)
    padded = int(clipped.size) * model_max
    return PaddingBaseline(max_seq=model_max, real_tokens=real, padded_tokens_padded_to_max=padded,
                           waste_padded_to_max=(padded - real) / real, arrival_batch=batch,
                           padded_tokens_arrival_batches=arrival, waste_arrival_batches=(arrival - real) / real)


def _length_summary(lengths: np.ndarray) -> LengthSummary:
    q = np.percentile(lengths, [50, 90, 99, 100])
    return LengthSummary(count=int(lengths.size), mean=float(lengths.mean()), p50=float(q[0]), p90=float(q[1]),
                         p99=float(q[2]), max=int(q[3]))
