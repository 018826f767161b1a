"""Reading report documents (``results.codec``): strictly, and leniently for hand-edited or older documents; and
formatting values for Markdown and HTML."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from calibkit.errors import DataError
from calibkit.report.formatting import esc_html, esc_md, num, pct, points
from calibkit.report.plots import target_accuracy
from calibkit.results.codec import load_document, load_result, parse_result
from calibkit.results.flags import Flag
from calibkit.results.runs import Comparison, TuneResult

TUNE = {"format": "calibkit-tune/1", "final": {"int8_flops_fraction": 1.0}}  # the least a tune document holds


def test_lenient_dispatches_on_format_and_tolerates_older_versions(caplog: pytest.LogCaptureFixture) -> None:
    assert isinstance(parse_result({"format": "calibkit-compare/1"}, strict=False), Comparison)
    assert isinstance(parse_result(TUNE, strict=False), TuneResult)
    report = parse_result({"format": "calibkit-compare/0", "agreement": 0.5}, strict=False)
    assert isinstance(report, Comparison) and report.agreement == 0.5
    assert "calibkit-compare/0" in caplog.text
    with pytest.raises(DataError, match="calibkit-compare/2 is not the calibkit-compare/1"):  # newer: refused
        parse_result({"format": "calibkit-compare/2", "agreement": 0.5}, strict=False)


def test_lenient_reads_missing_keys_as_absent() -> None:
    report = parse_result({
        "format": "calibkit-compare/1",
        "engines": [{"name": "A", "accuracy": 0.9}],
        "layers": [{"node": "fc1", "flag": "keep-fp16", "sensitivity": {"all_but_this": {"delta": 0.01}}}],
    }, strict=False)
    assert isinstance(report, Comparison)
    assert report.eval_set.path == "" and report.eval_set.count == 0 and report.task.fidelity is None
    engine = report.engines[0]
    assert engine.accuracy == 0.9 and engine.macro_f1 is None and engine.latency_ms.p50 is None
    assert engine.precision == "" and engine.confusion_matrix is None
    layer = report.layers[0]
    assert layer.flag is Flag.KEEP_FP16 and layer.flagged and layer.sqnr_db is None and layer.reasons == ()
    assert layer.sensitivity is not None and layer.sensitivity.all_but_this.delta == 0.01
    assert layer.sensitivity.only_this_int8.delta is None
    assert report.outputs.cosine_mean is None and report.recommendation.keep_in_higher_precision == ()


def test_strict_parse_refuses_missing_keys() -> None:
    with pytest.raises(DataError, match=r"lacks \$\.calibkit_version"):
        parse_result({"format": "calibkit-compare/1"})


@pytest.mark.parametrize(("doc", "message"), [
    ({"agreement": True}, r"\$\.agreement should be a finite number, not true"),  # a bool is not a number
    ({"engines": [{"accuracy": "0.9"}]}, r"\$\.engines\[0\]\.accuracy should be a finite number"),
    ({"engines": ["junk"]}, r"\$\.engines\[0\] should be an object"),
    ({"layers": [{"flag": "keep-fp16", "reasons": ["a", 3]}]}, r"\$\.layers\[0\]\.reasons\[1\] should be a string"),
    ({"layers": [{"flag": "maybe"}]}, r"\$\.layers\[0\]\.flag should be one of 'ok'"),
    ({"layers": [{"index": 1}]}, r"lacks \$\.layers\[0\]\.flag"),  # an enum has no empty value
    ({"histograms": {"t": {"counts": [1, 2]}}}, r"lacks \$\.histograms\.t\.upper"),  # nor a number
    ({"histograms": {"u": {"counts": [1], "upper": 1.0, "thresholds": {"mse": "x"}}}},
     r"\$\.histograms\.u\.thresholds\.mse should be a finite number"),
])
def test_lenient_still_refuses_mistyped_values_naming_the_field(doc: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        parse_result({"format": "calibkit-compare/1", **doc}, strict=False)


def test_numbers_that_are_not_finite_are_absent_where_optional_and_refused_elsewhere() -> None:
    nan, inf = float("nan"), float("inf")
    report = parse_result({"format": "calibkit-compare/1", "agreement": nan,
                           "layers": [{"flag": "ok", "sqnr_db": inf, "amax": -inf}]}, strict=False)
    assert isinstance(report, Comparison)
    assert report.agreement is None and report.layers[0].sqnr_db is None and report.layers[0].amax is None
    with pytest.raises(DataError, match=r"\$\.final\.int8_flops_fraction should be a finite number, not NaN"):
        parse_result({**TUNE, "final": {"int8_flops_fraction": nan}}, strict=False)


@pytest.mark.parametrize(
    ("relative", "expected"), [(False, 0.8444 - 0.02), (True, 0.8444 * 0.98), (None, 0.8444 - 0.02)]
)
def test_tune_target_accuracy(relative: bool | None, expected: float) -> None:
    target: dict[str, object] = {"max_drop": 2.0, "fp32_accuracy": 0.8444}  # points, as `tune --max-drop`
    if relative is not None:
        target["relative"] = relative
    report = parse_result({**TUNE, "target": target}, strict=False)
    assert isinstance(report, TuneResult)
    value = target_accuracy(report.target)
    assert value is not None and math.isclose(value, expected)
    bare = parse_result(TUNE, strict=False)
    assert isinstance(bare, TuneResult) and target_accuracy(bare.target) is None
    stated = parse_result({**TUNE, "target": {**target, "threshold": 0.8}}, strict=False)
    assert isinstance(stated, TuneResult)
    assert target_accuracy(stated.target) == 0.8  # the document's own threshold wins


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
    good.write_text(json.dumps({**TUNE, "peers": []}))
    assert load_document(good)["peers"] == []


def test_load_result_names_the_file_and_the_field(tmp_path: Path) -> None:
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**TUNE, "peers": [{"name": "ORT", "accuracy": "0.8"}]}))
    with pytest.raises(DataError, match=r"edited\.json: \$\.peers\[0\]\.accuracy should be a finite number"):
        load_result(edited, strict=False)
    with pytest.raises(DataError, match=r"edited\.json: the document lacks \$\.calibkit_version"):
        load_result(edited)
    edited.write_text(json.dumps({**TUNE, "peers": [{"name": "ORT", "accuracy": 0.8}]}))
    result = load_result(edited, strict=False)
    assert isinstance(result, TuneResult) and result.peers[0].accuracy == 0.8


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
