"""Calibration methods: pure functions from statistics to an amax (the symmetric INT8 clipping range).

- ``minmax``: amax = max |x| (exact, from the running min/max, not the histogram).
- ``percentile``: the p-th percentile of |x| from the histogram, interpolated inside its bin.
- ``entropy``: TensorRT's EntropyCalibration2 KL search as pytorch-quantization / ModelOpt implement it
  (``_compute_amax_entropy``, start_bin=128, stride=1), vectorised. Choices where published descriptions differ:
  * candidates i = start_bin .. n (every bin, stride 1), where n is the number of *occupied* bins of the
    power-of-two histogram (1024..2048 of 2048; the slides' 2048 over [0, max] is the upper bound);
  * the first bin's count is replaced by the second's (ModelOpt: ``bins[0] = bins[1]``; the zero-heavy first
    bin would otherwise dominate P);
  * P = bins[:i] with the outliers sum(bins[i:]) folded into bin i-1; Q = bins[:i] (without the outliers, as
    ModelOpt and MXNet do) merged into 128 groups by floor(128 k / i), each group's count spread over its
    non-empty bins, empty bins staying zero; KL(P||Q) of the normalised distributions (inf when P has mass
    where Q has none);
  * the *last* minimum wins ties; amax = the upper edge of bin i-1 (= i * bin width), not the bin centre
    (the MLPerf description uses the centre of the best bin).
- ``mse``: ModelOpt's ``_compute_amax_mse``: every bin centre c_i (i >= start_bin) is a candidate amax; the
  histogram's bin centres are fake-quantized (round-half-even, clip to +-127) with scale amax/127 and the
  count-weighted squared error, clipping included, is minimised. For the onnxruntime layout (``fitted``) the
  error is that of the grid the layout runs instead: [-amax, amax] clipped to the observed extremes in 255 steps
  (:meth:`calibkit.types.TensorRange.uint8_grid`). A one-sided tensor (a GELU output) then has steps half as
  wide at the same amax, so rounding costs a quarter as much against clipping, and the search keeps more of
  its largest values; a tensor reaching past amax on both sides gets the symmetric answer unchanged.

The per-tensor searches are independent and spend their time in numpy calls on arrays of 256 x 2048 (which
release the GIL), so :func:`compute_table` runs them on ``threads`` threads (default: the CPUs). Each tensor's
arithmetic is unchanged, so the ranges are the same bit for bit whatever the thread count.

An all-zero (or never finite) tensor gets amax 0.0; the cache writes its scale as ``0`` as TensorRT does, and
the Q/DQ step decides how to represent it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from calibkit.calibrate.stats import ActivationStats
from calibkit.errors import CalibrationError
from calibkit.types import INT8_MAX, UINT8_STEPS, CalibrationTable, Method, MethodParams, TensorRange


def compute_amax(stats: ActivationStats, method: Method, params: MethodParams = MethodParams(), *,
                 fitted: bool = False) -> float:
    """The amax ``method`` chooses for one tensor; ``fitted``: searched for the onnxruntime layout's fitted uint8
    grid (``mse`` only; the other methods follow TensorRT's definitions whatever the grid)."""
    method = Method(method)
    if stats.count == 0 or stats.absmax == 0.0:
        return 0.0
    if method is Method.MINMAX:
        return float(stats.absmax)
    hist = stats.histogram
    if method is Method.PERCENTILE:
        return min(hist.percentile(params.percentile), float(stats.absmax))
    counts = hist.occupied()
    if method is Method.ENTROPY:
        i = entropy_bin(counts, num_quant_bins=params.num_quant_bins, start_bin=params.start_bin)
        return min(i * hist.width, float(stats.absmax))
    if method is Method.MSE:
        extremes = (float(stats.min), float(stats.max)) if fitted else None
        return min(mse_amax(counts, hist.width, start_bin=params.start_bin, extremes=extremes),
                   float(stats.absmax))
    raise CalibrationError(f"unknown calibration method {method!r}")


@dataclass(frozen=True)
class ActivationHistogram:
    """One tensor's |x| histogram as calibration saw it, with the amax every method picks on it (what
    ``ck.histogram`` returns, e.g. to plot the thresholds over the counts).

    ``centres``/``counts``: the occupied bins (up to the last non-empty one); ``width``: the bin width;
    ``amax``: each method's amax; ``count``: finite values seen, ``absmax`` the largest |x| among them,
    ``non_finite`` the NaN and inf values (left out of every range)."""

    tensor: str
    centres: np.ndarray
    counts: np.ndarray
    width: float
    amax: Mapping[Method, float]
    count: int
    absmax: float
    non_finite: int


def tensor_histogram(stats: ActivationStats, params: MethodParams = MethodParams()) -> ActivationHistogram:
    """:class:`ActivationHistogram` of one tensor's statistics, every method's amax computed with ``params``."""
    hist = stats.histogram
    counts = hist.occupied()
    return ActivationHistogram(
        tensor=stats.tensor, centres=(np.arange(len(counts)) + 0.5) * hist.width, counts=counts, width=hist.width,
        amax={m: compute_amax(stats, m, params) for m in Method}, count=stats.count, absmax=float(stats.absmax),
        non_finite=stats.non_finite,
    )


def compute_table(
    store: Mapping[str, ActivationStats],
    method: Method | Mapping[str, Method],
    params: MethodParams = MethodParams(),
    model_sha256: str = "",
    calibration_set_id: str = "",
    *,
    tensors: Sequence[str] | None = None,
    provenance: Mapping[str, str] | None = None,
    threads: int | None = None,
    fitted: bool = False,
) -> CalibrationTable:
    """A CalibrationTable for ``tensors`` (default: all in ``store``).

    ``method`` may be one method or a mapping tensor -> method (for per-tensor tuning); tensors missing from
    the mapping use its ``"*"`` entry or entropy. ``threads``: how many searches run at once (default: the CPUs).
    ``fitted``: ranges for the onnxruntime layout's fitted uint8 grid (see :func:`compute_amax`).
    """
    names = list(tensors) if tensors is not None else list(store)
    if isinstance(method, Mapping):
        per = {str(k): Method(v) for k, v in method.items()}
        default = per.get("*", Method.ENTROPY)
        table_method = default
    else:
        per = {}
        default = table_method = Method(method)
    chosen = [per.get(t, default) for t in names]
    workers = min(len(names), _threads(threads))
    jobs = [(store[t], m) for t, m in zip(names, chosen, strict=True)]
    if workers > 1 and any(m in (Method.MSE, Method.ENTROPY) for m in chosen):
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="calibkit-method") as pool:
            amaxes = list(pool.map(lambda job: compute_amax(job[0], job[1], params, fitted=fitted), jobs))
    else:
        amaxes = [compute_amax(st, m, params, fitted=fitted) for st, m in jobs]
    ranges = [TensorRange(tensor=t, amax=a, method=m, observed_min=float(store[t].min),
                          observed_max=float(store[t].max))
              for t, a, m in zip(names, amaxes, chosen, strict=True)]
    return CalibrationTable(
        model_sha256=model_sha256,
        calibration_set_id=calibration_set_id,
        method=table_method,
        params=params,
        ranges=tuple(ranges),
        provenance=dict(provenance or {}),
    )


