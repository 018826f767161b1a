"""`calibkit tune`: search the mixed-precision plan that meets an accuracy target with the most INT8."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from calibkit.cli._common import (
    NO_REPORT,
    RichProgress,
    count,
    force_option,
    guard_out_dir,
    out,
    say,
    warn,
    write_stdout,
)
from calibkit.cli._requests import cli_paths, request_command
from calibkit.outdirs import default_report_dir
from calibkit.requests.resources import ResourceOptions
from calibkit.requests.tune import TuneRequest

if TYPE_CHECKING:  # pragma: no cover - types only
    from rich.table import Table

    from calibkit.evaluate.tune import TuneRun
    from calibkit.results.runs import PhaseCost, PlanEvidence, TuneResult

HELP = (
    "Find the plan that keeps accuracy within --max-drop of FP32 (and, with --min-agreement, at least that "
    "percentage of FP32's predictions unchanged) while keeping as much MatMul/Gemm work (FLOPs) in INT8 as "
    "possible.\n\n"
    "An eval set without labels works too: FP32's own predictions become the labels and the target is agreement "
    "alone (--min-agreement, default 99 there).\n\n"
    "The eval set is split (stratified by label, seeded, by row content) into a search part, used for every "
    "decision, and a holdout part, measured only for the final plan: the verdict gives the plan's accuracy "
    "difference to FP32 and its agreement with FP32 on the holdout with 95 % intervals, and says whether the "
    "holdout supports the claim (supported / not confirmed / contradicted). Layers are ranked by the output "
    "damage (KL divergence to FP32) of quantizing only that layer, per FLOP; the fewest are kept, "
    "and every candidate is measured. The calibration table is the one whose all-INT8 model flips the fewest "
    "FP32 predictions on the search split (accuracy differences between INT8 variants are mostly noise); "
    "--method auto adds a per-tensor table (per tensor the method with the best SQNR at its layer). "
    "Statistics are reused; finished evaluations are kept, so an interrupted run resumes.\n\n"
    "Writes OUT/model.int8.onnx, calibration.cache, calibration.json, plan.json (layers kept and why), "
    "tune.json, and a report with the accuracy vs INT8-coverage curve. OUT and the report folder must be new, "
    "empty or written by calibkit (a folder holding files calibkit did not write is refused, --force or not), "
    "and apart from the inputs.\n\n"
    "CI gate: with --fail-if-missed, tune exits with code 8 (TargetMissedError) after writing every output when "
    "no plan meets the target, when the holdout confirms none of them, or when the holdout's verdict does not "
    "support the plan; without it such a run exits 0 and says so in its first line.\n\n"
    "Examples:\n\n"
    "  calibkit tune demo_assets/model --calibration-set calibration_sets/logs-n512-s0 "
    "--eval-set demo_assets/data/test.jsonl --max-drop 0.5\n\n"
    "  calibkit tune model/ -c calib/ -e test.parquet --max-drop 1 --relative --method entropy --workers 4\n\n"
    "  calibkit tune model/ -c calib/ -e test.jsonl --max-drop 0.5 --min-agreement 99\n"
    "  calibkit tune embedder/ -c calib/ --traffic auto   (a sentence embedder, from the log alone: the plan keeps "
    "95 % of nearest neighbours in the FP32 index and a mean cosine of 0.995 unless --min-agreement / "
    "--min-cosine say otherwise)\n"
    "  calibkit tune model/ -c calib/ -e test.jsonl --min-agreement 99 --traffic auto   (agreement judged on "
    "10,500 unlabeled texts of the calibration set's own log, calibration texts excluded; the eval set's labels "
    "carry accuracy alone)\n"
    "  calibkit tune runs/minilm-smoothed -c calib/ -e test.jsonl --min-agreement 99   (a folder written by "
    "`calibkit smooth`: fewer layers to keep, measured against the same FP32 function)\n"
    "  calibkit tune model/ -c calib/ -e test.parquet --executor dask://10.0.0.5:8786   (a Dask cluster: "
    "statistics in shards, every candidate a work unit; re-run the same command to resume)\n"
)


def register(app: typer.Typer) -> None:
    app.command("tune", help=HELP, short_help="Find the mixed-precision plan that meets an accuracy target.")(tune)


def _param(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


#: the command line's own options (what to print, what to replace, the CI gate), beside the request's and the
#: resource options
PRESENTATION = (
    _param("no_report", bool, NO_REPORT),
    _param("json_out", str | None, typer.Option(
        None, "--json", help="'-': print the calibkit-tune/1 document (OUT/tune.json) on stdout instead of the "
        "summary.")),
    _param("force", bool, force_option("--out and --report")),
    _param("fail_if_missed", bool, typer.Option(
        False, "--fail-if-missed",
        help="CI gate: exit with code 8 (after writing OUT and the report) when no plan meets the target, the "
             "holdout confirms none, or the holdout does not support the plan.")),
)
RESOURCES = ("workers", "executor", "memory_budget", "max_batch_tokens")


def run_tune(request: TuneRequest, resources: ResourceOptions, *, no_report: bool, json_out: str | None,
             force: bool, fail_if_missed: bool) -> None:
    """Check the request and the outputs, make one ``calibkit.api.run`` call, print the result and apply the CI
    gate. Without --executor tune evaluates in a local pool of --workers; a chosen executor also shards the
    statistics."""
    from calibkit.api import run

    if json_out not in (None, "-"):
        from calibkit.errors import UsageError

        raise UsageError(f"--json takes '-' (stdout), got {json_out!r}",
                         hint="the document is written to OUT/tune.json anyway")
    model = cast(Path, request.model)  # typer requires MODEL and parses it as a path
    tokenizer, out_dir = cli_paths(request.tokenizer, request.out)
    dest = out_dir or Path("runs") / f"tune-{_model_name(model, tokenizer)}"
    inputs = [model, tokenizer, *cli_paths(request.calibration_set, request.eval_set, request.traffic)]
    guard_out_dir(dest, inputs=inputs, force=force, legacy_names=_OUT_NAMES)
    # the default report folder is claimed when it is picked: only once --out is known to be usable
    report = cast("Path | None", request.report)  # typer parses --report as a path
    report_dir = None if no_report else report or default_report_dir("tune")
    if report_dir is not None:
        _check_apart(dest, Path(report_dir))
        from calibkit.report.render import REPORT_NAMES

        guard_out_dir(Path(report_dir), inputs=inputs, option="--report", force=force, legacy_names=REPORT_NAMES)
    with RichProgress() as progress:
        tuned = run(replace(request, out=dest, report=report_dir), resources, progress)
    if json_out is not None:
        from calibkit._io import dumps_json
        from calibkit.results.codec import to_document

        write_stdout(dumps_json(to_document(tuned.result)))
    else:
        _summary(tuned, report_dir)
    if fail_if_missed and not tuned.result.claim_holds:
        from calibkit.errors import TargetMissedError

        raise TargetMissedError(f"{tuned.result.claim} (--max-drop/--min-agreement/--min-cosine)",
                                hint=f"every output was written ({dest}/plan.json holds the plan); "
                                "the exit code (8) is the CI gate of --fail-if-missed")


tune = request_command(TuneRequest, run_tune, resources=RESOURCES, extra=PRESENTATION)


def _model_name(model: Path, tokenizer: Path | None) -> str:
    """The default --out name: the model folder's name (an .onnx file's folder, else its stem)."""
    from calibkit.data.modeldir import ModelDir
    from calibkit.evaluate.inputs import default_name

    try:
        md = ModelDir.resolve(model, tokenizer)
    except Exception:  # the API reports the real problem with its hint; the name only needs a fallback
        return model.stem or "model"
    return default_name(md)


_OUT_NAMES = ("model.int8.onnx", "calibration.cache", "calibration.json", "plan.json", "tune.json")


def _check_apart(out_dir: Path, report_dir: Path) -> None:
    from calibkit.errors import UsageError

    a, b = out_dir.absolute().resolve(), report_dir.absolute().resolve()
    if a == b or a in b.parents or b in a.parents:
        raise UsageError(f"--out {out_dir} and --report {report_dir} overlap; each is written as a whole",
                         hint="pass two separate folders, e.g. --out runs/tune --report reports/tune")


def _summary(run: TuneRun, report_dir: Path | None) -> None:
    r = run.result
    (say if r.claim_holds else warn)(r.claim)
    _evidence_line(r)
    out.print(_table(r))
    _calibration_lines(run)
    f = r.final
    verdict = "met" if r.met_target else "NOT met (the plan measured closest to FP32 is written)"
    conf = r.target.agreement_confidence
    if r.target.min_agreement is not None and conf > 0.5:
        say(f"--min-agreement {r.target.min_agreement:g} counts as met on the search split when the one-sided "
            f"{100 * conf:g} % lower bound of the agreement reaches it (--agreement-confidence; 0.5: the estimate)")
    say(f"target {verdict}; INT8 share of linear FLOPs (fused ops included): {100 * f.int8_flops_fraction:.1f} %; "
        f"{len(r.candidates)} candidates measured, {r.evaluations_reused} evaluations reused")
    _decision_lines(r)
    for n in f.kept_nodes:
        why = f.reasons_for(n)
        short = f": {why[0].split(' (')[0]}" if why and not out.is_terminal else ""
        say(f"  keep {f.label(n)}{short}")
    say(f"wrote {run.out_dir}/ ({', '.join(_OUT_NAMES)})")
    if report_dir:
        say(f"report: {report_dir}/report.html")


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.2f} %"


def _cos(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.5f}"


def _classifies(kind: str) -> bool:
    """Whether the task kind a result names has one class per text (accuracy columns, labelled texts)."""
    from calibkit.tasks import kind_names, task_class

    return kind in kind_names() and task_class(kind).classifies


def _evidence_line(r: TuneResult) -> None:
    """Where accuracy and agreement were judged, when traffic was part of the evidence."""
    es = r.eval_set
    if es.traffic is None:
        return
    excluded = "; ".join(x for x in es.traffic.exclusions if not x.startswith("log sha256"))
    labelled = es.count if es.labels == "given" else 0  # es.count: the eval set's rows, traffic apart
    first = (f"accuracy on {labelled} labelled texts of {Path(es.path).name}; "
             if labelled > 0 and _classifies(r.target.task) else "")
    say(f"evidence: {first}agreement on {es.traffic.count} traffic texts of {Path(es.traffic.path).name} "
        f"(search {es.traffic_search}, holdout {es.traffic_holdout}; excluded {excluded or 'nothing'})")


def _table(r: TuneResult) -> Table:
    """FP32, all-INT8 and the plan on both splits: accuracy and agreement, or agreement and cosine."""
    from rich.table import Table

    from calibkit.results.runs import AGREEMENT_NOUNS

    classifies = _classifies(r.target.task)
    cols = ["", "agreement search", "agreement holdout"]
    cols[1:1] = ["accuracy search", "accuracy holdout"] if classifies else []
    cols += [] if classifies else ["cosine search", "cosine holdout"]
    index = (f"; neighbours looked up in an FP32 index of each split's texts, so the agreement depends on its "
             f"size: search {_texts(r.final.search_evidence)}, holdout {_texts(r.final.holdout_evidence)}"
             if r.target.task == "embedding" else "")
    t = Table(title=f"tune (agreement: share of {AGREEMENT_NOUNS.get(r.target.task, 'outputs')} kept, the plan's "
                    f"with its 95 % interval and texts{index})")
    for col in cols:
        t.add_column(col, justify="right" if col else "left")
    f, allint8 = r.final, r.all_int8
    rows = [("FP32", [_pct(r.target.fp32_accuracy), _pct(r.target.fp32_accuracy_holdout)], ["", ""], ["", ""]),
            (_all_int8_label(r),
             [_pct(allint8.accuracy_search if allint8 else None), _pct(f.all_int8_accuracy_holdout)],
             [_pct(allint8.agreement_search if allint8 else None), _pct(f.all_int8_agreement_holdout)],
             [_cos(allint8.cosine_search if allint8 else None), _cos(f.all_int8_cosine_holdout)]),
            (f"plan ({count(len(f.kept_nodes), 'layer')} kept)", [_pct(f.accuracy_search), _pct(f.accuracy_holdout)],
             [_agreement(f.agreement_search, f.search_evidence), _agreement(f.agreement_holdout, f.holdout_evidence)],
             [_cos(f.cosine_search), _cos(f.cosine_holdout)])]
    for name, acc, agr, cs in rows:
        t.add_row(name, *(acc + agr if classifies else agr + cs))
    return t


def _texts(ev: PlanEvidence | None) -> str:
    """The texts a plan's agreement on one split was measured on ("?" when the result does not say)."""
    n = None if ev is None else ev.agreement_n if ev.agreement_n is not None else ev.n
    return "?" if n is None else f"{n:,}"


