"""Report plots as PNG bytes. matplotlib is imported lazily and used without pyplot (no global state)."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calibkit.report.formatting import pct, shorten
from calibkit.results.runs import (
    Comparison,
    EngineEvaluation,
    LayerVerdict,
    Result,
    TensorHistogram,
    TuneResult,
    TuneTarget,
)

if TYPE_CHECKING:  # pragma: no cover - types only
    from matplotlib.axes import Axes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_HISTOGRAMS = 6
_DPI = 110
_FLAG_COLOURS = {"keep-fp32": "#c0392b", "keep-fp16": "#e67e22"}
_OK_COLOUR = "#4a78a8"
_METHOD_STYLES = {
    "minmax": ("#7f7f7f", ":"),
    "entropy": ("#1f77b4", "--"),
    "percentile": ("#2ca02c", "-."),
    "mse": ("#9467bd", (0, (5, 1, 1, 1))),
    "amax": ("#c0392b", "-"),
}


@dataclass(frozen=True)
class Plot:
    """One figure: ``name`` is its file stem under plots/, ``alt`` a text description for screen readers."""

    name: str
    title: str
    caption: str
    alt: str
    png: bytes


@dataclass(frozen=True)
class NamedHistogram:
    """A layer input's histogram with the tensor it was taken of."""

    tensor: str
    histogram: TensorHistogram


def target_accuracy(target: TuneTarget) -> float | None:
    """The lowest accuracy the target accepts: the document's own threshold, else FP32's accuracy less
    ``max_drop`` (accuracy points, or percent of the FP32 accuracy when relative, as `tune --max-drop` takes it)."""
    if target.threshold is not None:
        return target.threshold
    if target.fp32_accuracy is None or target.max_drop is None:
        return None
    if target.relative:
        return target.fp32_accuracy * (1.0 - target.max_drop / 100.0)
    return target.fp32_accuracy - target.max_drop / 100.0


def layer_name(layer: LayerVerdict) -> str:
    """A layer as reports name it, as the terminal does: its module path with its node (``label``), else its
    input tensor, else its index."""
    return layer.label if layer.node else layer.tensor or f"#{layer.index}"


def make_plots(report: Result) -> tuple[Plot, ...]:
    with warnings.catch_warnings():
        # Names and labels in scripts the default font lacks draw as boxes; that is no reason to warn.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        if isinstance(report, TuneResult):
            return tuple(p for p in (_tune_scatter(report), _speed_scatter(report)) if p is not None)
        plots = [_sqnr_bars(report), _range_chart(report), _histograms(report), _confusion(report)]
        return tuple(p for p in plots if p is not None)


# ---------------------------------------------------------------- helpers


def _figure(width: float, height: float, *, constrained: bool = True) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained" if constrained else None)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _label(value: str, width: int = 60) -> str:
    """User text for matplotlib: shortened, and ``$`` escaped so names never trigger mathtext."""
    return shorten(value, width).replace("$", r"\$")


def _layer_colour(layer: LayerVerdict) -> str:
    return _FLAG_COLOURS.get(layer.flag.value, "#e67e22") if layer.flagged else _OK_COLOUR


def _layer_ticks(ax: Axes, layers: Sequence[LayerVerdict]) -> None:
    """One y tick per layer, flagged names in bold colour, first layer at the top."""
    ax.set_yticks(range(len(layers)))
    ax.set_yticklabels([_tick_text(x) for x in layers], fontsize=7)
    for tick, layer in zip(ax.get_yticklabels(), layers):
        if layer.flagged:
            tick.set_color(_layer_colour(layer))
            tick.set_fontweight("bold")
    ax.set_ylim(len(layers) - 0.5, -0.5)
    ax.margins(y=0)


def _legend_above(ax: Axes, handles: Sequence[Any] | None = None) -> None:
    """The legend in a row above the axes, where it can hide no bar."""
    kwargs: dict[str, Any] = {"handles": list(handles)} if handles is not None else {}
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=5, fontsize=8, frameon=False, borderaxespad=0.2,
              **kwargs)


