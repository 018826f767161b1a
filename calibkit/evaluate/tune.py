"""`calibkit tune`: the mixed-precision plan with the most INT8 work that keeps accuracy within a target.

Flow (every number below is measured, none estimated):
1. statistics of the calibration set, collected once (reused from the statistics cache when present);
2. one table per method; with ``method="auto"`` also a per-tensor table: each tensor takes the method whose range
   does the least damage where it is read (output KL divergence to FP32 when only that node is INT8, summed
   over the nodes reading it, on the sensitivity subset); the table used is the one whose all-INT8 model flips
   the fewest of FP32's predictions on the search split (fidelity, not accuracy: accuracy differences between
   INT8 variants are mostly noise, flips are not), ties broken by KL divergence;
3. the eval set is split (stratified by label, seeded, by row content: see evidence.subsets) into a *search*
   part and a *holdout* part: every decision uses the search part; the holdout part is only measured at the
   end, for all-INT8 and the final plan, and the verdict says with 95 % intervals whether it supports the claim;
4. sensitivity ranking: for every quantized node (or the worst K by own INT8 error), the KL divergence to FP32
   when only that node is quantized (on a stratified subset of the search part); most damage per FLOP first;
5. calibkit.evaluate.search.search_plan: prefix / bisect / prune over the ranking, each candidate judged on
   the search part against the constraints (accuracy within ``max_drop`` of FP32 and, when given, at least
   ``min_agreement`` % of FP32's predictions kept, mean cosine at least ``min_cosine``) by
   evidence.plan_decisions: in growing chunks until its decision is settled (``decision_rule`` "sequential",
   a betting confidence sequence) or on the whole part ("whole-split"); the final plan is then evaluated on
   the rest of the search part, so its numbers are whole-split ones.
Each finished evaluation is appended to ``OUT/.tune/ledger.jsonl`` (keyed by what determines its result), so
an interrupted run resumes without redoing it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from calibkit._io import atomic_dir, commit_together, dumps_json, sha256_bytes
from calibkit._version import __version__
from calibkit.calibrate.methods import compute_table
from calibkit.calibrate.pipeline import gather_stats
from calibkit.calibrate.trtcache import write_cache
from calibkit.cpus import usable_cpus
from calibkit.data.calibset import CalibrationSet, load_calibration_set
from calibkit.data.evalset import EvalSet, label_ids
from calibkit.data.modeldir import ModelDir
from calibkit.data.tokenizer import TextTokenizer
from calibkit.errors import CalibrationError, DataError, UsageError
from calibkit.evaluate.estimate import announce, estimate_tune, finish
from calibkit.evaluate.flops import LinearWork, linear_work
from calibkit.evaluate.inputs import resolve_tune
from calibkit.evaluate.ledger import Evaluator, Ledger, from_record, job_key
from calibkit.evaluate.phases import PhaseClock
from calibkit.evaluate.search import SearchOutcome, int8_flops_fraction, search_plan
from calibkit.evaluate.sensitivity import (
    ALL_INT8,
    ONLY_THIS,
    SensitivityJob,
    SensitivityResult,
)
from calibkit.evaluate.served import served_check, served_model, time_plans
from calibkit.evaluate.speed import SPEED_TIE, fastest
from calibkit.evaluate.traffic import TrafficEvidence, evidence_of
from calibkit.evaluate.tune_defaults import (
    TUNE_AUTO_FINALISTS,
    TUNE_AUTO_TEXTS,
    TUNE_PRUNE_BUDGET,
    TUNE_PRUNE_MIN_SHARE,
    all_int8_holdout_texts,
)
from calibkit.evidence.candidates import Measured, Plan
from calibkit.evidence.confirm import fixed_sequence
from calibkit.evidence.holdout import agreement_noun, allowed_change, holdout_verdict, plan_evidence
from calibkit.evidence.intervals import wilson_lower
from calibkit.evidence.plan_decisions import (
    ESTIMATED,
    WHOLE_SPLIT,
    Judged,
    PlanJudge,
    constraints_for,
    make_rule,
)
from calibkit.evidence.risk import STRATIFIED, StratifiedJudge, risky_subset, stratify
from calibkit.evidence.sequential import DecisionRule, texts_needed
from calibkit.evidence.split import SplitEvidence, split_evidence, split_subsets
from calibkit.evidence.subsets import EvalSubset
from calibkit.executors import from_spec
from calibkit.graph import check_float_source, load_model, model_input_names, model_sha256
from calibkit.names import attention_products, node_names, with_product
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.quantize.placement import Placement, plan_placement
from calibkit.quantize.tablefile import write_calibration_json
from calibkit.requests.choices import Target
from calibkit.requests.tune import TuneRequest
from calibkit.resources import Resources, RunnerFactory
from calibkit.results.documents import PlanDocument
from calibkit.results.files import SmoothingRecord
from calibkit.results.runs import (
    FP32_PHASE,
    Candidate,
    Confirmation,
    Evidence,
    EvidenceCost,
    LinearFlops,
    MethodChoice,
    RowSelection,
    ServedCheck,
    SmoothingChoice,
    Speed,
    SpeedChoice,
    TuneEvalSet,
    TunePlan,
    TuneResult,
    TuneSplit,
    TuneTarget,
    finite,
)
from calibkit.tasks import task_class
from calibkit.types import CalibrationTable, Method

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

    from calibkit.calibrate.stats import StatsStore
    from calibkit.tasks import Task

log = logging.getLogger("calibkit.evaluate.tune")

PLAN_MODE = "plan"




DocumentWriter = Callable[["TuneResult | PlanDocument", Path], None]  # writes tune.json and plan.json (the codec)


@dataclass(frozen=True)
class TuneRun:
    """What a tune run wrote (OUT/ and its files) and its typed :class:`TuneResult`."""

    out_dir: Path
    model_path: Path
    cache_path: Path
    json_path: Path
    plan_path: Path
    result: TuneResult
    resumed_evaluations: int = 0

    @property
    def kept_nodes(self) -> tuple[str, ...]:
        return self.result.final.kept_nodes

    @property
    def int8_flops_fraction(self) -> float:
        return self.result.final.int8_flops_fraction

    @property
    def met_target(self) -> bool:
        return self.result.target.met

    @property
    def fp32_accuracy_holdout(self) -> float | None:
        return self.result.target.fp32_accuracy_holdout

    @property
    def accuracy_holdout(self) -> float | None:
        return self.result.final.accuracy_holdout


# -- helpers ---------------------------------------------------------------------------------------------------
def split_eval(labels: np.ndarray, holdout_fraction: float, seed: int, texts: Sequence[str] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """The search and holdout indices of :func:`split_subsets`, in its canonical order."""
    search, hold = split_subsets(labels, holdout_fraction, seed, texts)
    return search.array, hold.array


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(logits.argmax(axis=1) == labels)) if len(labels) else float("nan")


def _write_table(path: Path, table: CalibrationTable, extras: dict[str, Any]) -> str:
    write_calibration_json(path, table, extras)
    return sha256_bytes(dumps_json(table.to_dict()).encode("utf-8"))


def _typical_feeds(tok: TextTokenizer, cset: CalibrationSet, input_names: Sequence[str]) -> dict[str, np.ndarray]:
    lengths = np.minimum(tok.token_lengths(cset.texts), tok.max_length)
    median_text = cset.texts[int(np.argsort(lengths)[len(lengths) // 2])]
    return tok.encode([median_text]).feeds(input_names)


# -- the pipeline ----------------------------------------------------------------------------------------------
def run_tune(request: TuneRequest, resources: Resources) -> TuneRun:
    """Search the plan for ``request``, write OUT/ and return what was written with the typed result.

    The inputs the request names are loaded first (:func:`calibkit.evaluate.inputs.resolve_tune`). Traffic is
    split like the eval set; agreement with FP32 is then judged on it (search and holdout parts) and the eval
    set's labels carry accuracy alone. ``resources``: where evaluations run (``executor``; default: a process
    pool of ``workers``, closed at the end; a given executor also shards the statistics), the memory budget of
    statistics and layer taps, the runner factory, progress, and the ``writer`` of tune.json (without one no
    tune.json is written) and of the report folder (``request.report``)."""
    inputs = resolve_tune(request, resources.progress)
    writer = resources.writer
    with contextlib.ExitStack() as stack:
        given = resources.executor is not None
        if resources.executor is None:
            resources = replace(resources, executor=stack.enter_context(from_spec("local", resources.workers)))
        return _run_tune(inputs.model, inputs.calibration_set, inputs.eval_set, inputs.out, request,
                         progress=resources.progress, graph=inputs.graph,
                         render=writer.report if writer is not None and inputs.report is not None else None,
                         report_dir=inputs.report, resources=resources, shard_stats=given,
                         write_document=writer.document if writer is not None else None, rows=inputs.rows,
                         traffic=inputs.traffic)


@dataclass(frozen=True, eq=False)
class _Model:
    """The FP32 model being tuned, loaded once."""

    dir: ModelDir
    tokenizer: TextTokenizer
    sha: str
    proto: onnx.ModelProto
    input_names: tuple[str, ...]
    placement: Placement
    nodes: tuple[str, ...]
    task: Task


@dataclass(frozen=True, eq=False)
class _Jobs:
    """Makes the sensitivity work units of one run: a table, a plan and a subset of the evidence."""

    model: _Model
    evidence: SplitEvidence
    config: TuneRequest
    threads: int

    def __call__(self, table_path: Path, keep: Plan, subset: EvalSubset, mode: str,
                 node: str | None = None) -> SensitivityJob:
        idx = subset.array
        md = self.model.dir
        ev = self.evidence
        embedding = self.model.task.neighbour_index
        return SensitivityJob(
            source_model=str(md.onnx_path), calibration_json=str(table_path), tokenizer=str(md.tokenizer_path),
            texts=subset.take(ev.texts), labels=tuple(int(v) for v in ev.labels[idx]),
            reference_logits=ev.reference[idx], keep_nodes=tuple(keep), mode=mode, node=node,
            target=self.config.target, batch_size=self.config.batch_size, threads=self.threads,
            max_length=md.max_length, output_name=self.model.task.output_name, source_model_sha256=self.model.sha,
            task=ev.task, pooling=getattr(self.model.task, "pooling", None),
            # embeddings: every text's neighbours are looked up among the FP32 vectors of all evidence rows, so a
            # text's value is the same in whichever subset or chunk it is evaluated
            neighbour_index=ev.reference if embedding else None,
            index_rows=tuple(int(i) for i in idx) if embedding else None,
        )

    def all_but(self, node: str) -> Plan:
        return tuple(x for x in self.model.nodes if x != node)


SMOOTHED = "+smooth"  # suffix of the table keys of the smoothed variant
SMOOTHED_FOLDER = "smoothed-model"  # in OUT when the plan is on the smoothed model


@dataclass(frozen=True, eq=False)
class _Variant:
    """A model the tables are computed for: the FP32 model as given, or its smoothed copy (same function)."""

    name: str  # "plain" | "smoothed"
    model: _Model
    store: StatsStore
    jobs: _Jobs
    smoothing: SmoothingRecord | None = None  # smoothing.json of the smoothed copy

    @property
    def suffix(self) -> str:
        return "" if self.name == "plain" else SMOOTHED


@dataclass(frozen=True, eq=False)
class _Tables:
    """The calibration tables measured all-INT8 on the search split, and the one the search starts from."""

    tables: dict[str, tuple[CalibrationTable, Path, str]]  # key -> (table, its file, its hash)
    chosen_methods: dict[str, str]  # per tensor, with method auto
    accuracy: dict[str, float]
    flips: dict[str, float]
    kl: dict[str, float]  # the output divergence of each table's all-INT8 model (see _damage)
    base_key: str
    variant: _Variant | None = None  # the model the base table belongs to
    smoothing_note: str | None = None  # why no smoothed variant was measured, when none was
    cosine: dict[str, float] = field(default_factory=dict)  # embeddings: mean cosine to FP32, all-INT8
    race_texts: int = 0  # the search texts the tables were raced on (evidence.risk.risky_subset)
    # method auto: each finalist method's one-node runs (method -> node -> result) and the texts they ran on
    own_runs: dict[str, dict[str, SensitivityResult]] = field(default_factory=dict)
    own_texts: EvalSubset | None = None

    @property
    def base(self) -> tuple[CalibrationTable, Path, str]:
        return self.tables[self.base_key]


@dataclass(frozen=True, eq=False)
class _Ranking:
    order: list[str]  # the search keeps a prefix of this order in higher precision
    harm: dict[str, tuple[float, float]]  # node -> (damage, flip rate) when only it is INT8 (see _damage)
    base: SensitivityResult  # all INT8 on the sensitivity subset
    own_sqnr: dict[str, float]


@dataclass(frozen=True, eq=False)
class _Searched:
    outcome: SearchOutcome
    final: Measured
    on_search: dict[Plan, SensitivityResult]
    on_holdout: dict[Plan, SensitivityResult]
    cost: EvidenceCost | None = None
    confirmation: Confirmation | None = None
    note: str | None = None  # why the plan written is not the search's choice, beyond the confirmation
    all_int8_sample: tuple[EvalSubset, SensitivityResult] | None = None  # all-INT8 on holdout rows, not in full
    speed_choice: SpeedChoice | None = None
    speed: Speed | None = None  # the written plan's, beside FP32
    speed_note: str | None = None  # why it was not measured
    served: ServedCheck | None = None


@dataclass(frozen=True, eq=False)
class _Serving:
    """What timing and checking the served models needs: the FP32 model the user serves today (the original,
    also when the plan is on the smoothed copy), the run's runner factory and progress."""

    fp32: Path
    make_runner: RunnerFactory
    progress: ProgressCallback


