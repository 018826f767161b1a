"""`calibkit smooth`: a smoothed FP32 model folder (activation outliers moved into the weights) to calibrate."""

from __future__ import annotations

from pathlib import Path

import typer

from calibkit.cli._common import (
    FORCE,
    INTEGER,
    MAX_BATCH_TOKENS,
    MEMORY_BUDGET,
    TOKENIZER,
    RichProgress,
    guard_out_dir,
    handle_errors,
    say,
)

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


def smooth(
    model: Path = typer.Argument(..., help="Model folder (model.onnx + tokenizer + config.json) or an .onnx file."),
    calibration_set: Path = typer.Option(..., "--calibration-set", "-c", help="Folder written by `calibkit sample`."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="The smoothed model folder to write (new, or calibkit's)."),
    alpha: str = typer.Option(
        "auto", "--alpha",
        help="Migration strength in [0, 1] (1: activations flattened, the weights take every outlier), or auto: "
             "per activation, the alpha with the least INT8 product error on the calibration rows."),
    tokenizer: Path | None = TOKENIZER,
    batch_size: int = typer.Option(32, "--batch-size", "-b", parser=INTEGER, help="Most texts per inference batch."),
    memory_budget: str = MEMORY_BUDGET,
    max_batch_tokens: int | None = MAX_BATCH_TOKENS,
    force: bool = FORCE,
) -> None:
    with handle_errors():
        from calibkit.errors import UsageError

        value: float | None
        if alpha.strip().lower() == "auto":
            value = None
        else:
            try:
                value = float(alpha)  # NaN, infinities and the range are refused by calibkit.api.smooth
            except ValueError:
                raise UsageError(f"--alpha must be a number in [0, 1] or auto, got {alpha!r}") from None
        if batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
        from calibkit.api import budget
        from calibkit.api import smooth as run_smooth
        from calibkit.data.calibset import load_calibration_set
        from calibkit.data.modeldir import ModelDir

        budget(memory_budget, max_batch_tokens)  # a bad --memory-budget is refused before any work
        md = ModelDir.resolve(model, tokenizer)
        cset = load_calibration_set(calibration_set)
        guard_out_dir(out_dir, inputs=[model, calibration_set, tokenizer, md.onnx_path.parent], force=force)
        with RichProgress() as progress:
            result = run_smooth(md, cset, out_dir, alpha=value, batch_size=batch_size, memory_budget=memory_budget,
                                max_batch_tokens=max_batch_tokens, progress=progress)
        done = result.smoothed
        gains = sorted(c.gain_db for c in done)
        say(f"smoothed {len(done)} of {result.groups} activations read by weight MatMuls "
            f"(alpha {'auto' if value is None else value})"
            + (f"; INT8 product error down {gains[0]:.1f}-{gains[-1]:.1f} dB on the calibration rows" if gains
               else ""))
        say(f"FP32 outputs of the smoothed model match the original's to {result.max_deviation:.1e} of their range")
        say(f"wrote {result.out_dir}/ (model.onnx, smoothing.json, tokenizer and config) in "
            f"{result.timings.get('total', 0):.1f} s; next: calibkit calibrate {result.out_dir} -c {calibration_set}")
