"""What ``deploy`` is given: a tune output folder, a calibrate output folder or an engine calibkit built.

Each is turned into a recipe that :func:`calibkit.building.build` can follow: the FP32 model folder
(tokenizer and labels with it), the precision, the calibration table and the nodes kept in higher precision, a
ready Q/DQ model where one exists and the Q/DQ layout it was measured in (``qdq_target``), so deploy ships what
was measured. A tune folder's tune.json is read through the codec (:mod:`calibkit.results.codec`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from calibkit.deploy.traffic import SourceLog
from calibkit.errors import DataError, ModelError, UsageError
from calibkit.results.documents import SourceRecord
from calibkit.types import PathLike, Precision

LOG_SHA256 = "log sha256: "  # how tune's traffic evidence names the bytes of its log (evaluate.traffic.evidence_of)
NOT_OUTPUT_HINT = ("pass a folder written by `calibkit tune` or `calibkit calibrate` (it holds calibration.json), "
                   "or an engine written by `calibkit build` (with its ENGINE.calibkit.json sidecar)")


@dataclass(frozen=True)
class DeploySource:
    path: Path
    kind: str  # "tune" | "calibrate" | "engine"
    model: Path  # the FP32 ONNX model
    tokenizer: Path
    precision: Precision
    calibration_json: Path | None = None
    keep_nodes: tuple[str, ...] = ()
    qdq_model: Path | None = None  # a ready Q/DQ ONNX
    qdq_target: str | None = None  # its layout: "tensorrt" | "onnxruntime"
    weight_bits: int | None = None  # of an onnxruntime-layout engine (7: reduce-range)
    kept_weights: str | None = None  # how the plan's kept weight MatMuls were timed or built (blockwise | fp32)
    calibration_set: Path | None = None  # the folder its calibration texts came from, when known
    calibration_set_id: str = ""
    tune_claim: str | None = None  # a tune folder whose plan does not hold its claim: what tune said of it
    tune_traffic: SourceLog | None = None  # the log tune judged agreement with FP32 on, while it is still there

    def record(self) -> SourceRecord:
        """deploy's record of SOURCE: absolute paths (the repository's files name them relative to it,
        :func:`calibkit.deploy.repository.shipped_result`)."""
        def a(p: Path | None) -> str | None:
            return os.path.abspath(p) if p is not None else None

        return SourceRecord(path=os.path.abspath(self.path), kind=self.kind, model=os.path.abspath(self.model),
                            tokenizer=os.path.abspath(self.tokenizer), precision=self.precision,
                            calibration_json=a(self.calibration_json), kept_nodes=self.keep_nodes,
                            qdq_model=a(self.qdq_model), qdq_target=self.qdq_target,
                            calibration_set=a(self.calibration_set))


def _existing(path: str | Path | None, what: str, source: Path, document: Path) -> Path:
    if not path or not Path(path).exists():
        raise ModelError(f"{source}: the {what} it was made from is gone ({path or 'not recorded'}, named by "
                         f"{document})",
                         hint="deploy needs the FP32 model folder next to the results: restore it, or re-run the "
                              "command that wrote SOURCE")
    return Path(path)


def _check_folder(folder: Path, kind: str) -> None:
    """Refuse a calibrate or tune folder one of whose files is not the one calibkit wrote there (a swapped
    model.int8.onnx or calibration.json would be served under the plan deploy.json describes)."""
    from calibkit.outdirs import changed_files

    changed = changed_files(folder)
    if changed:
        raise ModelError(f"{folder}: {', '.join(changed)} changed after `calibkit {kind}` wrote the folder; deploy "
                         "would serve other files than the ones it measured",
                         hint=f"restore the files calibkit wrote, or re-run `calibkit {kind}` to write {folder} again")


def _from_folder(folder: Path) -> DeploySource:
    from calibkit.quantize.tablefile import load_calibration_json

    cal = folder / "calibration.json"
    if not cal.is_file():
        raise UsageError(f"{folder} is not a calibkit output (no calibration.json, tune.json or engine sidecar in it)",
                         hint=NOT_OUTPUT_HINT)
    kind, claim, traffic, kept_weights = "calibrate", None, None, None
    tune = folder / "tune.json"
    if tune.is_file():
        kind = "tune"
        claim, traffic, kept_weights = _read_tune(tune)
    _check_folder(folder, kind)
    cf = load_calibration_json(cal)
    model = _existing(cf.source_model, "FP32 model", folder, cal)
    tokenizer = _existing(cf.tokenizer, "tokenizer folder", folder, cal)
    cf.check_named_files()
    qdq = cf.file("model")
    cset = cf.calibration_set
    return DeploySource(
        path=folder, kind=kind, model=model, tokenizer=tokenizer, precision=Precision.INT8, calibration_json=cal,
        keep_nodes=tuple(cf.kept_nodes) if kind == "tune" else (),
        qdq_model=qdq if qdq is not None and qdq.is_file() else None, qdq_target=cf.target,
        calibration_set=cset if cset is not None and cset.is_dir() else None,
        calibration_set_id=cf.table.calibration_set_id, tune_claim=claim, tune_traffic=traffic,
        kept_weights=kept_weights)


def _read_tune(path: Path) -> tuple[str | None, SourceLog | None, str | None]:
    """tune.json through the codec (a file that is not a tune document is refused): what tune said of its plan
    when the plan does not hold its claim (not met, not confirmed, contradicted by the holdout), the traffic
    log it judged agreement on (with the sha256 it had then) when that file is still there, and how it served
    the plan's kept weight MatMuls."""
    from calibkit.results.codec import load_typed
    from calibkit.results.runs import TuneResult

    try:
        result = load_typed(path, TuneResult, strict=False)  # an older tune.json is read, with a warning
    except DataError as exc:
        raise UsageError(f"{path} is not a calibkit tune document ({exc.message})", hint=NOT_OUTPUT_HINT) from None
    from calibkit.provenance import document_path

    claim, kept = None if result.claim_holds else result.claim, _kept_weights(result.final.kept_weights, path)
    ev = result.eval_set.traffic
    log = document_path(path, ev.path, {}) if ev is not None else None  # tune.json: no paths marker
    if ev is None or log is None or not log.is_file():
        return claim, None, kept
    sha = next((e.removeprefix(LOG_SHA256) for e in ev.exclusions if e.startswith(LOG_SHA256)), None)
    return claim, SourceLog(log, None, sha or None), kept


