"""Module paths from dynamo name scopes and legacy node names; --exclude written either way."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibkit.names import NAME_SCOPES_KEY, display_names, node_names, unmatched_patterns
from calibkit.quantize.placement import plan_placement


def _graph(dynamo: bool) -> onnx.ModelProto:
    """x -> MatMul(W0) -> MatMul(W1) -> y, named as the dynamo or the legacy exporter names them."""
    inits = [numpy_helper.from_array(np.eye(4, dtype=np.float32), f"w{i}") for i in range(2)]
    modules = ["bert.encoder.layer.4.attention.self.query", "bert.encoder.layer.4.output.dense"]
    nodes = []
    for i, mod in enumerate(modules):
        src = "x" if i == 0 else "h0"
        if dynamo:
            n = helper.make_node("MatMul", [src, f"w{i}"], [f"h{i}"], name=f"node_MatMul_{90 + i}")
            scopes = ["", *[".".join(mod.split(".")[: k + 1]) for k in range(len(mod.split(".")))], f"linear_{i}"]
            entry = n.metadata_props.add()
            entry.key, entry.value = NAME_SCOPES_KEY, repr(scopes)
        else:
            n = helper.make_node("MatMul", [src, f"w{i}"], [f"h{i}"],
                                 name="/" + mod.replace(".", "/").replace("layer/4", "layer.4") + "/MatMul")
        nodes.append(n)
    nodes.append(helper.make_node("Identity", ["h1"], ["y"], name="out"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_dynamo_and_legacy_give_the_same_module_paths() -> None:
    dyn = node_names(_graph(True), ["MatMul"])
    leg = node_names(_graph(False), ["MatMul"])
    assert [n.module for n in dyn.values()] == [n.module for n in leg.values()] == [
        "bert.encoder.layer.4.attention.self.query", "bert.encoder.layer.4.output.dense"]
    assert dyn["node_MatMul_91"].legacy == "/bert/encoder/layer.4/output/dense/MatMul"
    assert leg["/bert/encoder/layer.4/output/dense/MatMul"].legacy == "/bert/encoder/layer.4/output/dense/MatMul"


def test_exclude_in_either_spelling_selects_the_same_node_on_both_exports() -> None:
    for pattern in (r"layer\.4/output", r"layer\.4\.output\.dense", "encoder.layer.4.output.dense$"):
        for dynamo in (True, False):
            p = plan_placement(_graph(dynamo), exclude=[pattern])
            assert len(p.excluded) == 1 and p.unmatched == ()
            assert [n.module for n in p.nodes] == ["bert.encoder.layer.4.attention.self.query"]


def test_unmatched_pattern_is_reported() -> None:
    p = plan_placement(_graph(True), exclude=[r"layer\.7/", "query"])
    assert p.unmatched == (r"layer\.7/",)
    assert unmatched_patterns(["nothing", "dense"], node_names(_graph(False)).values()) == ("nothing",)


def test_display_names_are_module_paths_when_unique() -> None:
    names = list(node_names(_graph(True), ["MatMul"]).values())
    assert list(display_names(names).values()) == [
        "bert.encoder.layer.4.attention.self.query", "bert.encoder.layer.4.output.dense"]
    anon = helper.make_node("MatMul", ["a", "b"], ["c"])
    g = helper.make_graph([anon], "g", [], [])
    assert list(node_names(helper.make_model(g)).values())[0].module == ""