def _flag_handles(layers: Sequence[LayerVerdict]) -> list[Any]:
    from matplotlib.patches import Patch

    flags = sorted({x.flag.value for x in layers if x.flagged})
    handles = [Patch(color=_OK_COLOUR, label="INT8 ok")]
    return handles + [Patch(color=_FLAG_COLOURS.get(f, "#e67e22"), label=_label(f)) for f in flags]


def _layer_height(n: int) -> float:
    return max(3.0, 0.17 * n + 1.3)


def _layer_figure(layers: Sequence[LayerVerdict], width: float = 9.0) -> Figure:
    """A figure with one row per layer. Margins come from the label length: constrained layout would take
    longer than the drawing on a 60-layer chart."""
    height = _layer_height(len(layers))
    fig = _figure(width, height, constrained=False)
    longest = max((len(_tick_text(x)) for x in layers), default=10)
    left = min(0.6, (0.3 + 0.056 * longest) / width)
    fig.subplots_adjust(left=left, right=1 - 0.25 / width, top=1 - 0.45 / height, bottom=0.55 / height)
    return fig


def _tick_text(layer: LayerVerdict) -> str:
    return _label(f"{layer.index}  {layer_name(layer)}", 56)


# ---------------------------------------------------------------- compare plots


def _sqnr_bars(report: Comparison) -> Plot | None:
    layers = report.layers
    if not any(x.sqnr_db is not None or x.quant_sqnr_db is not None for x in layers):
        return None
    fig = _layer_figure(layers)
    ax = fig.add_subplot()
    # bars: the layer's own INT8 error (what the flag reads); dots: the error at its output, which also
    # carries every earlier layer's error
    own = [x.quant_sqnr_db if x.quant_sqnr_db is not None else x.sqnr_db for x in layers]
    values = [v if v is not None else 0.0 for v in own]
    ax.barh(range(len(layers)), values, color=[_layer_colour(x) for x in layers], height=0.75)
    for i, v in enumerate(own):
        if v is None:
            ax.text(0, i, " n/a", va="center", fontsize=7, color="#888888")
    handles = _flag_handles(layers)
    out_pts = [(x.sqnr_db, i) for i, x in enumerate(layers) if x.sqnr_db is not None and x.quant_sqnr_db is not None]
    if out_pts:
        handles.append(ax.scatter([p[0] for p in out_pts], [p[1] for p in out_pts], s=10, color="#222222",
                                  zorder=3, label="output SQNR (accumulated)"))
    threshold = report.thresholds.min_sqnr_db
    if threshold is not None:
        handles.append(ax.axvline(threshold, color="#c0392b", linestyle="--", linewidth=1,
                                  label=f"flag below {threshold:g} dB"))
    _layer_ticks(ax, layers)
    ax.set_xlabel("own SQNR of the INT8 input (dB, higher is better)")
    ax.grid(axis="x", alpha=0.3)
    _legend_above(ax, handles)
    scored = [(v, x) for v, x in zip(own, layers) if v is not None]
    worst_text = layer_name(min(scored, key=lambda vx: vx[0])[1]) if scored else "—"
    n_flagged = sum(x.flagged for x in layers)
    return Plot(
        name="sqnr",
        title="Per-layer SQNR",
        caption=f"Bars: signal-to-quantization-noise ratio of each quantized input against its own fake-quantized "
        f"copy (the layer's own INT8 error); dots: SQNR at the layer's output, B against A, which also carries "
        f"every earlier layer's error. {n_flagged} flagged layer(s) in orange/red.",
        alt=f"Bar chart of SQNR for {len(layers)} layers; lowest: {worst_text}.",
        png=_png(fig),
    )