def _run_tune(
    model_dir: ModelDir,
    calibration_set: CalibrationSet | str | Path,
    eval_set: EvalSet,
    out_dir: str | Path,
    config: TuneRequest,
    *,
    progress: ProgressCallback | None,
    render: Callable[[TuneResult, Path], Any] | None,
    report_dir: str | Path | None,
    resources: Resources,
    shard_stats: bool,
    write_document: DocumentWriter | None,
    rows: EvalSubset | None,
    traffic: TrafficEvidence | None = None,
    graph: onnx.ModelProto | None = None,
) -> TuneRun:
    """The search, step by step (see the module docstring). ``graph``: the FP32 model when the caller loaded
    it (else it is loaded here)."""
    cb = progress or no_progress
    executor = resources.executor
    assert executor is not None  # run_tune provides one
    out = Path(out_dir)
    work = out.parent / f".{out.name}.tune"  # beside OUT so OUT itself is swapped in whole at the end
    t0 = time.perf_counter()
    clock = PhaseClock(usable_cpus() if executor.task_threads is None else executor.workers)
    cset = calibration_set if isinstance(calibration_set, CalibrationSet) else load_calibration_set(calibration_set)
    model = _load_model(model_dir, config, graph)
    if traffic is not None and len(eval_set):
        traffic = traffic.without(eval_set.texts, "eval_set")
    with clock.phase(FP32_PHASE, texts=len(eval_set) + (len(traffic) if traffic is not None else 0)):
        config, evidence = _draw_evidence(model, eval_set, config, resources, cb, traffic)
    estimate = estimate_tune(evidence, config, len(model.nodes), len(cset), clock.phases, executor,
                             TUNE_AUTO_FINALISTS * TUNE_AUTO_TEXTS, work / "ledger.jsonl")
    announce(estimate, "tune", cb)
    since = time.perf_counter()
    with clock.phase("calibration statistics"):
        store, reused_stats = gather_stats(model_dir, cset, model.placement.activations, model_sha256=model.sha,
                                           num_bins=config.params.num_bins, batch_size=config.batch_size,
                                           model=model.proto, resources=replace(
                                               resources, executor=executor if shard_stats else None, progress=cb))
        linear = linear_work(model.proto, _typical_feeds(model.tokenizer, cset, model.input_names), config.op_types)
    flops = {f.node: f.flops for f in linear.plain}  # what plans choose among; fused ops stay FP32 (below)
    from calibkit.outdirs import work_folder

    work_folder(work)  # a plain folder: a link or a file standing there is refused, never written through
    ledger = Ledger(work / "ledger.jsonl")
    ev = Evaluator(ledger, model.sha, executor, cb)
    clock.counter = ev
    jobs = _Jobs(model, evidence, config, executor.threads_per_task)
    variants = [_Variant("plain", model, store, jobs)]
    note = None
    if config.smooth:
        with clock.phase("smoothing"):
            smoothed, note = _smoothed_variant(model_dir, model, cset, config, evidence, resources, shard_stats, cb,
                                               work)
        variants += [smoothed] if smoothed is not None else []
    race = risky_subset(evidence, evidence.search, config.race_texts)
    with clock.phase("method tables"):
        tables = _measure_tables(variants, cset, config, ev, work, race)
    tables = replace(tables, smoothing_note=note)
    assert tables.variant is not None
    model, jobs = tables.variant.model, tables.variant.jobs
    with clock.phase("layer ranking"):
        ranking = _rank(model, evidence, config, jobs, ev, tables, flops, resources, cb)
    searched = _search(evidence, config, jobs, ev, tables, ranking, flops, clock,
                       _Serving(model_dir.onnx_path, resources.runner_factory, cb))
    result = _tune_result(eval_set, rows, model, evidence, config, tables, ranking, searched, flops, linear,
                          reused_stats, ev.reused, time.perf_counter() - t0, traffic)
    result = replace(result, phases=clock.result(), cpus=clock.cpus,
                     time_estimate=finish(estimate, time.perf_counter() - since, clock.phases))
    run = _write_run(out, report_dir, render, lambda: _write_outputs(
        out, model_dir, model.proto, tables.base[0], result, config, write_document, tables.variant, cset), result)
    return replace(run, resumed_evaluations=ledger.loaded)


def _write_run(out: Path, report_dir: str | Path | None, render: Callable[[TuneResult, Path], Any] | None,
               write: Callable[[], TuneRun], result: TuneResult) -> TuneRun:
    """OUT by ``write``, then the report: in ``report_dir`` replaced together with OUT or not at all, else in
    OUT/report."""
    if render is not None and report_dir:
        with commit_together():
            run = write()
            render(result, Path(report_dir))
        return run
    run = write()
    if render is not None:
        render(result, out / "report")
    return run




def _first(subset: EvalSubset, n: int) -> EvalSubset:
    """The first ``n`` rows of ``subset`` (its seeded order: a random part of it)."""
    return replace(subset, indices=subset.indices[:n], content_sha256="") if len(subset) > n else subset


