"""`calibrate` end to end: placement -> statistics (collected once, reused) -> method -> table -> Q/DQ model,
TensorRT cache, calibration.json and stats.npz, all written into OUT atomically (complete or not at all)."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibkit._io import atomic_dir, sha256_file
from calibkit._version import __version__
from calibkit.calibrate.methods import compute_table
from calibkit.calibrate.stats import StatsStore
from calibkit.calibrate.statscache import find_stats, save_stats, set_key
from calibkit.calibrate.trtcache import (
    ALGORITHM_FOR_METHOD,
    DEFAULT_TRT_VERSION,
    matched_amax,
    read_cache,
    write_cache,
)
from calibkit.data.calibset import MANIFEST, CalibrationSet, load_calibration_set
from calibkit.data.encode import DEFAULT_MEMORY_BUDGET, TokenBudget
from calibkit.data.modeldir import ModelDir
from calibkit.errors import CalibrationError, ModelError
from calibkit.names import node_names
from calibkit.quantize.fused import fused_fp32_linear, fused_warning
from calibkit.quantize.placement import Placement, plan_placement
from calibkit.quantize.qdq import weightless_copy
from calibkit.quantize.rangecheck import HARMFUL_CLIP_RATIO, ClipWarning, harmful_clipping
from calibkit.quantize.tablefile import write_calibration_json
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.requests.choices import Target
from calibkit.resources import Resources
from calibkit.results.files import (
    CalibrationDocument,
    CalibrationSetRecord,
    ClipRecord,
    StatisticsRecord,
    TensorRecord,
    TrtCacheRecord,
)
from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

    from calibkit.calibrate.trtcache import TrtCache
    from calibkit.quantize.qdq import QuantizeResult
    from calibkit.requests.smooth import SmoothRequest

log = logging.getLogger("calibkit.calibrate")

# Measured on the fast demo model (512 calibration texts, classifier head kept FP32, 2,114 held-out texts):
# FP32 75.31 %, mse 75.31, minmax 75.02, entropy 74.83, percentile(99.99) 74.31.
DEFAULT_METHOD = Method.MSE

MODEL_FILE = "model.int8.onnx"
CACHE_FILE = "calibration.cache"
JSON_FILE = "calibration.json"
STATS_FILE = "stats.npz"
#: the token budget of the statistics' batches when the run's resources name none
DEFAULT_BUDGET = TokenBudget(memory_bytes=DEFAULT_MEMORY_BUDGET)


@dataclass(frozen=True)
class CalibrationResult:
    out_dir: Path
    model_path: Path
    cache_path: Path
    json_path: Path
    stats_path: Path | None
    table: CalibrationTable
    quantized_nodes: tuple[str, ...]
    kept_nodes: tuple[str, ...]
    missing_ranges: tuple[str, ...]
    zero_ranges: tuple[str, ...]
    reused_stats: bool
    timings: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    unmatched_cache_names: tuple[str, ...] = ()  # --from-cache: names in the cache that match no quantized input
    # ranges that cut softmax / GELU outputs far below their observed values (also in ``warnings``)
    clipping: tuple[ClipWarning, ...] = ()


def versions() -> dict[str, str]:
    import onnx

    out = {"calibkit": __version__, "onnx": onnx.__version__}
    try:
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    except ImportError:  # pragma: no cover - onnxruntime is a hard dependency
        pass
    return out


def _manifest_sha(cset: CalibrationSet) -> str:
    m = cset.path / MANIFEST if cset.path.is_dir() else None
    return sha256_file(m) if m is not None and m.is_file() else ""


def gather_stats(
    model_dir: ModelDir,
    cset: CalibrationSet,
    tensors: Sequence[str],
    *,
    model_sha256: str,
    num_bins: int,
    batch_size: int,
    resources: Resources,
    use_cache: bool = True,
    cache_dir: Path | None = None,
    model: onnx.ModelProto | None = None,
    threads: int | None = None,
    model_bytes: list[bytes] | None = None,
) -> tuple[StatsStore, bool]:
    """Statistics of ``tensors`` over the set: from the cache when there, else by running the model.

    ``resources`` says how, and nothing else does: its ``executor``, when it has more than one worker, collects
    the statistics in shards there (calibkit.calibrate.sharded, bit-identical), any other (None included) leaves
    them to this process and ``resources.runner_factory``; ``resources.budget`` bounds each batch
    (:data:`DEFAULT_BUDGET` where the run has none) and ``resources.progress`` hears about it. A caller that
    wants other values passes ``dataclasses.replace(resources, ...)``. The budget changes memory and time,
    never the statistics, so it is not part of the cache key.

    ``model_bytes``: a one-element list holding the bytes ``model`` was parsed from (its file); the taps are
    appended to them instead of serializing the model again, and the list is emptied as they are handed on, so
    nothing keeps them alive while the model runs.

    ``use_cache=False`` (``--fresh-stats``) does not read the cache but still saves the fresh statistics."""
    key = set_key(cset.id, model_dir.tokenizer_path, model_dir.max_length)
    if use_cache:
        hit = find_stats(model_sha256, key, tensors, num_bins, cache_dir)
        if hit is not None:
            log.info("reusing statistics from %s (the model is not run again)", hit[1])
            return hit[0], True
    from calibkit.calibrate.collect import collect_stats
    from calibkit.data.encode import bucketed_batches
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.graph import load_model

    executor, progress = resources.executor, resources.progress
    tok = TextTokenizer(model_dir.tokenizer_path, max_length=model_dir.max_length)
    proto = model if model is not None else load_model(model_dir.onnx_path)
    input_names = [i.name for i in proto.graph.input if i.name not in {x.name for x in proto.graph.initializer}]
    budget = resources.budget if resources.budget is not None else DEFAULT_BUDGET
    batches = bucketed_batches(tok, cset.texts, input_names, batch_size=batch_size, budget=budget)
    if executor is not None and executor.workers > 1:
        from calibkit.calibrate.sharded import collect_stats_sharded

        store = collect_stats_sharded(proto.SerializeToString(), batches, tensors, executor, num_bins=num_bins,
                                      progress=progress)
    else:
        store = collect_stats(proto, batches, tensors, num_bins=num_bins, progress=progress, threads=threads,
                              serialized=model_bytes.pop() if model_bytes else None,
                              make_runner=resources.runner_factory)
    del proto
    meta = {
        **store.meta,
        "model_sha256": model_sha256,
        "calibration_set_id": cset.id,
        "stats_set_key": key,
        "texts": batches.num_texts,
        "truncated": batches.truncated,
        "max_length": batches.max_length,
        "max_length_source": model_dir.max_length_source,
        "batch_size": batch_size,
        "max_batch_tokens": budget.max_batch_tokens,
        "memory_budget_bytes": budget.memory_bytes,
    }
    store = StatsStore(dict(store.stats), store.num_bins, meta)
    save_stats(store, tensors, cache_dir)  # also without use_cache: --fresh-stats repairs a broken cache
    return store, False


def _summary_warnings(store: StatsStore, table: CalibrationTable) -> list[str]:
    out = []
    n = int(store.meta.get("texts", store.meta.get("samples", 0)) or 0)
    if n == 1:
        out.append("the calibration set holds a single text: ranges from one sample rarely generalise")
    trunc = int(store.meta.get("truncated", 0) or 0)
    if trunc:
        source = store.meta.get("max_length_source")
        out.append(
            f"{trunc} of {n} texts are longer than the model's maximum of {store.meta.get('max_length')} tokens "
            + (f"({source}) " if source else "") + "and were truncated"
        )
    nonfinite = [r.tensor for r in table.ranges if store[r.tensor].non_finite]
    if nonfinite:
        out.append(
            f"{len(nonfinite)} tensors held non-finite values (excluded from their ranges), e.g. {nonfinite[0]}"
        )
    zero = [r.tensor for r in table.ranges if r.amax == 0.0]
    if zero:
        out.append(f"{len(zero)} tensors were all zero (amax 0, cache scale 0; kept in FP32), e.g. {zero[0]}")
    return out


def structure_warnings(model: onnx.ModelProto, placement: Placement, exclude: Sequence[str]) -> list[str]:
    """What the user should know about the graph itself: --exclude patterns that select nothing, fused ops."""
    out = []
    if placement.unmatched:
        known = node_names(model, [n.op_type for n in placement.nodes] or None)
        sample = next(iter(known.values()), None)
        example = (f" (names look like {sample.node!r}" + (f", module paths like {sample.module!r}" if sample.module
                   else "") + ")") if sample else ""
        for p in placement.unmatched:
            out.append(f"--exclude '{p}' matches no quantized node{example}")
    fused = fused_warning(model)
    if fused:
        out.append(fused)
    return out


def load_hashed(path: Path) -> tuple[Any, str, list[bytes]]:
    """The model, its identity (the SHA-256 of its file, with its external-data files where it has any) and (in
    a one-element list, empty for models with external data) the file's bytes, from one read: the hash runs on
    a second thread (hashlib releases the GIL) while protobuf parses, instead of reading the file twice and
    hashing it first."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    import onnx
    from onnx.external_data_helper import uses_external_data

    from calibkit.errors import ModelError
    from calibkit.graph import check_float_source, check_not_empty, load_external_weights

    if not path.is_file():
        raise ModelError(f"ONNX model not found: {path}")
    data = path.read_bytes()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="calibkit-sha256") as pool:
        digest = pool.submit(lambda: hashlib.sha256(data).hexdigest())
        try:
            proto = onnx.load_model_from_string(data)
        except Exception as exc:
            raise ModelError(f"cannot read ONNX model {path}: {exc}") from exc
        sha = digest.result()
    check_float_source(check_not_empty(proto, path), path)
    if any(uses_external_data(t) for t in proto.graph.initializer):
        from calibkit.consistency import external_names_of, with_external_data

        sha = with_external_data(sha, path, external_names_of(proto))  # the weights beside it are the model too
        load_external_weights(proto, path)
        return proto, sha, []  # the file alone is not the model: taps fall back to serializing it
    return proto, sha, [data]


