"""`calibkit compare`: two engines on a labelled eval set, layer by layer, with layers to keep in FP16."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from calibkit.cli._common import (
    NO_REPORT,
    RichProgress,
    count,
    force_option,
    guard_out_dir,
    guard_out_file,
    out,
    say,
    warn,
    write_stdout,
)
from calibkit.cli._requests import cli_paths, request_command
from calibkit.outdirs import default_report_dir
from calibkit.requests.compare import CompareRequest
from calibkit.requests.resources import ResourceOptions

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.results.runs import Comparison, LayerVerdict, Range
    from calibkit.tasks.base import KindTraits
    from calibkit.types import PathLike

HELP = (
    "Compare engine A (baseline, e.g. FP32/FP16) with engine B (e.g. INT8) on a labelled eval set.\n\n"
    "Reports accuracy, macro-F1, confusion matrix and latency of each engine; agreement and logit error between "
    "them; and, for every quantized layer of the INT8 model (in graph order): the FP range and percentiles "
    "against the INT8 clipping range, the clipped fraction, the outlier ratio, SQNR and cosine of the layer's "
    "output, the effect of quantizing only this layer / keeping only this layer in higher precision (on accuracy "
    "where the eval set has class labels; else on fidelity to A in the task's terms: flips, nearest-neighbour "
    "agreement and cosine for embedders, per-token agreement; on the --traffic texts when given), and a "
    "keep-in-FP16 flag with the reasons that triggered it. Flags that one clipped tensor family explains are "
    "reported as one finding with its fix. Without per-layer sensitivity the verdict says it was not measured.\n\n"
    "Every accuracy, macro-F1, agreement and B-A difference carries a 95 % interval for paired predictions on "
    "the same examples (Wilson, paired bootstrap, exact McNemar). A difference whose interval covers zero is "
    "'not significant'; a per-layer effect within its own uncertainty is 'insufficient-evidence' (with the "
    "number of examples that would settle it); and no layer is advised to stay in FP16 while B is not "
    "significantly less accurate than A. Layer statistics, sensitivity samples and --limit use random subsets "
    "stratified by label, drawn from --seed by row content (the same rows in any file order give the same "
    "subset); the report lists the rows used.\n\n"
    "The eval set is JSONL, CSV/TSV, Parquet (columns text + label; labels as names or ids) or a Hugging Face "
    "datasets folder. A and B must be built from the same FP32 model.\n\n"
    "Outputs are checked before any work: --json must be a writable file path (an existing file only if it is "
    "an earlier compare document); the report folder must be new, empty or hold only files calibkit "
    "wrote (a file it did not write is never deleted, moved or overwritten).\n\n"
    "CI gate: with --min-agreement and/or --max-drop, compare exits with code 8 (TargetMissedError) after "
    "writing every output when B misses either; --save-outputs DIR keeps each text's outputs of both engines "
    "(outputs.npz, outputs.jsonl with row, text, label, classes, flipped) to reproduce a flip.\n\n"
    "Examples:\n\n"
    "  calibkit compare fp32.onnx int8.onnx --eval-set data/test.jsonl\n\n"
    "  calibkit compare fp16.onnx int8.onnx --reference fp32.onnx --eval-set test.parquet --json cmp.json\n\n"
    "  calibkit compare a.onnx b.onnx --eval-set test.csv --limit 500 --no-sensitivity --threshold-sqnr 25\n\n"
    "  calibkit compare embedder/fp32.onnx embedder/int8.onnx --traffic auto   (no eval set: the log's texts "
    "outside the calibration set are the evidence, neighbours and cosine judged without labels)\n\n"
    "  calibkit compare fp32.onnx int8.onnx -e test.jsonl --min-agreement 99 --max-drop 0.5 --save-outputs runs/out"
    "   (CI: exit 8 when missed)\n"
)


def register(app: typer.Typer) -> None:
    app.command("compare", help=HELP, short_help="Compare two engines, overall and layer by layer.")(compare)


#: the command line's own options (what to write and where), beside the request's and the resource options
PRESENTATION = (
    inspect.Parameter("json_path", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=typer.Option(
        None, "--json", help="Write the calibkit-compare/1 JSON document here ('-': to stdout, instead of the "
        "summary).")),
    inspect.Parameter("report", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=typer.Option(
        None, "--report", help="Report folder (default reports/<timestamp>-<A>-vs-<B>/).")),
    inspect.Parameter("no_report", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=NO_REPORT),
    inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=force_option("--report")),
)
RESOURCES = ("workers", "executor", "memory_budget", "max_batch_tokens")


def run_compare(request: CompareRequest, resources: ResourceOptions, *, json_path: Path | None, report: Path | None,
                no_report: bool, force: bool) -> None:
    """Check the request and the outputs, make one ``calibkit.api.run`` call, deliver the result and apply the
    CI gate."""
    from calibkit.api import run

    to_stdout = json_path is not None and str(json_path) == "-"
    inputs = cli_paths(request.engine_a, request.engine_b, request.reference, request.eval_set, request.traffic)
    a, b = cast(Path, request.engine_a), cast(Path, request.engine_b)  # typer requires both, parsed as paths
    json_file = json_path if not to_stdout else None
    if json_file:  # before the default report folder is picked, which claims it
        guard_out_file(json_file, inputs=inputs, option="--json", owned=_is_compare_json)
    report_dir = None if no_report else report or _default_report_dir(a, b)
    _guard_outputs(json_file, report_dir, request.save_outputs, inputs, force)
    with RichProgress() as progress:
        result = run(request, resources, progress)
    _deliver(result, json_path, report_dir, to_stdout, cast("Path | None", request.save_outputs))  # typer's path
    missed = result.gate.missed if result.gate is not None else ()
    if missed:
        from calibkit.errors import TargetMissedError

        raise TargetMissedError("; ".join(missed), hint="every output was written; the exit code (8) is the "
                                "CI gate of --min-agreement/--max-drop")


compare = request_command(CompareRequest, run_compare, resources=RESOURCES, extra=PRESENTATION)


def _deliver(result: Comparison, json_path: Path | None, report_dir: Path | None, to_stdout: bool,
             save_outputs: Path | None) -> None:
    """--json and the report folder (replaced together or not at all), then the document on stdout
    (``--json -``) or the summary."""
    from calibkit._io import commit_together, dumps_json, write_json
    from calibkit.results.codec import to_document

    doc = to_document(result)
    with commit_together():
        if json_path and not to_stdout:
            write_json(json_path, doc)
        if report_dir is not None:
            _render(doc, report_dir)
    if to_stdout:
        write_stdout(dumps_json(doc))
        return
    _print_summary(result, json_path, report_dir)
    if save_outputs is not None:
        say(f"wrote per-text outputs to {save_outputs}/ (outputs.jsonl, outputs.npz)")


def _guard_outputs(json_path: Path | None, report_dir: Path | None, save_outputs: PathLike | None,
                   inputs: list[Path | None], force: bool) -> None:
    """--report and --save-outputs are checked before any work (--json, already checked, is apart from them):
    writable, not an input, apart."""
    from calibkit.errors import UsageError

    if report_dir is not None:
        from calibkit.report.render import REPORT_NAMES

        guard_out_dir(report_dir, inputs=inputs, option="--report", force=force, legacy_names=REPORT_NAMES)
        if json_path and report_dir.absolute().resolve() in json_path.absolute().resolve().parents:
            raise UsageError(f"--json {json_path} lies inside --report {report_dir}, which is replaced as a "
                             "whole", hint="write --json outside the report folder (the report holds "
                             "report.json anyway)")
    if save_outputs is not None:
        from calibkit.api import OUTPUTS_JSONL, OUTPUTS_NPZ

        save_outputs = Path(save_outputs)
        guard_out_dir(save_outputs, inputs=inputs, option="--save-outputs", force=force,
                      legacy_names=(OUTPUTS_JSONL, OUTPUTS_NPZ))
        if report_dir is not None and (save_outputs.absolute().resolve() == report_dir.absolute().resolve()
                                       or report_dir.absolute().resolve() in save_outputs.absolute().resolve().parents):
            raise UsageError(f"--save-outputs {save_outputs} lies inside --report {report_dir}",
                             hint="pass a folder outside the report folder")


def _is_compare_json(path: Path) -> bool:
    """An earlier `compare --json` document (a file calibkit may overwrite)."""
    import json

    from calibkit.results.codec import COMPARE_FORMAT

    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith(COMPARE_FORMAT.partition("/")[0] + "/")


def _default_report_dir(a: Path, b: Path) -> Path:
    return default_report_dir(f"{a.stem}-vs-{b.stem}")


def _render(doc: dict, out_dir: Path) -> None:
    from calibkit._io import write_json

    try:
        from calibkit.report.render import render_report
    except ImportError:  # the report renderer is optional at this layer: keep the JSON
        write_json(out_dir / "report.json", doc)
        warn(f"report renderer not available; wrote {out_dir / 'report.json'}")
        return
    render_report(doc, out_dir)


def _print_summary(result: Comparison, json_path: Path | None, report_dir: Path | None) -> None:
    from rich.table import Table

    ev = result.eval_set
    t = Table(title=f"eval set {Path(ev.path).name}: {ev.count} examples (95 % intervals)")
    for col in ("engine", "precision", "accuracy", "macro-F1", "p50 ms/batch", "items/s"):
        t.add_column(col)
    for e in result.engines:
        t.add_row(
            f"{e.name}: {Path(e.path).name}",
            e.precision,
            f"{e.accuracy * 100:.2f} %" + _ci(e.accuracy_ci, 100, 1) if e.accuracy is not None else "-",
            f"{e.macro_f1:.4f}" + _ci(e.macro_f1_ci, 1, 3) if e.macro_f1 is not None else "-",
            _f1(e.latency_ms.p50),
            f"{e.throughput_per_s:.0f}" if e.throughput_per_s is not None else "-",
        )
    out.print(t)
    o = result.outputs
    d = result.accuracy_diff
    if d is not None and d.estimate is not None and d.low is not None and d.high is not None:
        out.print(f"B - A accuracy {d.estimate * 100:+.2f} points (95 % CI {d.low * 100:+.2f} to "
                  f"{d.high * 100:+.2f}; McNemar p {_g(d.mcnemar_p)}; {d.b_only} fixed, {d.a_only} broken): "
                  f"{d.verdict}")
    kind = result.task.kind
    fid = result.task.fidelity
    traits = _kind(kind)
    if not (traits is not None and traits.classifies) and fid is not None:
        extra = "  ".join(f"{k.replace('_', ' ')} {_n(v, '.4f')}" for k, v in fid.extra.items() if k != "k")
        what = traits.terminal_fidelity(fid, result.eval_set.count, _nn_ci(result.agreement_ci)) if traits else ""
        out.print(f"task {kind} ({result.task.output}): {what}  cosine to A mean {_n(fid.cosine_mean, '.5f')} "
                  f"min {_n(fid.cosine_min, '.5f')}  {extra}")
    if traits is not None and not traits.flips:  # no argmax to flip: the task line above says it all
        out.print(f"output error: max |err| {_n(o.max_abs_error, '.4g')}, mean |err| {_n(o.mean_abs_error, '.4g')}")
    else:
        changed = None if result.flip_rate is None else round(result.flip_rate * result.eval_set.count)
        out.print(
            f"agreement {_pct(result.agreement)} %{_ci(result.agreement_ci, 100, 2)} on {result.eval_set.count} "
            f"texts, flips (texts whose prediction changed) {_pct(result.flip_rate)} %  logit cosine mean "
            f"{_n(o.cosine_mean, '.5f')} min {_n(o.cosine_min, '.5f')}  max |err| {_n(o.max_abs_error, '.4g')}  "
            f"mean KL {_n(o.mean_kl, '.3g')}  ({_listed(len(result.disagreements), changed)})"
        )
    bands = result.flips_by_confidence
    if bands and sum(b.flips for b in bands):
        out.print("flips by A's top-2 probability gap: " + ", ".join(
            f"{b.flips} of {b.texts} texts at {b.low:g}-{b.high:g}" for b in bands)
            + f" ({bands[0].flips} where A itself was nearly undecided)")
    if result.traffic is not None:
        _print_traffic(result)
    if result.speed is not None:
        sp = result.speed
        say(f"speed of B against A, served (ONNX Runtime, every graph optimization, {sp.threads} threads, "
            f"{sp.rounds} interleaved rounds on {sp.texts} texts; {sp.cpu}: {sp.isa}): "
            + sp.words.replace(" FP32 ", " A's speed ", 1))
    elif result.speed_note:
        say(f"speed {result.speed_note}")
    for w in result.warnings:
        warn(w)
    if result.layers:
        _print_layers(result)
    _print_findings(result)
    _print_verdict(result)
    if json_path:
        say(f"JSON: {json_path}")
    if report_dir:
        say(f"report: {report_dir}")


def _print_traffic(result: Comparison) -> None:
    """B's fidelity to A on the traffic texts, with where they came from."""
    tr = result.traffic
    assert tr is not None
    ev, fid = tr.evidence, tr.fidelity
    excluded = "; ".join(x for x in ev.exclusions if not x.startswith("log sha256"))
    say(f"traffic: {ev.count} texts of {Path(ev.path).name} (no labels; excluded {excluded or 'nothing'})")
    traits = _kind(result.task.kind)
    own = traits.terminal_traffic(fid, ev.count, _nn_ci(tr.agreement_ci)) if traits is not None else None
    if own is not None:
        what = own
    elif tr.agreement_ci is not None:
        what = (f"agreement {_pct(fid.agreement)} %{_ci(tr.agreement_ci, 100, 2)}, {tr.flips} flips (texts "
                "whose prediction changed), "
                f"mean KL {_n(tr.mean_kl, '.3g')}")
    else:
        what = f"agreement {_pct(fid.agreement)} %"
    say(f"  B against A on traffic: {what}; cosine mean {_n(fid.cosine_mean, '.5f')} min {_n(fid.cosine_min, '.5f')}")


