"""What ``calibkit compare`` is asked: :class:`CompareRequest`, every option declared once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calibkit.errors import UsageError
from calibkit.evaluate.traffic import DEFAULT_TRAFFIC_SIZE
from calibkit.requests.checks import (
    COUNT,
    COUNT_OR_NONE,
    INT_LIMIT,
    TRAFFIC_SIZE,
    Bound,
    check_names,
    check_numbers,
    check_paths,
)
from calibkit.requests.options import Nested, check_bounds, declared, flag_of, option
from calibkit.requests.traffic import Traffic
from calibkit.results.flags import Thresholds
from calibkit.types import PathLike, check_seed

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.evalset import EvalSet
    from calibkit.enginefiles.artifact import EngineArtifact
    from calibkit.evaluate.traffic import TrafficEvidence


TASK_HELP = ("classification | embedding | token-classification | regression | multi-label [default: from the "
             "model's outputs and config.json: logits [batch, classes], last_hidden_state (mean-pooled) or a pooled "
             "embedding, logits [batch, seq, labels], a single score or problem_type regression, problem_type "
             "multi_label_classification].")
LIMIT_HELP = "Use N eval examples, drawn at random and stratified by label (--seed) [default: all]."
TRAFFIC_HELP = (
    "Unlabeled request log whose texts judge agreement with the baseline (the formats of `calibkit sample`), or "
    "'auto' for the log named in the calibration set's manifest (refused when it is gone or changed); a file named "
    "auto or default is that file. Default: that log when it is still there unchanged. Texts in the calibration "
    "set are excluded. Agreement needs no labels: a labelled set of a thousand texts cannot show 99 % agreement, a "
    "few thousand traffic texts can. From Python: a path, Traffic.AUTO, Traffic.DEFAULT, drawn TrafficEvidence or "
    "None (no traffic).")
NO_TRAFFIC = "--no-traffic"
NO_TRAFFIC_HELP = "Judge on the eval set alone, even when the calibration set's log is there."
TRAFFIC_TEXT_FIELD_HELP = "Text field of the traffic log, as `sample --text-field` (default: found)."
TRAFFIC_SIZE_HELP = "Traffic texts drawn (stratified by token length, --seed)."


def _threshold(flag: str, attribute: str, help: str, low: float | None = 0, high: float | None = None) -> Nested:
    return Nested(flag, attribute, help, Bound(low=low, high=high))


THRESHOLDS = (
    _threshold("--threshold-sqnr", "min_sqnr_db", "Flag layers whose own quantization SQNR (dB) is below.", None),
    _threshold("--threshold-clipped", "max_clipped_fraction", "Flag layers clipping more than this.", 0, 1),
    _threshold("--threshold-outlier", "max_outlier_ratio", "Flag max/p99.99 above this."),
    _threshold("--threshold-recovery", "min_recovery_points",
               "Flag when keeping only this layer recovers more points than this.", 0, 100),
    _threshold("--threshold-cost", "max_cost_points",
               "Flag when quantizing only this layer costs more points than this.", 0, 100),
    _threshold("--threshold-zeroed-weights", "max_zeroed_weights",
               "Flag layers whose INT8 weights round more than this fraction of non-zero FP weights to zero.", 0, 1),
    _threshold("--threshold-cosine", "cosine_effect", "Embedders: flag when keeping only this layer recovers (or "
               "quantizing only it costs) more mean cosine to A than this.", 0, 2),
)


@dataclass(frozen=True, kw_only=True)
class CompareRequest:
    """Engine A (the baseline) against engine B on an eval set and/or traffic: what to measure and how."""

    engine_a: PathLike | EngineArtifact = option(
        argument=True, positional=True, cli_type=Path,
        help="Engine A, the baseline (.onnx or .engine with its .calibkit.json sidecar, or a loaded EngineArtifact).")
    engine_b: PathLike | EngineArtifact = option(
        argument=True, positional=True, cli_type=Path, help="Engine B, built from the same FP32 model as A.")
    eval_set: PathLike | EvalSet | None = option(
        None, flags=("--eval-set", "-e"), positional=True, cli_type=Path | None,
        help="Eval set (JSONL, CSV, Parquet, datasets, or a loaded EvalSet); labels optional: without them, "
             "fidelity to A is reported instead of accuracy. Optional with traffic: the traffic texts are then the "
             "eval set (an embedder compared on its log alone).")
    reference: PathLike | EngineArtifact | None = option(
        None, cli_type=Path | None, help="Higher-precision engine (FP32) for FP ranges and reference logits.")
    task: str | None = option(None, help=TASK_HELP)
    limit: int | None = option(None, bound=COUNT_OR_NONE, help=LIMIT_HELP)
    seed: int = option(0, help="Seed of the --limit, layer-statistics and sensitivity subsets.")
    text_column: str | None = option(None, help="Text column (default: text, sentence, ...).")
    label_column: str | None = option(None, help="Label column (default: label, ...).")
    split: str | None = option(None, help="Split of a datasets DatasetDict (default test).")
    batch_size: int = option(32, bound=COUNT, help="Examples per inference batch.")
    layers: bool = option(True, flags=("--layers/--no-layers",), help="Per-layer ranges and SQNR.")
    layer_samples: int | None = option(512, bound=COUNT_OR_NONE,
                                       help="Examples streamed for layer statistics (stratified subset).")
    sensitivity: bool = option(
        True, flags=("--sensitivity/--no-sensitivity",),
        help="Per-layer effect on accuracy (labels) or fidelity to A (rebuilds a variant per layer; not measured "
             "for regression and multi-label models, nor without --layers).")
    sensitivity_samples: int = option(256, bound=COUNT, help="Examples per variant (stratified subset).")
    sensitivity_layers: int | None = option(
        None, bound=COUNT_OR_NONE,
        help="Only the K layers with the worst own SQNR or most zeroed weights (default: every layer).")
    speed: bool = option(
        True, flags=("--speed/--no-speed",),
        help="Time B against A as a server runs them (ONNX Runtime engines: every graph optimization), at batch 1 "
             "and 32 on the traffic texts (else the eval texts), interleaved rounds, the ratio of medians with the "
             "spread of single rounds. --no-speed: only each engine's latency during the evaluation.")
    thresholds: Thresholds = option(default_factory=Thresholds, nested=THRESHOLDS,
                                    help="The flag thresholds (a Thresholds value).")
    max_disagreements: int = option(50, bound=Bound(low=0, high=INT_LIMIT, integer=True),
                                    help="Disagreeing examples to list.")
    traffic: Traffic | PathLike | TrafficEvidence | None = option(
        Traffic.DEFAULT, cli_type=str | None, negation=NO_TRAFFIC, negation_help=NO_TRAFFIC_HELP,
        help=TRAFFIC_HELP)
    traffic_size: int = option(DEFAULT_TRAFFIC_SIZE, bound=TRAFFIC_SIZE, help=TRAFFIC_SIZE_HELP)
    traffic_text_field: str | None = option(None, help=TRAFFIC_TEXT_FIELD_HELP)
    save_outputs: PathLike | None = option(
        None, cli_type=Path | None,
        help="Folder for every evaluated text's outputs of each engine (outputs.npz) and its row, text, label and "
             "each engine's class (outputs.jsonl), to reproduce a flip.")
    min_agreement: float | None = option(
        None, bound=Bound(low=0, high=100, optional=True, example="99", what="a percentage"),
        help="CI gate: exit with code 8 (after writing every output) when B keeps fewer than this percentage of "
             "A's predictions (the printed point estimate), e.g. 99; from Python, the result's gate says it.")
    max_drop: float | None = option(
        None, bound=Bound(low=0, high=100, optional=True, example="0.5", what="a number of accuracy points"),
        help="CI gate: exit with code 8 (after writing every output) when B's accuracy is more than this many "
             "points below A's (needs labels), e.g. 0.5; from Python, the result's gate says it.")
    # ---- no command line sets these
    histogram_layers: int = option(6, cli=False, api=False,
                                   help="The worst layers (lowest own SQNR) whose |x| histograms the result keeps.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "traffic", Traffic.parse(self.traffic))
        self.validate()  # a request that exists is valid: checked once, when it is made

    @property
    def measures_sensitivity(self) -> bool:
        """Per-layer sensitivity is measured on the layers' taps: off without ``layers``."""
        return self.sensitivity and self.layers

    def validate(self) -> None:
        """Every check that needs no file read: UsageError naming the option and what to pass instead."""
        from calibkit.data.evalset import EvalSet
        from calibkit.enginefiles.artifact import EngineArtifact
        from calibkit.evaluate.traffic import TrafficEvidence

        check_paths({"engine_a": self.engine_a, "engine_b": self.engine_b},
                    {"eval_set": self.eval_set, "reference": self.reference, "save_outputs": self.save_outputs,
                     "traffic": self.traffic}, loaded=(EngineArtifact, EvalSet, TrafficEvidence))
        check_names({"task": self.task, "text_column": self.text_column, "label_column": self.label_column,
                     "split": self.split, "traffic_text_field": self.traffic_text_field})
        check_task(self.task)
        check_seed(self.seed)
        if not isinstance(self.thresholds, Thresholds):
            raise UsageError(f"thresholds must be a Thresholds value, got {type(self.thresholds).__name__}",
                             hint="e.g. thresholds=Thresholds(min_sqnr_db=25)")
        check_bounds(self)
        if self.eval_set is None and self.traffic is None:
            raise UsageError("compare needs texts to compare the engines on: an eval set, or traffic",
                             hint="pass --eval-set test.jsonl, or --traffic LOG (or 'auto': the log of B's "
                                  "calibration set)")


def check_task(task: str | None) -> None:
    """UsageError for a --task no task of calibkit's is."""
    from calibkit.tasks import kind_names

    if task is not None and task not in kind_names():
        raise UsageError(f"unknown --task {task!r}", hint="choose " + ", ".join(kind_names()))


def check_targets(**targets: float | None) -> None:
    """UsageError for a CI-gate target (``min_agreement``, ``max_drop``) that cannot be met or missed, by the
    bounds its :class:`CompareRequest` field declares."""
    decls = {f.name: (f, decl) for f, decl in declared(CompareRequest)}
    check_numbers({flag_of(*decls[name]): (value, decls[name][1].bound or Bound())
                   for name, value in targets.items()})
