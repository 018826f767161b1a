"""``calibkit deploy`` as a library call: SOURCE + traffic -> a Triton model repository.

1. SOURCE (a tune or calibrate folder, or an engine) becomes a build recipe (:mod:`calibkit.deploy.source`);
   the model's inputs must have dynamic batch and sequence axes (:mod:`calibkit.deploy.modelio`).
2. The traffic log is read like ``sample`` reads logs and tokenized with the model's tokenizer
   (:mod:`calibkit.deploy.traffic`); its lengths choose the buckets (:mod:`calibkit.deploy.profiles`) and a
   token budget the batch sizes (:mod:`calibkit.deploy.batching`).
3. The repository is written at once (:mod:`calibkit.deploy.repository`): the model built by
   :func:`calibkit.engines.build.build` (ONNX Runtime: the CPU-fast INT8 layout; TensorRT: the Q/DQ ONNX, a
   ``build_engine.sh`` with the exact trtexec command and the same build through calibkit's backend),
   config.pbtxt, perf_analyzer data and command, README and deploy.json.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._version import __version__
from calibkit.deploy.batching import DEFAULT_BATCH_TOKENS, DEFAULT_MAX_BATCH, DEFAULT_QUEUE_DELAY_US, BatchingPlan
from calibkit.deploy.profiles import MAX_PROFILES, ROUND_TO, BucketChoice
from calibkit.errors import ModelError, UsageError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.types import Backend, Precision, check_seed

DEPLOY_FORMAT = "calibkit-deploy/1"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class DeployOptions:
    backend: Backend = Backend.ONNXRUNTIME
    traffic: Path | None = None  # None: the calibration set's log
    text_field: str | None = None
    strict: bool = False
    redact: bool = True
    profiles: int | None = None  # 1..4; None: auto (the fewest within 5 % of the best)
    name: str | None = None
    max_seq: int | None = None  # None: the longest request, rounded up to 8, at most the model's maximum
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_batch: int = DEFAULT_MAX_BATCH
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
    instances: int = 1
    threads: int | None = None  # ONNX Runtime intra-op threads per instance
    perf_requests: int = 512
    max_texts: int = 50_000
    seed: int = 0
    reduce_range: bool | None = None
    workspace_mib: int = 4096
    round_to: int = ROUND_TO


@dataclass(frozen=True)
class DeployResult:
    out_dir: Path
    name: str
    backend: Backend
    precision: Precision
    config_path: Path
    model_path: Path | None  # ONNX Runtime: NAME/1/model.onnx; TensorRT: None (built on the serving GPU)
    engine_onnx: Path | None  # TensorRT: the Q/DQ ONNX build_engine.sh builds from
    build_script: Path | None
    perf_data: Path
    perf_command: tuple[str, ...]
    trtexec: tuple[str, ...]
    readme: Path
    choice: BucketChoice
    choices: tuple[BucketChoice, ...]
    batching: BatchingPlan
    tensorrt_available: bool
    doc: dict[str, Any] = field(default_factory=dict)


def _check(options: DeployOptions) -> None:
    from calibkit.deploy.profiles import check_k
    from calibkit.deploy.triton import INT32_MAX, UINT64_MAX, check_range

    Backend(options.backend)
    check_seed(options.seed)
    if options.profiles is not None:
        check_k(options.profiles)
    if options.name is not None and not _NAME.match(options.name):
        raise UsageError(f"--name {options.name!r} is not a Triton model name",
                         hint="use letters, digits, '_', '-' and '.', starting with a letter, digit or '_'")
    for flag, v, lo in (("--perf-requests", options.perf_requests, 1), ("--max-texts", options.max_texts, 1),
                        ("--workspace-mib", options.workspace_mib, 1)):
        if v < lo:
            raise UsageError(f"{flag} must be at least {lo} (got {v})")
    # config.pbtxt's fields, checked before any work (TritonModelConfig checks them again as it is made)
    check_range("--instances", options.instances, 1, INT32_MAX, "instance_group count (int32)")
    check_range("--max-batch", options.max_batch, 1, INT32_MAX, "max_batch_size (int32)")
    check_range("--queue-delay-us", options.queue_delay_us, 0, UINT64_MAX, "max_queue_delay_microseconds (uint64)")
    if options.threads is not None:
        check_range("--threads", options.threads, 1, INT32_MAX, "intra_op_thread_count")
    if options.backend is Backend.TENSORRT and options.threads is not None:
        raise UsageError("--threads sets ONNX Runtime's intra-op threads; it does not apply to --backend tensorrt",
                         hint="drop --threads (use --instances for more TensorRT execution contexts)")
    if options.backend is Backend.TENSORRT and options.reduce_range is not None:
        raise UsageError("--reduce-range applies to the ONNX Runtime layout only",
                         hint="drop it with --backend tensorrt (TensorRT's INT8 GEMMs accumulate in int32)")


def default_name(model: Path, precision: Precision) -> str:
    stem = model.parent.name if model.name == "model.onnx" else model.stem
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "model"
    return f"{name}-{precision.value}"[:128]


def _emit(cb: ProgressCallback, done: int, message: str) -> None:
    cb(ProgressEvent("deploy", done, 5, message))


def deploy(source: str | Path, out_dir: str | Path, options: DeployOptions = DeployOptions(),
           progress: ProgressCallback | None = None) -> DeployResult:
    """Write a Triton model repository for SOURCE to ``out_dir``; raises a CalibkitError (nothing written)
    when it cannot."""
    import calibkit.deploy.batching as batching
    import calibkit.deploy.profiles as profiles
    import calibkit.deploy.traffic as traffic
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.deploy.modelio import read_model_io
    from calibkit.deploy.repository import check_model_name, guard_repository
    from calibkit.deploy.source import resolve_source
    from calibkit.deploy.triton import TritonModelConfig, label_output, labels_text
    from calibkit.provenance import run_inputs

    cb = progress or no_progress
    _check(options)
    backend = Backend(options.backend)
    out = Path(out_dir)
    _emit(cb, 0, "reading SOURCE")
    src = resolve_source(source)
    inputs = run_inputs([source, options.traffic, src.model, src.tokenizer, src.calibration_set])
    guard_repository(out, inputs)  # before any work, as the command line does
    md = ModelDir.resolve(src.model, src.tokenizer)
    io = read_model_io(md.onnx_path)  # before any work: a model without dynamic axes is refused here
    if backend is Backend.TENSORRT and src.precision is Precision.INT8 and src.calibration_json is None \
            and src.qdq_target != "tensorrt":
        raise ModelError(f"{src.path} is an ONNX Runtime-layout INT8 model (uint8 activations) without its "
                         "calibration table; TensorRT needs the int8 (tensorrt) layout",
                         hint="deploy the calibrate or tune folder it came from with --backend tensorrt")
    name = options.name or default_name(src.model, src.precision)
    check_model_name(name, "--name" if options.name else "the default name (pass --name)")
    label = label_output(io, md.id2label)  # label names with a line break are refused here, before any work
    warnings = _source_warnings(src, backend)

    _emit(cb, 1, "reading the traffic")
    cset = src.calibration_set or traffic.find_calibration_set(
        src.calibration_set_id, [Path("calibration_sets"), src.path.parent / "calibration_sets"])
    log, expected = options.traffic, None
    if log is None:  # the set's own log, only as it was when the set was drawn
        default = traffic.default_traffic_log(cset, src.path)
        log, expected = default.path, default.sha256
    tr = traffic.read_traffic(log, text_field=options.text_field, strict=options.strict, redact=options.redact,
                              max_texts=options.max_texts, seed=options.seed, expected_sha256=expected)
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    lengths = np.concatenate([tok.token_lengths(tr.texts[i : i + 4096]) for i in range(0, len(tr.texts), 4096)])

    _emit(cb, 2, "choosing profiles and batch sizes")
    top = profiles.largest_max(lengths, md.max_length, options.max_seq, options.round_to)
    # k beyond the distinct padded lengths the traffic has adds nothing: those choices are left out
    choices = tuple(c for k in range(1, MAX_PROFILES + 1)
                    if (c := profiles.choose_buckets(lengths, k, max_seq=top, round_to=options.round_to)).k == k)
    if options.profiles:
        choice = choices[min(options.profiles, len(choices)) - 1]
    else:
        choice = profiles.auto_k(choices)
    plan = batching.plan_batching([b.hi for b in choice.buckets], batch_tokens=options.batch_tokens,
                                  max_batch=options.max_batch, queue_delay_us=options.queue_delay_us)
    baseline = _baseline(lengths, md.max_length, options)

    _emit(cb, 3, "tokenizing the perf_analyzer requests")
    from calibkit.deploy.perfdata import build_perf_data, perf_analyzer_command

    rng = np.random.default_rng(options.seed)
    n = min(options.perf_requests, len(tr.texts))
    pick = np.sort(rng.choice(len(tr.texts), size=n, replace=False))
    perf = build_perf_data(tok, [tr.texts[i] for i in pick], [int(lengths[i]) for i in pick], choice,
                           io.input_names)
    perf_cmd = perf_analyzer_command(name, "perf_data.json", max_batch=plan.max_batch_size)

    import calibkit.deploy.trtexec as trt_cmd
    from calibkit.engines.tensorrt import available as trt_available

    shape_profiles = [trt_cmd.ShapeProfile((1, b.lo), (bs, b.hi), (plan.max_batch_size, b.hi))
                      for b, bs in zip(choice.buckets, plan.per_bucket)]
    engine_onnx = f"model.{src.precision.value}.onnx"
    argv = trt_cmd.trtexec_command(engine_onnx, "1/model.plan", io.input_names, shape_profiles,
                                   timing_cache="1/model.plan.timing.cache", workspace_mib=options.workspace_mib,
                                   layer_info="1/model.plan.layers.json")
    has_trt = trt_available()

    config = TritonModelConfig(name=name, backend=backend, io=io, max_batch_size=plan.max_batch_size,
                               preferred_batch_sizes=plan.preferred, queue_delay_us=plan.queue_delay_us,
                               instances=options.instances, profiles=choice.k, intra_op_threads=options.threads,
                               label_output=label)
    doc = {
        "format": DEPLOY_FORMAT, "calibkit_version": __version__, "name": name, "backend": backend.value,
        "precision": src.precision.value, "source": src.to_dict(),
        "traffic": {**tr.to_dict(), "default": options.traffic is None},
        "model": {"inputs": [{"name": t.name, "data_type": t.triton_type, "dims": list(t.dims)} for t in io.inputs],
                  "outputs": [{"name": t.name, "data_type": t.triton_type, "dims": list(t.dims)}
                              for t in io.outputs],
                  "max_length": md.max_length, "max_length_source": md.max_length_source, "label_output": label},
        "lengths": _length_summary(lengths),
        "profiles": {"chosen_k": choice.k, "requested_k": options.profiles, "auto": options.profiles is None,
                     "round_to": options.round_to,
                     "choices": [c.to_dict() for c in choices], "baseline": baseline},
        "batching": plan.to_dict(), "warnings": warnings,
        "perf_analyzer": {"requests": perf.requests, "per_bucket": list(perf.per_bucket), "command": perf_cmd},
        "tensorrt": {"available_here": has_trt, "trtexec": argv,
                     "profiles": [{"min": list(p.min_shape), "opt": list(p.opt_shape), "max": list(p.max_shape)}
                                  for p in shape_profiles]},
    }
    files = _texts(doc, config.render(), argv, perf_cmd, choice, plan, baseline, has_trt)
    if label is not None:
        files[f"{name}/labels.txt"] = labels_text(md.id2label)

    _emit(cb, 4, "building the model and writing the repository")
    from calibkit.deploy.engine import PROFILES_FILE, PlanSpec
    from calibkit.deploy.repository import RepositoryFiles, write_repository

    json_docs: dict[str, object] = {"deploy.json": doc}
    compact_docs: dict[str, object] = {"perf_data.json": perf.doc}
    executables: tuple[str, ...] = ("perf_analyzer.sh",)
    if backend is Backend.TENSORRT:
        json_docs[f"{name}/{PROFILES_FILE}"] = PlanSpec(
            engine_onnx, "1/model.plan", options.workspace_mib,
            tuple({"min_seq": p.min_shape[1], "opt_seq": p.opt_shape[1], "max_seq": p.max_shape[1],
                   "min_batch": p.min_shape[0], "opt_batch": p.opt_shape[0], "max_batch": p.max_shape[0]}
                  for p in shape_profiles)).to_dict()
        executables += (f"{name}/build_engine.sh",)

    def build_models(model_dir: Path) -> None:
        from calibkit.engines.build import build

        target = model_dir / "1" / "model.onnx" if backend is Backend.ONNXRUNTIME else model_dir / engine_onnx
        build(_build_request(src, target, backend, options))

    write_repository(out, name, RepositoryFiles(files, executables, json_docs, compact_docs), build_models=build_models,
                     inputs=run_inputs([*inputs.paths, tr.path, cset]))
    _emit(cb, 5, "done")
    mdir = out / name
    return DeployResult(
        out_dir=out, name=name, backend=backend, precision=src.precision, config_path=mdir / "config.pbtxt",
        model_path=mdir / "1" / "model.onnx" if backend is Backend.ONNXRUNTIME else None,
        engine_onnx=mdir / engine_onnx if backend is Backend.TENSORRT else None,
        build_script=mdir / "build_engine.sh" if backend is Backend.TENSORRT else None,
        perf_data=out / "perf_data.json", perf_command=tuple(perf_cmd), trtexec=tuple(argv),
        readme=out / "README.md", choice=choice, choices=choices, batching=plan, tensorrt_available=has_trt, doc=doc)


def _source_warnings(src: Any, backend: Backend) -> list[str]:
    """What the chosen backend gets that is not its own layout (the model is served as it is)."""
    if (backend is Backend.ONNXRUNTIME and src.precision is Precision.INT8 and src.calibration_json is None
            and src.qdq_target == "tensorrt"):
        return [f"{src.path} has no calibration table, so its TensorRT-layout Q/DQ model is served as it is: ONNX "
                "Runtime runs that layout slower than FP32 on CPUs; deploy the calibrate or tune folder for the "
                "CPU-fast layout"]
    return []


def _build_request(src: Any, target: Path, backend: Backend, options: DeployOptions) -> Any:
    from calibkit.engines.build import BuildRequest

    common = {"model": src.model, "tokenizer": src.tokenizer, "output": target}
    if src.precision is not Precision.INT8:
        return BuildRequest(**common, precision=src.precision,
                            keep_nodes=src.keep_nodes if src.precision is Precision.FP16 else ())
    layout = "onnxruntime" if backend is Backend.ONNXRUNTIME else "tensorrt"
    if src.calibration_json is not None and not (src.qdq_model is not None and src.qdq_target == layout
                                                 and backend is Backend.TENSORRT):
        reduce = options.reduce_range
        if reduce is None and src.weight_bits is not None and src.qdq_target == "onnxruntime":
            reduce = src.weight_bits == 7  # as the engine deployed was built
        return BuildRequest(**common, precision=Precision.INT8, calibration=src.calibration_json, target=layout,
                            keep_nodes=src.keep_nodes, reduce_range=reduce if layout == "onnxruntime" else None)
    return BuildRequest(**common, precision=Precision.INT8, qdq_model=src.qdq_model)


def _baseline(lengths: np.ndarray, model_max: int, options: DeployOptions) -> dict[str, Any]:
    """One profile 1..model_max: every request padded to model_max (equal shapes, as Triton batches), and the
    same profile with arrival-order batches each padded to its longest request (a server that pads per batch)."""
    from calibkit.deploy.batching import batch_for
    from calibkit.deploy.profiles import padded_by_arrival

    clipped = np.clip(lengths, 1, model_max)
    real = int(clipped.sum())
    batch = batch_for(model_max, options.batch_tokens, options.max_batch)
    arrival = padded_by_arrival(lengths, batch, model_max)
    return {"max_seq": model_max, "real_tokens": real, "padded_tokens_padded_to_max": int(clipped.size) * model_max,
            "waste_padded_to_max": (int(clipped.size) * model_max - real) / real,
            "arrival_batch": batch, "padded_tokens_arrival_batches": arrival,
            "waste_arrival_batches": (arrival - real) / real}


def _length_summary(lengths: np.ndarray) -> dict[str, Any]:
    q = np.percentile(lengths, [50, 90, 99, 100])
    return {"count": int(lengths.size), "mean": float(lengths.mean()), "p50": float(q[0]), "p90": float(q[1]),
            "p99": float(q[2]), "max": int(q[3])}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _texts(doc: dict[str, Any], config: str, argv: list[str], perf_cmd: list[str], choice: BucketChoice,
           plan: BatchingPlan, baseline: dict[str, Any], has_trt: bool) -> dict[str, str]:
    import calibkit.deploy.perfdata as perfdata

    name, backend = doc["name"], Backend(doc["backend"])
    files: dict[str, str] = {f"{name}/config.pbtxt": config}
    files["perf_analyzer.sh"] = ("#!/bin/sh\n# Load test replaying real traffic lengths (written by calibkit deploy).\n"
                                 "# Run from this folder while the server runs (see README.md).\n"
                                 'cd "$(dirname "$0")" || exit 1\n' + perfdata.render(perf_cmd) + ' "$@"\n')
    if backend is Backend.TENSORRT:
        files[f"{name}/build_engine.sh"] = _build_script(name, argv)
    files["README.md"] = _readme(doc, choice, plan, baseline, has_trt, config, argv, perf_cmd)
    return files


def _build_script(name: str, argv: list[str]) -> str:
    from calibkit.deploy.trtexec import render

    return f"""#!/bin/sh
