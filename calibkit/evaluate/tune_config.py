"""What a tune run is asked for: :class:`TuneConfig` (targets, search budget, evidence, decision rule) and the
fidelity targets used when the user names none."""

from __future__ import annotations

from dataclasses import dataclass, field

from calibkit.evaluate.tune_defaults import TUNE_HOLDOUT, TUNE_SENSITIVITY_SAMPLES
from calibkit.quantize.placement import DEFAULT_OP_TYPES
from calibkit.types import MethodParams, check_seed


@dataclass(frozen=True)
class TuneConfig:
    max_drop: float = 0.5  # accuracy points (or percent of FP32 accuracy with relative=True)
    relative: bool = False
    min_agreement: float | None = None  # percent of FP32's predictions the plan must keep (e.g. 99)
    # embeddings: the mean cosine to FP32's vectors the plan must keep (e.g. 0.995), beside min_agreement
    # (for embeddings: the share of texts whose nearest neighbour in the FP32 index stays, evaluate.rowfidelity)
    min_cosine: float | None = None
    method: str = "auto"  # "auto" or a Method value
    holdout_fraction: float = TUNE_HOLDOUT
    sensitivity_samples: int = TUNE_SENSITIVITY_SAMPLES
    sensitivity_layers: int | None = None  # measured sensitivity for the K worst layers (own SQNR); None: all
    max_evaluations: int = 40
    workers: int | None = None
    seed: int = 0
    target: str = "tensorrt"
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    batch_size: int = 32
    params: MethodParams = field(default_factory=MethodParams)
    fidelity_only: bool = False  # unlabeled eval set: FP32's predictions are the labels, only min_agreement counts
    # --min-agreement is met on the search split when the one-sided lower bound of the agreement at this
    # confidence reaches it (0.5: the point estimate); measured on the demo: at the point estimate all-INT8 met
    # 99 % on the search split (99.19 %, 1,480 texts) and kept 98.74 % on the holdout
    agreement_confidence: float = 0.9
    # also try the model smoothed (calibkit smooth, alpha auto): every method's table on both, the variant whose
    # all-INT8 model flips the fewest FP32 predictions on the search split is the one the plan is searched on
    smooth: bool = True
    task: str | None = None  # --task: what the model's outputs mean (None: from its outputs and config.json)
    # how each candidate is judged on the search split (evaluate.plan_decisions): "sequential" (growing chunks,
    # a betting confidence sequence at agreement_confidence, stop once decided) or "whole-split" (every text,
    # then one fixed-n test, as before); first_chunk: texts of the first chunk of the sequential rule
    decision_rule: str = "sequential"
    first_chunk: int = 256
    # confirm the search's choice on the holdout split (evaluate.confirm: fixed-sequence testing of the passing
    # candidates, least INT8 first): the plan is the last one confirmed. False: the holdout is only a check
    confirm: bool = True
    # with confirm, when the first passing prefix has no margin the holdout could certify: doublings of it the
    # search measures for one with margin, then bisects (evaluate.search ``anchors``); 0: none
    confirm_anchors: int = 1
    # judge the search's candidates on the search split in strata by flip risk (evaluate.risk): the risky texts
    # in full, a seeded sample of the others, a stratified lower bound; False: every candidate on the split by
    # decision_rule. The holdout's confirmation is a plain random sample either way
    risk_strata: bool = True
    # the tables (methods, smoothing) are raced all-INT8 on the search texts most at risk of flipping, this many
    # (evaluate.risk.risky_subset): flips concentrate there, so a few hundred tell the tables apart (on the demo
    # classifier, eight tables raced on 512 cost 58 s of a 700 s tune on two cores)
    race_texts: int = 256

    def __post_init__(self) -> None:
        check_seed(self.seed)

    def threshold(self, fp32_accuracy: float) -> float:
        if self.fidelity_only:
            return 0.0
        if self.relative:
            return fp32_accuracy * (1.0 - self.max_drop / 100.0)
        return fp32_accuracy - self.max_drop / 100.0


DEFAULT_UNLABELED_AGREEMENT = 99.0  # percent of FP32's predictions kept, when the eval set has no labels
DEFAULT_EMBEDDING_AGREEMENT = 95.0  # percent of texts whose nearest neighbour in the FP32 index stays
DEFAULT_EMBEDDING_COSINE = 0.995  # mean cosine of the INT8 vectors to FP32's
