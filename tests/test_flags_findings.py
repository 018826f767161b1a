"""Flags that share a cause (one method clipping a family of tensors) become one finding with the fix."""

from __future__ import annotations

from calibkit.evaluate.findings import FlaggedInput, group_flags, strongest
from calibkit.quantize.rangecheck import GELU, SOFTMAX
from calibkit.results.flags import Flag, LayerFlag, Thresholds

INSUFF = LayerFlag(Flag.INSUFFICIENT, ("quantizing only this layer costs 0.9 points: insufficient evidence",))
KEEP = LayerFlag(Flag.KEEP_FP16, ("output SQNR 12.0 dB < 20 dB",))
OK = LayerFlag(Flag.OK, ())


def _attention(i: int, flag: LayerFlag, amax: float = 0.125) -> list[FlaggedInput]:
    node = f"/layer.{i}/attention/context/MatMul"
    return [FlaggedInput(node, f"probs_{i}", flag, SOFTMAX, "entropy", amax, 0.998, 0.02),
            FlaggedInput(node, f"value_{i}", flag, None, "entropy", 3.0, 3.5, 0.0)]


def test_six_clipped_softmax_outputs_are_one_finding() -> None:
    items = [x for i in range(6) for x in _attention(i, KEEP if i == 2 else INSUFF)]
    items.append(FlaggedInput("/layer.0/output/dense/MatMul", "h0", KEEP, None, "entropy", 5.0, 9.0, 0.01))
    items.append(FlaggedInput("/layer.1/output/dense/MatMul", "h1", OK))
    findings, rest = group_flags(items)
    [f] = findings
    assert f.family == SOFTMAX and f.method == "entropy" and f.cause == "clipping"
    assert [m.tensor for m in f.members] == [f"probs_{i}" for i in range(6)]
    assert [m.tensor for m in f.same_nodes] == [f"value_{i}" for i in range(6)]  # the other input of each node
    assert len(f.nodes) == 6 and f.flag_counts == {"keep-fp16": 2, "insufficient-evidence": 10}
    msg = f.message
    assert "6 attention Softmax outputs are clipped by entropy at amax 0.125 while their values reach 0.998" in msg
    assert "12 flagged inputs of 6 nodes" in msg and "--method minmax" in msg
    assert [r.tensor for r in rest] == ["h0"]  # an unrelated flag stays on its own; OK inputs are not returned
    d = f.to_dict()
    assert d["tensors"] == [f"probs_{i}" for i in range(6)] and d["fix"] == f.fix


def test_no_finding_without_a_shared_clipping_cause() -> None:
    # a range that keeps the peaks, a single clipped tensor, or clipping by two different methods
    kept = [x for i in range(4) for x in _attention(i, INSUFF, amax=0.9)]
    findings, rest = group_flags(kept)
    assert findings == () and len(rest) == 8
    one = _attention(0, INSUFF)
    assert group_flags(one)[0] == ()
    mixed = [FlaggedInput("n1", "g1", INSUFF, GELU, "percentile", 0.5, 4.0),
             FlaggedInput("n2", "g2", INSUFF, GELU, "mse", 0.5, 4.0)]
    assert group_flags(mixed)[0] == ()
    # known clipped fraction but no amax: still the shared cause, by the clipped-fraction threshold
    frac = [FlaggedInput(f"n{i}", f"g{i}", INSUFF, GELU, "percentile", None, None, 0.01) for i in range(3)]
    [g] = group_flags(frac, Thresholds(max_clipped_fraction=1e-3))[0]
    assert g.family == GELU and "smooth" in g.fix and len(g.members) == 3
    assert group_flags(frac, Thresholds(max_clipped_fraction=0.1))[0] == ()


def test_strongest_flag() -> None:
    assert strongest([Flag.WATCH, Flag.KEEP_FP16, Flag.INSUFFICIENT]) is Flag.KEEP_FP16
    assert strongest([Flag.KEEP_FP32, Flag.KEEP_FP16]) is Flag.KEEP_FP32 and strongest([]) is Flag.OK
