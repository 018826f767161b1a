import numpy as np
import pytest

from calibkit.calibrate.histogram import Histogram, bin_counts, range_exponent
from calibkit.calibrate.stats import StatsAccumulator
from calibkit.errors import CalibrationError


def test_bin_counts_match_np_histogram():
    rng = np.random.default_rng(1)
    x = rng.normal(size=50_000).astype(np.float32) * 3
    upper = 2.0 ** range_exponent(float(np.abs(x).max()))
    ours = bin_counts(x, upper, 512, signed=True)
    ref, _ = np.histogram(np.abs(x), bins=512, range=(0, upper))
    assert ours.sum() == x.size
    np.testing.assert_array_equal(ours, ref)


def test_range_exponent_is_strict_power_of_two():
    assert range_exponent(1.0) == 1  # 1.0 < 2**1
    assert range_exponent(0.75) == 0
    assert range_exponent(3.9) == 2
    assert range_exponent(0.0) == -126


@pytest.mark.parametrize("n_parts", [2, 5])
def test_merge_of_parts_equals_histogram_of_whole(n_parts):
    rng = np.random.default_rng(2)
    # parts with very different ranges force re-binning by several doublings
    parts = [rng.laplace(scale=10.0 ** (i - 2), size=3000).astype(np.float32) for i in range(n_parts)]
    whole = Histogram.of(np.concatenate(parts), num_bins=256)
    merged = Histogram.of(parts[0], 256)
    for p in parts[1:]:
        merged = merged.merge(Histogram.of(p, 256))
    assert merged.upper == whole.upper
    np.testing.assert_array_equal(merged.counts, whole.counts)
    # other order, other grouping: still exact
    rev = Histogram.of(parts[-1], 256)
    for p in reversed(parts[:-1]):
        rev = Histogram.of(p, 256).merge(rev)
    np.testing.assert_array_equal(rev.counts, whole.counts)


def test_streaming_accumulator_equals_one_shot_histogram():
    rng = np.random.default_rng(3)
    batches = [rng.normal(scale=s, size=(4, 7, 5)).astype(np.float32) for s in (0.01, 1.0, 0.3, 40.0, 2.0)]
    acc = StatsAccumulator("t", 1024)
    for b in batches:
        acc.observe(b)
    st = acc.freeze()
    whole = np.concatenate([b.ravel() for b in batches])
    ref = Histogram.of(whole, 1024)
    np.testing.assert_array_equal(st.histogram.counts, ref.counts)
    assert st.count == whole.size
    assert st.min == whole.min() and st.max == whole.max()
    assert st.absmax == np.abs(whole).max()


def test_widen_is_pairwise_sum():
    h = Histogram(np.arange(8, dtype=np.int64), 1.0)
    w = h.widened(4.0)
    np.testing.assert_array_equal(w.counts, [0 + 1 + 2 + 3, 4 + 5 + 6 + 7, 0, 0, 0, 0, 0, 0])
    with pytest.raises(CalibrationError):
        h.widened(0.5)


def test_merge_rejects_different_bin_counts():
    with pytest.raises(CalibrationError, match="bins"):
        Histogram.empty(256).merge(Histogram.empty(512))


@pytest.mark.parametrize("p", [50.0, 99.0, 99.9, 99.99])
def test_percentile_within_one_bin_of_numpy(p):
    rng = np.random.default_rng(4)
    x = rng.normal(size=200_000).astype(np.float32)
    h = Histogram.of(x, 2048)
    ref = np.percentile(np.abs(x), p)
    assert abs(h.percentile(p) - ref) <= h.width


def test_percentile_bounds():
    h = Histogram.of(np.array([1.0, 2.0, 3.0], np.float32), 256)
    with pytest.raises(CalibrationError):
        h.percentile(0)
    assert h.percentile(100) <= h.upper
    assert Histogram.empty(256).percentile(99) == 0.0