def _agreement(v: float | None, ev: PlanEvidence | None) -> str:
    """The plan's agreement on one split with its 95 % interval and the texts it was measured on."""
    iv = None if ev is None else ev.agreement
    if v is None or iv is None or iv.low is None or iv.high is None:
        return _pct(v)
    return f"{_pct(v)} [{100 * iv.low:.2f}, {100 * iv.high:.2f}] on {_texts(ev)}"


def _all_int8_label(r: TuneResult) -> str:
    """The all-INT8 row's name: its holdout numbers may come from a random sample of the holdout."""
    n = r.final.all_int8_texts_holdout
    return "all INT8" if n is None or n == r.eval_set.holdout else f"all INT8 (holdout: {n:,} random rows)"


def _calibration_lines(run: TuneRun) -> None:
    """The table the plan is on, and the smoothed model it is a plan of."""
    r = run.result
    m = r.methods
    out.print(f"calibration: {m.chosen} ({m.chosen_by}: "
              + ", ".join(f"{k} {_pct(v)} flipped" for k, v in m.all_int8_flip_rate_search.items()) + ")")
    sm = r.smoothing
    if sm is not None and sm.chosen:
        dev = "n/a" if sm.max_output_deviation is None else f"{sm.max_output_deviation:.1e}"
        say(f"the plan is on the smoothed model ({sm.activations_smoothed} activations smoothed, FP32 outputs equal "
            f"within {dev} of their range): {run.out_dir}/{sm.model}/ is its source; "
            f"`calibkit build {run.out_dir}/{sm.model} --precision int8 --qdq {run.out_dir}/model.int8.onnx -o "
            f"engines/plan.onnx` builds the plan's engine")
    elif sm is not None and not sm.tried:
        say(f"smoothing not tried: {sm.note}")


