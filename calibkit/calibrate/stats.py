"""Per-tensor activation statistics: streaming accumulation, merging, and saving as ``.npz``.

Memory is bounded by tensors x bins: nothing about individual samples is kept.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit._io import atomic_open
from calibkit.calibrate.histogram import BinCounter, Histogram, chunks, range_exponent
from calibkit.errors import CalibrationError

if TYPE_CHECKING:  # pragma: no cover - types only
    from numpy.lib.npyio import NpzFile

STATS_FORMAT = "calibkit-stats/1"


@dataclass(frozen=True, eq=False)
class ActivationStats:
    """What calibration knows about one tensor. ``count`` counts finite values; non-finite ones are apart."""

    tensor: str
    count: int
    nan_count: int
    posinf_count: int
    neginf_count: int
    min: float  # over finite values (0.0 when none were seen)
    max: float
    histogram: Histogram

    @property
    def absmax(self) -> float:
        return max(abs(self.min), abs(self.max))

    @property
    def non_finite(self) -> int:
        return self.nan_count + self.posinf_count + self.neginf_count

    def merge(self, other: ActivationStats) -> ActivationStats:
        if other.tensor != self.tensor:
            raise CalibrationError(f"cannot merge statistics of {self.tensor!r} and {other.tensor!r}")
        if self.count == 0:
            mn, mx = other.min, other.max
        elif other.count == 0:
            mn, mx = self.min, self.max
        else:
            mn, mx = min(self.min, other.min), max(self.max, other.max)
        return ActivationStats(
            tensor=self.tensor,
            count=self.count + other.count,
            nan_count=self.nan_count + other.nan_count,
            posinf_count=self.posinf_count + other.posinf_count,
            neginf_count=self.neginf_count + other.neginf_count,
            min=mn,
            max=mx,
            histogram=self.histogram.merge(other.histogram),
        )

    def summary(self) -> dict[str, Any]:
        """The per-tensor numbers calibration.json records."""
        return {
            "count": self.count,
            "nan": self.nan_count,
            "posinf": self.posinf_count,
            "neginf": self.neginf_count,
            "min": self.min,
            "max": self.max,
            "absmax": self.absmax,
            "p99_99": self.histogram.percentile(99.99) if self.count else 0.0,
        }


class StatsAccumulator:
    """Mutable running statistics of one tensor; ``observe`` a batch at a time, ``freeze`` at the end.

    ``observe`` reads its input in 256K-element chunks of views (strided views are fine: no copy of the input
    is made unless it holds non-finite values, and then only of one chunk). Chunking changes nothing in the
    result: min/max and counts are exact, and the histogram's power-of-two range widens exactly."""

    def __init__(self, tensor: str, num_bins: int, *, kernel: str = "bincount") -> None:
        self.tensor = tensor
        self.num_bins = num_bins
        self.count = 0
        self.nan = 0
        self.posinf = 0
        self.neginf = 0
        self.min = math.inf
        self.max = -math.inf
        self.exponent: int | None = None
        self.counts = np.zeros(num_bins, dtype=np.int64)
        self._counter = BinCounter(num_bins, kernel=kernel)

    def observe(self, values: np.ndarray) -> None:
        x = np.asarray(values)
        if x.dtype != np.float32 and x.dtype != np.float16:
            x = x.astype(np.float32)
        for part in chunks(x):
            self._observe_chunk(part)

    def _observe_chunk(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN propagates through min/max, inf shows
            flat = np.ravel(x)
            finite = np.isfinite(flat)
            bad = flat[~finite]
            nan = int(np.isnan(bad).sum())
            pos = int((bad == np.inf).sum())
            self.nan += nan
            self.posinf += pos
            self.neginf += bad.size - nan - pos
            x = flat[finite]
            if x.size == 0:
                return
            lo, hi = float(x.min()), float(x.max())
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        self.count += x.size
        exp = range_exponent(max(-lo, hi))
        if self.exponent is None:
            self.exponent = exp
        elif exp > self.exponent:
            self.counts = Histogram(self.counts, 2.0**self.exponent).widened(2.0**exp).counts
            self.exponent = exp
        self._counter.add(self.counts, x, 2.0**self.exponent, below_upper=True)  # range_exponent is strict

    def forget(self, value: float, n: int) -> None:
        """Take back ``n`` observations of the finite ``value`` (observed copies of a real entry that stood in
        for padding; min/max are unaffected because ``value`` itself is real)."""
        if n <= 0:
            return
        if self.exponent is None or n > self.count:
            raise CalibrationError(f"{self.tensor}: cannot forget {n} values of {self.count}")
        one = np.zeros(self.num_bins, dtype=np.int64)
        self._counter.add(one, np.array([value], dtype=np.float32), 2.0**self.exponent, below_upper=True)
        self.counts -= one * n
        self.count -= n

    def freeze(self) -> ActivationStats:
        seen = self.count > 0
        return ActivationStats(
            tensor=self.tensor,
            count=self.count,
            nan_count=self.nan,
            posinf_count=self.posinf,
            neginf_count=self.neginf,
            min=self.min if seen else 0.0,
            max=self.max if seen else 0.0,
            histogram=Histogram(self.counts.copy(), 2.0 ** (self.exponent if self.exponent is not None else -126)),
        )


@dataclass(frozen=True, eq=False)
class StatsStore(Mapping[str, ActivationStats]):
    """Statistics of every tapped tensor, plus where they came from (``meta``: model hash, set id, ...)."""

    stats: Mapping[str, ActivationStats]
    num_bins: int = 2048
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, tensor: str) -> ActivationStats:
        try:
            return self.stats[tensor]
        except KeyError:
            raise CalibrationError(
                f"no statistics for tensor {tensor!r}",
                hint="collect statistics with the same --op-types / --exclude, or delete the statistics cache",
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.stats)

    def __len__(self) -> int:
        return len(self.stats)

    @property
    def nbytes(self) -> int:
        return sum(s.histogram.counts.nbytes for s in self.stats.values())

    def subset(self, tensors: list[str] | tuple[str, ...]) -> StatsStore:
        return StatsStore({t: self[t] for t in tensors}, self.num_bins, dict(self.meta))

    def merge(self, other: StatsStore) -> StatsStore:
        """Combine statistics of two runs (e.g. two halves of a calibration set)."""
        out = dict(self.stats)
        for t, s in other.stats.items():
            out[t] = out[t].merge(s) if t in out else s
        return StatsStore(out, self.num_bins, dict(self.meta))

    def save(self, path: str | os.PathLike[str]) -> Path:
        names = list(self.stats)
        # arrays; Any because np.savez_compressed(**arrays) is checked against its allow_pickle: bool too
        arrays: dict[str, Any] = {
            "counts": np.stack([self.stats[t].histogram.counts for t in names])
            if names
            else np.zeros((0, self.num_bins), dtype=np.int64),
            "upper": np.array([self.stats[t].histogram.upper for t in names], dtype=np.float64),
            "ints": np.array(
                [[s.count, s.nan_count, s.posinf_count, s.neginf_count] for s in (self.stats[t] for t in names)],
                dtype=np.int64,
            ).reshape(len(names), 4),
            "minmax": np.array([[self.stats[t].min, self.stats[t].max] for t in names], dtype=np.float64).reshape(
                len(names), 2
            ),
        }
        header = {"format": STATS_FORMAT, "tensors": names, "num_bins": self.num_bins, "meta": dict(self.meta)}
        arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
        with atomic_open(path, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> StatsStore:
        """The statistics saved at ``path``, verified as the cache's entries are (:func:`verify_store`): a file
        that is truncated, edited (ranges rescaled, a NaN) or not a statistics file is a CalibrationError."""
        p = Path(path)
        if not p.is_file():
            raise CalibrationError(f"statistics file not found: {p}")
        hint = "re-run `calibkit calibrate`, which writes the statistics again"
        try:
            with open(p, "rb") as fh, np.load(fh, allow_pickle=False) as z:  # closed when np.load fails too
                store = cls.from_npz(z, p)
        except CalibrationError:
            raise
        except (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, RecursionError,
                zipfile.BadZipFile) as exc:
            raise CalibrationError(f"cannot read statistics {p}: {exc}", hint=hint) from exc
        problems = verify_store(store)
        if problems:
            raise CalibrationError(f"statistics {p} failed verification ({'; '.join(problems[:3])})", hint=hint)
        return store

    @classmethod
    def from_npz(cls, z: NpzFile, name: str | os.PathLike[str]) -> StatsStore:
        """The store held by an open ``.npz`` (``np.load``'s NpzFile) read from ``name``. Its arrays must have
        the shapes and kinds :meth:`save` writes (a :class:`CalibrationError` says which does not); what the
        numbers mean is checked by :func:`verify_store`."""
        header = read_header(z, name)
        counts, upper, ints, minmax = z["counts"], z["upper"], z["ints"], z["minmax"]
        tensors, bins = header["tensors"], header["num_bins"]
        n = len(tensors)
        shapes = {"counts": (counts, (n, bins), "iu"), "upper": (upper, (n,), "f"), "ints": (ints, (n, 4), "iu"),
                  "minmax": (minmax, (n, 2), "f")}
        for key, (arr, shape, kinds) in shapes.items():
            if arr.shape != shape or arr.dtype.kind not in kinds:
                raise CalibrationError(f"{name}: {key} is {arr.dtype}{list(arr.shape)}, not the "
                                       f"{'integers' if 'i' in kinds else 'floats'} {list(shape)} of {n} tensors")
        stats = {}
        for i, t in enumerate(tensors):
            stats[t] = ActivationStats(
                tensor=t,
                count=int(ints[i, 0]),
                nan_count=int(ints[i, 1]),
                posinf_count=int(ints[i, 2]),
                neginf_count=int(ints[i, 3]),
                min=float(minmax[i, 0]),
                max=float(minmax[i, 1]),
                histogram=Histogram(counts[i].astype(np.int64), float(upper[i])),
            )
        return cls(stats, int(bins), header.get("meta", {}))


def read_header(z: NpzFile, name: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of an open statistics ``.npz``: its format tag, the tensors (distinct strings) and the bins."""
    try:
        header = json.loads(bytes(z["header"]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{name}: the header is not JSON ({exc})") from exc
    if not isinstance(header, dict) or header.get("format") != STATS_FORMAT:
        got = header.get("format") if isinstance(header, dict) else None
        raise CalibrationError(f"{name} is not a calibkit statistics file (format {got!r})")
    tensors, bins, meta = header.get("tensors"), header.get("num_bins"), header.get("meta", {})
    if not isinstance(tensors, list) or not all(isinstance(t, str) for t in tensors):
        raise CalibrationError(f"{name}: the header's tensors are not a list of names")
    if len(set(tensors)) != len(tensors):
        raise CalibrationError(f"{name}: the header names a tensor twice")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2 or bins & (bins - 1):
        raise CalibrationError(f"{name}: the header's num_bins {bins!r} is not a power of two >= 2")
    if not isinstance(meta, dict):
        raise CalibrationError(f"{name}: the header's meta is not an object")
    return header


def verify_store(store: StatsStore, *, num_bins: int | None = None) -> list[str]:
    """What is wrong with the meaning of ``store``'s statistics (empty: nothing), so a statistics file that
    parses but was damaged or edited is never used: the bins asked; per tensor, counts that are not negative and
    add up to its count of finite values; a finite minimum and maximum (both 0 when nothing was seen,
    min <= max otherwise); and the recorded abs max where the histogram says it is: inside the top occupied
    bin's bounds, the range being the smallest power of two above it (ranges rescaled, or a NaN maximum, fail)."""
    problems: list[str] = []
    if num_bins is not None and store.num_bins != num_bins:
        problems.append(f"{store.num_bins} bins, not the {num_bins} asked")
    for t, s in store.items():
        h = s.histogram
        counts = h.counts
        if h.num_bins != store.num_bins:
            problems.append(f"{t}: {h.num_bins} bins in a store of {store.num_bins}")
            continue
        if min(s.count, s.nan_count, s.posinf_count, s.neginf_count) < 0 or (counts.size and counts.min() < 0):
            problems.append(f"{t}: a negative count")
            continue
        if int(counts.sum()) != s.count:
            problems.append(f"{t}: the histogram holds {int(counts.sum())} values, the count is {s.count}")
            continue
        if not (math.isfinite(s.min) and math.isfinite(s.max)):
            problems.append(f"{t}: the range [{s.min}, {s.max}] is not finite")
            continue
        if s.count == 0:
            if s.min != 0.0 or s.max != 0.0:
                problems.append(f"{t}: no value seen, yet the range is [{s.min}, {s.max}]")
            continue
        if s.min > s.max:
            problems.append(f"{t}: the minimum {s.min} is above the maximum {s.max}")
            continue
        top = int(np.flatnonzero(counts)[-1])
        low, high = top * h.width, (top + 1) * h.width
        if not low <= s.absmax <= high:
            problems.append(f"{t}: the recorded abs max {s.absmax:g} is outside the histogram's top occupied bin "
                            f"[{low:g}, {high:g}]")
        elif h.upper != 2.0 ** range_exponent(s.absmax):
            problems.append(f"{t}: the histogram's range {h.upper:g} is not the one its abs max {s.absmax:g} makes")
    return problems
