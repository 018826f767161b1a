"""Units of compare checked against brute-force numpy / sklearn: accumulators, masks, metrics, flags, Q/DQ
range reading (int8 zp 0, uint8 zp 128, asymmetric uint8, ModelOpt-style Cast before Q)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.metrics import confusion_matrix, f1_score

from calibkit.evaluate.layers import find_layers
from calibkit.evaluate.metrics import (
    classification_metrics,
    flips_by_confidence,
    latency_stats,
    output_agreement,
    output_error,
    top2_gap,
)
from calibkit.evaluate.streaming import ErrorAccumulator, RangeAccumulator, valid_mask
from calibkit.results.flags import Flag, Thresholds, flag_layer

RNG = np.random.default_rng(3)


def test_range_accumulator_streams_like_one_array() -> None:
    parts = [RNG.standard_normal((4, 7, 5)) * s for s in (0.1, 1.0, 30.0, 2.0)]  # the range grows mid-stream
    parts[1][0, 0, 0] = np.nan
    parts[2][1, 1, 1] = np.inf
    acc = RangeAccumulator("t", clip_ranges=[(-2.0, 2.0), (-1.0, 3.0)])
    for p in parts:
        acc.update(p.astype(np.float32))
    v = np.concatenate([p.reshape(-1) for p in parts]).astype(np.float32).astype(np.float64)
    v = v[np.isfinite(v)]
    assert acc.count == v.size and acc.nonfinite == 2
    assert acc.min == pytest.approx(v.min()) and acc.max == pytest.approx(v.max())
    assert acc.clipped_fraction(0) == pytest.approx(np.mean(np.abs(v) > 2.0))
    assert acc.clipped_fraction(1) == pytest.approx(np.mean((v < -1.0) | (v > 3.0)))
    width = acc.stats.histogram.width
    srt = np.sort(np.abs(v))
    for p in (50.0, 99.0, 99.99):
        k = math.ceil(p / 100 * srt.size)
        assert srt[max(0, k - 2)] - width <= acc.percentile(p) <= srt[min(srt.size - 1, k)] + width
    coarse = acc.coarse_stats(2048)
    assert coarse.histogram.num_bins == 2048 and coarse.histogram.total == v.size


def test_error_accumulator_sqnr_cosine() -> None:
    xs = [RNG.standard_normal((3, 6, 4)) for _ in range(3)]
    ys = [x + RNG.standard_normal(x.shape) * 0.05 for x in xs]
    masks = [RNG.random((3, 6)) > 0.3 for _ in xs]
    err = ErrorAccumulator()
    for x, y, m in zip(xs, ys, masks):
        err.update(x, y, valid_mask(x.shape, m.astype(np.int64)))
    a = np.concatenate([x[m].reshape(-1) for x, m in zip(xs, masks)])
    b = np.concatenate([y[m].reshape(-1) for y, m in zip(ys, masks)])
    assert err.count == a.size
    assert err.sqnr_db == pytest.approx(10 * math.log10((a @ a) / ((a - b) @ (a - b))))
    assert err.cosine == pytest.approx((a @ b) / math.sqrt((a @ a) * (b @ b)))
    same = ErrorAccumulator()
    same.update(xs[0], xs[0])
    assert same.sqnr_db == 200.0 and same.cosine == pytest.approx(1.0)


def test_valid_mask_layouts() -> None:
    m = np.array([[1, 1, 0], [1, 0, 0]])
    assert valid_mask((2, 3, 8), m).shape == (2, 3, 1)
    att = valid_mask((2, 4, 3, 3), m)
    full = np.broadcast_to(att, (2, 4, 3, 3))
    assert full[0, 0].sum() == 4 and full[1, 2].sum() == 1  # query and key both masked
    assert valid_mask((6, 8), m).reshape(-1).tolist() == [True, True, False, True, False, False]
    assert valid_mask((2, 3), m) is None  # [B, H] with H == S by coincidence: left alone
    assert valid_mask((2, 3, 8), np.ones((2, 3))) is None


def test_classification_metrics_against_sklearn() -> None:
    y = RNG.integers(0, 3, 200)
    p = np.where(RNG.random(200) < 0.7, y, RNG.integers(0, 3, 200))
    m = classification_metrics(y, p, ["a", "b", "c"])
    assert m.accuracy == pytest.approx(np.mean(y == p))
    assert m.macro_f1 == pytest.approx(f1_score(y, p, average="macro"))
    assert np.array_equal(np.array(m.confusion_matrix), confusion_matrix(y, p))


def test_output_agreement_and_error() -> None:
    a = RNG.standard_normal((50, 3))
    b = a + RNG.standard_normal((50, 3)) * 0.3
    ag = output_agreement(a, b)
    cos = np.array([x @ z / np.linalg.norm(x) / np.linalg.norm(z) for x, z in zip(a, b)])
    assert ag.agreement == pytest.approx(np.mean(a.argmax(1) == b.argmax(1)))
    assert ag.cosine_mean == pytest.approx(cos.mean()) and ag.cosine_min == pytest.approx(cos.min())
    assert ag.max_abs_error == pytest.approx(np.abs(a - b).max())
    pa = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    pb = np.exp(b) / np.exp(b).sum(1, keepdims=True)
    oe = output_error(a, b)
    assert oe.mean_kl == pytest.approx(np.mean((pa * np.log(pa / pb)).sum(1)))
    assert oe.logit_mse == pytest.approx(np.mean((a - b) ** 2))


def test_flips_by_confidence_counts_each_text_once_by_a_top2_gap() -> None:
    a = RNG.standard_normal((400, 3)) * 2
    b = a + RNG.standard_normal((400, 3)) * 0.5
    p = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    srt = np.sort(p, axis=1)
    gap = srt[:, -1] - srt[:, -2]
    assert np.allclose(top2_gap(a), gap)
    bands = flips_by_confidence(a, b)
    assert [(x.low, x.high) for x in bands] == [(0.0, 0.1), (0.1, 0.5), (0.5, 1.0)]
    assert sum(x.texts for x in bands) == 400
    flipped = a.argmax(1) != b.argmax(1)
    assert sum(x.flips for x in bands) == flipped.sum()
    assert bands[0].flips == (flipped & (gap < 0.1)).sum() and bands[0].texts == (gap < 0.1).sum()
    assert bands[2].flips == (flipped & (gap >= 0.5)).sum()
    # the near ties flip far more often than the confident texts under the same noise
    assert bands[0].flips / bands[0].texts > 3 * bands[2].flips / bands[2].texts
    # one class: always "confident", never a flip
    assert [x.texts for x in flips_by_confidence(a[:, :1], b[:, :1])] == [0, 0, 400]


def test_latency_stats() -> None:
    s = [0.010, 0.020, 0.030, 0.100]
    lat = latency_stats(s, 128, 32)
    assert lat.mean_ms == pytest.approx(40.0) and lat.p50_ms == pytest.approx(25.0)
    assert lat.p95_ms == pytest.approx(np.percentile(np.array(s) * 1000, 95))
    assert lat.throughput_per_s == pytest.approx(128 / 0.16)


def test_flags() -> None:
    t = Thresholds()
    ok = flag_layer(t, sqnr_db=35.0, clipped_fraction=1e-5, outlier_ratio=2.0, nonfinite=0, fp_absmax=10.0)
    assert ok.flag is Flag.OK and ok.reasons == ()
    bad = flag_layer(t, sqnr_db=12.0, clipped_fraction=1e-2, outlier_ratio=50.0, nonfinite=0, fp_absmax=10.0,
                     only_this_delta=-0.02, all_but_this_delta=0.01)
    assert bad.flag is Flag.KEEP_FP16 and len(bad.reasons) == 5
    assert flag_layer(t, sqnr_db=None, clipped_fraction=None, outlier_ratio=None, nonfinite=3,
                      fp_absmax=None).flag is Flag.KEEP_FP32
    assert flag_layer(t, sqnr_db=30.0, clipped_fraction=0.0, outlier_ratio=1.0, nonfinite=0,
                      fp_absmax=1e5).flag is Flag.KEEP_FP32
    loose = Thresholds(min_sqnr_db=10.0, max_clipped_fraction=0.1, max_outlier_ratio=100.0, min_recovery_points=5,
                       max_cost_points=5)
    assert flag_layer(loose, sqnr_db=12.0, clipped_fraction=1e-2, outlier_ratio=50.0, nonfinite=0, fp_absmax=10.0,
                      only_this_delta=-0.02, all_but_this_delta=0.01).flag is Flag.OK


def _qdq_model(zp_type: int, zp: int, scale: float, cast: bool = False) -> onnx.ModelProto:
    w = numpy_helper.from_array(RNG.integers(-127, 127, (4, 4)).astype(np.int8), "Wq")
    inits = [
        w,
        numpy_helper.from_array(np.full(4, 0.01, np.float32), "Ws"),
        numpy_helper.from_array(np.array(scale, np.float32), "xs"),
        helper.make_tensor("xz", zp_type, [], [zp]),
    ]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    src = "r"
    if cast:  # ModelOpt style: the FP32 tensor is cast to FP16 before Q (here to float again: shape only)
        nodes.append(helper.make_node("Cast", ["r"], ["r_cast"], name="cast", to=TensorProto.FLOAT))
        src = "r_cast"
    nodes += [
        helper.make_node("QuantizeLinear", [src, "xs", "xz"], ["rq"], name="q"),
        helper.make_node("DequantizeLinear", ["rq", "xs", "xz"], ["rdq"], name="dq"),
        helper.make_node("DequantizeLinear", ["Wq", "Ws"], ["Wdq"], name="wdq", axis=1),
        helper.make_node("MatMul", ["rdq", "Wdq"], ["y"], name="mm"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "zp_type, zp, low_q, high_q",
    [(TensorProto.INT8, 0, -127, 127), (TensorProto.UINT8, 128, -127, 127), (TensorProto.UINT8, 0, 0, 255),
     (TensorProto.UINT8, 10, -10, 245)],
)
def test_find_layers_reads_clip_range(zp_type: int, zp: int, low_q: int, high_q: int) -> None:
    (spec,) = find_layers(_qdq_model(zp_type, zp, 0.05))
    assert (spec.node, spec.op_type, spec.tensor, spec.output) == ("mm", "MatMul", "r", "y")
    assert spec.clip_low == pytest.approx(low_q * 0.05) and spec.clip_high == pytest.approx(high_q * 0.05)
    assert spec.amax == pytest.approx(max(abs(low_q), abs(high_q)) * 0.05)


def test_find_layers_walks_back_through_cast() -> None:
    (spec,) = find_layers(_qdq_model(TensorProto.INT8, 0, 0.1, cast=True))
    assert spec.tensor == "r" and spec.amax == pytest.approx(12.7)


def test_measured_sensitivity_demotes_a_heuristic_flag_to_watch() -> None:
    from calibkit.results.flags import Flag, Thresholds, flag_layer

    t = Thresholds()
    common = dict(sqnr_db=30.0, clipped_fraction=0.0, outlier_ratio=2.0, nonfinite=0, fp_absmax=10.0,
                  quant_sqnr_db=12.0)
    assert flag_layer(t, **common).flag is Flag.KEEP_FP16  # heuristic only: flagged
    harmless = flag_layer(t, **common, only_this_delta=-0.001, all_but_this_delta=0.002)
    assert harmless.flag is Flag.WATCH and any("but measured" in r for r in harmless.reasons)
    harmful = flag_layer(t, **common, only_this_delta=-0.02, all_but_this_delta=0.002)
    assert harmful.flag is Flag.KEEP_FP16
    nonfinite = flag_layer(t, **{**common, "nonfinite": 3}, only_this_delta=0.0, all_but_this_delta=0.0)
    assert nonfinite.flag is Flag.KEEP_FP32