def _decision_lines(r: TuneResult) -> None:
    """What the decisions cost, what the holdout confirmed and found, the warnings and where the time went."""
    cost = r.evidence_cost
    if cost is not None:
        extra = (f"; the plan's remaining {cost.completion_texts} then evaluated for its whole-split numbers"
                 if cost.completion_texts else "")
        if cost.confirm_texts:
            extra += f"; {cost.confirm_texts} holdout texts read by the confirmation"
        say(f"evidence ({cost.rule}): texts per candidate median {cost.texts_median:g} of the search split's "
            f"{cost.split_texts}, {cost.texts_total} in all for {cost.candidates} candidates{extra}")
    cf = r.confirmation
    if cf is not None:
        sc = r.speed_choice
        how = "the fastest" if sc is not None and sc.chosen != sc.most_int8 else "the last"
        said = (f"candidate {cf.chosen}, {how} of {sum(s.meets for s in cf.steps)} confirmed"
                if cf.chosen is not None else "none confirmed: the search's choice is written")
        say(f"holdout confirmation (fixed-sequence, least INT8 first, final test at {100 * cf.final_test_confidence:g} "
            f"%): {len(cf.steps)} of the search's passing candidates tested on {cf.holdout_texts} holdout texts; "
            f"{said} (the search alone chose candidate {cf.search_choice})")
    vh = r.final.holdout_verdict
    if vh is not None and vh.text:
        say(f"{r.holdout_says or 'no holdout verdict'}: {vh.text}")
    for line in r.speed_lines:
        say(line)
    for w in r.warnings:
        warn(w)
    if r.phases:
        passes = r.fp32_passes
        say(f"time: {sum(p.seconds for p in r.phases):.0f} s on {r.cpus} CPUs"
            + (f", {passes:.1f} FP32 passes over the evidence" if passes is not None else "") + " — "
            + "; ".join(phase_words(p) for p in r.phases))


def phase_words(p: PhaseCost) -> str:
    """One phase of the time line: its seconds, the texts it evaluated (said only when it evaluated some: a
    phase that reads none, or whose texts came back from the ledger, is not "0 texts") and its CPU use."""
    said = [f"{p.texts} texts"] if p.texts else []
    if p.utilisation is not None:
        said.append(f"CPU {100 * p.utilisation:.0f} %")
    return f"{p.phase} {p.seconds:.0f} s" + (f" ({', '.join(said)})" if said else "")
