"""`calibkit demo run`: the whole workflow on the demo assets, through the library API.

prepare -> sample the log -> calibrate with every method (statistics collected once) -> measure each method's
INT8 accuracy and fidelity to FP32 -> build FP32 / FP16 / INT8 engines -> compare FP32 vs INT8 (per layer, with
sensitivity) and FP16 vs INT8 -> tune to the accuracy and agreement targets -> deploy the tuned plan (a Triton
model repository shaped by the log's traffic, under runs/serving) -> an index page under reports/ that
a person opens first, and ``summary.json`` beside it (``tools/readme_measured.py`` turns it into the README's
measured rows).

Two INT8 layouts, each where it is served: the methods, the method table and the layer-by-layer compare study the
TensorRT Q/DQ layout (every MatMul/Gemm input quantized, attention MatMuls included: what TensorRT 11 builds
INT8 engines from, what calibrate writes by default; its INT8 engine is built with ``target="tensorrt"``), and
tune and deploy serve on ONNX Runtime, the backend the demo deploys to, so they tune, time and ship the
onnxruntime layout (:data:`SERVED_LAYOUT`: the fused integer kernels of ONNX Runtime's CPU provider): the plan
that is certified is the one that is timed and shipped.
"""

from __future__ import annotations

import contextlib
import html
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit._io import atomic_dir, dumps_json
from calibkit._version import __version__
from calibkit.evaluate.estimate import finish
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.report.formatting import fraction_pct as _pct
from calibkit.report.formatting import interval_text
from calibkit.results.files import (
    DemoCompare,
    DemoCompareFp16,
    DemoDeploy,
    DemoEmbedder,
    DemoEngine,
    DemoMethodTune,
    DemoSmoothing,
    DemoSummary,
    DemoTune,
    MethodFidelity,
)
from calibkit.results.runs import (
    Comparison,
    ConfidenceBand,
    Difference,
    HoldoutVerdict,
    PhaseCost,
    PlanEvidence,
    Range,
    TimeEstimate,
)
from calibkit.types import Method

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.evalset import EvalSet
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.demo.prepare import PrepareResult
    from calibkit.evaluate.tune import TuneRun

#: the layout the demo's tunes search and its deploy ships: ONNX Runtime's, the backend it deploys to
SERVED_LAYOUT = "onnxruntime"


@dataclass(frozen=True)
class WorkflowOptions:
    fast: bool = False
    workdir: Path = Path("demo_assets")
    reports_dir: Path = Path("reports")
    calibration_sets_dir: Path = Path("calibration_sets")
    log_lines: int = 20000
    sample_size: int = 512
    seed: int = 0
    max_drop: float = 0.5
    min_agreement: float | None = 99.0  # percent of FP32's predictions the tuned plan keeps
    workers: int | None = None
    eval_limit: int | None = None  # None: the whole test split
    sensitivity_samples: int = 256
    sensitivity_layers: int | None = 12  # compare's per-layer sensitivity: the worst K layers
    layer_samples: int = 512
    # tune's evidence budget; None: tune's own defaults (what a user of `calibkit tune` gets)
    tune_sensitivity_samples: int | None = None
    tune_max_evaluations: int | None = None
    methods: tuple[Method, ...] = tuple(Method)
    # more tunes, each restricted to one method (("entropy",): TensorRT's default calibrator, to show the fallback
    # search at work). None by default: with traffic evidence each one is a second full tune, about an hour on
    # 2 cores, and tune's own table comparison already measures every method all-INT8
    extra_tune_methods: tuple[str, ...] = ()
    # also calibrate every method on a smoothed copy of the model (calibkit smooth, alpha chosen per layer)
    smooth: bool = True
    # tune judges agreement on this many texts of the log (not in the calibration set); 0: the eval set alone
    traffic_size: int = 10_500  # the tune default (evaluate.tune_defaults): a holdout of over 5,000 texts
    # compare's traffic texts (when traffic_size is not 0); None: compare's own default
    compare_traffic_size: int | None = None
    tune_method: str = "auto"  # --fast: minmax alone (auto measures every node under every method: minutes)
    # the same pretrained weights as a sentence embedder (prepare's embedder/), tuned from the log alone: this
    # many traffic texts (0: skip)
    embedder_traffic_size: int = 2_400  # half held out: the plan confirmed on over 1,000 unseen texts

    @classmethod
    def quick(cls, **kw: Any) -> WorkflowOptions:
        """The --fast variant: logistic-regression head, smaller log, sample and eval subsets."""
        base: dict[str, Any] = dict(fast=True, log_lines=3000, sample_size=128, eval_limit=400,
                                    sensitivity_samples=64, sensitivity_layers=6, layer_samples=128,
                                    tune_sensitivity_samples=64, tune_max_evaluations=12, max_drop=1.0,
                                    min_agreement=None, extra_tune_methods=(),
                                    traffic_size=200, compare_traffic_size=200, tune_method="minmax",
                                    embedder_traffic_size=300)
        base.update(kw)
        return cls(**base)


@dataclass(frozen=True)
class WorkflowResult:
    """The index page (HTML and Markdown) and the summary it shows: ``document`` typed, ``summary`` its JSON."""

    index_html: Path
    index_md: Path
    summary: dict[str, Any] = field(default_factory=dict)
    document: DemoSummary | None = None


def _acc(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(logits.argmax(axis=1) == labels))


def _fidelity(logits: np.ndarray, fp32_logits: np.ndarray, labels: np.ndarray, seed: int) -> MethodFidelity:
    """Accuracy and agreement with FP32 of one INT8 model on the same examples, with 95 % intervals."""
    from calibkit.evaluate.metrics import output_error
    from calibkit.evidence.intervals import paired_difference, proportion

    pred, ref = logits.argmax(axis=1), fp32_logits.argmax(axis=1)
    return MethodFidelity(
        accuracy=Range(**proportion(pred == labels).to_dict()),
        accuracy_minus_fp32=Difference(**paired_difference(ref == labels, pred == labels, seed=seed).to_dict()),
        agreement=Range(**proportion(pred == ref).to_dict()),
        flips=int((pred != ref).sum()),
        n=int(len(labels)),
        mean_kl=output_error(fp32_logits, logits).mean_kl,
    )


