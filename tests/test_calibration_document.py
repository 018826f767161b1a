"""calibration.json and the demo's summary.json are typed documents (results.files) written and read by the
one codec: the round trips, the files calibrate writes (their keys as before, their bytes the codec's), documents
of earlier versions, a mistyped field named, the demo's index page rendered from the typed summary."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir

from calibkit._io import dumps_json
from calibkit.calibrate.pipeline import calibrate
from calibkit.data.calibset import write_calibration_set
from calibkit.data.modeldir import ModelDir
from calibkit.demo.workflow import _index
from calibkit.errors import CalibrationError, DataError
from calibkit.quantize.tablefile import load_calibration_json, write_calibration_json
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.results.codec import CALIBRATION_FORMAT, DEMO_FORMAT, document_json, parse_document
from calibkit.results.files import (
    CalibrationDocument,
    CalibrationSetRecord,
    ClipRecord,
    DemoCompare,
    DemoCompareFp16,
    DemoDeploy,
    DemoEmbedder,
    DemoEngine,
    DemoMethodTune,
    DemoSmoothing,
    DemoSummary,
    DemoTune,
    DocumentDigests,
    MethodFidelity,
    StatisticsRecord,
    TensorRecord,
    TrtCacheRecord,
    TuneRecord,
)
from calibkit.results.runs import ConfidenceBand, Difference, HoldoutVerdict, PlanEvidence, Range
from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange

TABLE = CalibrationTable("ab" * 32, "set-1", Method.ENTROPY, MethodParams(num_bins=1024),
                         (TensorRange("x", 2.5, Method.ENTROPY), TensorRange("y", 0.0, Method.MINMAX)),
                         {"model": "/m/model.onnx", "onnx_version": "1.17"})


def _every_field() -> CalibrationDocument:
    return CalibrationDocument(
        table=TABLE, target="onnxruntime", op_types=("MatMul",), exclude=("head*",), quantized_nodes=("a", "b"),
        kept_nodes=("c",), missing_ranges=("z",), files={"model": "model.int8.onnx"}, zero_ranges=("y",),
        fused_fp32=("attn",),
        tensors={"x": TensorRecord(2.5, 2.5 / 127, "entropy", count=10, nan=0, posinf=0, neginf=1, min=-3.0,
                                   max=2.0, absmax=3.0, p99_99=2.9),
                 "y": TensorRecord(0.0, 0.0, "minmax")},
        calibration_set=CalibrationSetRecord("set-1", "../set", "cd" * 32, 40, 2, None),
        statistics=StatisticsRecord(True, 1024, {"samples": 40, "unmasked": ["t"], "probe_seconds": 0.5}),
        trt_cache=TrtCacheRecord("EntropyCalibration2", 1, source="c.cache", unmatched=("u",), zero=(),
                                 non_finite=("n",)),
        warnings=("w",),
        clipping=(ClipRecord("softmax", "entropy", ("p",), (0.1,), (1.0,), 4, 3.0, "use minmax", "clipped"),),
        source_model="../model/model.onnx", tokenizer="../model", tune=TuneRecord(1.0, False),
        timings={"total": 1.5}, paths="relative to this document's folder",
        sha256=DocumentDigests(source_model="ef" * 32, files={"model": "01" * 32}),
    )


def test_a_document_round_trips_through_the_codec() -> None:
    doc = _every_field()
    written = json.loads(dumps_json(document_json(doc)))
    assert written["format"] == CALIBRATION_FORMAT
    assert written["table"] == TABLE.to_dict()  # the table keeps its own form: each range with its scale
    assert parse_document(CalibrationDocument, written) == doc
    bare = CalibrationDocument(table=TABLE)
    assert document_json(bare) == {"format": CALIBRATION_FORMAT, "table": TABLE.to_dict()}  # absent: not written
    assert parse_document(CalibrationDocument, document_json(bare)) == bare


def test_another_format_or_a_broken_table_is_refused() -> None:
    with pytest.raises(DataError, match="calibkit-calibration/1"):
        parse_document(CalibrationDocument, {"format": "calibkit-calibration/2", "table": TABLE.to_dict()})
    broken = {"format": CALIBRATION_FORMAT, "table": {**TABLE.to_dict(), "method": "guess"}}
    with pytest.raises(DataError, match=r"\$\.table is not a calibration table"):
        parse_document(CalibrationDocument, broken)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("caldoc")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CALIBKIT_CACHE", str(tmp / "cache"))
        write_model_dir(tmp / "model")
        write_calibration_set(tmp / "set", texts(24, seed=3), None)
        md = ModelDir.resolve(tmp / "model")
        calibrate(CalibrateRequest(model=md, calibration_set=tmp / "set", method=Method.ENTROPY, out=tmp / "cal",
                                   exclude=("nothing*",)))
        calibrate(CalibrateRequest(model=md, from_cache=tmp / "cal" / "calibration.cache", out=tmp / "fc"))
    return tmp


# the keys the writer wrote before calibration.json was typed, per writer and per object
CALIBRATE_KEYS = {"calibration_set", "clipping", "exclude", "files", "format", "fused_fp32", "kept_nodes",
                  "missing_ranges", "op_types", "paths", "quantized_nodes", "sha256", "source_model", "statistics",
                  "table", "target", "tensors", "timings", "tokenizer", "trt_cache", "warnings", "zero_ranges"}
FROM_CACHE_KEYS = CALIBRATE_KEYS - {"calibration_set", "clipping", "fused_fp32", "statistics"}
TENSOR_KEYS = {"amax", "scale", "method", "count", "nan", "posinf", "neginf", "min", "max", "absmax", "p99_99"}
STATISTICS_KEYS = {"reused", "num_bins", "samples", "batches", "padding_fraction", "unmasked", "session_seconds",
                   "probe_seconds", "inference_seconds", "statistics_seconds", "statistics_threads",
                   "statistics_cpu_seconds", "overlapped", "largest_batch_tapped_bytes", "runner_calls",
                   "model_sha256", "calibration_set_id", "stats_set_key", "texts", "truncated", "max_length",
                   "max_length_source", "batch_size", "max_batch_tokens", "memory_budget_bytes"}


def test_calibrate_writes_the_keys_it_wrote_before_in_the_codec_s_bytes(written: Path) -> None:
    for folder, keys in (("cal", CALIBRATE_KEYS), ("fc", FROM_CACHE_KEYS)):
        path = written / folder / "calibration.json"
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
        assert set(doc) == keys, folder
        assert all(set(t) == (TENSOR_KEYS if folder == "cal" else {"amax", "scale", "method"})
                   for t in doc["tensors"].values())
        cf = load_calibration_json(path)
        assert cf.document is not None and dumps_json(document_json(cf.document)) == text  # parsed back exactly
    cal = json.loads((written / "cal" / "calibration.json").read_text())
    assert set(cal["statistics"]) == STATISTICS_KEYS
    assert set(cal["calibration_set"]) == {"id", "path", "manifest_sha256", "texts", "truncated", "max_length"}
    assert set(cal["trt_cache"]) == {"algorithm", "version"}
    assert set(cal["sha256"]) == {"source_model", "tokenizer", "labels", "files"}
    assert set(cal["sha256"]["files"]) == {"model", "cache", "stats"}
    fc = json.loads((written / "fc" / "calibration.json").read_text())
    assert set(fc["trt_cache"]) == {"algorithm", "version", "source", "unmatched", "zero", "non_finite"}


def test_readers_get_typed_values(written: Path) -> None:
    cf = load_calibration_json(written / "cal")
    doc = cf.document
    assert doc is not None and doc.statistics is not None and doc.calibration_set is not None
    assert doc.statistics.reused is False and doc.statistics.num_bins == cf.table.params.num_bins
    assert doc.statistics.collected["texts"] == doc.calibration_set.texts == 24
    assert cf.calibration_set == (written / "set").resolve() and cf.source_model == (written / "model" /
                                                                                      "model.onnx").resolve()
    assert cf.tensors[cf.table.ranges[0].tensor].amax == cf.table.ranges[0].amax
    assert doc.warnings and "--exclude 'nothing*'" in doc.warnings[0]
    assert cf.sha256.files is not None and set(cf.sha256.files) == {"model", "cache", "stats"}


def test_a_document_of_an_earlier_version_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before paths were recorded relative to the document (no ``paths``, no ``sha256``), before zero ranges,
    fused ops and clipping were recorded, and with a key this version does not know."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old").mkdir()
    old = {
        "format": CALIBRATION_FORMAT, "table": TABLE.to_dict(), "target": "tensorrt", "op_types": ["MatMul"],
        "exclude": [], "tensors": {"x": {"amax": 2.5, "scale": 2.5 / 127, "method": "entropy", "count": 10,
                                         "nan": 0, "posinf": 0, "neginf": 0, "min": -1.0, "max": 2.5,
                                         "absmax": 2.5, "p99_99": 2.4}},
        "calibration_set": {"id": "set-1", "path": "sets/one", "manifest_sha256": "", "texts": 40, "truncated": 0,
                            "max_length": 128},
        "statistics": {"reused": False, "num_bins": 1024, "samples": 40},
        "trt_cache": {"algorithm": "EntropyCalibration2", "version": 1}, "warnings": [],
        "quantized_nodes": ["a"], "kept_nodes": [], "missing_ranges": [],
        "files": {"model": "model.int8.onnx", "cache": "calibration.cache"},
        "source_model": "models/m/model.onnx", "tokenizer": "models/m", "timings": {"total": 3.0},
        "written_by_an_old_version": {"kept": True},
    }
    (tmp_path / "old" / "calibration.json").write_text(json.dumps(old))
    cf = load_calibration_json(tmp_path / "old")
    assert cf.table == TABLE and cf.op_types == ("MatMul",) and cf.quantized_nodes == ("a",)
    assert cf.source_model == Path(os.path.abspath("models/m/model.onnx"))  # from the folder the run ran in
    assert cf.calibration_set == Path(os.path.abspath("sets/one"))
    assert cf.document is not None and cf.document.zero_ranges is None and cf.document.paths is None
    assert cf.sha256 == DocumentDigests() and cf.tensors["x"].p99_99 == 2.4
    assert cf.raw["calibration_set"]["path"] == os.path.abspath("sets/one")
    cf.check_named_files()  # nothing recorded to check against, nothing there: no error


def test_a_mistyped_field_is_refused_naming_it(tmp_path: Path) -> None:
    doc = json.loads(dumps_json(document_json(_every_field())))
    doc["calibration_set"]["texts"] = "forty"
    (tmp_path / "calibration.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=r"\$\.calibration_set\.texts should be an integer"):
        load_calibration_json(tmp_path)


def test_a_table_with_extras_is_written_as_its_document(tmp_path: Path) -> None:
    """The form tune writes: the same bytes as the typed document with those fields."""
    extras = {"target": "tensorrt", "op_types": ["MatMul"], "exclude": [], "files": {"model": "m.onnx"},
              "tune": {"max_drop": 1.0, "relative": True}}
    write_calibration_json(tmp_path / "a.json", TABLE, extras)
    write_calibration_json(tmp_path / "b.json", CalibrationDocument(
        table=TABLE, target="tensorrt", op_types=("MatMul",), exclude=(), files={"model": "m.onnx"},
        tune=TuneRecord(1.0, True)))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert set(json.loads((tmp_path / "a.json").read_text())) == {*extras, "format", "table", "paths", "sha256"}
    with pytest.raises(TypeError, match="no field target_typo"):  # never dropped silently
        write_calibration_json(tmp_path / "c.json", TABLE, {"target_typo": "tensorrt"})


# ---------------------------------------------------------------- the demo's summary.json

# the keys of summary.json as the demo wrote them before the summary was typed
DEMO_KEYS = {"format", "calibkit_version", "variant", "model_accuracy_recorded", "eval_examples", "calibration_set",
             "calibration_texts", "fp32_accuracy", "method_accuracy", "method_fidelity", "best_method",
             "best_method_by", "statistics_reused", "smoothing", "compare_fp32_vs_int8", "compare_fp16_vs_int8",
             "tune", "tune_by_method", "embedder", "int8_engine", "deploy", "timings_s"}


def _demo_summary() -> DemoSummary:
    rng = Range(0.9, 0.85, 0.95)
    diff = Difference(-0.01, -0.03, 0.01, 3, 1, 200, 0.6, False, "not significant", 1800)
    verdict = HoldoutVerdict(True, "the plan keeps 99 % agreement", {"agreement": "supported"})
    return DemoSummary(
        calibkit_version="0.2.0", variant="fast", model_accuracy_recorded=0.75, eval_examples=200,
        calibration_set="sets/demo", calibration_texts=64, fp32_accuracy=0.75,
        method_accuracy={"mse": 0.74, "mse + smoothing": 0.745},
        method_fidelity={"mse": MethodFidelity(rng, diff, rng, 4, 200, 0.01)}, best_method="mse",
        best_method_by="fewest flips", statistics_reused={"mse": False, "mse + smoothing": True},
        smoothing=DemoSmoothing("runs/smoothed", "auto", 12, 10, 6e-7, (3.5, 14.0)),
        compare_fp32_vs_int8=DemoCompare(0.98, rng, diff, ("a",), (), (ConfidenceBand(0.0, 0.1, 20, 3),),
                                         ("w",), {"A": 0.75, "B": None}),
        compare_fp16_vs_int8=DemoCompareFp16(0.99, {"A": 0.75, "B": 0.74}),
        tune=DemoTune(True, 1.0, ("n1",), 0.9, 0.75, 0.74, 0.745, 0.75, 99.0, "mse", 0.99, 0.98,
                      PlanEvidence(diff, rng, 3, 60), verdict, 60, 2, "runs/tune", "model", None, None, 100, 40),
        tune_by_method={"entropy": DemoMethodTune(False, (), 1.0, None, 0.7, 0.71, 5, 0.75, 0.74)},
        embedder=DemoEmbedder("embedder", True, 95.0, 0.995, 0.8, ("e",), "auto", True, 300, 100, 0.96, 0.999,
                              0.9, 0.99, verdict, 200, 0.97, 0.9, 0.998),
        int8_engine=DemoEngine("tensorrt", "runs/engines/int8-mse.onnx"),
        deploy=DemoDeploy("runs/serving", "demo-fast", (32, 128), 0.12, 0.4, (8, 16), "../../runs/serving/README.md"),
        timings_s={"calibrate": 12.5, "total": 80.0},
    )


def test_the_demo_summary_round_trips_and_keeps_its_keys() -> None:
    summary = _demo_summary()
    doc = json.loads(dumps_json(document_json(summary)))
    assert doc["format"] == DEMO_FORMAT and set(doc) == DEMO_KEYS
    assert doc["method_fidelity"]["mse"]["accuracy_minus_fp32"] == {
        "estimate": -0.01, "low": -0.03, "high": 0.01, "level": 0.95, "a_only": 3, "b_only": 1, "n": 200,
        "mcnemar_p": 0.6, "significant": False, "verdict": "not significant", "examples_to_settle": 1800}
    parsed = parse_document(DemoSummary, doc)
    assert parsed == summary
    # what came after the typed summary: the estimate, and what deploy shipped and measured, written when known
    from calibkit.results.runs import TimeEstimate

    later = replace(summary, time_estimate=TimeEstimate(0.01, 64, 100.0, 300.0, actual_seconds=120.0),
                    deploy=replace(summary.deploy, layout="tensorrt", agreement_with_fp32=0.991))
    doc = json.loads(dumps_json(document_json(later)))
    assert set(doc) == DEMO_KEYS | {"time_estimate"} and doc["deploy"]["layout"] == "tensorrt"
    assert parse_document(DemoSummary, doc) == later
    assert _index(parsed) == _index(summary)  # the index page renders from the typed value
    md = _index(summary)[0]
    assert "**mse**" in md and "3 of 20 texts under 0.1" in md and "[Serving" in md
    no_extras = replace(summary, smoothing=None, embedder=None, deploy=None)
    assert parse_document(DemoSummary, json.loads(dumps_json(document_json(no_extras)))) == no_extras
    assert document_json(no_extras)["embedder"] is None  # written as null, as before


def test_a_tokenizer_without_label_names_is_recorded_with_labels_null(tmp_path: Path) -> None:
    """An embedder's folder has no id2label: its labels digest is written as null beside the tokenizer's, as the
    writer did before the document was typed (and left out where no tokenizer is recorded)."""
    write_model_dir(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    del config["id2label"]
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    (tmp_path / "run").mkdir()
    path = write_calibration_json(tmp_path / "run" / "calibration.json", TABLE,
                                  {"target": "tensorrt", "tokenizer": str(tmp_path / "model")})
    text = path.read_text(encoding="utf-8")
    digests = json.loads(text)["sha256"]
    assert set(digests) == {"tokenizer", "labels"} and digests["labels"] is None
    cf = load_calibration_json(path)
    assert cf.sha256.labels is None and cf.document is not None
    assert dumps_json(document_json(cf.document)) == text
    assert "labels" not in json.loads(write_calibration_json(tmp_path / "run" / "bare.json", TABLE, {}).read_text(
        encoding="utf-8"))["sha256"]