# Builds {name}/1/model.plan on the serving GPU (written by calibkit deploy). A TensorRT engine is tied to the GPU
# model and the TensorRT version that built it: run this inside the Triton container that will serve it
# (trtexec is /usr/src/tensorrt/bin/trtexec there).
#   ./build_engine.sh            with trtexec (strongly typed, one optimization profile per length bucket)
#   ./build_engine.sh --calibkit the same build through calibkit's TensorRT backend (pip install 'calibkit[tensorrt]')
set -e
cd "$(dirname "$0")"
if [ "$1" = "--calibkit" ]; then
    exec python -m calibkit.deploy.engine .
fi
TRTEXEC="${{TRTEXEC:-$(command -v trtexec || echo /usr/src/tensorrt/bin/trtexec)}}"
"$TRTEXEC" {render(argv[1:])}
"""


def _readme(doc: dict[str, Any], choice: BucketChoice, plan: BatchingPlan, baseline: dict[str, Any], has_trt: bool,
            config: str, argv: list[str], perf_cmd: list[str]) -> str:
    from calibkit.deploy.perfdata import render as render_perf
    from calibkit.deploy.trtexec import render as render_trt

    name, backend = doc["name"], Backend(doc["backend"])
    tr, ln = doc["traffic"], doc["lengths"]
    rows = "\n".join(
        f"| {c['k']} | {', '.join(str(b['hi']) for b in c['buckets'])} | {c['padded_tokens']:,} | "
        f"{_pct(c['waste'])} |" for c in doc["profiles"]["choices"])
    buckets = "\n".join(
        f"| {b.lo}–{b.hi} | {b.requests:,} ({_pct(b.requests / choice.requests)}) | {b.median_length} | "
        f"{bs} |" for b, bs in zip(choice.buckets, plan.per_bucket))
    if backend is Backend.ONNXRUNTIME:
        serve = (f"```bash\ndocker run --rm -p8000:8000 -p8001:8001 -p8002:8002 -v \"$PWD\":/models \\\n"
                 f"    nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models\n```\n\n"
                 f"`{name}/1/model.onnx` is the ONNX Runtime INT8 layout for CPUs (`calibkit build --target "
                 "onnxruntime`: uint8 activations on the weight MatMuls, which ONNX Runtime fuses into its integer "
                 "kernels)." if doc["precision"] == "int8" else
                 "```bash\ndocker run --rm -p8000:8000 -p8001:8001 -p8002:8002 -v \"$PWD\":/models \\\n"
                 "    nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models\n```\n")
        trt_note = ""
    else:
        serve = (f"First build the engine on the serving GPU, inside the Triton container (its TensorRT must be the "
                 f"one that serves the plan):\n\n```bash\ndocker run --rm --gpus=1 -v \"$PWD\":/models "
                 f"nvcr.io/nvidia/tritonserver:<yy.mm>-py3 /models/{name}/build_engine.sh\n"
                 f"docker run --rm --gpus=1 -p8000:8000 -p8001:8001 -p8002:8002 -v \"$PWD\":/models \\\n"
                 f"    nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models\n```\n\n"
                 f"`{name}/build_engine.sh` runs:\n\n```bash\n{render_trt(argv)}\n```\n\n"
                 f"`{name}/build_engine.sh --calibkit` makes the same build through calibkit's TensorRT backend "
                 f"(`python -m calibkit.deploy.engine {name}`, reading `{name}/trt_profiles.json`).")
        trt_note = ("\n\n**TensorRT is not installed where this repository was written**: the engine was not built "
                    "and the trtexec command below was not run here. It is checked against trtexec's documented flags "
                    "only." if not has_trt else "")
    return f"""# Triton model repository: {name}

