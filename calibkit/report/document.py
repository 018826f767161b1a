"""Read a compare or tune JSON document into typed, forgiving views.

The documents come from other commands (and from users' disks), so every field is optional here: a missing or
mistyped value becomes ``None`` (rendered as "—") instead of an exception. Only a document that is not a JSON
object, or whose ``format`` names no known kind, is refused with a :class:`DataError`.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from calibkit.report.codec import COMPARE_FORMAT, FORMATS, load_document, result_type

__all__ = ["CompareReport", "TuneReport", "Report", "load_document", "parse_compare", "parse_document", "parse_tune"]

log = logging.getLogger("calibkit.report")



# ---------------------------------------------------------------- forgiving field readers


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _str(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(s for s in (_str(v) for v in _list(value)) if s is not None)


# ---------------------------------------------------------------- compare


@dataclass(frozen=True)
class Latency:
    mean: float | None
    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class Range:
    """A 95 % interval (fractions)."""

    estimate: float | None
    low: float | None
    high: float | None


def _range(value: Any) -> Range | None:
    d = _dict(value)
    if not d:
        return None
    return Range(_num(d.get("estimate")), _num(d.get("low")), _num(d.get("high")))


@dataclass(frozen=True)
class Difference:
    """B - A of a paired outcome with its interval and verdict ("gain" | "loss" | "not significant")."""

    range: Range
    verdict: str | None
    mcnemar_p: float | None
    examples_to_settle: int | None


def _difference(value: Any) -> Difference | None:
    d = _dict(value)
    r = _range(d)
    if r is None:
        return None
    return Difference(r, _str(d.get("verdict")), _num(d.get("mcnemar_p")), _int(d.get("examples_to_settle")))


@dataclass(frozen=True)
class EngineResult:
    name: str | None
    path: str | None
    precision: str | None
    backend: str | None
    accuracy: float | None
    macro_f1: float | None
    confusion_matrix: tuple[tuple[int, ...], ...] | None
    labels: tuple[str, ...]
    latency_ms: Latency
    throughput_per_s: float | None
    batch_size: int | None
    accuracy_ci: Range | None = None
    macro_f1_ci: Range | None = None


@dataclass(frozen=True)
class OutputStats:
    cosine_mean: float | None
    cosine_min: float | None
    max_abs_error: float | None
    mean_abs_error: float | None
    mean_kl: float | None = None
    logit_mse: float | None = None


@dataclass(frozen=True)
class Disagreement:
    index: int | None
    text: str | None
    label: str | None
    pred_a: str | None
    pred_b: str | None
    confidence_a: float | None = None  # A's top-2 probability gap


@dataclass(frozen=True)
class ConfidenceBand:
    """Texts whose top-2 probability gap under A lies in [low, high), and how many of them B flipped."""

    low: float | None
    high: float | None
    texts: int | None
    flips: int | None


@dataclass(frozen=True)
class Sensitivity:
    accuracy: float | None
    delta: float | None
    logit_mse: float | None
    delta_low: float | None = None
    delta_high: float | None = None
    significant: bool | None = None


@dataclass(frozen=True)
class LayerResult:
    index: int | None
    node: str | None
    op_type: str | None
    tensor: str | None
    amax: float | None
    fp_min: float | None
    fp_max: float | None
    fp_absmax: float | None
    p99: float | None
    p9999: float | None
    clipped_fraction: float | None
    outlier_ratio: float | None
    nonfinite: int | None
    sqnr_db: float | None
    cosine: float | None
    only_this_int8: Sensitivity | None
    all_but_this: Sensitivity | None
    flag: str | None
    reasons: tuple[str, ...]
    quant_sqnr_db: float | None = None  # the layer's own INT8 error (input vs its fake-quantized copy)

    @property
    def flagged(self) -> bool:
        return self.flag in ("keep-fp16", "keep-fp32")

    @property
    def label(self) -> str:
        """A short human label: the node name, else the tensor name, else the index."""
        return self.node or self.tensor or (f"#{self.index}" if self.index is not None else "?")


@dataclass(frozen=True)
class MethodThreshold:
    method: str
    amax: float


@dataclass(frozen=True)
class HistogramData:
    tensor: str
    counts: tuple[float, ...]
    upper: float | None
    thresholds: tuple[MethodThreshold, ...]


@dataclass(frozen=True)
class Setting:
    name: str
    value: str


@dataclass(frozen=True)
class Metric:
    name: str
    value: float


@dataclass(frozen=True)
class GoldResult:
    """One engine against the eval set's gold labels (token classification: word-level BIO tags)."""

    engine: str | None
    token_accuracy: float | None
    token_accuracy_ci: Range | None
    entity_f1: float | None
    entity_precision: float | None
    entity_recall: float | None


