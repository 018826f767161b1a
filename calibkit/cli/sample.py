"""`calibkit sample`: draw a representative calibration set from a production log."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import typer

from calibkit.cli._common import FORCE, RichProgress, guard_out_dir, out, warn
from calibkit.cli._requests import cli_paths, request_command
from calibkit.requests.resources import ResourceOptions
from calibkit.requests.sample import SampleRequest
from calibkit.results.files import SampleRecord

HELP = """Draw a calibration set from a JSON Lines request log (plain or .gz, any size).

Writes DIR/texts.jsonl (one {"text": ...} a line, plus "label" with --label-field) and DIR/manifest.json
(source hash, broken lines by kind, duplicates, redactions, strata, and how representative the sample's
token lengths are: PSI and KS against the whole log).

What happens to each line: broken lines are skipped and counted (--strict stops at the first one);
<script>/<style> blocks are removed (other markup is kept: the model should see what production sees);
e-mails, phone numbers, Luhn-valid card numbers and IP addresses become <EMAIL>, <PHONE>, <CARD>, <IP>
(--no-redact keeps them); duplicates (exact, or equal after NFKC + case + whitespace normalization) count
once. Texts longer than 65,536 characters are cut to that length first (counted as oversized); lines over
64 MiB are skipped. The sample is stratified by token length, label and topic cluster (not by a label with
more distinct values than max(20, size/8): a warning says so); same log + same seed gives a byte-identical
output.

--out must be a new or empty folder, or one calibkit wrote; inputs are never overwritten (a folder
holding files calibkit did not write is refused, --force or not).

Examples:

  calibkit sample logs/prod.jsonl.gz --size 512

  calibkit sample prod.jsonl --text-field request.text --label-field feedback.label --out calib/

  calibkit sample prod.jsonl --tokenizer models/minilm --seed 1 --strict
"""


def register(app: typer.Typer) -> None:
    app.command("sample", help=HELP,
                short_help="Draw a representative calibration set from a request log.", no_args_is_help=True)(sample)


#: the command line's own option, beside the request's
PRESENTATION = (inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=FORCE),)
RESOURCES: tuple[str, ...] = ()  # sample runs no model in batches: no worker, executor or memory option


def run_sample(request: SampleRequest, resources: ResourceOptions, *, force: bool) -> None:
    """Check the request and OUT, make one ``calibkit.api.run`` call, print what was drawn."""
    from calibkit.api import run

    target = request.out_dir
    guard_out_dir(target, inputs=cli_paths(request.logs, request.tokenizer), force=force,
                  legacy_names=("texts.jsonl", "manifest.json"))
    with RichProgress() as progress:
        cset = run(replace(request, out=target), resources, progress)
    m = cset.manifest
    if m is not None and m.sample is not None:  # always: sample records how it drew the set
        _summary(m.sample, m.count, target)
        for w in m.sample.warnings:
            warn(w)


sample = request_command(SampleRequest, run_sample, resources=RESOURCES, extra=PRESENTATION)


def _summary(m: SampleRecord, count: int, target: Path) -> None:
    from rich.table import Table

    lines, dd, rep, red, tf = m.lines, m.dedup, m.representativeness, m.redaction, m.text_field
    from calibkit.cli._common import printable

    t = Table(title=printable(f"calibration set: {target}"), show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    size = m.source.size_bytes
    t.add_row("log", printable(m.source.path + (f" ({size:,} bytes)" if size is not None else "")))
    t.add_row("text field", ", ".join(tf.paths) + (" (auto-detected)" if tf.auto_detected else ""))
    t.add_row("lines read", f"{lines.read:,}")
    broken = ", ".join(
        f"{k} {v.count:,} (line {', '.join(map(str, v.first_lines[:3]))})" for k, v in lines.broken.items()
    )
    t.add_row("broken lines", f"{lines.broken_total:,}" + (f": {broken}" if broken else ""))
    t.add_row(
        "duplicates",
        f"{dd.duplicate_lines:,} lines ({dd.exact_duplicates:,} exact, "
        f"{dd.normalized_duplicates:,} normalized); {dd.distinct_texts:,} distinct texts",
    )
    if red.enabled:
        t.add_row("redacted", ", ".join(f"{k} {v:,}" for k, v in red.counts.items()))
    else:
        t.add_row("redacted", "off (--no-redact)")
    t.add_row("strata", f"{len(m.strata.table)} (length x label x {m.strata.topics.clusters} topics)")
    ln = m.length
    measure = "tokenizer" if ln.measure.startswith("tokenizer") else ln.measure
    t.add_row(
        "sample",
        f"{count:,} texts; {ln.over_max.sample} longer than {ln.max_length} tokens ({measure})",
    )
    t.add_row("representative?", f"{rep.verdict} (PSI {rep.psi:.3f}, KS {rep.ks:.3f})")
    out.print(t)
    if rep.verdict != "representative":
        warn(representativeness_hint(rep.psi, count, len(m.strata.table)))


def representativeness_hint(psi: float, size: int, strata: int) -> str:
    """What a PSI over the threshold means and what to do about it: a small sample over many strata gives each
    stratum at least one text, which over-represents rare (often long) texts."""
    return (f"PSI {psi:.3f}: the population stability index compares the share of texts in each token-length "
            f"bin of the sample with the whole log's (under 0.1 representative, 0.1-0.25 slightly shifted). "
            f"{size:,} texts over {strata:,} strata give rare strata more than their share and leave rare lengths "
            f"to chance: draw a larger sample (--size {max(512, 4 * size):,}), or fewer topic strata (--clusters), "
            f"and compare the bins in manifest.json (representativeness.population_fraction / sample_fraction)")