Written by calibkit {doc['calibkit_version']} (`calibkit deploy`) from `{doc['source']['path']}`
({doc['source']['kind']}, {doc['precision']}), for {backend.value} (`{'onnxruntime_onnx' if
backend is Backend.ONNXRUNTIME else 'tensorrt_plan'}`).{trt_note}

## Start the server

{serve}

Clients pad each request to its bucket's length (below) with the tokenizer's pad id and attention mask 0:
Triton batches only requests of equal shape, so requests of one bucket batch together.

## Load test with real traffic

```bash
{render_perf(perf_cmd)}
```

`perf_data.json` holds {doc['perf_analyzer']['requests']} requests drawn at random from the traffic, tokenized
with the model's tokenizer and padded to their bucket (perf_analyzer's real-input JSON format).

## What was chosen and why

Traffic: `{tr['path']}`, {tr['usable']:,} usable requests ({tr['texts']:,} used{', a uniform sample' if
tr['sampled'] else ''}); token lengths p50 {ln['p50']:.0f}, p90 {ln['p90']:.0f}, p99 {ln['p99']:.0f}, max
{ln['max']} (model maximum {doc['model']['max_length']}).

Length buckets (one TensorRT optimization profile each: min = the bucket's shortest length, opt = max = its
padded length), chosen by dynamic programming to minimise padded tokens; padding waste = padded tokens per real
token:

| k | bucket maxes | padded tokens | waste |
|---|---|---|---|
{rows}

One profile 1–{baseline['max_seq']}, every request padded to {baseline['max_seq']}: waste
{_pct(baseline['waste_padded_to_max'])}; the same profile with arrival-order batches of
{baseline['arrival_batch']} each padded to its longest request: {_pct(baseline['waste_arrival_batches'])}.
Chosen: **k = {choice.k}** ({'auto: the fewest profiles within 5 % of the best' if doc['profiles']['auto'] else
f"--profiles {doc['profiles']['requested_k']}"}), waste {_pct(choice.waste)}.
{choice.over_max:,} requests ({_pct(choice.over_max_share)}) are longer than the largest max {choice.max_seq}
and are truncated to it (or must be refused).

| bucket (tokens) | requests | median length | preferred batch |
|---|---|---|---|
{buckets}

Batch sizes come from a budget of {plan.batch_tokens:,} padded tokens per batch (the largest power of two with
batch x length within it, at most --max-batch):
`preferred_batch_size` {list(plan.preferred)}, `max_batch_size` {plan.max_batch_size} (Triton applies it to every
length, so a batch of the longest bucket may reach {plan.worst_tokens:,} tokens),
`max_queue_delay_microseconds` {plan.queue_delay_us}.

## config.pbtxt

```
{config}```

Every number above is in `deploy.json`.
"""