def _kept_weights(value: str | None, document: Path) -> str | None:
    """How a document says the kept weight MatMuls were served, refused unless it is one of the words."""
    from calibkit.requests.choices import KeptWeights

    if value is not None and value not in {k.value for k in KeptWeights}:
        raise ModelError(f"{document} says the kept layers were served as {value!r}, which calibkit never writes",
                         hint=f"it takes {KeptWeights.words()}: restore the file or re-run the command that wrote it")
    return value


def _from_engine(engine: Path) -> DeploySource:
    from calibkit.consistency import check_engines
    from calibkit.enginefiles.artifact import EngineArtifact, sidecar_path

    art = EngineArtifact.load(engine)
    model = _existing(art.source_model, "FP32 model", engine, sidecar_path(engine))
    tokenizer = _existing(art.tokenizer, "tokenizer folder", engine, sidecar_path(engine))
    check_engines({"SOURCE": art})  # its tokenizer, labels, source model and table as they were at build time
    cal = Path(art.calibration_json) if art.calibration_json and Path(art.calibration_json).is_file() else None
    qdq: Path | None = None
    target = art.extra.target
    if art.precision is Precision.INT8 and engine.suffix == ".onnx":
        qdq = engine
        if target is None:  # built from --qdq: the layout of that model
            target = "onnxruntime" if _uint8_activations(engine) else "tensorrt"
    cset, set_id = None, ""
    if cal is not None:
        from calibkit.quantize.tablefile import load_calibration_json

        cf = load_calibration_json(cal)
        set_id = cf.table.calibration_set_id
        if cf.calibration_set is not None and cf.calibration_set.is_dir():
            cset = cf.calibration_set
    if art.precision is Precision.INT8 and cal is None and qdq is None:
        raise ModelError(f"{engine} is a TensorRT engine without its calibration table: deploy cannot rebuild it",
                         hint="deploy the calibrate or tune folder it was built from instead")
    return DeploySource(
        path=engine, kind="engine", model=model, tokenizer=tokenizer, precision=art.precision, calibration_json=cal,
        keep_nodes=tuple(art.kept_higher_precision), qdq_model=qdq, qdq_target=str(target) if target else None,
        weight_bits=art.extra.weight_bits, kept_weights=_kept_weights(art.extra.kept_weights, sidecar_path(engine)),
        calibration_set=cset,
        calibration_set_id=set_id)


def _uint8_activations(path: Path) -> bool:
    """Whether a Q/DQ model is in the onnxruntime layout (uint8 activation zero points)."""
    import onnx

    from calibkit.graph import load_model

    m = load_model(path, load_external_data=False)
    return any(i.name.endswith("zero_point") and i.data_type == onnx.TensorProto.UINT8 for i in m.graph.initializer)


def original_model(model: Path, *, max_steps: int = 8) -> Path:
    """The model the user gave, behind a smoothed copy: a smoothed model folder (calibkit smooth's, or the one
    tune smooths into its OUT/smoothed-model) records in its smoothing.json the model it was smoothed from;
    followed to the first model that is no smoothed copy (``model`` itself when it is none). Only its name is
    needed, so a recorded original that is gone still names it."""
    from calibkit.provenance import PATHS_KEY, SMOOTHING_JSON, document_path
    from calibkit.results.codec import read_smoothing

    for _ in range(max_steps):
        try:
            record = read_smoothing(model.parent)
        except DataError:
            break
        if record is None:
            break
        named = document_path(model.parent / SMOOTHING_JSON, record.source_model,
                              {PATHS_KEY: record.paths})  # older records: paths from the folder they ran in
        if named is None or named == model:
            break
        model = named
    return model


def resolve_source(path: PathLike) -> DeploySource:
    """Read SOURCE; a path that is none of the three is one UsageError saying what SOURCE may be."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"SOURCE {p} does not exist", hint=NOT_OUTPUT_HINT)
    if p.is_dir():
        return _from_folder(p)
    from calibkit.enginefiles.artifact import sidecar_path

    if not sidecar_path(p).is_file():
        raise UsageError(f"{p} is not a calibkit output (an engine would have {sidecar_path(p).name} beside it)",
                         hint=NOT_OUTPUT_HINT)
    return _from_engine(p)
