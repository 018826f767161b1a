"""What ``calibkit tune`` is asked: :class:`TuneRequest`, every option declared once.

The request is also the pipeline's configuration (``evaluate.tune`` reads it as ``config``): the options a
command line sets, and below them the search's knobs that only tests and benchmarks change (``api=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calibkit.errors import UsageError
from calibkit.evaluate.tune_defaults import (
    TUNE_CONFIRM_CANDIDATES,
    TUNE_HOLDOUT,
    TUNE_SENSITIVITY_SAMPLES,
    TUNE_TRAFFIC_SIZE,
)
from calibkit.quantize.placement import DEFAULT_OP_TYPES
from calibkit.requests.checks import COUNT_OR_NONE, INT_LIMIT, PERCENTILE, TRAFFIC_SIZE, Bound, check_names, check_paths
from calibkit.requests.choices import KeptWeights, Target
from calibkit.requests.compare import (
    LIMIT_HELP,
    NO_TRAFFIC,
    NO_TRAFFIC_HELP,
    TRAFFIC_HELP,
    TRAFFIC_TEXT_FIELD_HELP,
    check_task,
)
from calibkit.requests.options import Choice, calibration_set_option, check_bounds, coerce, model_option, option
from calibkit.requests.traffic import Traffic
from calibkit.types import Method, MethodParams, PathLike, check_seed

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.evalset import EvalSet
    from calibkit.data.modeldir import ModelDir
    from calibkit.evaluate.traffic import TrafficEvidence


class TuneMethod(Choice):
    """The calibration method of the plan's table: ``auto`` measures each and keeps the best, per tensor too."""

    AUTO = "auto"
    ENTROPY = Method.ENTROPY.value
    MINMAX = Method.MINMAX.value
    PERCENTILE = Method.PERCENTILE.value
    MSE = Method.MSE.value


