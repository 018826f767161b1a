"""Activation smoothing (SmoothQuant, Xiao et al. 2023): move per-channel activation outliers into the weights.

For an activation X [..., K] read by MatMul/Gemm nodes with constant weights W [K, N],
X·W = (X·diag(1/s))·(diag(s)·W). The smoothed model computes the same function in FP32 (up to float rounding),
but the tensor that gets a per-tensor INT8 range is X/s, whose outlier channels are scaled down, while the
per-output-channel weight scales absorb s. On transformers the GELU outputs feeding each FFN's second Linear and
the LayerNorm outputs carry a few channels 5-30x larger than the rest: a per-tensor range sized for them leaves
the bulk a handful of INT8 levels.

The graph change: one ``Mul(X, 1/s)`` node per smoothed activation, read by its weight MatMuls only (other
consumers, such as a residual Add, keep reading X); the weights are replaced by ``diag(s)·W``. One
elementwise op per activation is the runtime cost (TensorRT can fuse a pointwise op into the QuantizeLinear
after it; not verified here, where TensorRT is absent).

``s_k = max|X_k|^a / max|W_k|^(1-a)`` per input channel k (a = alpha; the maximum over every weight reading X).
With ``alpha=None`` each activation takes the alpha of :data:`ALPHA_GRID` (or no smoothing at all) whose
fake-quantized product ``Q(X/s)·Q(diag(s)·W)`` is closest to the FP32 product ``X·W`` on sampled calibration
rows: a per-layer choice measured on the user's data, not a constant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibkit.names import node_label
from calibkit.quantize.weights import fake_quantize_weight
from calibkit.types import INT8_MAX

ALPHA_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_SCALE_RANGE = (1e-4, 1e4)  # s is clipped to it: a dead channel must not divide by zero
SMOOTH_SUFFIX = "_smoothed"
_NO_ROWS = np.zeros((0, 0), np.float32)  # a tensor without recorded rows: nothing to measure the error on
METADATA_KEY = "calibkit.smoothing"


@dataclass(frozen=True)
class SmoothGroup:
    """An activation and the weight nodes that read it. ``axes``: the K (input-channel) axis of each weight."""

    tensor: str
    nodes: tuple[str, ...]
    weights: tuple[str, ...]
    axes: tuple[int, ...]


@dataclass(frozen=True)
class GroupChoice:
    tensor: str
    alpha: float | None  # None: left as it is (smoothing would not reduce the error)
    scale: np.ndarray | None  # s, float32 [K]
    error_before: float  # relative squared error of the fake-quantized product, unsmoothed
    error_after: float

    @property
    def gain_db(self) -> float:
        if self.error_after <= 0 or self.error_before <= 0:
            return 0.0
        return float(10.0 * np.log10(self.error_before / self.error_after))


def find_groups(model: onnx.ModelProto) -> list[SmoothGroup]:
    """Activations read by MatMul/Gemm nodes whose weight is a 2-D float32 initializer read by that node alone
    (a shared weight cannot absorb two different scales). Only those nodes are rewired; a group needs one."""
    inits = {i.name: i for i in model.graph.initializer}
    uses: dict[str, int] = {}
    for n in model.graph.node:
        for x in n.input:
            uses[x] = uses.get(x, 0) + 1
    found: dict[str, list[tuple[str, str, int]]] = {}
    for i, n in enumerate(model.graph.node):
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        x, w = n.input[0], n.input[1]
        if not x or x in inits or w not in inits or uses.get(w, 0) != 1:
            continue
        t = inits[w]
        if t.data_type != TensorProto.FLOAT or len(t.dims) != 2:
            continue
        axis = 0
        if n.op_type == "Gemm":
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if attrs.get("transA", 0):
                continue
            axis = 1 if attrs.get("transB", 0) else 0
        found.setdefault(x, []).append((node_label(n, i), w, axis))
    return [SmoothGroup(x, tuple(a for a, _, _ in v), tuple(b for _, b, _ in v), tuple(c for _, _, c in v))
            for x, v in found.items()]


def _as_kn(w: np.ndarray, axis: int) -> np.ndarray:
    return w if axis == 0 else w.T


def smoothing_scale(act_absmax: np.ndarray, weights_kn: Sequence[np.ndarray], alpha: float) -> np.ndarray:
    a = np.asarray(act_absmax, dtype=np.float64)
    a = np.maximum(a, max(float(a.max(initial=0.0)), 1e-12) * 1e-6)
    wmax = np.max([np.abs(w).max(axis=1) for w in weights_kn], axis=0).astype(np.float64)
    wmax = np.maximum(wmax, max(float(wmax.max(initial=0.0)), 1e-12) * 1e-6)
    s = a**alpha / wmax ** (1.0 - alpha)
    s = s / np.exp(np.mean(np.log(s)))  # centred on 1 in log space: the product does not care, float32 does
    return np.clip(s, *_SCALE_RANGE).astype(np.float32)


def product_error(rows: np.ndarray, weights_kn: Sequence[np.ndarray], scale: np.ndarray | None,
                  act_absmax: np.ndarray) -> float:
    """Relative squared error of the INT8 product (per-tensor activation range max|X/s|, per-output-channel
    weights), summed over the weights, against the FP32 product, on ``rows`` [n, K]."""
    x = rows.astype(np.float32, copy=False)
    s = np.ones(x.shape[1], np.float32) if scale is None else scale
    xs = x / s
    amax = float(np.max(act_absmax / s))
    step = amax / INT8_MAX if amax > 0 else 1.0
    xq = np.clip(np.rint(xs / step), -INT8_MAX, INT8_MAX) * step
    num = den = 0.0
    for w in weights_kn:
        y = x @ w
        yq = xq @ fake_quantize_weight(w * s[:, None], axis=1)
        num += float(np.sum((yq - y) ** 2, dtype=np.float64))
        den += float(np.sum(y**2, dtype=np.float64))
    return num / den if den > 0 else 0.0


def choose_scales(
    groups: Sequence[SmoothGroup],
    weights: Mapping[str, np.ndarray],
    absmax: Mapping[str, np.ndarray],
    rows: Mapping[str, np.ndarray],
    alpha: float | None = None,
) -> list[GroupChoice]:
    """The scale of every group: ``alpha`` for all, or (None) the best of :data:`ALPHA_GRID` per group, or none
    where no alpha lowers the error measured on ``rows``. A fixed alpha is applied even where it does not help
    (the user asked for it); its errors are still reported."""
    out = []
    for g in groups:
        if g.tensor not in absmax:
            continue
        wk = [_as_kn(weights[w], a) for w, a in zip(g.weights, g.axes)]
        a_max = np.asarray(absmax[g.tensor], dtype=np.float32)
        if a_max.shape != (wk[0].shape[0],) or not np.isfinite(a_max).all() or float(a_max.max(initial=0)) <= 0:
            continue
        sample = rows.get(g.tensor, _NO_ROWS)
        have_rows = len(sample) > 0
        before = product_error(sample, wk, None, a_max) if have_rows else float("nan")
        if alpha is not None:
            s = smoothing_scale(a_max, wk, alpha)
            after = product_error(sample, wk, s, a_max) if have_rows else float("nan")
            out.append(GroupChoice(g.tensor, float(alpha), s, before, after))
            continue
        if not have_rows:
            continue
        best: tuple[float, float | None, np.ndarray | None] = (before, None, None)
        for a in ALPHA_GRID:
            s = smoothing_scale(a_max, wk, a)
            e = product_error(sample, wk, s, a_max)
            if e < best[0]:
                best = (e, a, s)
        out.append(GroupChoice(g.tensor, best[1], best[2], before, best[0]))
    return out


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def apply_smoothing(model: onnx.ModelProto, groups: Sequence[SmoothGroup], choices: Sequence[GroupChoice],
                    metadata: str | None = None, *, in_place: bool = False) -> onnx.ModelProto:
    """A smoothed copy of ``model`` (the input is not modified unless ``in_place``: no second copy of the
    weights for a caller that owns the model): see the module docstring."""
    if in_place:
        out = model
    else:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    by_tensor = {g.tensor: g for g in groups}
    inits = {i.name: i for i in out.graph.initializer}
    taken = {o for n in out.graph.node for o in n.output} | set(inits) | {i.name for i in out.graph.input}
    taken |= {n.name for n in out.graph.node}
    node_pos = {node_label(n, i): i for i, n in enumerate(out.graph.node)}
    before_node: dict[int, list[onnx.NodeProto]] = {}
    for c in choices:
        if c.scale is None:
            continue
        g = by_tensor[c.tensor]
        smoothed = _unique(c.tensor + SMOOTH_SUFFIX, taken)
        inv = _unique(smoothed + "_inv_scale", taken)
        out.graph.initializer.append(numpy_helper.from_array((1.0 / c.scale).astype(np.float32), inv))
        mul = helper.make_node("Mul", [c.tensor, inv], [smoothed], name=_unique(smoothed + "_Mul", taken))
        first = None
        for name, w, axis in zip(g.nodes, g.weights, g.axes):
            pos = node_pos[name]
            out.graph.node[pos].input[0] = smoothed
            arr = numpy_helper.to_array(inits[w]).astype(np.float32)
            s = c.scale[:, None] if axis == 0 else c.scale[None, :]
            inits[w].CopyFrom(numpy_helper.from_array((arr * s).astype(np.float32), w))
            first = pos if first is None else min(first, pos)
        assert first is not None
        before_node.setdefault(first, []).append(mul)
    nodes = list(out.graph.node)
    ordered: list[onnx.NodeProto] = []
    for i, n in enumerate(nodes):
        ordered.extend(before_node.get(i, ()))  # right before the first reader: the order stays topological
        ordered.append(n)
    del out.graph.node[:]
    out.graph.node.extend(ordered)
    if metadata is not None:
        kept = [p for p in out.metadata_props if p.key != METADATA_KEY]
        del out.metadata_props[:]
        out.metadata_props.extend(kept)
        out.metadata_props.append(onnx.StringStringEntryProto(key=METADATA_KEY, value=metadata))
    return out


def smoothed_from(model: onnx.ModelProto | Mapping[str, str]) -> str | None:
    """The SHA-256 of the model a calibkit-smoothed model was made from (None for any other model), from the
    model or its ``metadata_props`` (:func:`calibkit.graph.metadata_props` reads them without the graph)."""
    import json

    props = {p.key: p.value for p in model.metadata_props} if isinstance(model, onnx.ModelProto) else model
    value = props.get(METADATA_KEY)
    if value is None:
        return None
    try:
        sha = json.loads(value).get("source_sha256")
    except (ValueError, AttributeError):
        return None
    return str(sha) if sha else None
