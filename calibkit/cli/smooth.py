"""`calibkit smooth`: a smoothed FP32 model folder (activation outliers moved into the weights) to calibrate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import typer

from calibkit.cli._common import RichProgress, guard_out_dir, say
from calibkit.cli._requests import FORCE_ONLY, cli_paths, request_command
from calibkit.requests.resources import ResourceOptions
from calibkit.requests.smooth import SmoothRequest

HELP = """Smooth a model before calibrating it (SmoothQuant): a few channels of a transformer's activations are
5-30x larger than the rest (the GELU outputs feeding each FFN's second Linear, the LayerNorm outputs), and a
per-tensor INT8 range sized for them leaves the other channels a handful of levels. smooth divides each such
activation by a per-channel scale s and multiplies the weights that read it by s, so the FP32 model computes the
same function (checked: the smoothed and original models are run side by side on calibration texts and the
folder is refused if they differ by more than float rounding) while the INT8 error falls.

The model runs once over the calibration set for per-channel maxima and a few sampled rows per activation; with
--alpha auto (the default) each activation gets the alpha (0.5-1.0, or no smoothing) whose fake-quantized INT8
product is closest to FP32 on those rows. OUT is a model folder like MODEL (model.onnx, tokenizer and config
copied) plus smoothing.json (alpha and error reduction per activation). calibrate, build, compare and tune
take it as they take MODEL; compare its INT8 build against the original FP32 model.

On the demo model (mse, 2,114 test texts) smoothing cut the INT8 model's flips of FP32's predictions from 37 to
about 20-27 and the KL divergence to FP32 by 4-7x; see the README for the command that measures it.

Examples:

  calibkit smooth demo_assets/model -c calibration_sets/logs-n512-s0 --out models/minilm-smoothed
  calibkit calibrate models/minilm-smoothed -c calibration_sets/logs-n512-s0 --method minmax

  calibkit smooth model.onnx --tokenizer hf/bert -c calib/ --alpha 0.8 --out bert-smoothed
"""


def register(app: typer.Typer) -> None:
    app.command("smooth", help=HELP,
                short_help="Move activation outliers into the weights (SmoothQuant).", no_args_is_help=True)(smooth)


RESOURCES = ("memory_budget", "max_batch_tokens")
PRESENTATION = FORCE_ONLY


def run_smooth(request: SmoothRequest, resources: ResourceOptions, *, force: bool) -> None:
    """Check the request, load MODEL and the calibration set, check OUT, make one ``calibkit.api.run`` call and
    print what was smoothed."""
    from calibkit.api import run
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.modeldir import ModelDir

    model, cset_path, tokenizer = cli_paths(request.model, request.calibration_set, request.tokenizer)
    md = ModelDir.resolve(cast(Path, model), tokenizer)  # typer requires MODEL and --calibration-set as paths
    cset = load_calibration_set(cast(Path, cset_path))
    out = cast(Path, request.out)  # typer requires OUT and parses it as a path
    guard_out_dir(out, inputs=[model, cset_path, tokenizer, md.onnx_path], force=force)
    with RichProgress() as progress:
        result = run(replace(request, model=md, calibration_set=cset), resources, progress)
    done = result.smoothed
    gains = sorted(c.gain_db for c in done)
    say(f"smoothed {len(done)} of {result.groups} activations read by weight MatMuls (alpha {request.alpha})"
        + (f"; INT8 product error down {gains[0]:.1f}-{gains[-1]:.1f} dB on the calibration rows" if gains else ""))
    say(f"FP32 outputs of the smoothed model match the original's to {result.max_deviation:.1e} of their range")
    say(f"wrote {result.out_dir}/ (model.onnx, smoothing.json, tokenizer and config) in "
        f"{result.timings.get('total', 0):.1f} s; next: calibkit calibrate {result.out_dir} -c {cset_path}")


smooth = request_command(SmoothRequest, run_smooth, resources=RESOURCES, extra=PRESENTATION)
