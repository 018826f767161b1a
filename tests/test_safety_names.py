"""A valid model whose node names collide with the names calibkit gives unnamed nodes (an unnamed MatMul at
index 1 beside a node really named ``MatMul_1``) is calibrated, tuned and compared, not refused by ONNX
Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from calib_helpers import texts, tiny_model, write_tokenizer
from cli_helpers import flat, run

from calibkit.data.calibset import write_calibration_set
from calibkit.names import node_labels
from calibkit.quantize.placement import plan_placement


def _colliding_model() -> onnx.ModelProto:
    m = tiny_model()
    assert m.graph.node[1].op_type == "MatMul" and m.graph.node[3].op_type == "MatMul"
    m.graph.node[1].name = ""  # calibkit calls an unnamed node <op>_<index>: MatMul_1
    m.graph.node[3].name = "MatMul_1"  # ... which another node of the model is really named
    onnx.checker.check_model(m)
    return m


def test_names_given_to_unnamed_nodes_are_unique_against_every_name() -> None:
    m = _colliding_model()
    labels = node_labels(m.graph)
    assert len(set(labels)) == len(labels) and labels[3] == "MatMul_1" and labels[1] != "MatMul_1"
    names = [n.name for n in plan_placement(m).nodes]
    assert len(set(names)) == len(names)
    plain = tiny_model()  # without a collision the names are the ones calibkit always gave
    plain.graph.node[1].name = ""
    assert node_labels(plain.graph)[1] == "MatMul_1"


def test_a_model_with_colliding_node_names_is_tuned_and_compared(tmp_path: Path,
                                                                 monkeypatch: object) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))  # type: ignore[attr-defined]
    (tmp_path / "model").mkdir()
    onnx.save(_colliding_model(), str(tmp_path / "model" / "model.onnx"))
    write_tokenizer(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]}) + "\n"
                          for i, t in enumerate(texts(400, seed=2))))
    r = run("tune", tmp_path / "model", "-c", tmp_path / "set", "-e", ev, "--out", tmp_path / "tu", "--no-report")
    assert r.exit_code == 0, r.output
    r = run("calibrate", tmp_path / "model", "-c", tmp_path / "set", "--out", tmp_path / "cal")
    assert r.exit_code == 0, r.output
    for name, extra in (("fp32.onnx", ["--precision", "fp32"]),
                        ("int8.onnx", ["--precision", "int8", "--calibration", tmp_path / "cal" / "calibration.json"])):
        r = run("build", tmp_path / "model", *extra, "-o", tmp_path / name)
        assert r.exit_code == 0, r.output
    r = run("compare", tmp_path / "fp32.onnx", tmp_path / "int8.onnx", "-e", ev, "--no-report")
    assert r.exit_code == 0, flat(r)