class _Clock:
    """Progress events of the workflow's steps and the seconds each one took (in the order they ran)."""

    STEPS = 11

    def __init__(self, cb: ProgressCallback) -> None:
        self.cb = cb
        self.t0 = time.perf_counter()
        self.timings: dict[str, float] = {}

    def step(self, i: int, msg: str) -> None:
        self.cb(ProgressEvent("demo workflow", i, self.STEPS, message=msg))

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - t


@dataclass(frozen=True)
class _Setup:
    """The prepared assets, the calibration set and the eval rows every later step reads."""

    variant: str
    work: Path
    runs: Path
    reports: Path
    prep: PrepareResult
    md: ModelDir
    cset: CalibrationSet
    ev: EvalSet
    labels: np.ndarray
    tok: TextTokenizer


def run_workflow(
    options: WorkflowOptions = WorkflowOptions(), progress: ProgressCallback | None = None
) -> WorkflowResult:
    """The whole demo (see the module docstring), one named step after another; the summary and the index page
    come from what the steps return."""
    clock = _Clock(progress or no_progress)
    setup = _setup(options, clock)
    estimate, since = _time_estimate(options, setup, clock.cb)
    models, smoothing = _smooth(options, setup, clock)
    calib, model_of = _calibrate_all(options, setup, models, clock)
    fp32_acc, method_acc, method_fid, best = _method_accuracy(options, setup, calib, clock)
    engines = _build_engines(setup, calib, model_of, best, clock)
    cmp_fp32, cmp_fp16 = _compare(options, setup, engines, clock)
    tres, extra_tunes = _tune(options, setup, clock)
    embedder = None
    if options.embedder_traffic_size and setup.prep.embedder_dir.is_dir():
        clock.step(8, "tune the sentence embedder from the log alone (no labels)")
        with clock.timed("embedder (tune + compare)"):
            embedder = _embedder_row(setup.prep.embedder_dir, setup, options, clock.cb)
    clock.step(9, "deploy the tuned plan: a Triton model repository shaped by the log's traffic")
    with clock.timed("deploy"):
        import calibkit as ck

        dres = ck.deploy(tres.out_dir, setup.runs / "serving", traffic=setup.work / "logs.jsonl",
                         name=f"demo-{setup.variant}", progress=clock.cb)
    clock.timings["total"] = time.perf_counter() - clock.t0
    took = [PhaseCost(step, seconds) for step, seconds in clock.timings.items()]
    estimate = finish(estimate, time.perf_counter() - since, took)

    clock.step(10, "write the index page")
    summary = DemoSummary(
        calibkit_version=__version__,
        variant=setup.variant,
        model_accuracy_recorded=setup.prep.accuracy,
        eval_examples=len(setup.ev),
        calibration_set=str(setup.cset.path),
        calibration_texts=len(setup.cset),
        fp32_accuracy=fp32_acc,
        method_accuracy=method_acc,
        method_fidelity=method_fid,
        best_method=best,
        best_method_by="fewest flips of FP32's predictions (then KL divergence)",
        statistics_reused={m: r.reused_stats for m, r in calib.items()},
        smoothing=smoothing,
        compare_fp32_vs_int8=_compare_summary(cmp_fp32),
        compare_fp16_vs_int8=DemoCompareFp16(cmp_fp16.agreement, {e.name: e.accuracy for e in cmp_fp16.engines}),
        tune=_tune_summary(tres, options, setup.md),
        tune_by_method={m: _extra_tune_summary(r) for m, r in extra_tunes.items()},
        embedder=embedder,
        int8_engine=DemoEngine(layout="tensorrt", path=str(engines["int8"].artifact.path)),
        deploy=DemoDeploy(repository=str(dres.out_dir), name=dres.name,
                          bucket_maxes=tuple(b.hi for b in dres.choice.buckets), waste=dres.choice.waste,
                          waste_one_profile=dres.profiles.baseline.waste_padded_to_max,
                          preferred_batch_size=tuple(dres.batching.preferred),
                          link=os.path.relpath(dres.readme, setup.reports / "index"),
                          layout=dres.layout.shipped if dres.layout else None,
                          agreement_with_fp32=dres.measurement.agreement if dres.measurement else None,
                          agreement_ci=dres.measurement.agreement_ci if dres.measurement else None,
                          agreement_texts=dres.measurement.texts if dres.measurement else None,
                          speed=dres.measurement.speed if dres.measurement else None),
        timings_s={k: round(v, 1) for k, v in clock.timings.items()},
        time_estimate=estimate,
    )
    doc = _write_index(summary, setup.reports / "index")
    clock.step(11, "done")
    return WorkflowResult(setup.reports / "index" / "index.html", setup.reports / "index" / "index.md", doc,
                          summary)


def _setup(options: WorkflowOptions, clock: _Clock) -> _Setup:
    """Steps 0-1: the demo assets (made or reused), the calibration set sampled from the log, the eval rows."""
    import calibkit as ck
    from calibkit.data.evalset import label_ids, load_eval_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.evaluate.inputs import limit_eval_set

    variant = "fast" if options.fast else "fine-tuned"
    work = Path(options.workdir)
    clock.step(0, "prepare the demo assets")
    with clock.timed("prepare"):
        prep = ck.prepare_demo(work, ck.PrepareOptions(fast=options.fast, log_lines=options.log_lines,
                                                       seed=options.seed), progress=clock.cb)
    md = ModelDir.resolve(prep.model_dir)
    clock.step(1, "sample the production log")
    with clock.timed("sample"):
        cset_dir = Path(options.calibration_sets_dir) / f"demo-{variant}-n{options.sample_size}-s{options.seed}"
        cset = ck.sample(work / "logs.jsonl", cset_dir, size=options.sample_size, seed=options.seed,
                         tokenizer=md.tokenizer_path, progress=clock.cb)
    # the test split is ordered by label: a limit draws a stratified random subset, never the first rows
    ev, _rows = limit_eval_set(load_eval_set(work / "data" / "test.jsonl"), options.eval_limit, options.seed)
    return _Setup(variant, work, work / "runs", Path(options.reports_dir) / f"demo-{variant}", prep, md, cset, ev,
                  label_ids(ev, md.id2label, len(md.id2label)),
                  TextTokenizer(md.tokenizer_path, max_length=md.max_length))