def _load_model(model_dir: ModelDir, config: TuneRequest, graph: onnx.ModelProto | None = None) -> _Model:
    """The FP32 model (``graph`` when loaded already), its placement and its task (which must be one tune can
    search plans for)."""
    from calibkit.tasks import check_label_count, choose_task, model_outputs

    tok = TextTokenizer(model_dir.tokenizer_path, max_length=model_dir.max_length)
    proto = graph if graph is not None else check_float_source(load_model(model_dir.onnx_path), model_dir.onnx_path)
    placement = plan_placement(proto, config.op_types)
    nodes = tuple(n.name for n in placement.nodes)
    if not nodes:
        raise CalibrationError(f"no {', '.join(config.op_types)} nodes to quantize in {model_dir.onnx_path.name}")
    id2label = model_dir.id2label
    task = choose_task(model_outputs(proto), {"id2label": {str(k): v for k, v in id2label.items()}}, config.task)
    check_label_count(task, proto, model_dir.onnx_path.name)
    if task.tunable is not None:
        raise UsageError(task.tunable, hint="use `calibkit compare` for its fidelity, and --exclude to keep layers")
    if config.min_cosine is not None and not task.cosine_target:
        raise UsageError(f"--min-cosine applies to embedding models; {model_dir.onnx_path.name} is a "
                         f"{task.kind} model", hint="use --min-agreement, or pass --task embedding")
    if task.classifies and not id2label:
        raise DataError("the model folder's config.json has no id2label: tune cannot map eval labels to classes",
                        hint="add id2label to config.json, or pass --task embedding / token-classification")
    return _Model(model_dir, tok, model_sha256(model_dir.onnx_path), proto,
                  model_input_names(proto), placement, nodes, task)


def _draw_evidence(model: _Model, eval_set: EvalSet, config: TuneRequest, resources: Resources,
                   cb: ProgressCallback, traffic: TrafficEvidence | None = None) -> tuple[TuneRequest, SplitEvidence]:
    """Labels (or, unlabeled, FP32's own predictions: the target becomes agreement alone), the FP32 reference
    on every row (once, in the task's terms: ``evidence.rowfidelity``), and the search / holdout / sensitivity
    split. Traffic texts join the rows with FP32's predictions as their labels and are marked, so accuracy is
    scored on the eval set's rows and agreement on the traffic's. Tasks without classes are judged on fidelity
    alone (agreement, and mean cosine for embeddings)."""
    task = model.task
    texts = eval_set.texts
    labelled = eval_set.has_labels and task.classifies
    mask = None
    if traffic is not None and len(traffic):
        texts = (*texts, *traffic.texts)
        mask = np.zeros(len(texts), dtype=bool)
        mask[len(eval_set):] = True
    if len(texts) < 15:
        raise DataError(f"too few texts to tune on ({len(texts)}: {len(eval_set)} in the eval set"
                        + (f", {len(traffic)} from traffic)" if traffic is not None else ")"),
                        hint="use at least a few hundred examples, or draw them from the log with --traffic")
    config = _fidelity_targets(config, eval_set, task, labelled)
    with resources.runner_factory(model.dir.onnx_path, name="fp32") as fp32:
        out = task.predict(fp32, model.tokenizer, texts, batch_size=config.batch_size, progress=cb,
                           task="FP32 reference")
    reference = task.row_reference(out.values, out.mask)
    id2label = model.dir.id2label
    labels = np.zeros(len(texts), dtype=np.int64)
    if task.classifies:
        fp32_pred = reference.argmax(axis=1).astype(np.int64)
        labels = fp32_pred
        if labelled:
            labels = np.concatenate([label_ids(eval_set, id2label, len(id2label)), fp32_pred[len(eval_set):]])
    evidence = split_evidence(texts, labels, reference, labelled=labelled,
                              class_names=[id2label[i] for i in sorted(id2label)],
                              holdout_fraction=config.holdout_fraction,
                              sensitivity_samples=config.sensitivity_samples, seed=config.seed, traffic=mask,
                              kind=task)
    if labelled:
        _check_labelled_split(evidence, len(eval_set))
    for w in evidence.warnings:  # returned with the result, whose caller shows them (the CLI as "warning:")
        log.info("%s", w)
    return config, evidence


def _check_labelled_split(evidence: SplitEvidence, n_labelled: int) -> None:
    """Accuracy is judged on both splits: each must hold labelled rows. Traffic can make the set large enough
    to tune on while the eval set's few labelled rows all land on one side (``--limit 1``), which used to end
    in a crash."""
    search = len(evidence.accuracy_positions(evidence.search))
    holdout = len(evidence.accuracy_positions(evidence.holdout))
    if search and holdout:
        return
    raise DataError(f"the eval set's {n_labelled} labelled example(s) cannot be split between the search and the "
                    f"holdout (search: {search}, holdout: {holdout}): accuracy cannot be judged on both",
                    hint="use more labelled examples (a larger --limit, or none), or an eval set without labels "
                         "to tune on fidelity to FP32 alone")


def _fidelity_targets(config: TuneRequest, eval_set: EvalSet, task: Task, labelled: bool) -> TuneRequest:
    """Without labels (or classes) the target is fidelity alone: --min-agreement (default 99 % for classifiers
    and token taggers; for embeddings, with neither target given, 95 % of nearest neighbours and a mean cosine
    of 0.995, what the demo's embedder reaches with a few layers kept)."""
    if labelled:
        return config
    if config.min_agreement is None and config.min_cosine is None:
        agreement, cosine = task.default_targets()
        config = replace(config, min_agreement=agreement, min_cosine=cosine)
    why = task.unlabelled_why()
    targets = ", ".join(t for t in (
        f"--min-agreement {config.min_agreement:g}" if config.min_agreement is not None else "",
        f"--min-cosine {config.min_cosine:g}" if config.min_cosine is not None else "") if t)
    if len(eval_set):
        log.warning("%s %s: tuning for fidelity to FP32 alone (%s; --max-drop does not apply)",
                    eval_set.path.name, why, targets)
    return replace(config, fidelity_only=True)


def _smoothed_variant(model_dir: ModelDir, model: _Model, cset: CalibrationSet, config: TuneRequest,
                      evidence: SplitEvidence, resources: Resources, shard_stats: bool, cb: ProgressCallback,
                      work: Path) -> tuple[_Variant | None, str | None]:
    """The model smoothed with alpha auto (calibrate.smoothing, its FP32 function checked), its statistics and
    jobs; reused from an interrupted run of the same model and calibration set. (None, why) when the model has
    nothing to smooth or is smoothed already."""
    from calibkit.calibrate.smoothing import smooth
    from calibkit.errors import DataError, ModelError
    from calibkit.outdirs import changed_files
    from calibkit.requests.smooth import SmoothRequest
    from calibkit.results.codec import read_smoothing

    folder = work / SMOOTHED_FOLDER
    try:
        record = read_smoothing(folder)
    except DataError as exc:
        log.warning("the smoothed copy of an earlier run is smoothed again: %s", exc.message)
        record = None
    if record is not None and (changed := changed_files(folder)):
        log.warning("%s: %s changed since smooth wrote it; smoothing again", folder, ", ".join(changed))
        record = None
    if not (record is not None and record.source_sha256 == model.sha and record.calibration_set_id == cset.id
            and (folder / "model.onnx").is_file()):
        try:
            smooth(SmoothRequest(model=model_dir, calibration_set=cset, out=folder, batch_size=config.batch_size),
                   replace(resources, progress=cb))
        except ModelError as exc:
            log.info("no smoothed variant: %s", exc.message)
            return None, exc.message
        record = read_smoothing(folder)
    md = ModelDir.resolve(folder)
    sm = _load_model(md, config)
    store, _ = gather_stats(md, cset, sm.placement.activations, model_sha256=sm.sha,
                            num_bins=config.params.num_bins, batch_size=config.batch_size, model=sm.proto,
                            resources=replace(resources, executor=resources.executor if shard_stats else None,
                                              progress=cb))
    assert resources.executor is not None
    return _Variant("smoothed", sm, store, _Jobs(sm, evidence, config, resources.executor.threads_per_task),
                    record), None