def _quantize(model: onnx.ModelProto | Path, table: CalibrationTable, op_types: Sequence[str], exclude: Sequence[str],
              target: str) -> QuantizeResult:
    from calibkit.graph import load_model
    from calibkit.quantize.qdq import Target, quantize_model

    proto = load_model(model) if isinstance(model, (str, Path)) else model
    return quantize_model(proto, table, op_types=tuple(op_types), exclude=tuple(exclude), target=Target(target))


def calibrate(request: CalibrateRequest, resources: Resources = Resources()) -> CalibrationResult:
    """Run ``request`` and write its OUT (see the module docstring): placement -> statistics -> the method's
    table -> Q/DQ model and its checks -> the files; with ``from_cache``, the Q/DQ model from a TensorRT
    calibration cache instead (no model run, no statistics). The model folder and the calibration set are loaded
    here when the request names them by path. ``resources``: the executor whose workers collect statistics in
    shards (None: this process), the token budget of tapped batches, the runner factory of the tapped model and
    where progress goes."""
    if request.from_cache is not None:
        return _calibrate_from_cache(request, _cache_model_dir(request), Path(request.from_cache))
    model_dir = model_dir_of(request)
    calibration_set = request.calibration_set
    method, params = Method(str(request.method)), request.params
    op_types, exclude, target = request.op_types, request.exclude, str(request.target)
    out_dir, trt_version, threads = request.out_dir, DEFAULT_TRT_VERSION, request.threads
    cache_dir = Path(request.cache_dir) if request.cache_dir is not None else None
    t0 = time.perf_counter()
    assert calibration_set is not None  # checked by CalibrateRequest.validate(): needed without --from-cache
    cset = calibration_set if isinstance(calibration_set, CalibrationSet) else load_calibration_set(calibration_set)
    # loaded once: placement, taps and Q/DQ all read this copy; the file's bytes go to the tapped session
    proto, sha, model_bytes = load_hashed(model_dir.onnx_path)
    placement, collected = _placement(proto, op_types, exclude, model_dir)
    t1 = time.perf_counter()
    stats = _Statistics(model_dir, cset, sha, collected, params.num_bins, request.batch_size, request.use_cache,
                        cache_dir, threads, resources)
    proto, store, reused = stats.gather(proto, model_bytes)
    t2 = time.perf_counter()
    provenance = {
        "model": str(model_dir.onnx_path),
        "calibration_set": str(cset.path),
        "calibration_set_manifest_sha256": _manifest_sha(cset),
        **{f"{k}_version": v for k, v in versions().items()},
    }
    table = compute_table(store, method, params, sha, cset.id, tensors=placement.activations, provenance=provenance,
                          threads=threads, fitted=target == Target.ONNXRUNTIME)
    t3 = time.perf_counter()
    qres = _quantize(proto, table, op_types, exclude, target)
    structure = structure_warnings(proto, placement, exclude)
    fused = [n.name for n in fused_fp32_linear(proto)]
    clipping = harmful_clipping(proto, ((r.tensor, r.amax, r.method.value) for r in table.ranges),
                                {r.tensor: float(store[r.tensor].absmax) for r in table.ranges})
    del proto
    t4 = time.perf_counter()
    warnings = [*structure, *_summary_warnings(store, table), *(c.message for c in clipping)]
    for w in warnings:
        log.info(w)
    document = _document(cset, store, table, method, provenance, reused, trt_version, warnings, target=target,
                         op_types=op_types, exclude=exclude, fused=fused, clipping=clipping)
    result = _write_outputs(
        Path(out_dir), model_dir, table, qres, store, document, trt_version,
        timings={"placement": t1 - t0, "statistics": t2 - t1, "method": t3 - t2, "quantize": t4 - t3},
        reused=reused, warnings=warnings, t_start=t0,
    )
    return replace(result, clipping=clipping)