@dataclass(frozen=True)
class TaskFidelity:
    """The ``task`` block: which task compare chose and B's fidelity to A in its terms (``fidelity``), and,
    for token classification with gold tags, each engine against them (``gold``)."""

    kind: str | None
    output: str | None
    labelled: bool | None
    agreement: float | None
    cosine_mean: float | None
    cosine_min: float | None
    extra: tuple[Metric, ...]  # task-specific numbers: retrieval_overlap_at_k, k, entity_f1, ...
    gold: tuple[GoldResult, ...] = ()
    gold_words: int | None = None
    gold_unscored_words: int | None = None
    gold_entities: int | None = None

    def metric(self, name: str) -> float | None:
        return next((m.value for m in self.extra if m.name == name), None)


_FIDELITY_CORE = ("agreement", "cosine_mean", "cosine_min")


def _task(value: Any) -> TaskFidelity | None:
    t = _dict(value)
    if not t:
        return None
    fid = _dict(t.get("fidelity"))
    gold = _dict(t.get("gold"))
    extra = tuple(Metric(str(k), v) for k, v in ((k, _num(v)) for k, v in fid.items() if k not in _FIDELITY_CORE)
                  if v is not None)
    engines = tuple(
        GoldResult(str(name), _num(g.get("token_accuracy")), _range(g.get("token_accuracy_ci")),
                   _num(g.get("entity_f1")), _num(g.get("entity_precision")), _num(g.get("entity_recall")))
        for name, g in ((n, _dict(g)) for n, g in _dict(gold.get("engines")).items())
    )
    return TaskFidelity(
        kind=_str(t.get("kind")), output=_str(t.get("output")), labelled=_bool(t.get("labelled")),
        agreement=_num(fid.get("agreement")), cosine_mean=_num(fid.get("cosine_mean")),
        cosine_min=_num(fid.get("cosine_min")), extra=extra, gold=engines, gold_words=_int(gold.get("words")),
        gold_unscored_words=_int(gold.get("unscored_words")), gold_entities=_int(gold.get("entities")),
    )


@dataclass(frozen=True)
class CompareReport:
    format: str
    calibkit_version: str | None
    eval_path: str | None
    eval_count: int | None
    eval_labels: tuple[str, ...]
    engines: tuple[EngineResult, ...]
    agreement: float | None
    outputs: OutputStats
    disagreements: tuple[Disagreement, ...]
    layers: tuple[LayerResult, ...]
    thresholds: tuple[Setting, ...]
    keep_nodes: tuple[str, ...]
    keep_precision: str | None
    histograms: tuple[HistogramData, ...]
    layer_samples: int | None = None
    sensitivity_samples: int | None = None
    agreement_ci: Range | None = None
    accuracy_diff: Difference | None = None
    macro_f1_diff: Range | None = None
    warnings: tuple[str, ...] = ()
    seed: int | None = None
    subsets: tuple[Setting, ...] = ()  # which rows each measurement used
    task: TaskFidelity | None = None
    flips_by_confidence: tuple[ConfidenceBand, ...] = ()

    def layer_for_node(self, node: str) -> LayerResult | None:
        return next((layer for layer in self.layers if layer.node == node), None)

    def histogram_for(self, tensor: str | None) -> HistogramData | None:
        return next((h for h in self.histograms if h.tensor == tensor), None) if tensor else None