def _measure_tables(variants: Sequence[_Variant], cset: CalibrationSet, config: TuneRequest, ev: Evaluator,
                    work: Path, race: EvalSubset) -> _Tables:
    """One table per method and variant (plain, and smoothed unless --no-smooth), raced all-INT8 on ``race``
    (the search texts most at risk of flipping, evidence.risk.risky_subset: where tables differ); the variant
    whose best table flips the fewest FP32 predictions there is the one searched on. With method auto that
    variant also gets the per-tensor table: each tensor takes, among the ``TUNE_AUTO_FINALISTS`` best methods of the
    race, the one whose range does the least damage where it is read (on the sensitivity subset).
    The table flipping the fewest FP32 predictions is the base of the search."""
    methods = [Method(config.method)] if config.method != "auto" else list(Method)
    tables: dict[str, tuple[CalibrationTable, Path, str]] = {}
    owner: dict[str, _Variant] = {}
    search = race
    acc: dict[str, float] = {}
    flips: dict[str, float] = {}
    kl: dict[str, float] = {}
    cos: dict[str, float] = {}

    def measure(keys: Sequence[str]) -> None:  # all in one executor call: one tail for the race, not one a table
        results = ev.run([owner[k].jobs(tables[k][1], (), search, ALL_INT8) for k in keys],
                         [tables[k][2] for k in keys], "all-INT8 " + (f"({keys[0]})" if len(keys) == 1 else "tables"))
        for k, r in zip(keys, results):
            sc = owner[k].jobs.evidence.scores(search, r)
            acc[k], flips[k], kl[k], cos[k] = sc.accuracy, 1.0 - sc.agreement, _damage(r), sc.cosine

    def rank(keys: Sequence[str]) -> str:
        return min(keys, key=lambda k: (flips[k], kl[k], SMOOTHED in k, "auto" not in k))

    for v in variants:
        for m in methods:
            key = m.value + v.suffix
            t = compute_table(v.store, m, config.params, v.model.sha, cset.id, tensors=v.model.placement.activations,
                              fitted=config.target is Target.ONNXRUNTIME)
            p = work / f"table-{key}.json"
            tables[key], owner[key] = (t, p, _write_table(p, t, {"target": config.target})), v
    measure(list(tables))
    chosen = owner[rank(list(tables))]
    chosen_methods: dict[str, str] = {}
    own_runs: dict[str, dict[str, SensitivityResult]] = {}
    sens = None
    if config.method == "auto":
        # for every method and node of the chosen variant, the output KL divergence to FP32 when only that node
        # is INT8
        jobs, model = chosen.jobs, chosen.model
        sens = _first(jobs.evidence.sensitivity, TUNE_AUTO_TEXTS)
        own_kl: dict[str, dict[str, float]] = {}
        finalists = sorted(methods, key=lambda m: (flips[m.value + chosen.suffix], kl[m.value + chosen.suffix]))
        picked = [(m, tables[m.value + chosen.suffix]) for m in finalists[:TUNE_AUTO_FINALISTS]]
        res = ev.run([jobs(p, jobs.all_but(n), sens, ONLY_THIS, n) for _, (_, p, _) in picked for n in model.nodes],
                     [tsha for _, (_, _, tsha) in picked for _ in model.nodes],
                     f"per-layer fidelity ({', '.join(m.value + chosen.suffix for m, _ in picked)})")
        for i, (m, _) in enumerate(picked):
            own_runs[m.value] = {r.node: r for r in res[i * len(model.nodes):(i + 1) * len(model.nodes)] if r.node}
            own_kl[m.value] = {n: _damage(r) for n, r in own_runs[m.value].items()}
        chosen_methods = _auto_methods_by_fidelity(own_kl, model.placement)
        per_tensor = {t: Method(m) for t, m in chosen_methods.items()}
        t = compute_table(chosen.store, per_tensor, config.params, model.sha, cset.id,
                          tensors=model.placement.activations, fitted=config.target is Target.ONNXRUNTIME)
        key = "auto" + chosen.suffix
        p = work / f"table-{key}.json"
        tables[key], owner[key] = (t, p, _write_table(p, t, {"target": config.target})), chosen
        measure([key])
    base_key = rank([k for k in tables if owner[k] is chosen])
    return _Tables(tables, chosen_methods, acc, flips, kl, base_key, chosen, cosine=cos, race_texts=len(race),
                   own_runs=own_runs, own_texts=sens)


def _rank(model: _Model, evidence: SplitEvidence, config: TuneRequest, jobs: _Jobs, ev: Evaluator,
          tables: _Tables, flops: dict[str, float], resources: Resources, cb: ProgressCallback) -> _Ranking:
    """Layers ordered by their own quantization error (cheap, every layer), then the worst K of them re-ordered
    by measured damage per FLOP: quantize only it (every other layer in higher precision) and measure the output
    KL divergence to FP32 — in an all-INT8 model the other layers' errors mask it, so this ranks far more
    sharply."""
    from calibkit.evaluate.compare import worst_layers
    from calibkit.evaluate.layers import weight_errors

    table, table_path, table_sha = tables.base
    probe = evidence.search.take(evidence.texts)[:128]
    base_meas, base_model = _layer_quality(model.proto, {tables.base_key: table}, model.tokenizer, probe, cb,
                                           resources)[tables.base_key]
    nodes = model.nodes
    by_badness = [spec.node for spec in worst_layers(base_meas.layers, weight_errors(base_model, model.proto), None)]
    by_badness += [n for n in nodes if n not in by_badness]
    k = len(nodes) if config.sensitivity_layers is None else min(config.sensitivity_layers, len(nodes))
    sens = evidence.sensitivity
    (base,) = ev.run([jobs(table_path, (), sens, ALL_INT8)], table_sha, "sensitivity base")
    known = _known_one_node_runs(model, tables, sens)
    measured = ev.run([jobs(table_path, jobs.all_but(n), sens, ONLY_THIS, n) for n in by_badness[:k]
                       if n not in known], table_sha, "sensitivity (quantize one node)")
    harm = {r.node: (_damage(r), r.flip_rate) for r in [*measured, *(known[n] for n in by_badness[:k] if n in known)]
            if r.node}
    own_sqnr: dict[str, float] = {}
    for lm in base_meas.layers:
        if lm.quant_sqnr_db is not None:
            own_sqnr[lm.spec.node] = min(own_sqnr.get(lm.spec.node, float("inf")), lm.quant_sqnr_db)
    return _Ranking(_rank_by_harm_per_flop(by_badness[:k], harm, flops) + by_badness[k:], harm, base, own_sqnr)


def _known_one_node_runs(model: _Model, tables: _Tables, sens: EvalSubset) -> dict[str, SensitivityResult]:
    """The base table's one-node runs that method auto's per-layer fidelity already made, on the same texts: a
    node quantized alone reads only its own inputs' ranges, so where the base table gives every activation input
    of the node the range of one finalist method, that finalist's run is the node's run under the base table."""
    if not tables.own_runs or tables.own_texts is None or tables.own_texts.indices != sens.indices:
        return {}
    suffix = tables.variant.suffix if tables.variant is not None else ""
    single = tables.base_key[:-len(suffix)] if suffix and tables.base_key.endswith(suffix) else tables.base_key
    out: dict[str, SensitivityResult] = {}
    for qn in model.placement.nodes:
        methods = ({tables.chosen_methods.get(t) for t in qn.activation_inputs} if single == "auto"
                   else {single})
        runs = tables.own_runs.get(next(iter(methods)) or "", {}) if len(methods) == 1 else {}
        if qn.name in runs:
            out[qn.name] = runs[qn.name]
    return out


def _search(evidence: SplitEvidence, config: TuneRequest, jobs: _Jobs, ev: Evaluator, tables: _Tables,
            ranking: _Ranking, flops: dict[str, float], clock: PhaseClock, serving: _Serving) -> _Searched:
    """The plan search on the search split (evaluate.search), the confirmation on the holdout, the fastest
    confirmed plan (served models timed beside FP32), then all-INT8 and the final plan measured once each on
    the holdout split and the served model checked against the certified arithmetic."""
    _, table_path, table_sha = tables.base
    on_search: dict[Plan, SensitivityResult] = {}
    with clock.phase("flip risk"):
        judge = _judge(evidence, config, jobs, ev, tables)
    done = 0

    def evaluate(plans: Sequence[Plan]) -> list[Any]:
        # the search is the longest step: say which candidates are measured, then what the last one measured
        nonlocal done
        first, last, most = done + 1, done + len(plans), config.max_evaluations
        which = f"candidate {first}" if first == last else f"candidates {first}-{last}"
        ev.progress(ProgressEvent("plan search", done, most, message=f"measuring {which}"))
        if judge is not None:  # each candidate on as many chunks of the search split as its decision needs
            scores: list[Any] = list(judge.judge(plans))
        else:
            res = ev.run([jobs(table_path, p, evidence.search, PLAN_MODE) for p in plans], table_sha,
                         "candidate plans")
            on_search.update(zip(plans, res))
            scores = [tuple(evidence.scores(evidence.search, r)) for r in res]
        done = last
        ev.progress(ProgressEvent("plan search", done, most,
                                  message=f"candidate {last}: {_measured_text(plans[-1], scores[-1], flops)}"))
        return scores

    fp32_search = evidence.accuracy_of_reference(evidence.search)
    confirms = config.confirm and judge is not None and len(evidence.holdout) > 0
    margin = _holdout_margin(config, evidence, judge.rule) if confirms and judge is not None else None
    with clock.phase("plan search"):
        outcome = search_plan(ranking.order, flops, evaluate, config.threshold(fp32_search),
                              max_evaluations=config.max_evaluations,
                              min_agreement=None if config.min_agreement is None else config.min_agreement / 100.0,
                              agreement_examples=len(evidence.agreement_positions(evidence.search)),
                              agreement_z=NormalDist().inv_cdf(config.agreement_confidence),
                              anchors=config.confirm_anchors if confirms else 0,
                              margin=margin, prune_min_share=TUNE_PRUNE_MIN_SHARE, prune_budget=TUNE_PRUNE_BUDGET)
    final: Measured | None = outcome.best
    if final is None:  # nothing met the target: report the most faithful plan measured
        final = max(outcome.tried, key=lambda m: (m.agreement, m.accuracy, m.int8_flops_fraction))
    cost = _evidence_cost(config, evidence, outcome.tried, judge)
    confirmation, hold_judge = None, None
    if confirms and outcome.best is not None:
        with clock.phase("holdout confirmation"):
            hold_judge = _judge(evidence, config, jobs, ev, tables, evidence.holdout, "holdout confirmation")
            # None only where the holdout has no constraint the search split had (no labelled row in it beside
            # traffic, and no fidelity target): not handled, as it was not before (None has no judge)
            assert hold_judge is not None
            confirmation, outcome, final = _confirm(outcome, hold_judge, config, evidence, ev)
        # every candidate judged, those a parallel batch reached past the first failure too
        cost = replace(cost, confirm_texts=sum(hold_judge.texts().values()))
    speeds = _SpeedRun(None, _speed_note(config), {})
    if speeds.note is None and outcome.tried:
        with clock.phase("speed"):
            speeds, confirmation, outcome, final = _fastest(outcome, final, confirmation, evidence, config, jobs,
                                                           tables, serving)
    with clock.phase("holdout numbers"):
        on_holdout, all_int8 = _holdout_numbers(evidence, config, jobs, ev, tables, final, confirmation, hold_judge)
    note = None
    if confirmation is not None and confirmation.chosen is None and judge is not None:
        outcome, final, note = _all_int8_if_as_good(outcome, final, judge, on_search, on_holdout, evidence)
    served = None
    if speeds.note is None and final.plan in on_holdout:
        with clock.phase("served check"):
            model = speeds.models.get(final.plan) or served_model(jobs.model.proto, tables.base[0], final.plan,
                                                                  config.op_types, config.kept_weights)
            served = served_check(model, jobs.model.task, jobs.model.tokenizer, evidence, evidence.holdout,
                                  on_holdout[final.plan], make_runner=serving.make_runner,
                                  batch_size=config.batch_size, seed=config.seed + 3, progress=serving.progress)
    return _Searched(outcome, final, on_search, on_holdout, cost, confirmation, note, all_int8, speeds.choice,
                     speeds.timed.get(final.plan), speeds.note, served)