def _placement(proto: onnx.ModelProto, op_types: Sequence[str], exclude: Sequence[str],
               model_dir: ModelDir) -> tuple[Placement, list[str]]:
    """The placement (exclusions applied) and the tensors statistics are collected for: every quantizable
    input, exclusions ignored, so a later run with other --exclude reuses them."""
    placement = plan_placement(proto, op_types, exclude)
    if not placement.activations:
        raise CalibrationError(
            f"no activation inputs of {', '.join(op_types)} nodes to calibrate in {model_dir.onnx_path.name}",
            hint="check --op-types (e.g. MatMul,Gemm) and --exclude",
        )
    return placement, list(plan_placement(proto, op_types).activations)


@dataclass(frozen=True)
class _Statistics:
    """The statistics step of :func:`calibrate`: what it collects, where from and with what."""

    model_dir: ModelDir
    cset: CalibrationSet
    sha: str
    tensors: Sequence[str]
    num_bins: int
    batch_size: int
    use_cache: bool
    cache_dir: Path | None
    threads: int | None
    resources: Resources

    def gather(self, proto: onnx.ModelProto, model_bytes: list[bytes]) -> tuple[onnx.ModelProto, StatsStore, bool]:
        """(the model, its statistics, whether they came from the cache). While the model runs, ONNX Runtime
        holds its weights; a second copy here would only wait for the Q/DQ step (1.3 GB for BERT-large). So
        when the model runs in this process the taps are planned on a weightless copy and the model is read
        again after (and refused if its file changed meanwhile)."""
        lean = bool(model_bytes) and not self._sharded() and not self._cached()
        stats_model = weightless_copy(proto) if lean else proto
        if lean:
            del proto
        store, reused = gather_stats(
            self.model_dir, self.cset, self.tensors, model_sha256=self.sha, num_bins=self.num_bins,
            batch_size=self.batch_size, use_cache=self.use_cache, cache_dir=self.cache_dir, model=stats_model,
            threads=self.threads, model_bytes=model_bytes, resources=self.resources,
        )
        model_bytes.clear()  # statistics from the cache never needed them
        del stats_model
        if not lean:
            return proto, store, reused
        again, sha, reread = load_hashed(self.model_dir.onnx_path)
        reread.clear()
        if sha != self.sha:
            raise ModelError(
                f"{self.model_dir.onnx_path} changed while it was being calibrated",
                hint="calibrate again once the file is no longer being written",
            )
        return again, store, reused

    def _sharded(self) -> bool:
        ex = self.resources.executor
        return ex is not None and ex.workers > 1

    def _cached(self) -> bool:
        key = set_key(self.cset.id, self.model_dir.tokenizer_path, self.model_dir.max_length)
        return self.use_cache and find_stats(self.sha, key, self.tensors, self.num_bins, self.cache_dir) is not None