def _print_layers(result: Comparison) -> None:
    """The flagged layers: a table on a terminal; piped, one plain line per layer with the full node name and a
    short reason (the long reasons stay in the report)."""
    from rich.table import Table

    flagged = result.flagged
    by_flag: dict[str, int] = {}
    for v in flagged:
        by_flag[v.flag.value] = by_flag.get(v.flag.value, 0) + 1
    title = (f"{len(flagged)} of {len(result.layers)} quantized layer inputs flagged "
             f"({count(len({v.node for v in flagged}), 'node')} of {len({v.node for v in result.layers})})"
             + (": " + ", ".join(f"{n} {flag}" for flag, n in by_flag.items()) if flagged else ""))
    if not out.is_terminal:
        say(title)
        for v in flagged:
            say(layer_line(v))
    else:
        lt = Table(title=title)
        for col in ("#", "node", "tensor", "amax", "fp absmax", "clipped", "own SQNR", "out SQNR", "flag", "reasons"):
            lt.add_column(col)
        for v in flagged[:25]:
            lt.add_row(
                str(v.index), v.label, v.tensor, _f(v.amax), _f(v.fp_absmax),
                f"{v.clipped_fraction:.1e}" if v.clipped_fraction is not None else "-",
                _f(v.quant_sqnr_db), _f(v.sqnr_db), v.flag.value, "; ".join(v.reasons),
            )
        if flagged:
            out.print(lt)