def _holdout_numbers(evidence: SplitEvidence, config: TuneRequest, jobs: _Jobs, ev: Evaluator, tables: _Tables,
                     final: Measured, confirmation: Confirmation | None,
                     hold_judge: PlanJudge | StratifiedJudge | None
                     ) -> tuple[dict[Plan, SensitivityResult], tuple[EvalSubset, SensitivityResult] | None]:
    """The final plan measured in full on the holdout, all-INT8 beside it (a random sample once a plan is
    confirmed, the whole holdout where it may be written instead)."""
    _, table_path, table_sha = tables.base
    on_holdout: dict[Plan, SensitivityResult] = {}
    # the plan's search-split numbers are those its decision rested on (the stratified estimate: evidence.risk);
    # the numbers the plan claims are the holdout's, measured in full below
    all_int8: tuple[EvalSubset, SensitivityResult] | None = None
    if len(evidence.holdout):
        if hold_judge is not None:  # the confirmed plan's holdout rows so far are in its judge: complete them
            # its run_chunks returns SensitivityResults, kept as such; None only for an empty holdout
            on_holdout[final.plan] = cast(SensitivityResult, hold_judge.complete(final.plan))
        # all-INT8 is context once a plan is confirmed (a random sample of the holdout); in full where it may
        # be written instead (the holdout confirmed nothing)
        sample = all_int8_holdout_texts(len(evidence.holdout))
        whole = (confirmation is not None and confirmation.chosen is None) or sample == len(evidence.holdout)
        # where the plan is all-INT8, its own key (the whole holdout) replaces the sample's
        rows = {(): evidence.holdout if whole else evidence.sample(evidence.holdout, sample, config.seed + 2),
                final.plan: evidence.holdout}
        plans = [p for p in rows if p not in on_holdout]
        res = ev.run([jobs(table_path, p, rows[p], PLAN_MODE) for p in plans], table_sha, "holdout check")
        for p, r in zip(plans, res, strict=True):
            if rows[p] is evidence.holdout:
                on_holdout[p] = r
            else:
                all_int8 = (rows[p], r)
    return on_holdout, all_int8


@dataclass(frozen=True, eq=False)
class _SpeedRun:
    choice: SpeedChoice | None
    note: str | None
    timed: dict[Plan, Speed]
    models: dict[Plan, bytes] = field(default_factory=dict)


def _speed_note(config: TuneRequest) -> str | None:
    """Why the plans' speed is not measured here (None: it is)."""
    if not config.speed:
        return "not measured (--no-speed)"
    if config.target is not Target.ONNXRUNTIME:
        return ("not measured: a tensorrt-layout plan is served by TensorRT, which is not installed here; its "
                "engine is timed where it is built (trtexec), and ONNX Runtime's time for this layout on a CPU "
                "says nothing of TensorRT's; to serve on ONNX Runtime, tune with --target onnxruntime, which times "
                "its plans")
    return None


def _fastest(outcome: SearchOutcome, final: Measured, confirmation: Confirmation | None, evidence: SplitEvidence,
             config: TuneRequest, jobs: _Jobs, tables: _Tables, serving: _Serving
             ) -> tuple[_SpeedRun, Confirmation | None, Any, Measured]:
    """Every plan the holdout confirmed, served as ONNX Runtime serves it and timed beside FP32 on holdout texts
    (evaluate.speed); the fastest at its slowest batch size is written (evaluate.speed.fastest: within the tie, the
    fastest at the other batch size, then the most faithful on the search split). Each confirmed plan carries the
    claim (fixed-sequence testing rejects every hypothesis before the first failure, the family's error kept at
    alpha), so the choice among them needs no correction. Without a confirmation, the written plan alone is timed."""
    tried = list(outcome.tried)
    if confirmation is not None and confirmation.chosen is not None:
        ids = [st.candidate for st in confirmation.steps if st.meets]
    else:
        ids = [next(i for i, m in enumerate(tried) if m.plan == final.plan)]
    models = {tried[i].plan: served_model(jobs.model.proto, tables.base[0], tried[i].plan, config.op_types,
                                               config.kept_weights)
              for i in ids}
    rows = evidence.holdout if len(evidence.holdout) else evidence.search
    texts = [evidence.texts[int(i)] for i in rows.array[evidence.agreement_positions(rows)]] or list(
        rows.take(evidence.texts))
    by_id = time_plans(serving.fp32, {i: models[tried[i].plan] for i in ids}, jobs.model.tokenizer,
                       jobs.model.input_names, texts, make_runner=serving.make_runner, seed=config.seed + 4,
                       progress=serving.progress)
    timed = {tried[i].plan: by_id[i] for i in ids}
    if len(ids) < 2 or confirmation is None or confirmation.chosen is None:
        return _SpeedRun(None, None, timed, models), confirmation, outcome, final
    fidelity = {i: tried[i].agreement if tried[i].agreement == tried[i].agreement else tried[i].cosine for i in ids}
    chosen = fastest(by_id, fidelity)
    choice = SpeedChoice(candidates=tuple(ids), speeds=tuple(by_id[i] for i in ids), chosen=chosen,
                         most_int8=confirmation.chosen, tie=SPEED_TIE)
    if chosen != confirmation.chosen:
        final = tried[chosen]
        outcome = replace(outcome, best=final)
        confirmation = replace(confirmation, chosen=chosen)
    return _SpeedRun(choice, None, timed, models), confirmation, outcome, final


def _all_int8_if_as_good(outcome: SearchOutcome, final: Measured, judge: PlanJudge | StratifiedJudge,
                         on_search: dict[Plan, SensitivityResult], on_holdout: dict[Plan, SensitivityResult],
                         evidence: SplitEvidence) -> tuple[Any, Measured, str | None]:
    """When the holdout confirmed no candidate, the search's choice is written unless all-INT8 — simpler, and all
    INT8 — kept more of FP32 on the holdout (agreement or cosine higher, none lower, accuracy not lower): a plan
    that keeps layers in FP32 and is less faithful there than all-INT8 is never handed over."""
    plain = next((m for m in outcome.tried if not m.plan), None)
    if plain is None or not final.plan or () not in on_holdout or final.plan not in on_holdout:
        return outcome, final, None
    a = evidence.scores(evidence.holdout, on_holdout[()])
    p = evidence.scores(evidence.holdout, on_holdout[final.plan])

    def at_least(x: float, y: float) -> bool:
        return not (x == x and y == y) or x >= y

    better = ((a.agreement == a.agreement and a.agreement > p.agreement)
              or (a.cosine == a.cosine and a.cosine > p.cosine))
    if not (better and at_least(a.agreement, p.agreement) and at_least(a.cosine, p.cosine)
            and at_least(a.accuracy, p.accuracy)):
        return outcome, final, None
    # its run_chunks returns SensitivityResults, kept as such; None only for an empty split (the search's is not)
    on_search[()] = cast(SensitivityResult, judge.complete(()))
    outcome, all_int8 = _whole_split_numbers(outcome, plain, on_search[()], evidence)
    note = (f"the holdout confirmed no candidate, and all-INT8 kept more of FP32 there "
            f"(agreement {100 * a.agreement:.2f} % against {100 * p.agreement:.2f} % for the search's choice, which "
            f"keeps {len(final.plan)} layers in FP32): all-INT8 is written, unconfirmed")
    return outcome, all_int8, note


def _holdout_margin(config: TuneRequest, evidence: SplitEvidence, rule: DecisionRule
                    ) -> Callable[[Measured], bool] | None:
    """Whether the holdout could confirm a plan that kept there what the search split says it keeps at worst: a
    fixed-n exact test at ``rule``'s final confidence certifies, on the holdout's agreement texts, the lower
    bound (at that confidence) of the plan's search-split agreement over the texts its decision read (the
    estimate itself, where the count is unknown), and its cosine reached --min-cosine. Where the search puts its
    anchors (evaluate.search), not a decision. The estimate alone is not enough: the demo embedder's first
    passing prefix kept 96.42 % of neighbours on 571 search texts, which 1,200 holdout texts would certify, and
    kept 95.50 % there, which they cannot."""
    if config.min_agreement is None:
        return None
    need = config.min_agreement / 100.0
    n = len(evidence.agreement_positions(evidence.holdout))
    confidence = rule.final_confidence
    z = NormalDist().inv_cdf(confidence)

    def margin(m: Measured) -> bool:
        if not m.agreement > need or (config.min_cosine is not None and not m.cosine >= config.min_cosine):
            return False
        low = wilson_lower(m.agreement, m.texts, z) if m.texts else m.agreement
        more = texts_needed(low, need, confidence) if low > need else None
        return more is not None and more <= n

    return margin