def _document(cset: CalibrationSet, store: StatsStore, table: CalibrationTable, method: Method,
              provenance: dict[str, Any], reused: bool, trt_version: int, warnings: list[str], *, target: str,
              op_types: Sequence[str], exclude: Sequence[str], fused: list[str],
              clipping: Sequence[ClipWarning] = ()) -> CalibrationDocument:
    """calibration.json's fields beside the table: what was quantized, per-tensor statistics, the set, the
    statistics' provenance and the TensorRT cache's algorithm (what the Q/DQ step made is added on writing)."""
    return CalibrationDocument(
        table=table,
        target=target,
        op_types=tuple(op_types),
        exclude=tuple(exclude),
        fused_fp32=tuple(fused),
        tensors={
            r.tensor: TensorRecord(amax=r.amax, scale=r.scale, method=r.method.value, **store[r.tensor].summary())
            for r in table.ranges
        },
        calibration_set=CalibrationSetRecord(
            id=cset.id,
            path=str(cset.path),
            manifest_sha256=provenance["calibration_set_manifest_sha256"],
            texts=len(cset),
            truncated=int(store.meta.get("truncated", 0) or 0),
            max_length=store.meta.get("max_length"),
        ),
        statistics=StatisticsRecord(reused=reused, num_bins=store.num_bins, collected=dict(store.meta)),
        trt_cache=TrtCacheRecord(algorithm=ALGORITHM_FOR_METHOD[method], version=trt_version),
        warnings=tuple(warnings),
        clipping=tuple(_clip_record(c) for c in clipping),
    )