def _time_estimate(options: WorkflowOptions, setup: _Setup, cb: ProgressCallback) -> tuple[TimeEstimate, float]:
    """Steps 2-9 priced before they start (evaluate.estimate), from the FP32 model timed on a sample of the eval
    texts; --fast, the quick variant, is the shortcut. Sent through ``cb``; returned with when it was made."""
    from calibkit.enginefiles.registry import model_runner
    from calibkit.evaluate.estimate import (
        DemoSize,
        announce,
        demo_steps,
        estimate,
        measure_text_seconds,
        padded_tokens,
        token_counts,
    )
    from calibkit.evaluate.predict import predict_logits
    from calibkit.evaluate.traffic import DEFAULT_TRAFFIC_SIZE
    from calibkit.evaluate.tune_defaults import TUNE_AUTO_FINALISTS, TUNE_AUTO_TEXTS, TUNE_SENSITIVITY_SAMPLES
    from calibkit.graph import load_model
    from calibkit.quantize.placement import plan_placement
    from calibkit.requests.deploy import DEFAULT_MEASURE_TEXTS
    from calibkit.requests.tune import TuneRequest

    with model_runner(setup.md.onnx_path, name="fp32") as r:
        seconds, n = measure_text_seconds(lambda xs: predict_logits(r, setup.tok, xs), setup.ev.texts, batch_size=32,
                                          seed=options.seed, lengths=lambda xs: token_counts(setup.tok, xs))
    nodes = len(plan_placement(load_model(setup.md.onnx_path)).nodes)
    scale = 1.0
    if setup.cset is not None and len(setup.cset.texts) and len(setup.ev):
        # the log's texts (the calibration set is a stratified sample of them) against the eval texts timed
        def per_text(texts: Sequence[str]) -> float:
            return padded_tokens(token_counts(setup.tok, texts), 32) / len(texts)

        scale = per_text(list(setup.cset.texts)) / max(1e-9, per_text(list(setup.ev.texts)))

    def size(o: WorkflowOptions) -> DemoSize:
        return DemoSize(
            eval_texts=min(len(setup.ev), o.eval_limit or len(setup.ev)), calibration=o.sample_size, nodes=nodes,
            methods=len(o.methods), smooth=o.smooth, traffic=o.traffic_size,
            compare_traffic=0 if not o.traffic_size else o.compare_traffic_size or DEFAULT_TRAFFIC_SIZE,
            embedder_traffic=o.embedder_traffic_size if setup.prep.embedder_dir.is_dir() else 0,
            sensitivity_samples=o.sensitivity_samples, sensitivity_layers=o.sensitivity_layers,
            layer_samples=o.layer_samples, tune_method=o.tune_method,
            max_evaluations=o.tune_max_evaluations or TuneRequest(model="", calibration_set="").max_evaluations,
            tune_sensitivity_samples=o.tune_sensitivity_samples or TUNE_SENSITIVITY_SAMPLES,
            auto_texts_per_node=TUNE_AUTO_FINALISTS * TUNE_AUTO_TEXTS, traffic_scale=scale,
            deploy_texts=DEFAULT_MEASURE_TEXTS)

    fast = {} if options.fast else {"--fast": demo_steps(size(WorkflowOptions.quick()))}
    e = estimate(demo_steps(size(options)), seconds, n, shortcuts=fast)
    announce(e, "the rest of the demo", cb)
    return e, time.perf_counter()


def _smooth(options: WorkflowOptions, setup: _Setup, clock: _Clock) -> tuple[dict[str, Any], DemoSmoothing | None]:
    """Step 2: the smoothed copy of the model (when asked). Returns the model folders by variant suffix and
    the summary's smoothing record."""
    import calibkit as ck
    from calibkit.data.modeldir import ModelDir

    models = {"": setup.md}  # variant suffix -> model folder
    if not options.smooth:
        return models, None
    clock.step(2, "smooth the model (activation outliers moved into the weights)")
    with clock.timed("smooth"):
        sres = ck.smooth(setup.md, setup.cset, setup.runs / "smoothed-model", progress=clock.cb)
    models[SMOOTHED] = ModelDir.resolve(sres.out_dir)
    return models, DemoSmoothing(model=str(sres.out_dir), alpha="auto", groups=sres.groups,
                                 smoothed=len(sres.smoothed), max_output_deviation=sres.max_deviation,
                                 gain_db=tuple(round(c.gain_db, 2) for c in sres.smoothed))


def _calibrate_all(options: WorkflowOptions, setup: _Setup, models: dict[str, Any],
                   clock: _Clock) -> tuple[dict[str, Any], dict[str, Any]]:
    """Step 3: every method on every model variant (statistics collected once per model). Returns the results
    and the model folder of each, by variant key (``mse``, ``mse + smoothing``)."""
    import calibkit as ck

    clock.step(3, "calibrate with every method" + (", on the model and on its smoothed copy" if options.smooth
                                                   else ""))
    calib: dict[str, Any] = {}
    model_of: dict[str, Any] = {}
    with clock.timed("calibrate"):
        for suffix, mdir in models.items():
            for m in options.methods:
                key = m.value + suffix
                model_of[key] = mdir
                calib[key] = ck.calibrate(mdir, setup.cset, setup.runs / calibrate_dir(key), method=m.value,
                                          progress=clock.cb)
    return calib, model_of


def _method_accuracy(options: WorkflowOptions, setup: _Setup, calib: dict[str, Any],
                     clock: _Clock) -> tuple[float, dict[str, float], dict[str, MethodFidelity], str]:
    """Step 4: FP32's accuracy, every variant's INT8 accuracy and fidelity to FP32, and the best variant:
    fidelity, not accuracy, picks it (accuracy differences between INT8 variants are mostly noise)."""
    from calibkit.enginefiles.registry import model_runner
    from calibkit.evaluate.predict import predict_logits

    clock.step(4, "measure every method's INT8 accuracy")
    tok, ev, cb = setup.tok, setup.ev, clock.cb
    with clock.timed("method accuracy"):
        with model_runner(setup.md.onnx_path, name="fp32") as r:
            fp32_logits = predict_logits(r, tok, ev.texts, progress=cb, task="FP32 accuracy")
        method_acc: dict[str, float] = {}
        method_fid: dict[str, MethodFidelity] = {}
        for m, res in calib.items():
            with model_runner(res.model_path, name=f"int8-{m}", layout="tensorrt") as r:
                lg = predict_logits(r, tok, ev.texts, progress=cb, task=f"INT8 ({m}) accuracy")
            method_acc[m] = _acc(lg, setup.labels)
            method_fid[m] = _fidelity(lg, fp32_logits, setup.labels, options.seed)
        best = min(method_fid, key=lambda k: (method_fid[k].flips, method_fid[k].mean_kl))
    return _acc(fp32_logits, setup.labels), method_acc, method_fid, best