def _confirm(outcome: SearchOutcome, hold_judge: PlanJudge | StratifiedJudge, config: TuneRequest,
             evidence: SplitEvidence, ev: Evaluator) -> tuple[Confirmation, Any, Measured]:
    """Fixed-sequence confirmation on the holdout (evidence.confirm): the last candidate confirmed becomes the
    plan; when none is, the search's own choice stays (and the holdout verdict says what it found)."""
    tried = list(outcome.tried)
    batch = max(1, min(int(getattr(ev.executor, "workers", 1) or 1), 4))
    chosen, steps = fixed_sequence(tried, hold_judge.judge, batch, config.confirm_candidates)
    best = outcome.best
    assert best is not None  # _search confirms only a search that chose a plan
    search_choice = next(i for i, m in enumerate(tried) if m.plan == best.plan)
    final = tried[chosen] if chosen is not None else best
    record = Confirmation(
        rule=config.decision_rule, confidence=config.agreement_confidence,
        final_test_confidence=hold_judge.rule.final_confidence, holdout_texts=len(evidence.holdout), chosen=chosen,
        search_choice=search_choice, steps=steps)
    return record, replace(outcome, best=final), final


def _measured_text(plan: Plan, score: Judged | tuple[float, ...], flops: dict[str, float]) -> str:
    """One candidate's measurement for a progress line: its INT8 share, agreement and, once decided (a judge's
    :class:`Judged`; else the split's scores, accuracy first), the decision."""
    agreement = score.agreement if isinstance(score, Judged) else (score[1] if len(score) > 1 else float("nan"))
    words = [f"{100 * int8_flops_fraction(plan, flops):.1f} % INT8"]
    if agreement == agreement:
        words.append(f"agreement {100 * agreement:.2f} %")
    if isinstance(score, Judged):
        words.append(f"{'meets' if score.meets else 'misses'} the target on {score.texts} texts")
    return ", ".join(words)


def _judge(evidence: SplitEvidence, config: TuneRequest, jobs: _Jobs, ev: Evaluator, tables: _Tables,
           subset: EvalSubset | None = None, task: str = "candidate plans") -> PlanJudge | StratifiedJudge | None:
    """The judge of candidates on ``subset`` (default: the search split) under ``config.decision_rule``
    (evidence.plan_decisions); None when there is nothing to decide (no accuracy rows and no fidelity target:
    every candidate meets). A relative accuracy drop is taken from FP32's accuracy on ``subset``."""
    subset = evidence.search if subset is None else subset
    _, table_path, table_sha = tables.base
    fp32 = evidence.accuracy_of_reference(subset)
    drop = None
    if not config.fidelity_only and len(evidence.accuracy_positions(subset)) and fp32 == fp32:
        drop = min(fp32 * config.max_drop / 100.0 if config.relative else config.max_drop / 100.0, 1.0 - 1e-9)
    constraints = constraints_for(min_agreement=config.min_agreement, min_cosine=config.min_cosine, max_drop=drop,
                                  binary_agreement=getattr(jobs.model.task, "binary_agreement", True))
    if not constraints:
        return None

    def run_chunks(pairs: Sequence[tuple[Plan, EvalSubset]]) -> list[SensitivityResult]:
        return ev.run([jobs(table_path, p, c, PLAN_MODE) for p, c in pairs], table_sha, task)

    rule = make_rule(config.decision_rule, config.agreement_confidence, config.first_chunk)
    every = tuple(c.name for c in constraints) if config.agreement_confidence <= 0.5 else ESTIMATED
    # all-INT8 of the base table on the whole split: the search's first candidate, and the risk of each text
    base_job = jobs(table_path, (), subset, ALL_INT8)
    rec = ev.ledger.get(job_key(base_job, table_sha, ev.model_sha))
    base = from_record(rec) if rec is not None and not rec.get("error") else None
    # the search split in strata by flip risk; the holdout, whose tests are the claim, stays a plain random sample
    # judged by the decision rule: measured on the demo, its stratified bound on 1,362 texts could not confirm a
    # plan at 99.39 % that its 5,250 texts certify, and a wrong risk model can hide nothing there
    if config.risk_strata and subset is evidence.search:
        if base is None:
            (base,) = ev.run([base_job], table_sha, "all-INT8 (flip risk)")
        strata = stratify(evidence, subset, base.agreement_values, seed=config.seed)
        if strata is not None:
            log.info("search split by flip risk (evaluated/total): %s", strata.describe())
            judge: PlanJudge | StratifiedJudge = StratifiedJudge(
                evidence, subset, strata, constraints, run_chunks, config.agreement_confidence, rule)
            judge.seed((), base)
            return judge
    judge = PlanJudge(evidence, subset, rule, constraints, run_chunks, estimated=every)
    if base is not None:
        judge.seed((), base)
    return judge


def _whole_split_numbers(outcome: SearchOutcome, final: Measured, whole: SensitivityResult, evidence: SplitEvidence
                         ) -> tuple[Any, Measured]:
    """The final plan's search-split numbers over the whole split (its decision may have needed fewer rows)."""
    sc = evidence.scores(evidence.search, whole)
    full = replace(final, accuracy=sc.accuracy, agreement=sc.agreement, cosine=sc.cosine)
    tried = tuple(full if m.plan == final.plan else m for m in outcome.tried)
    best = full if outcome.best is not None and outcome.best.plan == final.plan else outcome.best
    return replace(outcome, best=best, tried=tried), full


def _traffic_rows(evidence: SplitEvidence, subset: EvalSubset) -> int:
    return 0 if evidence.traffic is None else int(evidence.traffic[subset.array].sum())


def _evidence_cost(config: TuneRequest, evidence: SplitEvidence, tried: Sequence[Measured],
                   judge: PlanJudge | StratifiedJudge | None) -> EvidenceCost:
    """Texts of the search split each candidate's decision was evaluated on."""
    n = len(evidence.search)
    texts = [m.texts if m.texts is not None else n for m in tried]
    rule = (STRATIFIED if isinstance(judge, StratifiedJudge) else config.decision_rule) if judge is not None \
        else WHOLE_SPLIT
    return EvidenceCost(rule=rule, split_texts=n, candidates=len(texts),
                        texts_median=float(np.median(texts)) if texts else 0.0, texts_total=int(sum(texts)))


def _tune_result(eval_set: EvalSet, rows: EvalSubset | None, model: _Model, evidence: SplitEvidence,
                 config: TuneRequest, tables: _Tables, ranking: _Ranking, searched: _Searched,
                 flops: dict[str, float], linear: LinearWork, reused_stats: bool, reused_evals: int, seconds: float,
                 traffic: TrafficEvidence | None = None) -> TuneResult:
    """The typed result of the run (no NaN: what does not apply is None)."""
    final, outcome = searched.final, searched.outcome
    hold_scores = {p: evidence.scores(evidence.holdout, r) for p, r in searched.on_holdout.items()}
    if searched.all_int8_sample is not None:
        hold_scores[()] = evidence.scores(*searched.all_int8_sample)
    hold_acc = {p: sc.accuracy for p, sc in hold_scores.items()}
    # INT8 share over ALL linear FLOPs: work hidden in fused contrib ops (ORT Attention) stays FP32 in every plan
    share = linear.plain_share
    base_key = tables.base_key
    return TuneResult(
        calibkit_version=__version__,
        eval_set=_tune_eval_set(eval_set, rows, evidence, config, model.dir.id2label, traffic),
        target=_tune_target(config, evidence, met=outcome.best is not None),
        methods=_method_choice(config, tables),
        candidates=tuple(
            Candidate(id=i, stage=m.stage, kept_nodes=tuple(m.plan), int8_flops_fraction=m.int8_flops_fraction * share,
                      accuracy_search=finite(m.accuracy), method=base_key, accepted=m.plan == final.plan,
                      meets_target=m.meets, accuracy_holdout=finite(hold_acc.get(m.plan)),
                      agreement_search=finite(m.agreement), cosine_search=finite(m.cosine), texts_search=m.texts)
            for i, m in enumerate(outcome.tried)
        ),
        final=_final_plan(model, evidence, config, tables, ranking, searched, flops, share, hold_acc, hold_scores),
        split=_split(evidence, config.seed),
        linear_flops=LinearFlops(share, tuple(f.node for f in linear.fused if not f.integer),
                                 tuple(linear.uncounted)),
        warnings=_tune_warnings(config, evidence, searched, linear),
        smoothing=_smoothing_choice(config, tables),
        statistics_reused=reused_stats,
        evaluations_reused=reused_evals,
        seconds=round(seconds, 1),
        evidence_cost=searched.cost,
        confirmation=searched.confirmation,
        speed_choice=searched.speed_choice,
    )


def _tune_eval_set(eval_set: EvalSet, rows: EvalSubset | None, evidence: SplitEvidence, config: TuneRequest,
                   id2label: Mapping[int, str], traffic: TrafficEvidence | None) -> TuneEvalSet:
    """The result's eval set: its rows per split, what served as labels, the traffic evidence."""
    return TuneEvalSet(
        path=str(eval_set.path), count=len(eval_set), search=len(evidence.search.array),
        holdout=len(evidence.holdout.array), sensitivity_samples=len(evidence.sensitivity),
        labels=task_class(evidence.task).labels_used(config.fidelity_only),
        evidence=Evidence(str(eval_set.path), len(eval_set), tuple(id2label[i] for i in sorted(id2label)),
                          RowSelection.of_subset(rows), labelled=not config.fidelity_only),
        traffic=evidence_of(traffic),
        traffic_search=_traffic_rows(evidence, evidence.search),
        traffic_holdout=_traffic_rows(evidence, evidence.holdout),
    )


def _tune_target(config: TuneRequest, evidence: SplitEvidence, *, met: bool) -> TuneTarget:
    """The result's target: the constraints asked for and FP32's accuracy on each split."""
    fp32_search = evidence.accuracy_of_reference(evidence.search)
    return TuneTarget(
        relative=config.relative, fp32_accuracy=finite(fp32_search),
        fp32_accuracy_holdout=finite(evidence.accuracy_of_reference(evidence.holdout)),
        threshold=finite(config.threshold(fp32_search)), met=met,
        max_drop=None if config.fidelity_only else config.max_drop, min_agreement=config.min_agreement,
        agreement_confidence=config.agreement_confidence, min_cosine=config.min_cosine, task=evidence.task,
    )