def _clip_record(c: ClipWarning) -> ClipRecord:
    return ClipRecord(family=c.family, method=c.method, tensors=tuple(c.tensors), amax=tuple(c.amax),
                      observed_absmax=tuple(c.observed), of=c.of, threshold=HARMFUL_CLIP_RATIO[c.family],
                      suggestion=c.suggestion, message=c.message)


def _write_outputs(
    out: Path,
    model_dir: ModelDir,
    table: CalibrationTable,
    qres: QuantizeResult,
    store: StatsStore | None,
    document: CalibrationDocument,
    trt_version: int,
    *,
    timings: dict[str, float],
    reused: bool,
    warnings: Sequence[str],
    t_start: float,
    unmatched: Sequence[str] = (),
    cache_source: Path | None = None,
) -> CalibrationResult:
    from calibkit.quantize.qdq import save_model

    t = time.perf_counter()
    files = {"model": MODEL_FILE, "cache": CACHE_FILE}
    if store is not None:
        files["stats"] = STATS_FILE
    document = replace(
        document,
        quantized_nodes=tuple(qres.quantized_nodes),
        kept_nodes=tuple(qres.kept_nodes),
        missing_ranges=tuple(qres.missing_ranges),
        zero_ranges=tuple(getattr(qres, "zero_ranges", ())),
        files=files,
        source_model=str(model_dir.onnx_path),
        tokenizer=str(model_dir.tokenizer_path),
    )
    with atomic_dir(out, what="calibrate", legacy_names=(MODEL_FILE, CACHE_FILE, STATS_FILE, JSON_FILE)) as tmp:
        save_model(qres.model, tmp / MODEL_FILE)
        if cache_source is not None:
            shutil.copyfile(cache_source, tmp / CACHE_FILE)
        else:
            write_cache(tmp / CACHE_FILE, table, version=trt_version)
        if store is not None:
            store.save(tmp / STATS_FILE)
        timings = {**timings, "write": time.perf_counter() - t, "total": time.perf_counter() - t_start}
        rounded = {k: round(v, 3) for k, v in timings.items()}
        write_calibration_json(tmp / JSON_FILE, replace(document, timings=rounded))
    return CalibrationResult(
        out_dir=out,
        model_path=out / MODEL_FILE,
        cache_path=out / CACHE_FILE,
        json_path=out / JSON_FILE,
        stats_path=out / STATS_FILE if store is not None else None,
        table=table,
        quantized_nodes=tuple(qres.quantized_nodes),
        kept_nodes=tuple(qres.kept_nodes),
        missing_ranges=tuple(qres.missing_ranges),
        zero_ranges=tuple(getattr(qres, "zero_ranges", ())),
        reused_stats=reused,
        timings=timings,
        warnings=tuple(warnings),
        unmatched_cache_names=tuple(unmatched),
    )


def model_dir_of(request: CalibrateRequest | SmoothRequest) -> ModelDir:
    """The request's model folder: the loaded one, or resolved from its path (and ``tokenizer``)."""
    model = request.model
    if isinstance(model, ModelDir):
        return model
    return ModelDir.resolve(Path(model), Path(request.tokenizer) if request.tokenizer is not None else None)