def _print_findings(result: Comparison) -> None:
    """Flags that share one cause, one finding each with its fix (one line each when piped)."""
    for f in result.findings:
        if out.is_terminal:
            out.print(f"[bold]finding[/bold]: {f.message}", markup=True, highlight=False)
        else:
            say(f"finding: {f.message}")


def _print_verdict(result: Comparison) -> None:
    """What per-layer sensitivity measured, and the recommendation in words (never "no layer needs higher
    precision" without per-layer evidence)."""
    rec, ev = result.recommendation, result.sensitivity
    if ev is not None and ev.measured:
        fid = f"all-INT8 agreement {_pct(ev.all_int8_agreement)} %"
        if ev.all_int8_cosine is not None:
            fid += f", mean cosine {_n(ev.all_int8_cosine, '.4f')}"
        if ev.all_int8_accuracy is not None:
            fid += f", accuracy {_pct(ev.all_int8_accuracy)} % (reference {_pct(ev.reference_accuracy)} %)"
        say(f"per-layer sensitivity: {count(ev.layers, 'node')} on {ev.samples} {ev.source} texts, judged by "
            f"{ev.basis}; {fid}")
    keep = result.keep_in_higher_precision
    label = {v.node: v.label for v in result.layers}
    unsure = [v for v in result.layers if v.flag.value == "insufficient-evidence"]
    if keep:
        # the list follows the clause it lists ("keep N nodes"); the not-settled clause and its nodes come after
        head, _, rest = (rec.verdict or f"keep {count(len(keep), 'node')} in {rec.precision}").partition("; ")
        say(f"recommendation: {head}: {_names(keep, label)}")
        unsettled = list(dict.fromkeys(v.node for v in unsure if v.node not in keep))
        if rest and unsettled:
            say(f"{rest}: {_names(unsettled, label)}")
    elif rec.verdict:
        say(f"recommendation: {rec.verdict}")
    else:  # a document written before verdicts were recorded
        say("recommendation: not measured — this result records no per-layer verdict")
    if unsure:
        nodes = len({v.node for v in unsure})
        say(f"{count(len(unsure), 'quantized layer input')} of {count(nodes, 'node')}: insufficient evidence "
            "(effect within its 95 % interval; see the reasons)")
    if result.gate is not None:
        g = result.gate
        targets = ", ".join(x for x in (f"--min-agreement {g.min_agreement:g} %" if g.min_agreement is not None
                                        else "", f"--max-drop {g.max_drop:g}" if g.max_drop is not None else "") if x)
        say(f"CI gate ({targets}): " + ("met" if g.met else "missed: " + "; ".join(g.missed)))


