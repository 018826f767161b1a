"""calibrate warns when a range cuts softmax or GELU outputs far below their observed values."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from calib_helpers import texts, tiny_model, write_model_dir
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from calibkit.calibrate.pipeline import calibrate
from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set
from calibkit.data.modeldir import ModelDir
from calibkit.quantize.rangecheck import GELU, SOFTMAX, harmful_clipping, tensor_families
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.types import Method


def _gelu_graph() -> onnx.ModelProto:
    """x -> MatMul -> decomposed erf GELU -> MatMul; and a plain Mul that is not a GELU."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), n) for n in ("W1", "W2", "W3")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["hd"]),
        helper.make_node("Erf", ["hd"], ["he"]),
        helper.make_node("Add", ["he", "one"], ["ha"]),
        helper.make_node("Mul", ["h", "ha"], ["hm"]),
        helper.make_node("Mul", ["hm", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "W2"], ["y"]),
        helper.make_node("Mul", ["x", "half"], ["xs"]),
        helper.make_node("MatMul", ["xs", "W3"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("y", "z")],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_families_from_producers() -> None:
    assert tensor_families(tiny_model()).get("P") == SOFTMAX
    fam = tensor_families(_gelu_graph())
    assert fam.get("g") == GELU and fam.get("hm") == GELU
    assert "xs" not in fam and "h" not in fam


def test_one_warning_per_family_and_method_with_the_fix() -> None:
    model = tiny_model()
    [w] = harmful_clipping(model, [("P", 0.125, "entropy"), ("H", 0.1, "entropy")], {"P": 0.998, "H": 5.0})
    assert w.family == SOFTMAX and w.tensors == ("P",) and w.method == "entropy" and w.of == 1
    assert "0.125" in w.message and "0.998" in w.message and "--method minmax" in w.message
    assert w.to_dict()["observed_absmax"] == [0.998]
    # a range that keeps most of the peak, or a tensor of no known family, is not warned about
    assert harmful_clipping(model, [("P", 0.7, "mse")], {"P": 0.998}) == ()
    assert harmful_clipping(model, [("H", 0.01, "entropy")], {"H": 5.0}) == ()
    [g] = harmful_clipping(_gelu_graph(), [("g", 0.5, "percentile"), ("xs", 0.01, "percentile")],
                           {"g": 4.0, "xs": 2.0})
    assert g.family == GELU and g.tensors == ("g",) and "smooth" in g.message


def test_calibrate_reports_it_in_the_result_json_and_cli(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(write_model_dir(tmp_path / "model"))
    cset = write_calibration_set(tmp_path / "set", texts(30, seed=7), None)
    res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.PERCENTILE, percentile=20.0,
                                     out=tmp_path / "pct"))
    [w] = res.clipping
    assert w.family == SOFTMAX and w.tensors == ("P",) and w.message in res.warnings
    doc = json.loads((tmp_path / "pct" / "calibration.json").read_text())
    assert doc["clipping"][0]["tensors"] == ["P"] and w.message in doc["warnings"]
    ok = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX, out=tmp_path / "mm"))
    assert ok.clipping == () and not any("clips" in x for x in ok.warnings)
    r = CliRunner().invoke(app, ["calibrate", str(tmp_path / "model"), "-c", str(tmp_path / "set"), "--method",
                                 "percentile", "--percentile", "20", "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "attention Softmax outputs" in flat and "--method minmax" in flat


@pytest.mark.slow
def test_entropy_on_the_demo_model_warns_about_every_attention_softmax(demo_assets_fast, tmp_path, monkeypatch) -> None:
    """The README's first example (--method entropy): all six attention Softmax outputs are cut to ~0.125-0.19
    while they reach 1; mse keeps them."""
    from calibkit.data.sample_pipeline import sample_log
    from calibkit.requests.sample import SampleRequest

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(demo_assets_fast / "model")
    cset = sample_log(SampleRequest(logs=demo_assets_fast / "logs.jsonl", out=tmp_path / "cset", size=128))
    res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp_path / "entropy"))
    soft = [w for w in res.clipping if w.family == SOFTMAX]
    assert len(soft) == 1 and len(soft[0].tensors) == soft[0].of == 6
    assert max(soft[0].amax) < 0.5 and max(soft[0].observed) > 0.9
    mse = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MSE, out=tmp_path / "mse"))
    assert not [w for w in mse.clipping if w.family == SOFTMAX]
