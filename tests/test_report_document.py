"""Reading report documents forgivingly, and formatting values for Markdown and HTML."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from calibkit.errors import DataError
from calibkit.report.document import CompareReport, TuneReport, load_document, parse_document
from calibkit.report.formatting import esc_html, esc_md, num, pct, points


def test_dispatches_on_format_and_tolerates_other_versions(caplog: pytest.LogCaptureFixture) -> None:
    assert isinstance(parse_document({"format": "calibkit-compare/1"}), CompareReport)
    assert isinstance(parse_document({"format": "calibkit-tune/1"}), TuneReport)
    report = parse_document({"format": "calibkit-compare/2", "agreement": 0.5})
    assert isinstance(report, CompareReport) and report.agreement == 0.5
    assert "calibkit-compare/2" in caplog.text


def test_mistyped_fields_become_none() -> None:
    report = parse_document({
        "format": "calibkit-compare/1",
        "agreement": True,  # a bool is not a number
        "engines": [{"accuracy": "0.9", "confusion_matrix": [[1, 2], [3]], "batch_size": 4.0}, "junk"],
        "layers": [{"index": 1, "sqnr_db": float("inf"), "flag": "keep-fp16", "reasons": ["a", 3, None]}],
        "histograms": {"t": {"counts": [1, -2]}, "u": {"counts": [1, 2], "thresholds": {"mse": "x", "amax": 1}}},
    })
    assert isinstance(report, CompareReport)
    assert report.agreement is None
    assert len(report.engines) == 1
    engine = report.engines[0]
    assert engine.accuracy is None and engine.confusion_matrix is None and engine.batch_size == 4
    layer = report.layers[0]
    assert layer.sqnr_db is None and layer.flagged and layer.reasons == ("a", "3")
    assert [h.tensor for h in report.histograms] == ["u"]
    assert [(t.method, t.amax) for t in report.histograms[0].thresholds] == [("amax", 1.0)]


@pytest.mark.parametrize(
    ("relative", "expected"), [(False, 0.8444 - 0.02), (True, 0.8444 * 0.98), (None, 0.8444 - 0.02)]
)
def test_tune_target_accuracy(relative: bool | None, expected: float) -> None:
    target: dict[str, object] = {"max_drop": 2.0, "fp32_accuracy": 0.8444}  # points, as `tune --max-drop`
    if relative is not None:
        target["relative"] = relative
    report = parse_document({"format": "calibkit-tune/1", "target": target})
    assert isinstance(report, TuneReport)
    assert report.target_accuracy is not None and math.isclose(report.target_accuracy, expected)
    assert parse_document({"format": "calibkit-tune/1"}).target_accuracy is None  # type: ignore[union-attr]
    stated = parse_document({"format": "calibkit-tune/1", "target": {**target, "threshold": 0.8}})
    assert stated.target_accuracy == 0.8  # type: ignore[union-attr]  # the document's own threshold wins


def test_load_document_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_document(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "calibkit-tune/1",\n  "target": ')
    with pytest.raises(DataError, match="line 2"):
        load_document(bad)
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataError, match="cannot read"):
        load_document(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"format": "calibkit-tune/1", "peers": []}))
    assert load_document(good)["peers"] == []


def test_formatting() -> None:
    assert pct(0.84444) == "84.44 %"
    assert pct(None) == "—"
    assert pct(84.4) == "84.40"  # already a percentage: shown as it is
    assert points(-0.0365) == "-3.65 pt"
    assert num(None) == "—" and num(7) == "7" and num(0.5) == "0.500" and num(1.5e-6) == "1.5e-06"
    assert num(123456.7, 1) == "123457"
    assert esc_html('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"
    assert esc_md("a|b\r\nc_d <i>") == r"a\|b c\_d \<i\>"
    assert esc_md(None) == "—"