def _build_engines(setup: _Setup, calib: dict[str, Any], model_of: dict[str, Any], best: str,
                   clock: _Clock) -> dict[str, Any]:
    """Step 5: FP32 and FP16 engines, and the best variant's INT8 engine in the TensorRT layout."""
    import calibkit as ck

    clock.step(5, "build FP32, FP16 and INT8 engines")
    eng = setup.runs / "engines"
    model = setup.prep.model_dir
    with clock.timed("build"):
        return {
            "fp32": ck.build(model, eng / "fp32.onnx", precision="fp32"),
            "fp16": ck.build(model, eng / "fp16.onnx", precision="fp16"),
            "int8": ck.build(model_of[best].onnx_path.parent, eng / f"int8-{variant_slug(best)}.onnx",
                             precision="int8", calibration=calib[best].json_path, target="tensorrt"),
        }


def _compare(options: WorkflowOptions, setup: _Setup, engines: dict[str, Any], clock: _Clock) -> tuple[Any, Any]:
    """Step 6: FP32 vs INT8 (per layer, with sensitivity) and FP16 vs INT8, each rendered as a report."""
    import calibkit as ck

    clock.step(6, "compare FP32 vs INT8 and FP16 vs INT8")
    with clock.timed("compare"):
        cmp_fp32 = ck.compare(engines["fp32"].artifact, engines["int8"].artifact, setup.ev,
                              layer_samples=options.layer_samples, sensitivity_samples=options.sensitivity_samples,
                              sensitivity_layers=options.sensitivity_layers, workers=options.workers,
                              seed=options.seed, progress=clock.cb, traffic="auto" if options.traffic_size else None,
                              **_compare_traffic(options))
        ck.render_report(cmp_fp32, setup.reports / "compare-fp32-vs-int8")
        cmp_fp16 = ck.compare(engines["fp16"].artifact, engines["int8"].artifact, setup.ev,
                              reference=engines["fp32"].artifact, layer_samples=options.layer_samples,
                              sensitivity=False, seed=options.seed, progress=clock.cb, traffic=None)
        ck.render_report(cmp_fp16, setup.reports / "compare-fp16-vs-int8")
    return cmp_fp32, cmp_fp16


def _tune(options: WorkflowOptions, setup: _Setup, clock: _Clock) -> tuple[TuneRun, dict[str, TuneRun]]:
    """Step 7: the mixed-precision plan on the model as the user has it (tune measures the smoothed variant
    itself, and judges agreement on the log's own texts not in the calibration set), then the same search
    restricted to each of ``extra_tune_methods``."""
    import calibkit as ck

    clock.step(7, "tune the mixed-precision plan")
    md, cset, ev, runs, reports = setup.md, setup.cset, setup.ev, setup.runs, setup.reports
    with clock.timed("tune"):
        tres = ck.tune(md, cset, ev, runs / "tune", max_drop=options.max_drop, method=options.tune_method,
                       target=SERVED_LAYOUT,
                       min_agreement=options.min_agreement, **_tune_budget(options), workers=options.workers,
                       seed=options.seed,
                       report=reports / "tune", progress=clock.cb, traffic="auto" if options.traffic_size else None,
                       traffic_size=max(1, options.traffic_size))
    extra: dict[str, TuneRun] = {}
    for m in options.extra_tune_methods:
        with clock.timed(f"tune ({m})"):
            extra[m] = ck.tune(md, cset, ev, runs / f"tune-{m}", max_drop=options.max_drop, method=m,
                               target=SERVED_LAYOUT,
                               **_tune_budget(options), workers=options.workers,
                               seed=options.seed, report=reports / f"tune-{m}", progress=clock.cb,
                               traffic="auto" if options.traffic_size else None,
                               traffic_size=max(1, options.traffic_size))
    return tres, extra


def _compare_traffic(options: WorkflowOptions) -> dict[str, Any]:
    """compare's traffic size where the options set one (--fast), else nothing: compare's own default (tune's
    larger evidence is tune's, not compare's)."""
    return {} if options.compare_traffic_size is None else {"traffic_size": options.compare_traffic_size}


def _tune_budget(options: WorkflowOptions) -> dict[str, Any]:
    """tune's evidence budget where the options set one (--fast), else nothing: tune's own defaults."""
    chosen = {"sensitivity_samples": options.tune_sensitivity_samples, "max_evaluations": options.tune_max_evaluations}
    return {k: v for k, v in chosen.items() if v is not None}


def _compare_summary(cmp: Comparison) -> DemoCompare:
    return DemoCompare(
        agreement=cmp.agreement,
        agreement_ci=cmp.agreement_ci,
        accuracy_difference=cmp.difference.accuracy,
        keep_in_higher_precision=tuple(cmp.keep_in_higher_precision),
        insufficient_evidence=tuple(v.node for v in cmp.layers if v.flag.value == "insufficient-evidence"),
        flips_by_confidence=tuple(cmp.flips_by_confidence),
        warnings=tuple(cmp.warnings),
        engines={e.name: e.accuracy for e in cmp.engines},
    )


