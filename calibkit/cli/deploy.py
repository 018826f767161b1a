"""`calibkit deploy`: a tuned plan (or a calibration, or an engine) -> a Triton model repository."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from calibkit.cli._common import RichProgress, guard_out_dir, out, say, warn
from calibkit.cli._requests import FORCE_ONLY, cli_paths, request_command
from calibkit.requests.deploy import DeployRequest
from calibkit.requests.resources import ResourceOptions
from calibkit.types import request_path

if TYPE_CHECKING:
    from calibkit.results.documents import DeployResult

HELP = """Write a Triton Inference Server model repository for SOURCE, shaped by the traffic it will serve.

SOURCE is a folder written by `calibkit tune` (the tuned plan) or `calibkit calibrate`, or an engine written by
`calibkit build` (with its .calibkit.json sidecar). Deploy ships what was measured: the INT8 Q/DQ layout SOURCE
was measured in (tune's plan, the calibration's --target, the engine's own), unless --layout asks for another,
which is shipped with a warning; it sizes the server from the traffic's token lengths.

Measured in the same run (ONNX Runtime): the model written, against FP32, on --measure-texts traffic texts
(calibration texts left out): agreement with FP32 with its 95 % interval, and per-batch latency against FP32
(same texts, same batches, same session options). Both are in deploy.json and the README, and summarised here.

Traffic: --traffic LOG is read like `calibkit sample` reads logs (JSON Lines, plain or .gz; --text-field, broken
lines skipped and counted, personal data redacted unless --no-redact) and tokenized with the model's tokenizer.
Default: for a tune folder, the log tune judged agreement on (tune.json); else the log the calibration set was
drawn from (its manifest.json); each only while it holds the bytes it had then.

What is chosen, and why:
  length buckets   Triton batches only requests of equal shape, so clients pad each request to its bucket's
                   length. --profiles K (1-4; auto, the default: the fewest within 5 % of the best) buckets are chosen
                   by dynamic programming to minimise padded tokens; each is one TensorRT optimization profile
                   (min = its shortest length, opt = max = its padded length). The padding waste of every k is
                   reported against one 1-512 profile, with the share of requests longer than the largest max.
  batch sizes      from a budget of --batch-tokens padded tokens per batch (the largest power of two within it,
                   per bucket): preferred_batch_size and max_batch_size, plus --queue-delay-us.

OUT (a new folder, or one calibkit wrote; anything else is refused) receives:
  NAME/config.pbtxt        onnxruntime_onnx | tensorrt_plan, dynamic dims, dynamic_batching, instance_group,
                           label_filename (NAME/labels.txt) when the model has label names
  NAME/1/model.onnx        ONNX Runtime: the INT8 model in the measured layout (or --layout)
  NAME/build_engine.sh     TensorRT: the exact trtexec command (strongly typed, min/opt/max shapes per input and
                           profile, timing cache) and, with --calibkit, the same build through calibkit's TensorRT
                           backend; run it on the serving GPU. TensorRT is not needed (and often absent) here.
  perf_data.json, perf_analyzer.sh   real traffic texts, tokenized and bucket-padded, for perf_analyzer
  README.md, deploy.json   how to start the server; every choice, the numbers behind it, the measurement

Examples:

  calibkit deploy runs/tune-model --out serving/   (--backend onnxruntime, the default, as in `calibkit build`)

  calibkit deploy runs/tune-model --backend onnxruntime --out serving-fast/ --layout onnxruntime --measure-texts 2000

  calibkit deploy runs/tune-model --backend tensorrt --out serving-trt/ --traffic logs/prod.jsonl.gz --profiles 3

  calibkit deploy runs/entropy --backend onnxruntime --out serving/ --traffic prod.jsonl --text-field request.text

  calibkit deploy engines/int8.onnx --backend onnxruntime --out serving/ --name sentiment --batch-tokens 4096
"""


def register(app: typer.Typer) -> None:
    app.command("deploy", help=HELP, short_help="Write a Triton model repository sized by the traffic.",
                no_args_is_help=True)(deploy)


RESOURCES: tuple[str, ...] = ()  # deploy takes no worker, executor or memory option
PRESENTATION = FORCE_ONLY


def run_deploy(request: DeployRequest, resources: ResourceOptions, *, force: bool) -> None:
    """Check the request and OUT, make one ``calibkit.api.run`` call, print what was written and measured."""
    from calibkit.api import run

    guard_out_dir(request_path(request.out), inputs=cli_paths(request.source, request.traffic), force=force)
    with RichProgress() as progress:
        res = run(request, resources, progress)
    _summary(res)


deploy = request_command(DeployRequest, run_deploy, resources=RESOURCES, extra=PRESENTATION)


def _summary(res: DeployResult) -> None:
    from rich.table import Table

    tr = res.traffic
    origin = {"tune": " (the log tune judged agreement on)", "calibration set": " (the calibration set log)"}
    say(f"traffic: {tr.path}{origin.get(tr.origin, '')}: {tr.usable:,} usable "
        f"requests of {tr.lines:,} lines" + (f", {tr.texts:,} sampled" if tr.sampled else ""))
    base = res.profiles.baseline
    t = Table(title=f"length buckets (padding waste = padded / real tokens - 1; one 1-{base.max_seq} profile: "
                    f"{100 * base.waste_padded_to_max:.1f} % padded to {base.max_seq}, "
                    f"{100 * base.waste_arrival_batches:.1f} % in arrival batches)")
    for col in ("k", "bucket maxes", "padded tokens", "waste", ""):
        t.add_column(col, justify="left" if col in ("bucket maxes", "") else "right")
    for c in res.choices:
        t.add_row(str(c.k), ", ".join(str(b.hi) for b in c.buckets), f"{c.padded_tokens:,}", f"{100 * c.waste:.1f} %",
                  "chosen" if c.k == res.choice.k else "")
    out.print(t)
    ch = res.choice
    say(f"{ch.over_max:,} of {ch.requests:,} requests ({100 * ch.over_max_share:.2f} %) are longer than the largest "
        f"max {ch.max_seq} (truncated to it, or to be refused)")
    b = res.batching
    say(f"batching: preferred_batch_size {list(b.preferred)}, max_batch_size {b.max_batch_size} "
        f"(budget {b.batch_tokens:,} padded tokens per batch), max_queue_delay_microseconds {b.queue_delay_us}")
    _say_measurement(res)
    for w in _warnings(res):
        warn(w)
    say(f"wrote {res.out_dir}/ ({res.name}/config.pbtxt, README.md, deploy.json, perf_data.json)")
    if res.model_path is not None:
        say(f"  model: {res.model_path}")
    if res.build_script is not None:
        state = "installed here" if res.tensorrt_available else "NOT installed here: nothing was built"
        say(f"  TensorRT is {state}; build {res.name}/1/model.plan on the serving GPU with {res.build_script}")
    say(f"  start: tritonserver --model-repository={res.out_dir}   load test: {res.out_dir}/perf_analyzer.sh")


def _say_measurement(res: DeployResult) -> None:
    lay = res.layout
    if lay is not None:
        say(f"layout: {lay.shipped}" + (" (as measured)" if lay.as_measured else
                                        f" (NOT the measured {lay.measured} layout)"))
    m = res.measurement
    if m is None:
        say(f"measured: {res.measurement_note}")
        return
    ci = m.agreement_ci
    agree = "agreement not measured for this task" if m.agreement is None else \
        f"agreement with FP32 {100 * m.agreement:.2f} %" + (
            f" [{100 * ci.low:.2f}, {100 * ci.high:.2f}] 95 %" if ci and ci.low is not None and ci.high is not None
            else "")
    lat = m.latency
    say(f"measured on {m.texts:,} traffic texts: {agree}")
    if m.speed is not None:
        say(f"speed: {m.speed.words} ({m.speed.threads} threads, {m.speed.rounds} interleaved rounds; "
            f"{m.speed.cpu}: {m.speed.isa})")
    else:
        say(f"per batch of {lat.batch_size}: {lat.served_median_ms:.2f} ms served vs {lat.fp32_median_ms:.2f} ms FP32 "
            f"({lat.speedup:.2f}x FP32's speed)")


def _warnings(res: DeployResult) -> list[str]:
    found = list(res.warnings)
    req = res.profiles.requested_k
    if req is not None and req > res.choice.k:
        found.append(f"--profiles {req}: the traffic has only {res.choice.k} distinct padded lengths, so "
                     f"{res.choice.k} profiles were written")
    return found