def _threads(threads: int | None) -> int:
    if threads is not None:
        return max(1, int(threads))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def entropy_bin(counts: np.ndarray, *, num_quant_bins: int = 128, start_bin: int = 128) -> int:
    """The candidate i (number of kept bins) minimising KL(P||Q); amax = i * bin width."""
    h = np.asarray(counts, dtype=np.float64).copy()
    n = len(h)
    if n == 0:
        return 0
    if n > 1:
        h[0] = h[1]
    start = min(max(start_bin, num_quant_bins), n)
    if n <= start:
        return n
    kl = entropy_divergences(h, num_quant_bins=num_quant_bins, start_bin=start)
    cands = np.arange(start, n + 1)
    finite = np.isfinite(kl)
    if not finite.any():
        return n
    best = np.where(finite, kl, np.inf)
    last_argmin = len(best) - 1 - int(np.argmin(best[::-1]))
    return int(cands[last_argmin])


def entropy_divergences(h: np.ndarray, *, num_quant_bins: int, start_bin: int) -> np.ndarray:
    """KL(P_i || Q_i) for every candidate i in start_bin..len(h), all at once (see the module docstring).

    With T the total, R_i = sum(h[i:]), S_j / z_j the count / non-empty bins of group j:
    KL = [sum P log P - sum_j S_j log(S_j/z_j) - R_i log(q_{i-1})] / T - log T + log(T - R_i).
    """
    n = len(h)
    total = h.sum()
    cands = np.arange(start_bin, n + 1)
    csum = np.concatenate([[0.0], np.cumsum(h)])
    nonzero = h > 0
    cnz = np.concatenate([[0], np.cumsum(nonzero)])
    with np.errstate(divide="ignore", invalid="ignore"):
        hlogh = np.where(nonzero, h * np.log(np.where(nonzero, h, 1.0)), 0.0)
    clogh = np.concatenate([[0.0], np.cumsum(hlogh)])

    j = np.arange(num_quant_bins + 1)
    # group j holds bins k with floor(nq*k/i) == j, i.e. k in [ceil(j*i/nq), ceil((j+1)*i/nq))
    bounds = -((-j[None, :] * cands[:, None]) // num_quant_bins)  # [cands, nq+1]
    s = csum[bounds[:, 1:]] - csum[bounds[:, :-1]]
    z = cnz[bounds[:, 1:]] - cnz[bounds[:, :-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        slogq = np.where(z > 0, s * np.log(np.where(s > 0, s, 1.0) / np.maximum(z, 1)), 0.0).sum(axis=1)

    rest = total - csum[cands]  # R_i
    last = h[cands - 1]
    p_last = last + rest
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = clogh[cands - 1] + np.where(p_last > 0, p_last * np.log(np.where(p_last > 0, p_last, 1.0)), 0.0)
        g_last = np.minimum(((cands - 1) * num_quant_bins) // cands, num_quant_bins - 1)
        s_last = s[np.arange(len(cands)), g_last]
        z_last = z[np.arange(len(cands)), g_last]
        q_last = np.where(last > 0, s_last / np.maximum(z_last, 1), 0.0)
        rlogq = np.where(rest > 0, rest * np.log(np.where(q_last > 0, q_last, 1.0)), 0.0)
        kept = total - rest
        kl = (plogp - slogq - rlogq) / total - np.log(total) + np.log(np.where(kept > 0, kept, 1.0))
    invalid = ((last == 0) & (rest > 0)) | (kept <= 0)
    return np.where(invalid, np.inf, np.maximum(kl, 0.0))


def fake_quant(x: np.ndarray, amax: float) -> np.ndarray:
    """Symmetric INT8 quantize-dequantize with scale amax/127 (round half to even, clip to +-127)."""
    if amax <= 0:
        return np.zeros_like(x)
    scale = amax / INT8_MAX
    return np.clip(np.round(x / scale), -INT8_MAX, INT8_MAX) * scale


def fitted_scales(amax: np.ndarray, observed_min: float, observed_max: float) -> np.ndarray:
    """The fitted uint8 grid's scale for each candidate amax, as :meth:`TensorRange.uint8_grid` computes it."""
    lo = np.maximum(min(observed_min, 0.0), -amax)
    hi = np.minimum(max(observed_max, 0.0), amax)
    symmetric = ((lo == -amax) & (hi == amax)) | ~(hi - lo > 0)
    return np.where(symmetric, amax / INT8_MAX, (hi - lo) / UINT8_STEPS)


def mse_amax(counts: np.ndarray, width: float, *, start_bin: int = 128, chunk: int = 256,
             extremes: tuple[float, float] | None = None) -> float:
    """The bin centre (i >= start_bin) that minimises the count-weighted squared fake-quantization error.

    ``extremes`` (observed min, max): the error of the fitted uint8 grid for each candidate instead of the
    symmetric int8 one. Its values are multiples of its scale (the zero point is an integer), so a |x| is
    rounded to that scale and clipped at amax, which is exact for the clipping (a value past amax on the
    negative side exists only where the grid reaches -amax) and, as for the symmetric grid, measured at bin
    centres for the rounding."""
    c = np.asarray(counts, dtype=np.float64)
    n = len(c)
    if n == 0:
        return 0.0
    centres = (np.arange(n) + 0.5) * width
    first = min(start_bin, n - 1)
    cand = centres[first:]
    used = c > 0
    xc, wc = centres[used], c[used]
    best_err, best = np.inf, float(cand[-1])
    for a in range(0, len(cand), chunk):
        amax = cand[a : a + chunk][:, None]
        if extremes is None:
            scale = amax / INT8_MAX
            q = np.clip(np.round(xc[None, :] / scale), -INT8_MAX, INT8_MAX) * scale
        else:
            scale = fitted_scales(amax, *extremes)
            q = np.minimum(np.round(xc[None, :] / scale) * scale, amax)
        err = ((q - xc[None, :]) ** 2 * wc[None, :]).sum(axis=1)
        k = int(np.argmin(err))
        if err[k] < best_err:
            best_err, best = float(err[k]), float(cand[a + k])
    return best
