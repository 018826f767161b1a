"""ONNX Runtime's int8 kernels on CPUs without VNNI: 7-bit weights for the onnxruntime layout, exact Q/DQ
arithmetic when a TensorRT-layout model is evaluated on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_qdq_model import B2, W1, W2, X, fq, run, table_for, tiny_model

from calibkit.engines.cpu import cpu_flags, int8_gemm_saturates
from calibkit.engines.onnxruntime import EXACT_QDQ, evaluation_optimization
from calibkit.errors import UsageError
from calibkit.quantize.qdq import Target, quantize_model
from calibkit.quantize.weights import REDUCED_WEIGHT_MAX, fake_quantize_weight, quantize_weight

CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"


def test_cpu_flags_and_saturation_rule() -> None:
    assert cpu_flags(CPUINFO) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags("no flags here") is None
    assert int8_gemm_saturates("x86_64", {"avx2", "fma"}) is True
    assert int8_gemm_saturates("x86_64", {"avx2", "avx512_vnni"}) is False
    assert int8_gemm_saturates("AMD64", {"avx2", "avx_vnni"}) is False
    assert int8_gemm_saturates("aarch64", {"asimd"}) is False  # ARM's dot-product kernels do not saturate
    assert int8_gemm_saturates("x86_64", set()) is False  # unknown flags: assume a modern CPU


def test_reduced_range_weights_use_seven_bits() -> None:
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    q8, q7 = quantize_weight(w, 1), quantize_weight(w, 1, REDUCED_WEIGHT_MAX)
    assert int(np.abs(q8.values).max()) == 127 and int(np.abs(q7.values).max()) == REDUCED_WEIGHT_MAX
    np.testing.assert_allclose(q7.scale, np.abs(w).max(0) / REDUCED_WEIGHT_MAX, rtol=1e-6)
    err8 = np.abs(fake_quantize_weight(w, 1) - w).max()
    err7 = np.abs(q7.values * q7.scale - w).max()
    assert err8 < err7 < 2.2 * err8  # about one bit coarser, never wrong


def test_onnxruntime_layout_with_reduce_range_matches_its_fake_quant() -> None:
    t = table_for(X)
    res = quantize_model(tiny_model(), t, target=Target.ONNXRUNTIME, reduce_range=True)
    ints = [numpy_helper.to_array(i) for i in res.model.graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert ints and max(int(np.abs(v).max()) for v in ints) == REDUCED_WEIGHT_MAX
    a = t.amax()
    h = fq(X, a["x"]) @ (quantize_weight(W1, 1, 63).values * quantize_weight(W1, 1, 63).scale)
    r = np.maximum(h, 0)
    q2 = quantize_weight(W2, 0, 63)
    want = fq(r, a["r"]) @ (q2.values * q2.scale[:, None]).T + B2
    np.testing.assert_allclose(run(res.model, X)["y"], want, rtol=1e-4, atol=1e-4)


def test_reduce_range_is_refused_for_the_tensorrt_layout() -> None:
    with pytest.raises(UsageError, match="onnxruntime layout only"):
        quantize_model(tiny_model(), table_for(X), target=Target.TENSORRT, reduce_range=True)


def test_tensorrt_layout_is_evaluated_as_exact_qdq(tmp_path: Path) -> None:
    from calibkit.enginefiles.registry import open_runner
    from calibkit.quantize.qdq import save_model

    assert evaluation_optimization("tensorrt") == EXACT_QDQ and evaluation_optimization("onnxruntime") == "all"
    assert evaluation_optimization(None) == "all"
    levels = {}
    for target in (Target.TENSORRT, Target.ONNXRUNTIME):
        p = tmp_path / f"{target.value}.onnx"
        reduce = target is Target.ONNXRUNTIME  # 7-bit weights: ORT's kernels equal exact Q/DQ on every CPU
        save_model(quantize_model(tiny_model(), table_for(X), target=target, reduce_range=reduce).model, p)
        with open_runner(p) as r:  # no sidecar: the layout is read from the zero points
            levels[target.value] = r._optimization  # noqa: SLF001
            got = r.infer({"x": X})["y"]
        np.testing.assert_allclose(got, run(onnx.load(str(p)), X)["y"], rtol=1e-4, atol=1e-4)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(tiny_model(), str(fp32))
    with open_runner(fp32) as r:
        levels["fp32"] = r._optimization  # noqa: SLF001
    assert levels == {"tensorrt": EXACT_QDQ, "onnxruntime": "all", "fp32": "all"}


def test_build_reduce_range_flag_is_checked(tmp_path: Path) -> None:
    from calibkit.building import BuildRequest, validate
    from calibkit.types import Precision

    with pytest.raises(UsageError, match="only applies to --precision int8"):
        validate(BuildRequest(model=tmp_path, output=tmp_path / "m.onnx", precision=Precision.FP16,
                              reduce_range=True))
    with pytest.raises(UsageError, match="come quantized"):
        validate(BuildRequest(model=tmp_path, output=tmp_path / "m.onnx", precision=Precision.INT8,
                              qdq=tmp_path / "q.onnx", reduce_range=False))