def _names(nodes: list[str] | tuple[str, ...], label: dict[str, str], most: int = 12) -> str:
    """The first ``most`` nodes by the name the layer table gives them, and how many more there are."""
    shown = ", ".join(label.get(n, n) for n in nodes[:most])
    return shown + (f" and {len(nodes) - most} more" if len(nodes) > most else "")


def layer_line(v: LayerVerdict) -> str:
    """One log line for a flagged layer: index, flag, full node name (with its module), the first reason cut to
    a short clause."""
    reason = v.reasons[0] if v.reasons else ""
    short = reason.split(";")[0].split(" (")[0]
    if len(short) > 100:
        short = short[:97] + "..."
    more = f" (+{len(v.reasons) - 1} more)" if len(v.reasons) > 1 else ""
    return f"layer {v.index} {v.flag.value} {v.label}: {short}{more}"


def _nn_ci(iv: Range | None) -> str:
    """A nearest-neighbour agreement's interval, or why it has none: each text's neighbours are among the
    others, so its per-text values are not independent draws a paired interval could rest on."""
    return _ci(iv, 100, 2) or " (no interval: neighbours are looked up among the same texts, not drawn apart)"


def _listed(shown: int, changed: int | None) -> str:
    if changed and not shown:
        return f"none of {changed} flips listed: the predictions are not classes"
    return f"{shown} of {changed if changed is not None else '?'} flips listed"


def _ci(iv: Range | None, scale: float, digits: int) -> str:
    if iv is None or iv.low is None or iv.high is None:
        return ""
    return f" [{iv.low * scale:.{digits}f}, {iv.high * scale:.{digits}f}]"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _f1(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _g(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _kind(name: str) -> type[KindTraits] | None:
    """The task kind a result names (None for a name no registered kind has, e.g. a document's of a kind this
    process does not know)."""
    from calibkit.tasks import kind_names, task_class

    return task_class(name) if name in kind_names() else None


def _n(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.2f}"
