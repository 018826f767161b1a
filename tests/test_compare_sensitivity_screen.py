"""compare's per-layer sensitivity runs a layer kept alone in higher precision only where that can change the
layer's flag: the flags are the exhaustive analysis's, on a model where one layer must stay in FP32."""

from __future__ import annotations

import pytest
from test_tune_pipeline import sensitive_folder

import calibkit as ck
import calibkit.evaluate.compare as cmp
from calibkit.evaluate.decisions import NOT_KEPT_ALONE


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("screen")
    ev = sensitive_folder(root, 300)["eval"]
    cal = ck.calibrate(root / "model", root / "cset", method="minmax", out=root / "cal", executor="inline")
    fp = ck.build(root / "model", root / "fp32.onnx")
    q = ck.build(root / "model", root / "int8.onnx", precision="int8", qdq=cal.model_path)
    return {"a": fp.artifact, "b": q.artifact, "eval": ev}


def _compare(engines: dict[str, object], samples: int):  # type: ignore[no-untyped-def]
    return ck.compare(engines["a"], engines["b"], engines["eval"], traffic=None, batch_size=16, speed=False,
                      sensitivity_samples=samples, executor="inline")


@pytest.mark.parametrize("samples", [64, 160])
def test_the_fast_path_flags_what_the_exhaustive_one_flags(engines, samples: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fast = _compare(engines, samples)
    with monkeypatch.context() as m:  # no layer settles: both variants of every layer, as before
        m.setattr(cmp, "cost_settles", lambda thresholds, task: None)
        full = _compare(engines, samples)
    assert [(v.node, v.flag) for v in fast.layers] == [(v.node, v.flag) for v in full.layers]
    assert all(v.sensitivity.all_but_this.accuracy is not None for v in full.layers)
    skipped = [v for v in fast.layers if v.sensitivity.all_but_this.accuracy is None]
    # fc1 (the outlier rounds its input's sentiment dimensions to zero) costs a settled keep quantized alone
    assert [v.node for v in skipped] == ["fc1"] and skipped[0].flag.value == "keep-fp16"
    assert NOT_KEPT_ALONE in skipped[0].reasons
    assert skipped[0].sensitivity.only_this_int8 == full.layer("fc1").sensitivity.only_this_int8
    for v in fast.layers:
        if v not in skipped:  # measured the same way, to the same numbers
            assert v.sensitivity == full.layer(v.node).sensitivity and v.reasons == full.layer(v.node).reasons
    assert fast.keep_in_higher_precision == full.keep_in_higher_precision