def _sensitivity(value: Any) -> Sensitivity | None:
    if not isinstance(value, dict):
        return None
    return Sensitivity(_num(value.get("accuracy")), _num(value.get("delta")), _num(value.get("logit_mse")),
                       _num(value.get("delta_low")), _num(value.get("delta_high")), _bool(value.get("significant")))


def _matrix(value: Any) -> tuple[tuple[int, ...], ...] | None:
    rows = _list(value)
    if not rows:
        return None
    out = []
    for row in rows:
        cells = [_num(c) for c in _list(row)]
        if not cells or any(c is None for c in cells):
            return None
        out.append(tuple(int(c) for c in cells if c is not None))
    if len({len(r) for r in out}) != 1 or len(out) != len(out[0]):
        return None
    return tuple(out)


def _engine(value: Any) -> EngineResult:
    e = _dict(value)
    lat = _dict(e.get("latency_ms"))
    return EngineResult(
        name=_str(e.get("name")),
        path=_str(e.get("path")),
        precision=_str(e.get("precision")),
        backend=_str(e.get("backend")),
        accuracy=_num(e.get("accuracy")),
        macro_f1=_num(e.get("macro_f1")),
        confusion_matrix=_matrix(e.get("confusion_matrix")),
        labels=_strs(e.get("labels")),
        latency_ms=Latency(_num(lat.get("mean")), _num(lat.get("p50")), _num(lat.get("p95"))),
        throughput_per_s=_num(e.get("throughput_per_s")),
        batch_size=_int(e.get("batch_size")),
        accuracy_ci=_range(e.get("accuracy_ci")),
        macro_f1_ci=_range(e.get("macro_f1_ci")),
    )


def _layer(value: Any) -> LayerResult:
    x = _dict(value)
    sens = _dict(x.get("sensitivity"))
    return LayerResult(
        index=_int(x.get("index")),
        node=_str(x.get("node")),
        op_type=_str(x.get("op_type")),
        tensor=_str(x.get("tensor")),
        amax=_num(x.get("amax")),
        fp_min=_num(x.get("fp_min")),
        fp_max=_num(x.get("fp_max")),
        fp_absmax=_num(x.get("fp_absmax")),
        p99=_num(x.get("p99")),
        p9999=_num(x.get("p9999")),
        clipped_fraction=_num(x.get("clipped_fraction")),
        outlier_ratio=_num(x.get("outlier_ratio")),
        nonfinite=_int(x.get("nonfinite")),
        sqnr_db=_num(x.get("sqnr_db")),
        quant_sqnr_db=_num(x.get("quant_sqnr_db")),
        cosine=_num(x.get("cosine")),
        only_this_int8=_sensitivity(sens.get("only_this_int8")),
        all_but_this=_sensitivity(sens.get("all_but_this")),
        flag=_str(x.get("flag")),
        reasons=_strs(x.get("reasons")),
    )


def _histograms(value: Any) -> tuple[HistogramData, ...]:
    out = []
    for tensor, h in _dict(value).items():
        h = _dict(h)
        counts = [_num(c) for c in _list(h.get("counts"))]
        if not counts or any(c is None or c < 0 for c in counts):
            continue
        thresholds = tuple(
            MethodThreshold(str(k), v)
            for k, v in ((k, _num(v)) for k, v in _dict(h.get("thresholds")).items())
            if v is not None
        )
        out.append(HistogramData(str(tensor), tuple(c for c in counts if c is not None), _num(h.get("upper")),
                                 thresholds))
    return tuple(out)


def _setting_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return "—" if value is None else str(value)