def _tune_summary(tres: TuneRun, options: WorkflowOptions, md: ModelDir) -> DemoTune:
    r = tres.result
    return DemoTune(
        met_target=tres.met_target,
        max_drop_points=options.max_drop,
        kept_nodes=tuple(tres.kept_nodes),
        int8_flops_fraction=tres.int8_flops_fraction,
        fp32_accuracy_holdout=tres.fp32_accuracy_holdout,
        accuracy_holdout=tres.accuracy_holdout,
        accuracy_search=r.final.accuracy_search,
        fp32_accuracy_search=r.target.fp32_accuracy,
        min_agreement_percent=options.min_agreement,
        method=r.methods.chosen,
        agreement_search=r.final.agreement_search,
        agreement_holdout=r.final.agreement_holdout,
        holdout_evidence=r.final.holdout_evidence,
        holdout_verdict=r.final.holdout_verdict,
        holdout_examples=r.eval_set.holdout,
        evaluations_reused=r.evaluations_reused,
        out=str(tres.out_dir),
        model=str(md.onnx_path.parent),
        smoothing=r.smoothing,
        traffic=r.eval_set.traffic,
        traffic_search=r.eval_set.traffic_search,
        traffic_holdout=r.eval_set.traffic_holdout,
        layout=SERVED_LAYOUT,
        speed=r.final.speed,
        speed_note=r.final.speed_note,
    )


def _extra_tune_summary(r: TuneRun) -> DemoMethodTune:
    return DemoMethodTune(met_target=r.met_target, kept_nodes=tuple(r.kept_nodes),
                          int8_flops_fraction=r.int8_flops_fraction, accuracy_holdout=r.accuracy_holdout,
                          all_int8_accuracy_holdout=r.result.final.all_int8_accuracy_holdout,
                          accuracy_search=r.result.final.accuracy_search, candidates=len(r.result.candidates),
                          fp32_accuracy_search=r.result.target.fp32_accuracy,
                          fp32_accuracy_holdout=r.fp32_accuracy_holdout)


def _write_index(summary: DemoSummary, folder: Path) -> dict[str, Any]:
    """summary.json (through the codec), index.md and index.html, swapped into ``folder`` together; returns
    summary.json's document."""
    from calibkit.results.codec import document_json

    doc = document_json(summary)
    md_text, html_text = _index(summary)
    with atomic_dir(folder, what="demo index", legacy_names=("summary.json", "index.md", "index.html")) as tmp:
        (tmp / "summary.json").write_text(dumps_json(doc), encoding="utf-8")
        (tmp / "index.md").write_text(md_text, encoding="utf-8", errors="backslashreplace")
        (tmp / "index.html").write_text(html_text, encoding="utf-8", errors="backslashreplace")
    return doc


SMOOTHED = " + smoothing"


def _embedder_row(folder: Path, setup: _Setup, options: WorkflowOptions, cb: ProgressCallback) -> DemoEmbedder:
    """The embedder through the user's path: tune from the log alone (neighbours in the FP32 index and mean
    cosine, defaults 95 % and 0.995; smoothing found by tune), then compare FP32 against the plan's engine on
    the eval texts (labels unused: both sides' neighbours among those texts)."""
    import calibkit as ck

    cset, ev, runs, reports = setup.cset, setup.ev, setup.runs, setup.reports
    res = ck.tune(folder, cset, None, runs / "tune-embedder", method=options.tune_method, **_tune_budget(options),
                  workers=options.workers, seed=options.seed, report=reports / "tune-embedder", progress=cb,
                  traffic="auto", traffic_size=options.embedder_traffic_size)
    r = res.result
    src = res.out_dir / r.smoothing.model if r.smoothing is not None and r.smoothing.model else folder
    eng = runs / "engines"
    fp32 = ck.build(folder, eng / "embedder-fp32.onnx", precision="fp32")
    plan = ck.build(src, eng / "embedder-plan.onnx", precision="int8", qdq=res.model_path)
    cmp = ck.compare(fp32.artifact, plan.artifact, ev, sensitivity=False, layer_samples=options.layer_samples,
                     seed=options.seed, progress=cb, traffic=None)
    ck.render_report(cmp, reports / "compare-embedder")
    f, t = r.final, r.target
    extra = dict(cmp.task.fidelity.extra) if cmp.task.fidelity is not None else {}
    return DemoEmbedder(
        model=str(folder), met_target=t.met, min_agreement_percent=t.min_agreement,
        min_cosine=t.min_cosine, int8_flops_fraction=f.int8_flops_fraction, kept_nodes=tuple(f.kept_nodes),
        method=r.methods.chosen, smoothed=bool(r.smoothing and r.smoothing.chosen),
        traffic_search=r.eval_set.traffic_search, traffic_holdout=r.eval_set.traffic_holdout,
        agreement_holdout=f.agreement_holdout, cosine_holdout=f.cosine_holdout,
        all_int8_agreement_holdout=f.all_int8_agreement_holdout,
        all_int8_cosine_holdout=f.all_int8_cosine_holdout,
        holdout_verdict=f.holdout_verdict,
        compare_texts=len(ev), compare_top1=cmp.agreement,
        compare_overlap_at_k=extra.get("retrieval_overlap_at_k"),
        compare_cosine_mean=cmp.task.fidelity.cosine_mean if cmp.task.fidelity is not None else None,
        holdout_evidence=f.holdout_evidence,
    )