def _range_chart(report: Comparison) -> Plot | None:
    layers = report.layers
    if not any(x.amax or x.fp_absmax or x.p9999 for x in layers):
        return None
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = _layer_figure(layers)
    ax = fig.add_subplot()
    ys = range(len(layers))

    def positive(v: float | None) -> float | None:
        return v if v is not None and v > 0 else None

    amax = [positive(x.amax) for x in layers]
    absmax = [positive(x.fp_absmax) for x in layers]
    p9999 = [positive(x.p9999) for x in layers]
    floor = min((v for v in amax + absmax + p9999 if v is not None), default=1e-3) / 2
    ax.barh(ys, [(a or floor) - floor for a in amax], left=floor, height=0.6,
            color=[_layer_colour(x) for x in layers], alpha=0.45)
    top = ax.scatter([v for v in absmax if v is not None], [y for y, v in zip(ys, absmax) if v is not None],
               marker="|", s=80, color="black", linewidths=1.5, label="FP |x| max", zorder=3)
    p99 = ax.scatter([v for v in p9999 if v is not None], [y for y, v in zip(ys, p9999) if v is not None],
               marker="o", s=14, facecolors="white", edgecolors="#2ca02c", linewidths=1.2, label="FP p99.99",
               zorder=3)
    ax.set_xscale("log")
    values = [v for v in amax + absmax + p9999 if v is not None]
    decades = math.log10(max(values) / min(values)) if values else 0.0
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    _layer_ticks(ax, layers)
    ax.set_xlabel("|activation| (log scale)")
    ax.grid(axis="x", which="both", alpha=0.25)
    from matplotlib.patches import Patch

    clip = Patch(color="#8a9bb0", alpha=0.45, label="INT8 clip range [0, amax] (colour: flag)")
    _legend_above(ax, [clip, top, p99])
    return Plot(
        name="ranges",
        title="FP range vs INT8 clip range",
        caption="Bars: the INT8 clip range [0, amax] of each layer (flagged layers in orange/red). Ticks: the "
        "largest FP magnitude seen; circles: its 99.99th percentile. A tick far right of its bar means clipped "
        "outliers; a bar far right of its circle means coarse INT8 steps.",
        alt=f"Log-scale range chart for {len(layers)} layers.",
        png=_png(fig),
    )


def _worst_histograms(report: Comparison) -> list[tuple[NamedHistogram, LayerVerdict | None]]:
    by_tensor = {x.tensor: x for x in report.layers if x.tensor}
    chosen: list[tuple[NamedHistogram, LayerVerdict | None]] = [
        (NamedHistogram(tensor, h), by_tensor.get(tensor)) for tensor, h in report.histograms.items()
        if len(h.counts) > 0
    ]

    def badness(item: tuple[NamedHistogram, LayerVerdict | None]) -> tuple[int, float]:
        layer = item[1]
        if layer is None:
            return (2, 0.0)
        return (0 if layer.flagged else 1, layer.sqnr_db if layer.sqnr_db is not None else math.inf)

    chosen.sort(key=badness)
    return chosen[:MAX_HISTOGRAMS]


def _histograms(report: Comparison) -> Plot | None:
    chosen = _worst_histograms(report)
    if not chosen:
        return None
    from matplotlib.ticker import NullLocator

    cols = 2 if len(chosen) > 1 else 1
    rows = math.ceil(len(chosen) / cols)
    # A fixed grid: constrained layout costs more than the drawing here, and the labels are short.
    # Legends sit right of each panel so they never hide a threshold line.
    width = 6.6 * cols
    fig = _figure(width, 3.0 * rows, constrained=False)
    fig.subplots_adjust(left=0.6 / width, right=1 - 1.45 / width, bottom=0.45 / (3.0 * rows),
                        top=1 - 0.35 / (3.0 * rows), wspace=2.1 / 5.2, hspace=0.55)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(chosen):]:
        ax.set_visible(False)
    for ax, (named, layer) in zip(axes.flat, chosen):
        hist = named.histogram
        upper = hist.upper if hist.upper and hist.upper > 0 else float(len(hist.counts))
        edges = [upper * i / len(hist.counts) for i in range(len(hist.counts) + 1)]
        ax.stairs([max(c, 0.5) for c in hist.counts], edges, fill=True, color="#9bb7d4", baseline=0.5)
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())
        right = upper
        thresholds = sorted((m, a) for m, a in hist.thresholds.items() if a is not None)
        for method, amax in thresholds:
            colour, style = _METHOD_STYLES.get(method, ("#333333", "--"))
            ax.axvline(amax, color=colour, linestyle=style, linewidth=1.4, label=f"{_label(method, 16)} {amax:.3g}")
            right = max(right, amax)
        ax.set_xlim(0, right * 1.04)
        title = layer_name(layer) if layer else named.tensor
        flag = f"  [{layer.flag.value}]" if layer and layer.flagged else ""
        ax.set_title(_label(title, 52) + flag, fontsize=8.5, color=_layer_colour(layer) if layer else "black")
        ax.set_xlabel("|x|", fontsize=8)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(labelsize=7)
        if thresholds:
            ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return Plot(
        name="histograms",
        title="Activation histograms of the worst layers",
        caption="Histogram of |x| (log counts) with the clip threshold each calibration method would choose; "
        "'amax' is the one in use.",
        alt=f"Histograms of {len(chosen)} layers with calibration thresholds.",
        png=_png(fig),
    )