def parse_compare(doc: dict[str, Any]) -> CompareReport:
    eval_set = _dict(doc.get("eval_set"))
    outputs = _dict(doc.get("outputs"))
    rec = _dict(doc.get("recommendation"))
    return CompareReport(
        format=str(doc.get("format")),
        calibkit_version=_str(doc.get("calibkit_version")),
        eval_path=_str(eval_set.get("path")),
        eval_count=_int(eval_set.get("count")),
        eval_labels=_strs(eval_set.get("labels")),
        engines=tuple(_engine(e) for e in _list(doc.get("engines")) if isinstance(e, dict)),
        agreement=_num(doc.get("agreement")),
        outputs=OutputStats(
            _num(outputs.get("cosine_mean")),
            _num(outputs.get("cosine_min")),
            _num(outputs.get("max_abs_error")),
            _num(outputs.get("mean_abs_error")),
            _num(outputs.get("mean_kl")),
            _num(outputs.get("logit_mse")),
        ),
        layer_samples=_int(doc.get("layer_samples")),
        sensitivity_samples=_int(doc.get("sensitivity_samples")),
        disagreements=tuple(
            Disagreement(_int(d.get("index")), _str(d.get("text")), _str(d.get("label")), _str(d.get("pred_a")),
                         _str(d.get("pred_b")), _num(d.get("confidence_a")))
            for d in _list(doc.get("disagreements"))
            if isinstance(d, dict)
        ),
        layers=tuple(_layer(x) for x in _list(doc.get("layers")) if isinstance(x, dict)),
        thresholds=tuple(Setting(str(k), _setting_text(v)) for k, v in sorted(_dict(doc.get("thresholds")).items())),
        keep_nodes=_strs(rec.get("keep_in_higher_precision")),
        keep_precision=_str(rec.get("precision")),
        histograms=_histograms(doc.get("histograms")),
        agreement_ci=_range(doc.get("agreement_ci")),
        accuracy_diff=_difference(_dict(doc.get("difference")).get("accuracy")),
        macro_f1_diff=_range(_dict(doc.get("difference")).get("macro_f1")),
        warnings=_strs(doc.get("warnings")),
        seed=_int(doc.get("seed")),
        subsets=_subsets(doc),
        task=_task(doc.get("task")),
        flips_by_confidence=tuple(
            ConfidenceBand(_num(b.get("low")), _num(b.get("high")), _int(b.get("texts")), _int(b.get("flips")))
            for b in _list(doc.get("flips_by_confidence"))
            if isinstance(b, dict)
        ),
    )


def _subsets(doc: dict[str, Any]) -> tuple[Setting, ...]:
    out = []
    named = [("eval rows (--limit)", _dict(doc.get("eval_set")).get("rows"))]
    named += [(f"{k} subset", v) for k, v in sorted(_dict(doc.get("subsets")).items())]
    for name, value in named:
        d = _dict(value)
        if d:
            out.append(Setting(name, f"{d.get('count')} of {d.get('of')} rows, {d.get('strategy')}, seed "
                                     f"{d.get('seed')}, content sha256 {str(d.get('content_sha256'))[:16]}"))
    return tuple(out)


# ---------------------------------------------------------------- tune


@dataclass(frozen=True)
class Candidate:
    id: int | None
    int8_flops_fraction: float | None
    accuracy_search: float | None
    accuracy_holdout: float | None
    kept_nodes: tuple[str, ...]
    method: str | None
    accepted: bool | None
    meets_target: bool | None = None
    agreement_search: float | None = None


@dataclass(frozen=True)
class NodeReasons:
    node: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Peer:
    name: str | None
    accuracy: float | None


@dataclass(frozen=True)
class TunePlan:
    kept_nodes: tuple[str, ...]
    int8_flops_fraction: float | None
    accuracy_search: float | None
    accuracy_holdout: float | None
    reasons: tuple[NodeReasons, ...]
    agreement_search: float | None = None
    agreement_holdout: float | None = None
    holdout_accuracy_diff: Difference | None = None
    holdout_agreement: Range | None = None
    holdout_supported: bool | None = None
    holdout_verdict: str | None = None

    def reasons_for(self, node: str) -> tuple[str, ...]:
        return next((r.reasons for r in self.reasons if r.node == node), ())