def _md_html(lines: list[str]) -> list[str]:
    """HTML of simple Markdown lines: '## ' headings, '|' table rows (the separator row skipped), paragraphs;
    backticks and ** dropped."""
    e = html.escape
    out: list[str] = []
    table: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                cells = [c.strip() for c in line.strip("|").split("|")]
                tag = "th" if not table else "td"
                table.append("<tr>" + "".join(f"<{tag}>{e(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if table:
            out += ["<table>", *table, "</table>"]
            table = []
        text = line.replace("`", "").replace("**", "")
        if line.startswith("## "):
            out.append(f"<h2>{e(text[3:])}</h2>")
        elif text:
            out.append(f"<p>{e(text)}</p>")
    return out


def _ci(r: Range | Difference | None, signed: bool = False) -> str:
    """An interval as " [low, high]" in percent ("" when absent)."""
    return interval_text(None if r is None else {"low": r.low, "high": r.high}, signed)


def _embedder_lines(e: DemoEmbedder | None) -> list[str]:
    if not e:
        return []
    v = e.holdout_verdict.text if e.holdout_verdict is not None else ""

    def cos(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    return [
        "## The same weights as a sentence embedder, tuned from the log alone",
        "",
        f"`calibkit tune embedder/ -c <set> --traffic auto` (no eval set, no labels): {e.traffic_search} traffic "
        f"texts to search on, {e.traffic_holdout} held out; target: {e.min_agreement_percent:g} % of texts "
        f"keep their nearest neighbour in the FP32 index and mean cosine ≥ {e.min_cosine:g} — "
        f"{'met' if e.met_target else 'NOT met'} on the search split (calibration: {e.method}).",
        "",
        "| | neighbours kept (holdout) | mean cosine (holdout) | INT8 share of FLOPs |",
        "|---|---|---|---|",
        f"| all INT8 | {_pct(e.all_int8_agreement_holdout)} | {cos(e.all_int8_cosine_holdout)} | 100.0 % |",
        f"| plan ({len(e.kept_nodes)} layers kept) | {_pct(e.agreement_holdout)} | {cos(e.cosine_holdout)}"
        f" | {100 * e.int8_flops_fraction:.1f} % |",
        "",
        f"Holdout: {v}." if v else "",
        f"`calibkit compare` FP32 vs the plan's engine on {e.compare_texts} eval texts (both sides' neighbours "
        f"among them): top-1 {_pct(e.compare_top1)}, top-10 overlap {_pct(e.compare_overlap_at_k)}, mean "
        f"cosine {cos(e.compare_cosine_mean)}.",
        "",
    ]


def variant_slug(key: str) -> str:
    """A variant's name in file names: mse, mse-smoothed."""
    return key[: -len(SMOOTHED)] + "-smoothed" if key.endswith(SMOOTHED) else key


def calibrate_dir(key: str) -> str:
    """runs/<this>: calibrate-mse, calibrate-mse-smoothed"""
    return "calibrate-" + variant_slug(key)


def _method_rows(s: DemoSummary) -> list[tuple[str, str, str, str, str]]:
    """method, accuracy [CI], agreement with FP32 [CI], flips, mean KL."""
    rows = []
    for m, a in s.method_accuracy.items():
        f = s.method_fidelity.get(m)
        if f is None:
            rows.append((m, _pct(a), "—", "—", "—"))
            continue
        rows.append((m, _pct(a) + _ci(f.accuracy), _pct(f.agreement.estimate) + _ci(f.agreement),
                     f"{f.flips} of {f.n} ({_pct(f.flips / f.n if f.n else None)})", f"{f.mean_kl:.4f}"))
    return rows


def _smoothing_line(sm: DemoSmoothing) -> str:
    gains = sm.gain_db or (0.0,)
    return (f"Rows marked '{SMOOTHED.strip()}' are calibrated on a smoothed copy of the model (`calibkit smooth`, "
            f"alpha {sm.alpha}: {sm.smoothed} of {sm.groups} activations read by weight MatMuls divided "
            f"by per-channel scales that the weights absorb; INT8 product error {min(gains):.1f}-{max(gains):.1f} "
            f"dB lower on the calibration rows; FP32 outputs equal to the original's within "
            f"{sm.max_output_deviation:.1e} of their range). The compared INT8 engine and the tuned plan use "
            f"the model of the best row.")


def _holdout_word(v: HoldoutVerdict | None) -> str:
    """What the holdout said of a plan's claim, with each constraint's word when they differ."""
    if v is None:
        return "no holdout verdict"
    word = {True: "supported", False: "NOT supported"}.get(v.supported, "not confirmed")  # type: ignore[arg-type]
    said = set(v.by_constraint.values())
    if len(said) > 1:
        word += " (" + "; ".join(f"{k}: {w}" for k, w in v.by_constraint.items()) + ")"
    return word


def _plan_verdict(what: str, v: HoldoutVerdict | None, ev: PlanEvidence | None, kept: str,
                  agreement: float | None) -> tuple[bool, str]:
    """(confirmed, line): one tuned plan's holdout verdict with its agreement, interval and texts."""
    texts = None if ev is None else ev.agreement_n if ev.agreement_n is not None else ev.n
    line = (f"{what}: holdout {_holdout_word(v)} — {kept} {_pct(agreement)}"
            f"{_ci(ev.agreement if ev is not None else None)}" + (f" on {texts:,} holdout texts" if texts else ""))
    if ev is not None and ev.cosine is not None and ev.cosine.estimate is not None:
        low, high = ev.cosine.low, ev.cosine.high
        line += f", mean cosine {ev.cosine.estimate:.4f}" + (f" [{low:.4f}, {high:.4f}]" if low is not None
                                                              and high is not None else "")
    d = ev.accuracy_minus_fp32 if ev is not None else None
    if d is not None and d.estimate is not None:
        line += f", accuracy {100 * d.estimate:+.2f} points{_ci(d, signed=True)} vs FP32 ({d.verdict})"
    return v is not None and v.supported is True, line


def _layers(n: int) -> str:
    return f"{n} layer{'s' * (n != 1)}"


def verdict_lines(s: DemoSummary) -> list[str]:
    """Every verdict the demo reached, one line each with its 95 % interval and the texts it rests on; the
    ones the holdout did not confirm first (what the closing summary and the index page lead with)."""
    t = s.tune
    rows = [_plan_verdict(f"tuned plan ({_layers(len(t.kept_nodes))} kept, {100 * t.int8_flops_fraction:.1f} % of "
                          "FLOPs in INT8)", t.holdout_verdict, t.holdout_evidence, "FP32's predictions kept",
                          t.agreement_holdout)]
    e = s.embedder
    if e is not None:
        index = (f" (nearest neighbours looked up among the {e.traffic_holdout:,} holdout texts)"
                 if e.traffic_holdout else "")
        rows.append(_plan_verdict(f"sentence embedder plan ({_layers(len(e.kept_nodes))} kept){index}",
                                  e.holdout_verdict, e.holdout_evidence, "nearest neighbour in the FP32 index kept",
                                  e.agreement_holdout))
    c = s.compare_fp32_vs_int8
    d = c.accuracy_difference
    line = (f"compare FP32 vs INT8 ({s.best_method}) on {s.eval_examples:,} test texts: FP32's predictions kept "
            f"{_pct(c.agreement)}{_ci(c.agreement_ci)}")
    if d is not None and d.estimate is not None:
        line += f", accuracy {100 * d.estimate:+.2f} points{_ci(d, signed=True)} ({d.verdict})"
    rows.append((True, line))  # a measurement, not a claim to confirm
    return [line for confirmed, line in sorted(rows, key=lambda r: r[0])]


def _compare_line(s: DemoSummary) -> str:
    c = s.compare_fp32_vs_int8
    d = c.accuracy_difference
    keep = c.keep_in_higher_precision
    parts = [f"FP32 vs INT8 ({s.best_method}, TensorRT layout) on the whole test split: agreement "
             f"{_pct(c.agreement)}{_ci(c.agreement_ci)}"]
    if d:
        parts.append(f"accuracy {100 * d.estimate:+.2f} points{_ci(d, signed=True)} ({d.verdict})")  # type: ignore[operator]
    parts.append(f"{len(keep)} layers advised to stay in higher precision" if keep
                 else "no layer advised to stay in higher precision")
    if c.insufficient_evidence:
        parts.append(f"{len(c.insufficient_evidence)} with insufficient evidence")
    if c.flips_by_confidence:
        parts.append(confidence_text(c.flips_by_confidence))
    return "; ".join(parts) + "."


def confidence_text(bands: Sequence[ConfidenceBand]) -> str:
    """'flips by FP32's top-2 probability gap: 17 of 84 texts under 0.1, 2 of 382 at 0.1-0.5, 0 of 1648 from 0.5'."""
    last = len(bands) - 1
    cells = [f"{b.flips} of {b.texts} texts " + (f"under {b.high:g}" if i == 0 else
                                                 f"from {b.low:g}" if i == last else
                                                 f"at {b.low:g}–{b.high:g}")
             for i, b in enumerate(bands)]
    return "flips by FP32's top-2 probability gap: " + ", ".join(cells)


def _tune_lines(tune: DemoTune) -> list[str]:
    agree = (f" and at least {tune.min_agreement_percent:g} % of FP32's predictions unchanged"
             if tune.min_agreement_percent is not None else "")
    evidence = tune.holdout_evidence
    lines = [
        f"Target: at most {tune.max_drop_points} points below FP32{agree}, on the search split — "
        f"{'met' if tune.met_target else 'NOT met'} (calibration: {tune.method}).",
        f"INT8 share of MatMul/Gemm FLOPs: **{100 * tune.int8_flops_fraction:.1f} %**; "
        f"{len(tune.kept_nodes)} layers kept in higher precision.",
        f"Search split: FP32 {_pct(tune.fp32_accuracy_search)}, plan {_pct(tune.accuracy_search)}, agreement "
        f"{_pct(tune.agreement_search)}. Holdout split ({tune.holdout_examples} examples the "
        f"search never saw): FP32 {_pct(tune.fp32_accuracy_holdout)}, plan {_pct(tune.accuracy_holdout)}, "
        f"agreement {_pct(tune.agreement_holdout)}"
        f"{_ci(evidence.agreement if evidence is not None else None)}.",
    ]
    v = tune.holdout_verdict
    if v is not None and v.text:
        word = {True: "supports", False: "does not support"}.get(v.supported, "cannot judge")  # type: ignore[arg-type]
        lines.append(f"The holdout **{word}** the claim: {v.text}.")
    if tune.speed is not None:
        lines.append(f"Served on ONNX Runtime ({tune.layout} layout, {tune.speed.threads} threads, beside FP32 in "
                     f"{tune.speed.rounds} interleaved rounds): **{tune.speed.words}**.")
    elif tune.speed_note:
        lines.append(f"Speed {tune.speed_note}.")
    return lines


def _deploy_speed_line(s: DemoSummary) -> str | None:
    d = s.deploy
    assert d is not None  # called only for a summary with a deploy
    if d.speed is None:
        return None
    return (f"The deployed model ({d.layout} layout) against FP32, measured by deploy on the log's texts: "
            f"{d.speed.words} ({d.speed.threads} threads; {d.speed.cpu}: {d.speed.isa})"
            + (f"; agreement {_pct(d.agreement_with_fp32)}{_ci(d.agreement_ci)} on {d.agreement_texts} texts"
               if d.agreement_with_fp32 is not None else "") + ".")


LAYOUT_NOTE = ("The methods and the layer-by-layer compare use the TensorRT Q/DQ layout (every MatMul/Gemm input in "
               "INT8, attention MatMuls included: what TensorRT 11 builds INT8 engines from); the tuned plan and the "
               "deployed model use the onnxruntime layout (weight MatMuls only, ONNX Runtime's fused integer "
               "kernels), the backend the demo deploys to: the plan tune certifies is the one deploy ships and "
               "times.")


def _extra_md(s: DemoSummary) -> list[str]:
    out: list[str] = []
    for m, r in s.tune_by_method.items():
        out += [
            f"### The same search restricted to {m}",
            "",
            f"All-INT8 with {m} on the holdout split: {_pct(r.all_int8_accuracy_holdout)}. The plan keeps "
            f"{len(r.kept_nodes)} layers in higher precision ({100 * r.int8_flops_fraction:.1f} % of the FLOPs "
            f"stay INT8): {_pct(r.accuracy_search)} on the search split against FP32 "
            f"{_pct(r.fp32_accuracy_search)} (target {'met' if r.met_target else 'NOT met'}), and "
            f"{_pct(r.accuracy_holdout)} on the holdout split against FP32 {_pct(r.fp32_accuracy_holdout)} "
            f"— the holdout gap is what the search split cannot see. {r.candidates} candidates measured.",
            "",
        ]
    return out


def _index(s: DemoSummary) -> tuple[str, str]:
    """The index page as Markdown and as HTML (the same content)."""
    return _index_md(s), _index_html(s)


def _estimate_line(s: DemoSummary) -> str:
    """What the demo said, before smoothing, the steps after sampling would take, and what they took."""
    from calibkit.results.runs import duration_text, span_text

    t = s.time_estimate
    if t is None:
        return ""
    took = f"; they took {duration_text(t.actual_seconds)}" if t.actual_seconds is not None else ""
    cut = t.shortcut
    shorter = f" {cut.option}: about {span_text(cut.likely_seconds, cut.worst_seconds)}." if cut else ""
    return (f"Estimated after sampling, for the steps that follow: about "
            f"{span_text(t.likely_seconds, t.worst_seconds)} (likely to worst, an FP32 text "
            f"{1000 * t.text_seconds:.2g} ms on this machine){took}.{shorter}")


def _index_md(s: DemoSummary) -> str:
    tune = s.tune
    rows = _method_rows(s)
    kept = tune.kept_nodes
    lines = [
        f"# calibkit demo ({s.variant} model)",
        "",
        f"FP32 accuracy on {s.eval_examples} held-out movie-review snippets: **{_pct(s.fp32_accuracy)}**.",
        f"Calibration set: {s.calibration_texts} texts sampled from the production log ({s.calibration_set}).",
        "",
        LAYOUT_NOTE,
        "",
        "## Verdicts (95 % intervals; the ones the holdout did not confirm first)",
        "",
        *[f"- {line}" for line in verdict_lines(s)],
        "",
        "## INT8 by calibration method (every MatMul/Gemm in INT8, TensorRT Q/DQ layout; 95 % intervals)",
        "",
        "| method | accuracy | agreement with FP32 | flips | mean KL |",
        "|---|---|---|---|---|",
        *[f"| {' | '.join(r)} |" for r in rows],
        "",
        f"Best single method by fidelity (fewest flips of FP32's predictions): **{s.best_method}**.",
        "",
        *([_smoothing_line(s.smoothing), ""] if s.smoothing else []),
        _compare_line(s),
        "",
        "## Tuned mixed-precision plan",
        "",
        *_tune_lines(tune),
        "",
        *[f"- `{n}`" for n in kept],
        "",
        *([_deploy_speed_line(s) or "", ""] if s.deploy and s.deploy.speed else []),
        *_extra_md(s),
        *_embedder_lines(s.embedder),
        "## Reports",
        "",
        "- [FP32 vs INT8, layer by layer](../compare-fp32-vs-int8/report.html)",
        "- [FP16 vs INT8](../compare-fp16-vs-int8/report.html)",
        "- [Tuning: accuracy vs INT8 coverage](../tune/report.html)",
        *(["- [The embedder's tuning](../tune-embedder/report.html)",
           "- [FP32 vs the embedder's plan](../compare-embedder/report.html)"] if s.embedder else []),
        *[f"- [Tuning with {m} only](../tune-{m}/report.html)" for m in s.tune_by_method],
        *([f"- [Serving: Triton model repository of the tuned plan]({s.deploy.link})"]
          if s.deploy else []),
        "",
        "## Time (seconds)",
        "",
        *([_estimate_line(s), ""] if s.time_estimate else []),
        "| step | s |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in s.timings_s.items()],
        "",
    ]
    return "\n".join(lines)


def _inline_html(line: str) -> str:
    """One line of the index's Markdown as HTML: escaped, `code` and **bold** rendered (not shown literally)."""
    import re

    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", line)):
        if i % 2:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(part)))
    return "".join(out)


def _index_html(s: DemoSummary) -> str:
    tune = s.tune
    rows = _method_rows(s)
    kept = tune.kept_nodes
    e = html.escape
    body = [
        f"<h1>calibkit demo ({e(s.variant)} model)</h1>",
        f"<p>FP32 accuracy on {s.eval_examples} held-out movie-review snippets: "
        f"<b>{_pct(s.fp32_accuracy)}</b>. Calibration set: {s.calibration_texts} texts sampled from the "
        f"production log (<code>{e(s.calibration_set)}</code>).</p>",
        f"<p>{_inline_html(LAYOUT_NOTE)}</p>",
        "<h2>Verdicts (95 % intervals; the ones the holdout did not confirm first)</h2><ul>",
        *[f"<li>{_inline_html(line)}</li>" for line in verdict_lines(s)], "</ul>",
        "<h2>INT8 by calibration method (TensorRT Q/DQ layout; 95 % intervals)</h2><table><tr><th>method</th>"
        "<th>accuracy</th><th>agreement with FP32</th><th>flips</th><th>mean KL</th></tr>",
        *["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows],
        f"</table><p>Best single method by fidelity (fewest flips of FP32's predictions): "
        f"<b>{e(s.best_method)}</b>.</p>",
        *([f"<p>{_inline_html(_smoothing_line(s.smoothing))}</p>"] if s.smoothing else []),
        f"<p>{_inline_html(_compare_line(s))}</p>",
        "<h2>Tuned mixed-precision plan</h2>",
        *[f"<p>{_inline_html(line)}</p>" for line in _tune_lines(tune)],
        "<ul>", *[f"<li><code>{e(n)}</code></li>" for n in kept], "</ul>",
        *([f"<p>{_inline_html(_deploy_speed_line(s) or '')}</p>"] if s.deploy and s.deploy.speed else []),
        *[f"<p>{_inline_html(line)}</p>" for line in _extra_md(s) if line and not line.startswith("#")],
        *_md_html(_embedder_lines(s.embedder)),
        "<h2>Reports</h2><ul>",
        *[f'<li><a href="../tune-{e(m)}/report.html">Tuning with {e(m)} only</a></li>'
          for m in s.tune_by_method],
        '<li><a href="../compare-fp32-vs-int8/report.html">FP32 vs INT8, layer by layer</a></li>',
        '<li><a href="../compare-fp16-vs-int8/report.html">FP16 vs INT8</a></li>',
        '<li><a href="../tune/report.html">Tuning: accuracy vs INT8 coverage</a></li>',
        *(['<li><a href="../tune-embedder/report.html">The embedder\'s tuning</a></li>',
           '<li><a href="../compare-embedder/report.html">FP32 vs the embedder\'s plan</a></li>']
          if s.embedder else []),
        *([f'<li><a href="{e(s.deploy.link)}">Serving: Triton model repository of the tuned plan</a></li>']
          if s.deploy else []),
        "</ul>",
        "<h2>Time (seconds)</h2>",
        *([f"<p>{_inline_html(_estimate_line(s))}</p>"] if s.time_estimate else []),
        "<table>",
        *[f"<tr><td>{e(k)}</td><td>{v}</td></tr>" for k, v in s.timings_s.items()],
        "</table>",
    ]
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.5}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .6rem}code{font-size:.9em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>calibkit demo</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