def _method_choice(config: TuneRequest, tables: _Tables) -> MethodChoice:
    """The calibration method chosen, with each method's all-INT8 measurements on the search split."""
    method_counts: dict[str, int] = {}
    for name in tables.chosen_methods.values():
        method_counts[name] = method_counts.get(name, 0) + 1
    return MethodChoice(
        requested=config.method, chosen=tables.base_key,
        all_int8_accuracy_search={k: finite(v) for k, v in tables.accuracy.items()},
        all_int8_flip_rate_search={k: finite(v) for k, v in tables.flips.items()},
        all_int8_mean_kl_search={k: finite(v) for k, v in tables.kl.items()},
        all_int8_cosine_search={k: finite(v) for k, v in tables.cosine.items()},
        per_tensor_counts=method_counts,
        chosen_by=(f"fewest flips of FP32's predictions on the {tables.race_texts} search texts closest to "
                   "FP32's decision boundary (then KL divergence)"),
    )


def _final_plan(model: _Model, evidence: SplitEvidence, config: TuneRequest, tables: _Tables, ranking: _Ranking,
                searched: _Searched, flops: dict[str, float], share: float, hold_acc: Mapping[Plan, float],
                hold_scores: Mapping[Plan, Any]) -> TunePlan:
    """The plan the run writes, with its evidence on both splits, the holdout verdict and why each layer kept
    FP32 stayed so (``hold_acc``, ``hold_scores``: each plan run on the holdout, its accuracy and scores)."""
    final, conf = searched.final, searched.confirmation
    search_ev, agree_search = plan_evidence(config, evidence, evidence.search, searched.on_search.get(final.plan))
    if agree_search is None:  # the decision's estimate (the plan is not re-run on the rest of the search split)
        agree_search = finite(final.agreement)
    hold_ev, agree_hold = plan_evidence(config, evidence, evidence.holdout, searched.on_holdout.get(final.plan))
    all_int8_scores = hold_scores.get(())
    final_search = searched.on_search.get(final.plan)
    final_hold = hold_scores.get(final.plan)
    reasons = _reasons(final.plan, ranking.harm, ranking.base, flops, ranking.own_sqnr, searched.outcome.tried,
                       evidence.task)
    modules, products = node_names(model.proto, config.op_types), attention_products(model.proto)
    return TunePlan(
        kept_nodes=tuple(final.plan), int8_flops_fraction=final.int8_flops_fraction * share, method=tables.base_key,
        accuracy_search=finite(final.accuracy), accuracy_holdout=finite(hold_acc.get(final.plan)),
        all_int8_accuracy_holdout=finite(hold_acc.get(())),
        all_int8_agreement_holdout=finite(all_int8_scores.agreement) if all_int8_scores else None,
        all_int8_cosine_holdout=finite(all_int8_scores.cosine) if all_int8_scores else None,
        all_int8_texts_holdout=None if all_int8_scores is None else len(
            searched.all_int8_sample[0] if searched.all_int8_sample is not None else evidence.holdout),
        cosine_search=finite(evidence.scores(evidence.search, final_search).cosine if final_search else final.cosine),
        cosine_holdout=finite(final_hold.cosine) if final_hold else None,
        agreement_search=agree_search, agreement_holdout=agree_hold, search_evidence=search_ev,
        holdout_evidence=hold_ev,
        holdout_verdict=holdout_verdict(config, hold_ev, allowed_change(config, evidence), evidence.task,
                                        confirmed=conf is not None and conf.chosen is not None),
        reasons={n: tuple(r) for n, r in reasons.items()},
        kept_modules={n: with_product(modules[n].module, products.get(n)) for n in final.plan
                      if n in modules and modules[n].module},
        speed=searched.speed, speed_note=searched.speed_note, served=searched.served,
        kept_weights=str(config.kept_weights) if config.target is Target.ONNXRUNTIME else None,
    )


def _tune_warnings(config: TuneRequest, evidence: SplitEvidence, searched: _Searched, linear: LinearWork
                   ) -> tuple[str, ...]:
    """The evidence's warnings, then what the run could not prove or confirm and the FLOPs fused ops keep FP32."""
    warnings = list(evidence.warnings)
    outcome, conf = searched.outcome, searched.confirmation
    chose = outcome.tried[conf.search_choice] if conf is not None and conf.search_choice is not None else searched.final
    unproven = _uncertified(config, evidence, outcome.tried, chose)
    if unproven:
        warnings.append(unproven)
    sc = searched.speed_choice
    confirmed = conf if conf is None or sc is None else replace(conf, chosen=sc.most_int8)  # before speed chose
    if confirmed is not None and confirmed.chosen != confirmed.search_choice:
        warnings.append(_confirmation_warning(confirmed, len(evidence.holdout)))
    served = searched.served
    if (served is not None and config.min_agreement is not None and served.served_agreement_ci is not None
            and served.served_agreement_ci.low is not None
            and served.served_agreement_ci.low < config.min_agreement / 100.0):
        warnings.append(
            f"the served model (ONNX Runtime's integer kernels) kept {100 * (served.served_agreement or 0):.2f} % "
            f"of FP32 on {served.texts:,} holdout texts, 95 % lower bound {100 * served.served_agreement_ci.low:.2f} "
            f"% under --min-agreement {config.min_agreement:g}: {served.changed} texts fall otherwise than in the "
            "certified Q/DQ arithmetic; the claim is certified for the exact arithmetic, not proven for the served "
            "kernels")
    if searched.note:
        warnings.append(searched.note)
    if linear.plain_share < 1.0:
        warnings.append(f"{100 * (1 - linear.plain_share):.1f} % of the linear FLOPs are inside fused com.microsoft "
                        f"ops ({', '.join(sorted({f.op_type for f in linear.fused}))}) that stay FP32: quantize the "
                        "unfused export to put them in INT8")
    return tuple(warnings)


def _damage(r: SensitivityResult) -> float:
    """How far a variant's outputs are from FP32's beyond the agreement itself, for ranking layers and tables:
    the output KL divergence where outputs are class logits, else 1 - the mean cosine (embeddings), else the
    flip rate (token classification: the share of tokens changed)."""
    if r.mean_kl == r.mean_kl:
        return r.mean_kl
    if r.cosine_values:
        return 1.0 - r.mean_cosine
    return r.flip_rate


def _uncertified(config: TuneRequest, evidence: SplitEvidence, tried: Sequence[Measured], final: Measured
                 ) -> str | None:
    """When the search split was too small to certify --min-agreement for a candidate with more INT8 than the
    plan — its agreement reached the target, its lower bound did not — how many texts would have settled it."""
    if config.min_agreement is None or config.agreement_confidence <= 0.5:
        return None
    # the sequential rule certifies at the end of the split with a share of alpha (92.5 % for 90 %)
    confidence = make_rule(config.decision_rule, config.agreement_confidence, config.first_chunk).final_confidence
    need = config.min_agreement / 100.0
    floor = config.threshold(evidence.accuracy_of_reference(evidence.search)) - 1e-12
    better = [m for m in tried if not m.meets and m.agreement == m.agreement and m.agreement >= need
              and m.int8_flops_fraction > final.int8_flops_fraction and not m.accuracy < floor
              and (config.min_cosine is None or not m.cosine < config.min_cosine)]
    if not better:
        return None
    m = max(better, key=lambda c: c.int8_flops_fraction)
    n = len(evidence.agreement_positions(evidence.search))
    more = texts_needed(m.agreement, need, confidence)
    what = (f"about {more:,} would settle it" if more else "no number of texts settles a rate this close")
    hint = " (tune --traffic LOG --traffic-size N draws them from the log)" if more else ""
    return (f"a candidate with {100 * m.int8_flops_fraction:.1f} % of the linear FLOPs in INT8 kept "
            f"{100 * m.agreement:.2f} % of {agreement_noun(evidence.task)} on the search split's {n} agreement "
            f"texts: at or above "
            f"--min-agreement {config.min_agreement:g}, but its one-sided {100 * confidence:g} % "
            f"lower bound is not, so it was not accepted; {n} texts cannot certify it, {what}{hint}")


def _confirmation_warning(conf: Confirmation, holdout: int) -> str:
    """Why the plan is not the search's choice: the holdout did not confirm a candidate on the way to it."""
    failed = next((s for s in conf.steps if not s.meets), None)
    seen = ""
    if failed is not None:
        agr = f", agreement {100 * failed.agreement:.2f} %" if failed.agreement is not None else ""
        seen = (f"; candidate {failed.candidate} ({100 * failed.int8_flops_fraction:.1f} % INT8{agr} on "
                f"{failed.texts:,} holdout texts) was not confirmed")
    if conf.chosen is None:
        return (f"the holdout split ({holdout:,} texts) confirmed none of the candidates that met the target on "
                f"the search split{seen}: the plan written is the search's own choice (candidate "
                f"{conf.search_choice}), and the holdout verdict says what the holdout found; more traffic texts "
                "(--traffic-size) give the holdout more to confirm with")
    last = next(s for s in conf.steps if s.candidate == conf.chosen)
    return (f"the plan is candidate {conf.chosen} ({100 * last.int8_flops_fraction:.1f} % INT8), the last one "
            f"the holdout split ({holdout:,} texts) confirmed, not the search's choice (candidate "
            f"{conf.search_choice}){seen}; fixed-sequence testing keeps the chance that the plan misses the target "
            f"at {100 * (1 - conf.confidence):g} %, its choice included (--no-confirm: the search's choice)")


