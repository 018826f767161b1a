"""The repository's text files rendered from its :class:`DeployResult`: README.md, perf_analyzer.sh and (TensorRT)
build_engine.sh. Every number in them is a field of deploy.json."""

from __future__ import annotations

from calibkit.results.documents import DeployResult, ServedLatency, ServedMeasurement
from calibkit.types import Backend

_DOCKER = ("docker run --rm -p8000:8000 -p8001:8001 -p8002:8002 -v \"$PWD\":/models \\\n"
           "    nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models")


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def perf_script(res: DeployResult) -> str:
    from calibkit.deploy.perfdata import render

    return ("#!/bin/sh\n# Load test replaying real traffic lengths (written by calibkit deploy).\n"
            "# Run from this folder while the server runs (see README.md).\n"
            'cd "$(dirname "$0")" || exit 1\n' + render(list(res.perf_command)) + ' "$@"\n')


def build_script(res: DeployResult) -> str:
    from calibkit.deploy.trtexec import render

    return f"""#!/bin/sh
# Builds {res.name}/1/model.plan on the serving GPU (written by calibkit deploy). A TensorRT engine is tied to the
# GPU model and the TensorRT version that built it: run this inside the Triton container that will serve it
# (trtexec is /usr/src/tensorrt/bin/trtexec there).
#   ./build_engine.sh            with trtexec (strongly typed, one optimization profile per length bucket)
#   ./build_engine.sh --calibkit the same build through calibkit's TensorRT backend (pip install 'calibkit[tensorrt]')
set -e
cd "$(dirname "$0")"
if [ "$1" = "--calibkit" ]; then
    exec python -m calibkit.deploy.engine .
fi
TRTEXEC="${{TRTEXEC:-$(command -v trtexec || echo /usr/src/tensorrt/bin/trtexec)}}"
"$TRTEXEC" {render(list(res.tensorrt.trtexec[1:]))}
"""


def _serve(res: DeployResult) -> str:
    """How to start the server, and what the model file is."""
    from calibkit.deploy.trtexec import render

    name = res.name
    if res.backend is Backend.TENSORRT:
        return (f"First build the engine on the serving GPU, inside the Triton container (its TensorRT must be the "
                f"one that serves the plan):\n\n```bash\ndocker run --rm --gpus=1 -v \"$PWD\":/models "
                f"nvcr.io/nvidia/tritonserver:<yy.mm>-py3 /models/{name}/build_engine.sh\n"
                f"{_DOCKER.replace('docker run --rm', 'docker run --rm --gpus=1', 1)}\n```\n\n"
                f"`{name}/build_engine.sh` runs:\n\n```bash\n{render(list(res.tensorrt.trtexec))}\n```\n\n"
                f"`{name}/build_engine.sh --calibkit` makes the same build through calibkit's TensorRT backend "
                f"(`python -m calibkit.deploy.engine {name}`, reading `{name}/trt_profiles.json`).\n"
                + _layout_line(res))
    text = f"```bash\n{_DOCKER}\n```\n"
    return text + _layout_line(res)


def _layout_line(res: DeployResult) -> str:
    lay = res.layout
    if lay is None:
        return ""
    kind = ("ONNX Runtime's fused INT8 layout (uint8 activations on the weight MatMuls, which ONNX Runtime fuses "
            "into its integer kernels)" if lay.shipped == "onnxruntime" else
            "the TensorRT Q/DQ layout (int8 activations on every quantized MatMul/Gemm input)")
    measured = ("the layout SOURCE was measured in" if lay.as_measured else
                f"**not** the {lay.measured} layout SOURCE was measured in")
    where = f"`{res.name}/1/model.onnx`" if res.backend is Backend.ONNXRUNTIME else \
        f"`{res.name}/model.{res.precision.value}.onnx`"
    return f"\n{where} is {kind}: {measured}."


def _measured(res: DeployResult) -> str:
    m = res.measurement
    if m is None:
        note = res.measurement_note or "not measured"
        return f"{note[0].upper()}{note[1:]}."
    return _measurement(m, res)


def _measurement(m: ServedMeasurement, res: DeployResult) -> str:
    lat = m.latency
    ci = m.agreement_ci
    agree = ("agreement is not measured for this task (no per-text fidelity)" if m.agreement is None else
             f"agreement with FP32 **{100 * m.agreement:.2f} %**" +
             (f" (95 % interval {100 * ci.low:.2f}–{100 * ci.high:.2f} %)" if ci and ci.low is not None
              and ci.high is not None else ""))
    cos = f", mean cosine to FP32's vectors {m.cosine:.5f}" if m.cosine is not None else ""
    threads = f"{lat.threads} intra-op threads" if lat.threads else "ONNX Runtime's default threads"
    return (f"`{res.name}/1/model.onnx` against the FP32 model, on {m.texts:,} texts drawn from the traffic (seed "
            f"{m.seed}; {m.calibration_texts_left_out:,} calibration texts left out), task {m.task}: {agree}{cos}.\n\n"
            f"Speed, measured beside FP32 on the machine that wrote this repository ({threads}, every graph "
            f"optimization, the same batches of these texts for both, interleaved rounds, the ratio of medians, "
            f"in brackets the lowest and highest single round): "
            + (f"{m.speed.words}; " if m.speed is not None else "")
            + f"at batch {lat.batch_size}{_lengths(lat)}, {lat.served_median_ms:.2f} ms served against "
            f"{lat.fp32_median_ms:.2f} ms "
            f"FP32 per batch: **{lat.speedup:.2f}x** ({_verdict(m)}). "
            f"The serving machine's numbers may differ: "
            f"`perf_analyzer.sh` measures them there.")