def _cache_model_dir(request: CalibrateRequest) -> ModelDir:
    """The model of ``--from-cache``: a bare .onnx file needs no tokenizer (the model does not run)."""
    try:
        return model_dir_of(request)
    except ModelError:
        model = request.model
        path = Path(model) if not isinstance(model, ModelDir) else model.onnx_path
        if not (path.is_file() and path.suffix == ".onnx"):
            raise
        return ModelDir(onnx_path=path, tokenizer_path=path.parent)


def _calibrate_from_cache(request: CalibrateRequest, model_dir: ModelDir, cache_path: Path) -> CalibrationResult:
    """Build the Q/DQ model from an existing TensorRT calibration cache (no model run, no statistics).

    Cache names that match no quantized activation (TensorRT-internal ``ONNXTRT_Broadcast_*`` or
    ``(Unnamed Layer* N)`` names, tensors of other op types) are reported in ``unmatched_cache_names``;
    quantized inputs the cache lacks stay FP32 and are reported as ``missing_ranges``.
    """
    from calibkit.graph import load_model, model_sha256

    op_types, exclude, target, out_dir = request.op_types, request.exclude, str(request.target), request.out_dir
    t0 = time.perf_counter()
    cache = read_cache(cache_path)
    sha = model_sha256(model_dir.onnx_path)
    graph_only = load_model(model_dir.onnx_path, load_external_data=False)
    placement = plan_placement(graph_only, op_types, exclude)
    structure = structure_warnings(graph_only, placement, exclude)
    del graph_only
    wanted = set(placement.activations)
    method = cache.method
    matched = matched_amax(cache, wanted, str(cache_path))  # refuses unusable or unmatched caches
    ranges = tuple(
        TensorRange(tensor=t, amax=float(matched[t]), method=method) for t in placement.activations if t in matched
    )
    unmatched = sorted(n for n in [*cache.scales, *cache.non_finite] if n not in wanted)
    cache_sha = sha256_file(cache_path)
    table = CalibrationTable(
        model_sha256=sha,
        calibration_set_id=f"trt-cache:{cache_sha}",
        method=method,
        params=MethodParams(),
        ranges=ranges,
        provenance={
            "model": str(model_dir.onnx_path),
            "trt_cache": str(cache_path),
            "trt_cache_sha256": cache_sha,
            **{f"{k}_version": v for k, v in versions().items()},
        },
    )
    qres = _quantize(model_dir.onnx_path, table, op_types, exclude, target)
    warnings = [*structure, *_cache_warnings(cache, unmatched, qres.missing_ranges, wanted)]
    for w in warnings:
        log.info(w)
    document = CalibrationDocument(
        table=table,
        target=target,
        op_types=tuple(op_types),
        exclude=tuple(exclude),
        tensors={r.tensor: TensorRecord(amax=r.amax, scale=r.scale, method=r.method.value) for r in ranges},
        trt_cache=TrtCacheRecord(algorithm=cache.algorithm, version=cache.version, source=str(cache_path),
                                 unmatched=tuple(unmatched), zero=tuple(cache.zero),
                                 non_finite=tuple(cache.non_finite)),
        warnings=tuple(warnings),
    )
    return _write_outputs(
        Path(out_dir), model_dir, table, qres, None, document, cache.version,
        timings={"read": time.perf_counter() - t0}, reused=False, warnings=warnings, t_start=t0,
        unmatched=unmatched, cache_source=Path(cache_path),
    )


def _cache_warnings(cache: TrtCache, unmatched: Sequence[str], missing: Sequence[str],
                    wanted: set[str]) -> list[str]:
    """What --from-cache should say about the cache against the model: names it does not know, non-finite and
    zero scales, quantized inputs it lacks."""
    out = []
    if unmatched:
        out.append(
            f"{len(unmatched)} cache entries match no quantized tensor of the model (TensorRT-internal names or "
            f"other ops), e.g. {unmatched[0]}"
        )
    if cache.non_finite:
        out.append(f"{len(cache.non_finite)} cache entries hold a non-finite scale, e.g. {cache.non_finite[0]}")
    if missing:
        out.append(f"{len(missing)} quantized inputs have no scale in the cache (kept in FP32)")
    zeros = [t for t in cache.zero if t in wanted]
    if zeros:
        out.append(f"{len(zeros)} cache entries hold scale 0 (their nodes stay FP32): {', '.join(zeros[:5])}")
    return out