class DecisionRuleName(Choice):
    """How each candidate is judged on the search split (``evidence.plan_decisions``)."""

    SEQUENTIAL = "sequential"
    WHOLE_SPLIT = "whole-split"


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """The mixed-precision plan with the most INT8 work that keeps accuracy (and/or agreement, cosine) within
    a target of FP32's, confirmed on a holdout split."""

    model: PathLike | ModelDir = model_option()
    calibration_set: PathLike | CalibrationSet = calibration_set_option(
        "Folder written by `calibkit sample`, or the loaded set.")
    eval_set: PathLike | EvalSet | None = option(
        None, flags=("--eval-set", "-e"), positional=True, cli_type=Path | None,
        help="Labelled eval set (JSONL, CSV, Parquet, datasets, or a loaded EvalSet). Optional with --traffic: "
             "embedders and token taggers are judged on fidelity to FP32, which needs no labels.")
    out: PathLike | None = option(
        None, flags=("--out", "-o"), positional=True, cli_type=Path | None,
        help="Output folder: model.int8.onnx, calibration.cache, calibration.json, plan.json, tune.json "
             "(default runs/tune-<model>/).")
    tokenizer: PathLike | None = option(None, cli_type=Path | None,
                                        help="Tokenizer folder when MODEL is an .onnx file.")
    max_drop: float = option(0.5, bound=Bound(low=0, high=100, example="0.5"),
                             help="Allowed accuracy drop below FP32 (points).")
    relative: bool = option(False, help="Read --max-drop as percent of FP32 accuracy.")
    min_agreement: float | None = option(
        None, bound=Bound(above=0, high=100, optional=True, example="99"),
        help="Also require this percentage of FP32's predictions unchanged (e.g. 99).")
    min_cosine: float | None = option(
        None, bound=Bound(above=-1, below=1, optional=True, example="0.995"),
        help="Embeddings: also require this mean cosine of the INT8 vectors to FP32's (e.g. 0.995). Without labels "
             "and with neither target given, an embedder is tuned for --min-agreement 95 (nearest neighbours kept) "
             "and --min-cosine 0.995.")
    task: str | None = option(None, help="classification | embedding | token-classification | regression | "
                                         "multi-label (default: from the model's outputs).")
    agreement_confidence: float = option(
        0.9, bound=Bound(low=0.5, below=1, example="0.9"),
        help="A plan meets --min-agreement on the search split only when the one-sided lower bound of its "
             "agreement at this confidence reaches it (0.5: the point estimate), so the claim survives the holdout.")
    method: TuneMethod = option(TuneMethod.AUTO, flags=("--method", "-m"), cli_type=str,
                                help="auto | entropy | minmax | percentile | mse.")
    target: Target = option(Target.TENSORRT, cli_type=str, help="Q/DQ layout: tensorrt | onnxruntime.")
    holdout: float = option(TUNE_HOLDOUT, bound=Bound(low=0, below=1, example="0.3"),
                            help="Fraction of the evidence (eval set and traffic) held out for the confirmation "
                                 "and the final check.")
    sensitivity_samples: int = option(TUNE_SENSITIVITY_SAMPLES,
                                      bound=Bound(low=8, high=INT_LIMIT, integer=True, example="256"),
                                      help="Examples per ranking run.")
    sensitivity_layers: int | None = option(
        None, bound=COUNT_OR_NONE,
        help="Measure sensitivity only for the K layers with the worst own SQNR (default: every layer).")
    max_evaluations: int = option(40, bound=Bound(low=1, high=INT_LIMIT, integer=True, example="40"),
                                  help="Budget of candidate plans.")
    limit: int | None = option(None, bound=COUNT_OR_NONE, help=LIMIT_HELP)
    percentile: float = option(MethodParams.percentile, bound=PERCENTILE,
                               help="Percentile of |x| of the percentile method.")
    seed: int = option(0, help="Seed of the --limit subset and the search/holdout split.")
    report: PathLike | None = option(None, cli_type=Path | None,
                                     help="Report folder (default on the command line: reports/<time>-tune/; "
                                          "from Python: none).")
    traffic: Traffic | PathLike | TrafficEvidence | None = option(
        Traffic.DEFAULT, cli_type=str | None, negation=NO_TRAFFIC, negation_help=NO_TRAFFIC_HELP,
        help=TRAFFIC_HELP)
    traffic_size: int = option(TUNE_TRAFFIC_SIZE, bound=TRAFFIC_SIZE,
                               help="Traffic texts drawn (stratified by token length, --seed); half are held out, "
                                    "so the plan is confirmed on over 5,000 texts the search never saw.")
    traffic_text_field: str | None = option(None, help=TRAFFIC_TEXT_FIELD_HELP)
    decision_rule: DecisionRuleName = option(
        DecisionRuleName.SEQUENTIAL, cli_type=str,
        help="sequential: judge each candidate on growing chunks of the search split and stop once its decision is "
             "settled at --agreement-confidence (betting confidence sequence, valid under repeated looks); "
             "whole-split: every candidate on the whole search split.")
    confirm: bool = option(
        True, flags=("--confirm/--no-confirm",),
        help="Confirm the plan on the holdout split: the candidates that met the target on the search split (at "
             f"most {TUNE_CONFIRM_CANDIDATES}: the one with the least INT8 and those with the most) are tested "
             "there from the least INT8 up, stopping at the first that fails, and the plan is the last one "
             "confirmed (fixed-sequence testing: the chance that it misses the target stays at 1 - "
             "--agreement-confidence, its choice among up to --max-evaluations candidates included). "
             "--no-confirm: the search's own choice; the holdout only checks it.")
    speed: bool = option(
        True, flags=("--speed/--no-speed",),
        help="onnxruntime target: time every plan the holdout confirmed as ONNX Runtime serves it (every graph "
             "optimization, the fused integer kernels), beside FP32, at batch 1 and 32 on holdout texts, and write "
             "the fastest (plans within 3 % of it: the most faithful); then check the served model against the "
             "arithmetic tune certified on the holdout. --no-speed: the confirmed plan with the most INT8 work, "
             "untimed.")
    kept_weights: KeptWeights = option(
        KeptWeights.BLOCKWISE, cli_type=str,
        help="onnxruntime target: how the served model runs the weight MatMuls a plan keeps out of static INT8, "
             "as each plan is timed and the served model checked (deploy serves them so). blockwise: 8-bit weights "
             "in blocks of 128, activations quantized per block at run time (ONNX Runtime's MatMulNBits, about as "
             "fast as INT8); fp32: exactly as certified.")
    smooth: bool = option(
        True, flags=("--smooth/--no-smooth",),
        help="Also measure the model smoothed (SmoothQuant, alpha auto, same FP32 function, checked) and search "
             "on it when its all-INT8 model flips fewer FP32 predictions; the plan's OUT then holds "
             "smoothed-model/, its source. --no-smooth: the model as given only.")
    # ---- the search's knobs: no command line sets them
    op_types: tuple[str, ...] = option(DEFAULT_OP_TYPES, cli=False, api=False,
                                       help="The operator types whose inputs are quantized.")
    batch_size: int = option(32, cli=False, api=False, help="Texts per batch of every evaluation.")
    fidelity_only: bool = option(
        False, cli=False, api=False,
        help="Set by the pipeline for an unlabeled eval set: FP32's predictions are the labels, only the fidelity "
             "targets count.")
    first_chunk: int = option(256, cli=False, api=False, bound=Bound(low=1, high=INT_LIMIT, integer=True),
                              help="Texts of the first chunk of the sequential decision rule.")
    confirm_anchors: int = option(
        1, cli=False, api=False,
        help="With confirm, when the first passing prefix has no margin the holdout could certify: doublings of it "
             "the search measures for one with margin, then bisects (evaluate.search anchors); 0: none.")
    confirm_candidates: int = option(
        TUNE_CONFIRM_CANDIDATES, cli=False, api=False, bound=Bound(low=2, high=INT_LIMIT, integer=True),
        help="With confirm, the most candidates tested on the holdout: the passing one with the least INT8 (the "
             "fallback) and the ones with the most, each a pass over the holdout (evidence.confirm).")
    risk_strata: bool = option(
        True, cli=False, api=False,
        help="Judge the search's candidates in strata by flip risk (evidence.risk): the risky texts in full, a "
             "seeded sample of the others, a stratified lower bound; False: every candidate on the split by the "
             "decision rule. The holdout's confirmation is a plain random sample either way.")
    # flips concentrate in the riskiest texts, so a few hundred tell the tables apart (on the demo classifier,
    # eight tables raced on 512 cost 58 s of a 700 s tune on two cores)
    race_texts: int = option(256, cli=False, api=False,
                             help="The search texts most at risk of flipping the tables (methods, smoothing) are "
                                  "raced all-INT8 on (evidence.risk.risky_subset).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "traffic", Traffic.parse(self.traffic))
        for name, kind in (("method", TuneMethod), ("target", Target), ("decision_rule", DecisionRuleName),
                           ("kept_weights", KeptWeights)):
            object.__setattr__(self, name, coerce(kind, getattr(self, name)))
        self.validate()  # a request that exists is valid: checked once, when it is made

    @property
    def holdout_fraction(self) -> float:
        return self.holdout

    @property
    def params(self) -> MethodParams:
        """The calibration methods' parameters this request sets (the percentile)."""
        return MethodParams(percentile=self.percentile)

    def threshold(self, fp32_accuracy: float) -> float:
        """The least accuracy a plan may reach: FP32's less ``max_drop`` (points, or percent with ``relative``)."""
        if self.fidelity_only:
            return 0.0
        if self.relative:
            return fp32_accuracy * (1.0 - self.max_drop / 100.0)
        return fp32_accuracy - self.max_drop / 100.0

    def validate(self) -> None:
        """Every check that needs no file read: UsageError naming the option and what to pass instead."""
        from calibkit.data.calibset import CalibrationSet
        from calibkit.data.evalset import EvalSet
        from calibkit.data.modeldir import ModelDir
        from calibkit.evaluate.traffic import TrafficEvidence

        check_paths({"model": self.model, "calibration_set": self.calibration_set},
                    {"eval_set": self.eval_set, "out": self.out, "tokenizer": self.tokenizer, "report": self.report,
                     "traffic": self.traffic}, loaded=(ModelDir, CalibrationSet, EvalSet, TrafficEvidence))
        check_names({"task": self.task, "method": self.method, "target": self.target,
                     "decision_rule": self.decision_rule, "traffic_text_field": self.traffic_text_field,
                     "kept_weights": self.kept_weights},
                    required=("method", "target", "decision_rule", "kept_weights"))
        check_task(self.task)
        _check_choice("--method", self.method, TuneMethod, "use auto, entropy, minmax, percentile or mse")
        _check_choice("--target", self.target, Target, "use tensorrt or onnxruntime")
        _check_choice("--decision-rule", self.decision_rule, DecisionRuleName, "use sequential or whole-split")
        _check_choice("--kept-weights", self.kept_weights, KeptWeights, "use blockwise or fp32")
        check_seed(self.seed)
        check_bounds(self)


def _check_choice(flag: str, value: object, kind: type[Choice], hint: str) -> None:
    if not isinstance(value, kind):
        raise UsageError(f"unknown {flag} {value!r}", hint=hint)

