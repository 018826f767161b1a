"""`calibkit calibrate`: activation ranges -> INT8 Q/DQ model, TensorRT cache and calibration.json."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import cast

import typer

from calibkit.cli._common import FORCE, RichProgress, count, guard_out_dir, say, warn
from calibkit.cli._requests import cli_paths, request_command
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.requests.resources import ResourceOptions

HELP = """Calibrate a model on a calibration set and write an INT8 Q/DQ ONNX model.

The model runs once over the calibration set (FP32, ONNX Runtime, length-bucketed batches, padding masked out);
every activation input of the quantized ops streams into a 2048-bin |x| histogram plus min/max and NaN/inf
counts. The statistics are cached ($CALIBKIT_CACHE or ~/.cache/calibkit/stats), so calibrating again with
another --method, or with more --exclude, does not run the model again.

Memory: batches are length-bucketed and bounded by --memory-budget, the bytes of tapped activations held at
once (attention probabilities grow with batch x sequence^2; calibkit prices them by two tiny probe runs; the
next batch is inferred while this one's statistics run, so each batch gets half).
Long texts go in smaller batches, short ones in batches of --batch-size. While the model runs, only ONNX
Runtime holds its weights (calibkit reads the file again for the Q/DQ step): measured peaks with the default
budget are 2.1 GB for BERT-base (a 0.44 GB file) and 4.7 GB for BERT-large (1.34 GB), about what plain FP32
inference over the same texts takes.
The statistics, and so the ranges, do not depend on the budget or the batch size.

Activations with outlier channels (GELU outputs, LayerNorm outputs) lose the most to a per-tensor range:
`calibkit smooth` first writes an equivalent model folder with those outliers moved into the weights.

Methods: mse (default: minimum expected squared quantization error, clipping included; the best held-out
accuracy on the demo model), entropy (TensorRT EntropyCalibration2 KL search), minmax (max |x|, TensorRT's advice
for NLP), percentile (--percentile of |x|).

OUT receives model.int8.onnx, calibration.cache (TensorRT 8-10 legacy cache), calibration.json (ranges, statistics,
provenance) and stats.npz. It is written atomically: on error nothing half-written is left. OUT must be new,
empty or a folder calibkit wrote (a folder holding any file calibkit did not write is refused, --force or
not); it may not be or lie inside the model folder or the calibration set. Every range is checked before a
model is written: NaN, inf, negative, a denormal or overflowing scale, implausible against the recorded
statistics, or (from a cache, which has none) above 65504 is refused by tensor name; a --from-cache cache that
names none of the model's tensors is an error.

Examples:

  calibkit calibrate demo_assets/model --calibration-set calibration_sets/prod-n512-s0

  calibkit calibrate model.onnx --tokenizer hf/minilm --calibration-set calib/ --method minmax --out runs/mm

  calibkit calibrate demo_assets/model --calibration-set calib/ --method percentile --percentile 99.9

  calibkit calibrate demo_assets/model --calibration-set calib/ --exclude 'layer\\.5/output' --target onnxruntime

  calibkit calibrate model/ -c calib/ --exclude 'bert.encoder.layer.5.output.dense'   (module path: any exporter)

  calibkit calibrate demo_assets/model --from-cache trt/calibration.cache --out runs/from-trt

  calibkit calibrate bert-large/ --calibration-set calib/ --memory-budget 512M --max-batch-tokens 8192
  calibkit calibrate demo_assets/model -c calib/ --executor dask://10.0.0.5:8786   (statistics in shards on a
  Dask cluster, merged here: bit-identical to one process)
"""


def register(app: typer.Typer) -> None:
    app.command("calibrate", help=HELP,
                short_help="Compute INT8 ranges and write a Q/DQ ONNX model.", no_args_is_help=True)(calibrate)


#: the command line's own option, beside the request's and the resource options
PRESENTATION = (inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=FORCE),)
RESOURCES = ("memory_budget", "max_batch_tokens", "executor")


def run_calibrate(request: CalibrateRequest, resources: ResourceOptions, *, force: bool) -> None:
    """Check the request and OUT, make one ``calibkit.api.run`` call, print what was written."""
    from calibkit.api import run

    dest = request.out_dir
    if request.from_cache is not None:
        _guard(dest, cli_paths(request.model, request.tokenizer, request.from_cache), force)
        _from_cache_summary(run(request, resources), request.from_cache)
        return
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.modeldir import ModelDir

    model, cset_path, tokenizer = cli_paths(request.model, request.calibration_set, request.tokenizer)
    md = ModelDir.resolve(cast(Path, model), tokenizer)  # typer requires MODEL and parses it as a path
    cset = load_calibration_set(cast(Path, cset_path))  # validate() refused its absence
    _guard(dest, [model, cset_path, tokenizer], force)
    with RichProgress() as progress:
        result = run(replace(request, model=md, calibration_set=cset, out=dest), resources, progress)
    _summary(result, str(request.method), len(cset))


calibrate = request_command(CalibrateRequest, run_calibrate, resources=RESOURCES, extra=PRESENTATION)


def _guard(dest: Path, inputs: list[Path | None], force: bool) -> None:
    guard_out_dir(dest, inputs=inputs, force=force,
                  legacy_names=("model.int8.onnx", "calibration.cache", "calibration.json", "stats.npz"))


def _from_cache_summary(result, cache: object) -> None:  # type: ignore[no-untyped-def]
    say(f"built {result.model_path} from {cache}: {count(len(result.quantized_nodes), 'node')} quantized, "
        f"{len(result.table.ranges)} ranges taken from the cache")
    if result.unmatched_cache_names:
        names = ", ".join(result.unmatched_cache_names[:5])
        say(f"{len(result.unmatched_cache_names)} cache names match no quantized tensor (TensorRT-internal "
            f"names or other ops), e.g. {names}")
    if result.zero_ranges:
        warn(f"{len(result.zero_ranges)} tensors have scale 0 in the cache, so their nodes stay FP32: "
             f"{', '.join(result.zero_ranges[:5])}")
    if result.missing_ranges:
        say(f"{len(result.missing_ranges)} quantized inputs are not in the cache (their nodes stay FP32): "
            f"{', '.join(result.missing_ranges[:5])}")
    say(f"wrote {result.out_dir}/ (model.int8.onnx, calibration.cache, calibration.json)")


def _summary(result, method: str, texts: int) -> None:  # type: ignore[no-untyped-def]
    stats = "reused cached statistics (the model was not run)" if result.reused_stats else (
        f"statistics from {texts} texts in {result.timings.get('statistics', 0):.1f} s")
    say(f"calibrated with {method}: {stats}")
    say(f"{count(len(result.table.ranges), 'activation range')}, {count(len(result.quantized_nodes), 'node')} "
        f"quantized, {len(result.kept_nodes)} kept in higher precision")
    for w in result.warnings:
        warn(w)
    say(f"wrote {result.out_dir}/ (model.int8.onnx, calibration.cache, calibration.json, stats.npz) "
              f"in {result.timings.get('total', 0):.1f} s")