@dataclass(frozen=True)
class TuneReport:
    format: str
    calibkit_version: str | None
    max_drop: float | None
    relative: bool | None
    fp32_accuracy: float | None
    candidates: tuple[Candidate, ...]
    final: TunePlan | None
    peers: tuple[Peer, ...]
    threshold: float | None = None  # the document's own lowest accepted accuracy, when it states one
    min_agreement: float | None = None  # percent of FP32's predictions the plan must keep
    method_flips: tuple[Setting, ...] = ()
    chosen_method: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def target_accuracy(self) -> float | None:
        """The lowest accuracy the target accepts. ``max_drop`` is in accuracy points (percent of the FP32
        accuracy when relative), as `calibkit tune --max-drop` takes it."""
        if self.threshold is not None:
            return self.threshold
        if self.fp32_accuracy is None or self.max_drop is None:
            return None
        if self.relative:
            return self.fp32_accuracy * (1.0 - self.max_drop / 100.0)
        return self.fp32_accuracy - self.max_drop / 100.0


def parse_tune(doc: dict[str, Any]) -> TuneReport:
    target = _dict(doc.get("target"))
    final = doc.get("final")
    plan = None
    if isinstance(final, dict):
        hold = _dict(final.get("holdout_evidence"))
        verdict = _dict(final.get("holdout_verdict"))
        plan = TunePlan(
            agreement_search=_num(final.get("agreement_search")),
            agreement_holdout=_num(final.get("agreement_holdout")),
            holdout_accuracy_diff=_difference(hold.get("accuracy_minus_fp32")),
            holdout_agreement=_range(hold.get("agreement")),
            holdout_supported=_bool(verdict.get("supported")),
            holdout_verdict=_str(verdict.get("text")),
            kept_nodes=_strs(final.get("kept_nodes")),
            int8_flops_fraction=_num(final.get("int8_flops_fraction")),
            accuracy_search=_num(final.get("accuracy_search")),
            accuracy_holdout=_num(final.get("accuracy_holdout")),
            reasons=tuple(
                NodeReasons(str(node), _strs(r) if isinstance(r, list) else tuple(s for s in [_str(r)] if s))
                for node, r in _dict(final.get("reasons")).items()
            ),
        )
    return TuneReport(
        format=str(doc.get("format")),
        calibkit_version=_str(doc.get("calibkit_version")),
        max_drop=_num(target.get("max_drop")),
        relative=_bool(target.get("relative")),
        fp32_accuracy=_num(target.get("fp32_accuracy")),
        threshold=_num(target.get("threshold")),
        min_agreement=_num(target.get("min_agreement")),
        method_flips=tuple(Setting(str(k), f"{100 * v:.2f} %") for k, v in
                           _dict(_dict(doc.get("methods")).get("all_int8_flip_rate_search")).items()
                           if isinstance(v, (int, float))),
        chosen_method=_str(_dict(doc.get("methods")).get("chosen")),
        warnings=_strs(doc.get("warnings")),
        candidates=tuple(
            Candidate(
                id=_int(c.get("id")),
                int8_flops_fraction=_num(c.get("int8_flops_fraction")),
                accuracy_search=_num(c.get("accuracy_search")),
                accuracy_holdout=_num(c.get("accuracy_holdout")),
                kept_nodes=_strs(c.get("kept_nodes")),
                method=_str(c.get("method")),
                accepted=_bool(c.get("accepted")),
                meets_target=_bool(c.get("meets_target")),
                agreement_search=_num(c.get("agreement_search")),
            )
            for c in _list(doc.get("candidates"))
            if isinstance(c, dict)
        ),
        final=plan,
        peers=tuple(
            Peer(_str(p.get("name")), _num(p.get("accuracy"))) for p in _list(doc.get("peers")) if isinstance(p, dict)
        ),
    )


# ---------------------------------------------------------------- entry points

Report = CompareReport | TuneReport


def parse_document(doc: Any) -> Report:
    """Dispatch on ``doc["format"]``. Raises :class:`DataError` for anything that is not a known report."""
    kind = result_type(doc)  # the one check of what a document is (report.codec)
    fmt = doc["format"]
    known = FORMATS[kind]
    if fmt != known:
        log.warning("report format %s is not %s; rendering what can be read", fmt, known)
    return parse_compare(doc) if known == COMPARE_FORMAT else parse_tune(doc)