def _smoothing_choice(config: TuneRequest, tables: _Tables) -> SmoothingChoice | None:
    if not config.smooth:
        return None
    v = tables.variant
    chosen = v is not None and v.name == "smoothed"
    rec = v.smoothing if v is not None and chosen else None
    tried = tables.smoothing_note is None
    return SmoothingChoice(tried, chosen, SMOOTHED_FOLDER if chosen else None, rec.smoothed if rec else None,
                           rec.max_output_deviation if rec else None, tables.smoothing_note)


def _split(evidence: SplitEvidence, seed: int) -> TuneSplit:
    search, holdout, sens = (RowSelection.of_subset(s) for s in (evidence.search, evidence.holdout,
                                                                 evidence.sensitivity))
    assert search is not None and holdout is not None and sens is not None  # subsets given: selections made
    return TuneSplit(search, holdout, sens, seed)


def _rank_by_harm_per_flop(nodes: Sequence[str], harm: dict[str, tuple[float, float]], flops: dict[str, float]
                           ) -> list[str]:
    """Most output damage (KL to FP32 when only this node is INT8) per MatMul/Gemm FLOP first: the search keeps
    a prefix of this order, and keeping a cheap harmful node (an attention MatMul) costs almost no INT8 coverage.
    Damage is additive to first order, so this is the greedy knapsack order."""
    total = sum(flops.values()) or 1.0

    def density(n: str) -> float:
        return harm[n][0] / max(flops.get(n, 0.0) / total, 1e-4)

    return sorted(nodes, key=lambda n: (-density(n), -harm[n][1], flops.get(n, 0.0)))


def _layer_quality(
    fp: onnx.ModelProto,
    tables: dict[str, CalibrationTable],
    tok: TextTokenizer,
    texts: Sequence[str],
    cb: ProgressCallback,
    resources: Resources,
) -> dict[str, tuple[Any, Any]]:
    """Per table: the per-layer measurements (own and output SQNR) of its all-INT8 model, and that model."""
    from calibkit.evaluate.layers import find_layers
    from calibkit.evaluate.taps import measure_layers, ort_runner_factory
    from calibkit.quantize.qdq import Target, quantize_model

    out: dict[str, tuple[Any, Any]] = {}
    for i, (m, table) in enumerate(tables.items()):
        cb(ProgressEvent("per-layer SQNR of each table", i, len(tables), message=m))
        q = quantize_model(fp, table, target=Target.TENSORRT).model
        out[m] = (measure_layers(find_layers(q), texts, tok, reference=fp, baseline=fp, candidate=q,
                                 runner_factory=ort_runner_factory(factory=resources.runner_factory),
                                 budget=resources.budget), q)
    cb(ProgressEvent("per-layer SQNR of each table", len(tables), len(tables)))
    return out


def _auto_methods_by_fidelity(own_kl: dict[str, dict[str, float]], placement: Placement) -> dict[str, str]:
    """For each activation tensor, the method with the least summed KL over the nodes reading it (ties: the
    method listed first)."""
    out: dict[str, str] = {}
    for t in placement.activations:
        readers = [qn.name for qn in placement.nodes if t in qn.activation_inputs]
        out[t] = min(own_kl, key=lambda m: sum(own_kl[m].get(n, float("inf")) for n in readers))
    return out


def _reasons(
    plan: Plan, harm: dict[str, tuple[float, float]], base: SensitivityResult, flops: dict[str, float],
    own_sqnr: dict[str, float], tried: Sequence[Measured] = (), task: str | None = None,
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    noun = agreement_noun(task)
    total = sum(flops.values()) or 1.0
    for n in plan:
        r = []  # measured effects first: a layer is kept for what quantizing it did, not for a statistic
        miss = _smallest_failed_return(plan, n, tried)
        if miss is not None:
            others = len(plan) - len(miss.plan) - 1
            what = "it" if others == 0 else f"it and {others} other kept layer{'s' * (others > 1)}"
            if miss.accuracy == miss.accuracy:
                r.append(f"the same plan with {what} in INT8 was measured at {100 * miss.accuracy:.2f} % "
                         f"accuracy, agreement {100 * miss.agreement:.2f} %: short of the target")
            else:
                r.append(f"the same plan with {what} in INT8 kept {100 * miss.agreement:.2f} % of {noun}"
                         + (f", mean cosine {miss.cosine:.5f}" if miss.cosine == miss.cosine else "")
                         + ": short of the target")
        elif tried:  # what quantizing it alone did is no reason to keep it when that did nothing: say why
            r.append("kept for its place in the sensitivity ranking (output damage per FLOP): the search "
                     "never measured this plan with it in INT8")
        if n in harm:
            what = "an output KL divergence" if base.mean_kl == base.mean_kl else (
                "a cosine distance (1 - mean cosine)" if base.cosine_values else "a changed share")
            r.append(f"quantizing only it gives {what} to FP32 of {harm[n][0]:.4g} and changes "
                     f"{100 * harm[n][1]:.2f} % of {noun} on the sensitivity subset (all INT8: "
                     f"{_damage(base):.4g}, {100 * base.flip_rate:.2f} %)")
        if not r and n in own_sqnr:  # nothing measured its effect: say so, with the one number there is
            r.append(f"its effect was not measured alone; it ranks high by its own INT8 error (SQNR "
                     f"{own_sqnr[n]:.1f} dB, input against its fake-quantized copy)")
        r.append(f"costs {100 * flops.get(n, 0.0) / total:.2f} % of the MatMul/Gemm FLOPs")
        out[n] = r
    return out


def _smallest_failed_return(plan: Plan, node: str, tried: Sequence[Measured]) -> Measured | None:
    """The measured candidate that missed the target with ``node`` alone of ``plan`` returned to INT8, else the
    prune stage's return of it with the fewest other kept layers (small layers are returned together), else None:
    a smaller prefix of the ranking that missed says nothing of this layer."""
    kept = set(plan)
    misses = [m for m in tried if not m.meets and node not in m.plan and set(m.plan) < kept
              and (len(m.plan) == len(kept) - 1 or m.stage == "prune")]
    return max(misses, key=lambda m: len(m.plan), default=None)


def _write_outputs(out: Path, model_dir: ModelDir, fp: onnx.ModelProto, table: CalibrationTable, result: TuneResult,
                   config: TuneRequest, write_document: DocumentWriter | None, variant: _Variant | None = None,
                   cset: CalibrationSet | None = None) -> TuneRun:
    """OUT/ as a whole: the plan's INT8 model, its calibration cache and table, plan.json and, through
    ``write_document`` (the report layer's serializer), tune.json. A plan on the smoothed model also gets that
    model folder (OUT/smoothed-model/), which calibration.json names as its source: `calibkit build
    OUT/smoothed-model --precision int8 --qdq OUT/model.int8.onnx` builds the plan's engine."""
    from calibkit.quantize.qdq import Target, quantize_model, save_model

    smoothed = variant is not None and variant.name == "smoothed"
    source = out / SMOOTHED_FOLDER / "model.onnx" if smoothed else model_dir.onnx_path
    final = result.final
    plan = final.kept_nodes
    q = quantize_model(fp, table, op_types=config.op_types, keep_nodes=plan,
                       target=Target(config.target))
    extras = {
        "target": config.target, "op_types": list(config.op_types), "exclude": [],
        "quantized_nodes": list(q.quantized_nodes), "kept_nodes": list(q.kept_nodes),
        "missing_ranges": list(q.missing_ranges),
        "files": {"model": "model.int8.onnx", "cache": "calibration.cache", "plan": "plan.json"},
        "source_model": str(source), "tokenizer": str(model_dir.tokenizer_path),
        "tune": {"max_drop": config.max_drop, "relative": config.relative},
    }
    if cset is not None:  # deploy leaves these texts out of what it measures on
        extras["calibration_set"] = {"id": cset.id, "path": str(cset.path), "texts": len(cset)}
    legacy = ("model.int8.onnx", "calibration.cache", "calibration.json", "plan.json", "tune.json")
    with atomic_dir(out, what="tune", legacy_names=legacy) as tmp:
        if smoothed:
            assert variant is not None
            shutil.copytree(variant.model.dir.onnx_path.parent, tmp / SMOOTHED_FOLDER)
        save_model(q.model, tmp / "model.int8.onnx")
        write_cache(tmp / "calibration.cache", table)
        write_calibration_json(tmp / "calibration.json", table, extras)
        if write_document is not None:
            write_document(plan_file(result, config.target), tmp / "plan.json")
            write_document(_traffic_beside(result, out), tmp / "tune.json")
    return TuneRun(out_dir=out, model_path=out / "model.int8.onnx", cache_path=out / "calibration.cache",
                   json_path=out / "calibration.json", plan_path=out / "plan.json", result=result)


def _traffic_beside(result: TuneResult, folder: Path) -> TuneResult:
    """``result`` with its traffic log's path relative to ``folder``, tune.json's: a relative path in a document
    is read against the document's folder (:func:`calibkit.provenance.document_path`), wherever the reader
    runs; it was written as given, relative to the folder tune ran in."""
    ev = result.eval_set.traffic
    if ev is None or not ev.path:
        return result
    where = os.path.relpath(os.path.abspath(ev.path), os.path.abspath(folder))
    return replace(result, eval_set=replace(result.eval_set, traffic=replace(ev, path=where)))


def plan_file(result: TuneResult, layout: str) -> PlanDocument:
    """plan.json: what a deployment needs of the plan — the layers kept and why, the Q/DQ ``layout`` it was
    measured (and model.int8.onnx written) in, its INT8 share and the measurements behind it. A build input, not
    a report; written through the codec like tune.json."""
    return PlanDocument.of(result, layout)