def _confusion(report: Comparison) -> Plot | None:
    engines = [e for e in report.engines if e.confusion_matrix]
    if not engines:
        return None
    size = max(len(e.confusion_matrix or ()) for e in engines)
    cell = 0.55 if size <= 10 else 0.3
    side = max(2.6, cell * size + 1.6)
    fig = _figure(side * len(engines) + 0.4, side + 0.5)
    axes = fig.subplots(1, len(engines), squeeze=False)[0]
    for ax, engine in zip(axes, engines):
        _draw_confusion(ax, engine, report.eval_set.labels)
    return Plot(
        name="confusion",
        title="Confusion matrices",
        caption="Rows: true label; columns: predicted label; colour: share of the row.",
        alt="Confusion matrices of " + ", ".join(_label(e.name or "?") for e in engines) + ".",
        png=_png(fig),
    )


def _draw_confusion(ax: Axes, engine: EngineEvaluation, fallback_labels: Sequence[str]) -> None:
    matrix = engine.confusion_matrix or ()
    n = len(matrix)
    labels = list(engine.labels if len(engine.labels) == n else fallback_labels)
    if len(labels) != n:
        labels = [str(i) for i in range(n)]
    shares = [[c / max(sum(row), 1) for c in row] for row in matrix]
    ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    if n <= 12:
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                ax.text(j, i, str(count), ha="center", va="center", fontsize=8,
                        color="white" if shares[i][j] > 0.6 else "black")
    short = [_label(s, 12) for s in labels]
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(short, fontsize=7, rotation=45 if n > 3 else 0, ha="right" if n > 3 else "center")
    ax.set_yticklabels(short, fontsize=7)
    ax.set_xlabel("predicted", fontsize=8)
    ax.set_ylabel("true", fontsize=8)
    name = " ".join(s for s in (engine.name, engine.precision) if s)
    ax.set_title(_label(f"{name or '?'}  acc {pct(engine.accuracy)}", 40), fontsize=9)


# ---------------------------------------------------------------- tune plot