def _lengths(lat: ServedLatency) -> str:
    if lat.shortest is None or lat.longest is None:
        return ""
    return (f" (requests of {lat.shortest}–{lat.longest} tokens, the length bucket most requests fall in, the "
            f"batch Triton forms of them)")


def _verdict(m: ServedMeasurement) -> str:
    """Faster or slower than FP32, by the batch size at which the served model gains least."""
    if m.speed is None:
        return "faster than FP32" if m.latency.speedup >= 1 else "slower than FP32"
    low = m.speed.slowest
    if low.speedup >= 1:
        return "faster than FP32 at every batch size measured"
    return f"SLOWER than FP32 at batch {low.batch_size}: {low.speedup:.2f}x"


def _buckets(res: DeployResult) -> str:
    choice, plan, base = res.choice, res.batching, res.profiles.baseline
    rows = "\n".join(f"| {c.k} | {', '.join(str(b.hi) for b in c.buckets)} | {c.padded_tokens:,} | {_pct(c.waste)} |"
                     for c in res.choices)
    buckets = "\n".join(
        f"| {b.lo}–{b.hi} | {b.requests:,} ({_pct(b.requests / choice.requests)}) | {b.median_length} | {bs} |"
        for b, bs in zip(choice.buckets, plan.per_bucket))
    how = ("auto: the fewest profiles within 5 % of the best" if res.profiles.auto else
           f"--profiles {res.profiles.requested_k}")
    return f"""Length buckets (one TensorRT optimization profile each: min = the bucket's shortest length, opt = max =
its padded length), chosen by dynamic programming to minimise padded tokens; padding waste = padded tokens per
real token:

| k | bucket maxes | padded tokens | waste |
|---|---|---|---|
{rows}

One profile 1–{base.max_seq}, every request padded to {base.max_seq}: waste {_pct(base.waste_padded_to_max)}; the
same profile with arrival-order batches of {base.arrival_batch} each padded to its longest request:
{_pct(base.waste_arrival_batches)}. Chosen: **k = {choice.k}** ({how}), waste {_pct(choice.waste)}.
{choice.over_max:,} requests ({_pct(choice.over_max_share)}) are longer than the largest max {choice.max_seq}
and are truncated to it (or must be refused).

| bucket (tokens) | requests | median length | preferred batch |
|---|---|---|---|
{buckets}

Batch sizes come from a budget of {plan.batch_tokens:,} padded tokens per batch (the largest power of two with
batch x length within it, at most --max-batch):
`preferred_batch_size` {list(plan.preferred)}, `max_batch_size` {plan.max_batch_size} (Triton applies it to every
length, so a batch of the longest bucket may reach {plan.worst_tokens:,} tokens),
`max_queue_delay_microseconds` {plan.queue_delay_us}."""


def readme(res: DeployResult, config: str) -> str:
    from calibkit.deploy.perfdata import render

    tr, ln = res.traffic, res.lengths
    platform = "onnxruntime_onnx" if res.backend is Backend.ONNXRUNTIME else "tensorrt_plan"
    trt_note = ("\n\n**TensorRT is not installed where this repository was written**: the engine was not built and "
                "the trtexec command below was not run here. It is checked against trtexec's documented flags only."
                if res.backend is Backend.TENSORRT and not res.tensorrt_available else "")
    warnings = "".join(f"\n\n> **Warning:** {w}" for w in res.warnings)
    return f"""# Triton model repository: {res.name}

Written by calibkit {res.calibkit_version} (`calibkit deploy`) from `{res.source.path}`
({res.source.kind}, {res.precision.value}), for {res.backend.value} (`{platform}`).{trt_note}{warnings}

## Start the server

{_serve(res)}

Clients pad each request to its bucket's length (below) with the tokenizer's pad id and attention mask 0:
Triton batches only requests of equal shape, so requests of one bucket batch together.

## Measured: the served model against FP32

{_measured(res)}

## Load test with real traffic

```bash
{render(list(res.perf_command))}
```

`perf_data.json` holds {res.perf_analyzer.requests} requests drawn at random from the traffic, tokenized
with the model's tokenizer and padded to their bucket (perf_analyzer's real-input JSON format).

## What was chosen and why

Traffic: `{tr.path}`, {tr.usable:,} usable requests ({tr.texts:,} used{', a uniform sample' if tr.sampled else ''});
token lengths p50 {ln.p50:.0f}, p90 {ln.p90:.0f}, p99 {ln.p99:.0f}, max {ln.max} (model maximum
{res.model.max_length}).

{_buckets(res)}

## config.pbtxt

```
{config}```

Every number above is in `deploy.json`.
"""
