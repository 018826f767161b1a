"""TensorRT backend: the pure profile computation, the clear error without TensorRT, and (gpu) a real build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.engines import tensorrt as trt_backend
from calibkit.engines.tensorrt.profile import profile_from_lengths
from calibkit.errors import MissingDependencyError, UsageError


def test_profile_from_lengths_median_and_p99_rounded_to_8() -> None:
    lengths = np.array([5] * 50 + [9] * 40 + [30] * 9 + [200])
    p = profile_from_lengths(lengths, model_max=512)
    assert p.min_seq == 1
    assert p.opt_seq == int(np.ceil(np.median(lengths)))
    p99 = float(np.percentile(lengths, 99))
    assert p.max_seq == int(np.ceil(p99 / 8) * 8) and p.max_seq % 8 == 0 and p.max_seq >= p99
    assert p.shapes() == ((1, 1), (16, p.opt_seq), (64, p.max_seq))


def test_profile_caps_at_model_max_and_flags_override() -> None:
    assert profile_from_lengths([500, 510, 511], model_max=128).max_seq == 128
    assert profile_from_lengths([500, 510, 511], model_max=128).opt_seq == 128  # opt clipped into [min, max]
    p = profile_from_lengths([10, 20, 30], model_max=512, min_seq=4, opt_seq=16, max_seq=48)
    assert (p.min_seq, p.opt_seq, p.max_seq) == (4, 16, 48)
    assert profile_from_lengths(None, model_max=256).to_dict()["max_seq"] == 256
    assert profile_from_lengths(None, model_max=256).opt_seq == 128


@pytest.mark.parametrize("kw", [{"min_seq": 10, "max_seq": 5}, {"opt_seq": 0}, {"max_seq": 1024}])
def test_profile_rejects_bad_flags(kw: dict[str, int]) -> None:
    with pytest.raises(UsageError):
        profile_from_lengths([10, 20], model_max=512, **kw)


def test_stubs_alone_do_not_count_as_tensorrt() -> None:
    if trt_backend.available():
        pytest.skip("a real TensorRT is installed here")
    with pytest.raises(MissingDependencyError) as exc:
        trt_backend.load_tensorrt()
    assert "--backend onnxruntime" in (exc.value.hint or "")


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "emb")
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 2)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"], name="/emb/Gather"),
        helper.make_node("ReduceMean", ["e"], ["pooled"], name="/pool", axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["logits"], name="/classifier/MatMul"),
    ]
    g = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 2])], [emb, w],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\nc\nd\n", encoding="utf-8")
    return d


@pytest.mark.skipif(trt_backend.available(), reason="TensorRT is installed: the missing-dependency path cannot run")
def test_cli_tensorrt_backend_without_tensorrt(tmp_path: Path) -> None:
    out = tmp_path / "m.engine"
    res = CliRunner().invoke(app, ["build", str(_model_dir(tmp_path)), "--backend", "tensorrt", "-o", str(out)])
    assert res.exit_code == MissingDependencyError.exit_code, res.output
    text = " ".join(res.output.split())
    assert "TensorRT is not installed" in text and "hint:" in text and "Traceback" not in res.output
    assert list(tmp_path.glob("m.engine*")) == []


def _gpu() -> bool:
    return trt_backend.available() and shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True
    ).returncode == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs TensorRT, cuda-python and an NVIDIA GPU")
def test_build_and_run_engine_on_gpu(tmp_path: Path) -> None:
    from calibkit.enginefiles.registry import open_runner

    d = _model_dir(tmp_path)
    out = tmp_path / "m.fp32.engine"
    res = CliRunner().invoke(
        app, ["build", str(d), "--backend", "tensorrt", "--min-seq", "1", "--opt-seq", "8", "--max-seq", "16",
              "-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    assert out.is_file() and out.with_name(out.name + ".timing.cache").is_file()
    assert out.with_name(out.name + ".layers.json").is_file()
    ids = np.array([[2, 4, 5, 3], [2, 6, 3, 0]], dtype=np.int64)
    with open_runner(d / "model.onnx") as ort_runner:
        ref = ort_runner.infer({"input_ids": ids})["logits"]
    with open_runner(out) as runner:
        got = runner.infer({"input_ids": ids})["logits"]
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)