def _tune_scatter(report: TuneResult) -> Plot | None:
    # accuracy where the plan was judged on labels; else the task's agreement with FP32 (fidelity-only tunes)
    by_accuracy = any(c.accuracy_search is not None for c in report.candidates)
    what = "accuracy" if by_accuracy else "agreement with FP32"
    measured = [(c.int8_flops_fraction, c.accuracy_search if by_accuracy else c.agreement_search, c)
                for c in report.candidates]
    points = [(x, y, c) for x, y, c in measured if y is not None]
    fig = _figure(9.5, 5.0)
    ax = fig.add_subplot()
    for ok, colour, label in ((True, "#2ca02c", "meets the target"), (False, "#c0392b", "misses the target")):
        group = [(x, y) for x, y, c in points if c.meets_target is ok]
        if group:
            ax.scatter([x for x, _ in group], [y for _, y in group], s=28,
                       color=colour, alpha=0.8, label=f"candidate, {label}", zorder=3)
    holdout = [(x, c.accuracy_holdout) for x, _, c in points if c.accuracy_holdout is not None]
    if holdout:
        ax.scatter([x for x, _ in holdout], [y for _, y in holdout], s=30,
                   facecolors="none", edgecolors="#333333", linewidths=0.8, label="hold-out accuracy", zorder=3)
    fp32, target = report.target.fp32_accuracy, target_accuracy(report.target)
    if not by_accuracy:
        fp32 = None
        target = None if report.target.min_agreement is None else report.target.min_agreement / 100.0
    if fp32 is not None:
        ax.axhline(fp32, color="#333333", linewidth=1, label=f"FP32 {pct(fp32)}")
    if target is not None:
        ax.axhline(target, color="#c0392b", linestyle="--", linewidth=1.2, label=f"target {pct(target)}")
    peers = [(p.name, p.accuracy) for p in report.peers if p.accuracy is not None]
    for i, (name, accuracy) in enumerate(peers):
        ax.axhline(accuracy, color="#8c564b", linestyle=":", linewidth=1, alpha=0.8)
        ax.text(0.005, accuracy, _label(name or f"peer {i + 1}", 40), transform=ax.get_yaxis_transform(),
                fontsize=7, color="#8c564b", va="bottom")
    final = report.final
    star = final.accuracy_search if by_accuracy else final.agreement_search
    if star is not None:
        ax.scatter([final.int8_flops_fraction], [star], marker="*", s=260, color="#f1c40f",
                   edgecolors="black", linewidths=0.8, label="chosen plan", zorder=4)
    ax.set_xlabel("share of FLOPs running in INT8")
    ax.set_ylabel(f"{what} (search set)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return Plot(
        name="tune",
        title=f"{what[0].upper()}{what[1:]} vs INT8 coverage",
        caption="Every candidate plan the search tried: further right means more of the model runs in INT8. The "
        f"dashed line is the {what} target; the star is the chosen plan.",
        alt=f"Scatter of {len(points)} candidate plans.",
        png=_png(fig),
    )


def _speed_scatter(report: TuneResult) -> Plot | None:
    """Each timed plan's speed-up over FP32 at its slowest batch size against its agreement with FP32 (search
    split), the frontier (no other plan both faster and more faithful) joined, the written plan starred."""
    sc = report.speed_choice
    if sc is None or len(sc.candidates) < 2:
        return None
    by_id = {c.id: c for c in report.candidates}
    points = [(s.slowest.speedup, agreement, i, s) for i, s in zip(sc.candidates, sc.speeds)
              if i in by_id and (agreement := by_id[i].agreement_search) is not None]
    if len(points) < 2:
        return None
    fig = _figure(8.5, 4.6)
    ax = fig.add_subplot()
    frontier = sorted((p for p in points if not any(q[0] > p[0] and q[1] > p[1] for q in points)),
                      key=lambda p: p[0])
    ax.plot([p[0] for p in frontier], [p[1] for p in frontier], color="#1f77b4", linewidth=1.2,
            label="frontier (nothing both faster and more faithful)", zorder=2)
    for x, y, i, s in points:
        ax.errorbar([x], [y], xerr=[[x - s.slowest.speedup_low], [s.slowest.speedup_high - x]], fmt="o",
                    color="#2ca02c", ecolor="#999999", capsize=3, zorder=3)
        ax.annotate(f"{i} ({100 * by_id[i].int8_flops_fraction:.0f} % INT8)", (x, y), textcoords="offset points",
                    xytext=(5, 4), fontsize=7)
    chosen = next(p for p in points if p[2] == sc.chosen) if any(p[2] == sc.chosen for p in points) else None
    if chosen is not None:
        ax.scatter([chosen[0]], [chosen[1]], marker="*", s=260, color="#f1c40f", edgecolors="black",
                   linewidths=0.8, label="written plan", zorder=4)
    ax.axvline(1.0, color="#333333", linewidth=1, label="FP32's speed")
    ax.set_xlabel("speed-up over FP32 at the slowest batch size (bars: lowest and highest round)")
    ax.set_ylabel("agreement with FP32 (search split)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return Plot(
        name="speed",
        title="Speed against agreement of the confirmed plans",
        caption="Every plan the holdout confirmed, served as ONNX Runtime serves it and timed beside FP32; the "
        "line joins the plans no other plan beats on both speed and agreement; the star is the plan written "
        "(the fastest, and within 3 % the most faithful).",
        alt=f"Scatter of {len(points)} confirmed plans by speed-up and agreement.",
        png=_png(fig),
    )
