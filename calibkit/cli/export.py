"""`calibkit export`: the user's own model (Hugging Face, sentence-transformers or ONNX) as the model folder
every other command reads."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from calibkit.cli._common import RichProgress, guard_out_dir, say
from calibkit.cli._requests import FORCE_ONLY, cli_paths, request_command
from calibkit.requests.export import ExportRequest
from calibkit.requests.resources import ResourceOptions
from calibkit.types import request_path

HELP = """Export your own model to the model folder calibkit reads: model.onnx (FP32, dynamic batch and sequence
axes, the task recorded in its metadata) beside the tokenizer and config.json.

SOURCE is a Hugging Face folder as save_pretrained writes it (config.json with model.safetensors or
pytorch_model.bin: a sequence-classification head (classification, regression or multi-label), a
token-classification head, or a bare encoder), a sentence-transformers folder (modules.json: Transformer,
Pooling (mean, CLS or max) and an optional Normalize), or an ONNX file with its tokenizer (--tokenizer, or
beside it), which is copied and checked rather than re-exported.

A checkpoint is exported with torch.onnx.export (needs torch and onnxscript: pip install 'calibkit[export]')
and then run by ONNX Runtime beside the PyTorch model on probe texts at three batch shapes: the largest
difference is printed, and past --tolerance (relative to the largest output) nothing is written.

Examples:

  calibkit export hf/my-classifier --out models/my-classifier
  calibkit export hf/all-MiniLM-L6-v2 --out models/minilm            # sentence-transformers: pooled embedding
  calibkit export hf/bert-mlm --task embedding --out models/bert      # any head: its encoder alone
  calibkit export model.onnx --tokenizer hf/my-classifier --out models/mine
  calibkit sample logs.jsonl --tokenizer models/my-classifier && calibkit calibrate models/my-classifier -c ...
"""


def register(app: typer.Typer) -> None:
    app.command("export", help=HELP, short_help="Export your own model to a calibkit model folder.",
                no_args_is_help=True)(export)


RESOURCES: tuple[str, ...] = ()  # an export runs no batches: no worker, executor or memory option
PRESENTATION = FORCE_ONLY


def run_export(request: ExportRequest, resources: ResourceOptions, *, force: bool) -> None:
    """Check the request and OUT, make one ``calibkit.api.run`` call, print what was exported and its parity."""
    from calibkit.api import run
    from calibkit.exporter import resolve_source

    source = cast(Path, request.source)  # typer requires SOURCE and parses it as a path
    src = resolve_source(source, request.tokenizer)
    guard_out_dir(request_path(request.out),
                  inputs=[source, *cli_paths(request.tokenizer), src.tokenizer, src.checkpoint], force=force)
    with RichProgress() as progress:
        result = run(request, resources, progress)
    what = {"sentence-embedding": f"sentence-transformers, {src.pooling} pooling"
                                  + (", normalised" if src.normalize else ""),
            "encoder": "the encoder, last_hidden_state"}.get(result.head, result.head)
    article = "an" if result.task[:1] in "aeiou" else "a"
    say(f"exported {source} ({what}) as {article} {result.task} model: inputs {', '.join(result.inputs)}, "
        f"output {result.output}, dynamic batch and sequence axes ({result.exporter})")
    p = result.parity
    if p is not None:
        shapes = ", ".join(f"{b}x{s}" for b, s in p.shapes)
        say(f"FP32 parity with the source on {p.texts} probe texts (batch x sequence {shapes}): largest "
            f"difference {p.max_abs_diff:.2e} ({p.relative:.1e} of the largest output; tolerance "
            f"{p.tolerance:g})")
    say(f"wrote {result.out_dir}/ (model.onnx, tokenizer, config.json) in {result.seconds:.1f} s; next: "
        f"calibkit sample LOGS --tokenizer {result.out_dir}, then calibkit calibrate {result.out_dir} -c SET")


export = request_command(ExportRequest, run_export, resources=RESOURCES, extra=PRESENTATION)
