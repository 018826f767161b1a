"""`calibkit build` for ONNX Runtime on a tiny model folder: each precision, the sidecar, and CLI errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from calibkit._io import sha256_file
from calibkit.cli import app
from calibkit.enginefiles.artifact import EngineArtifact, sidecar_path
from calibkit.enginefiles.registry import open_runner
from calibkit.errors import ModelError
from calibkit.quantize.tablefile import write_calibration_json
from calibkit.types import Backend, CalibrationTable, Method, MethodParams, Precision, TensorRange

RNG = np.random.default_rng(11)
W1 = (RNG.standard_normal((6, 12)) * 0.4).astype(np.float32)
W2 = (RNG.standard_normal((12, 2)) * 0.4).astype(np.float32)
X = RNG.standard_normal((3, 6)).astype(np.float32)


def _model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="/l1/MatMul"),
        helper.make_node("Erf", ["h"], ["e"], name="/act/Erf"),
        helper.make_node("MatMul", ["e", "W2"], ["logits"], name="/classifier/MatMul"),
    ]
    g = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(W2, "W2")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    onnx.save(_model(), str(d / "model.onnx"))
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    (d / "config.json").write_text('{"id2label": {"0": "neg", "1": "pos"}}', encoding="utf-8")
    return d


def _calibration(model_dir: Path, path: Path, sha: str | None = None, target: str = "tensorrt") -> Path:
    h = X @ W1
    amax = {"x": float(np.abs(X).max()), "e": float(np.abs(np.tanh(h)).max()) + 0.2}
    table = CalibrationTable(
        sha if sha is not None else sha256_file(model_dir / "model.onnx"), "set", Method.MINMAX, MethodParams(),
        tuple(TensorRange(t, a, Method.MINMAX) for t, a in amax.items()),
    )
    return write_calibration_json(path, table, {"target": target, "exclude": []})


def _run(args: list[str]):
    return CliRunner().invoke(app, args)


def _logits(path: Path) -> np.ndarray:
    with open_runner(path) as r:
        return r.infer({"x": X})["logits"]


def test_fp32_copy_and_sidecar(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "engines" / "m.fp32.onnx"
    res = _run(["build", str(model_dir), "--precision", "fp32", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == (model_dir / "model.onnx").read_bytes()
    art = EngineArtifact.load(out)
    assert art.precision is Precision.FP32 and art.backend is Backend.ONNXRUNTIME
    assert art.source_model_sha256 == sha256_file(model_dir / "model.onnx")
    assert Path(art.source_model).samefile(model_dir / "model.onnx")
    assert Path(art.tokenizer).samefile(model_dir)
    assert art.calibration_json is None and art.versions["onnx"] == onnx.__version__


def test_fp16(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.fp16.onnx"
    res = _run(["build", str(model_dir), "-p", "fp16", "-o", str(out)])
    assert res.exit_code == 0, res.output
    art = EngineArtifact.load(out)
    assert art.precision is Precision.FP16
    assert set(art.kept_higher_precision) == {"/act/Erf", "/classifier/MatMul"}
    res = _run(["build", str(model_dir), "-p", "fp16", "-x", "^/l1/", "-o", str(tmp_path / "k.onnx")])
    assert res.exit_code == 0, res.output
    assert "/l1/MatMul" in EngineArtifact.load(tmp_path / "k.onnx").kept_higher_precision
    types = {i.name: i.data_type for i in onnx.load(str(out)).graph.initializer}
    assert types["W1"] == TensorProto.FLOAT16
    ref = _logits(model_dir / "model.onnx")
    np.testing.assert_allclose(_logits(out), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("recorded", "target", "built"), [
    ("tensorrt", None, "tensorrt"), ("onnxruntime", None, "onnxruntime"), ("tensorrt", "tensorrt", "tensorrt"),
    ("tensorrt", "onnxruntime", "onnxruntime"), ("onnxruntime", "tensorrt", "tensorrt"),
])
def test_int8_from_calibration(model_dir: Path, tmp_path: Path, recorded: str, target: str | None,
                               built: str) -> None:
    """Without --target the build follows the layout calibration.json records (the INT8 model calibrate and tune
    measured), whatever the backend's own; another layout is built with a warning naming both."""
    cal = _calibration(model_dir, tmp_path / "cal" / "calibration.json", target=recorded)
    out = tmp_path / "m.int8.onnx"
    args = ["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "-o", str(out)]
    res = _run(args + (["--target", target] if target else []))
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    # the layout is said as built, beside the backend that runs it (it said "(int8, onnxruntime)" for both)
    assert f"(int8, {built} Q/DQ layout, onnxruntime backend)" in said
    assert (f"records the {recorded} Q/DQ layout" in said) == (built != recorded)
    assert (f"pass --target {recorded} for the measured one" in said) == (built != recorded)
    art = EngineArtifact.load(out)
    assert art.precision is Precision.INT8
    assert Path(art.calibration_json).samefile(cal) and art.calibration_sha256 == sha256_file(cal)
    assert art.extra.target == built and art.extra.measured_layout == recorded
    m = onnx.load(str(out))
    zp = next(i for i in m.graph.initializer if i.name == "x_zero_point")
    assert zp.data_type == (TensorProto.INT8 if built == "tensorrt" else TensorProto.UINT8)
    ref, got = _logits(model_dir / "model.onnx"), _logits(out)
    assert not np.array_equal(ref, got)
    np.testing.assert_allclose(got, ref, atol=0.05 * np.abs(ref).max())


def test_int8_exclude_and_qdq_copy(model_dir: Path, tmp_path: Path) -> None:
    cal = _calibration(model_dir, tmp_path / "calibration.json", target="onnxruntime")
    first = tmp_path / "a.onnx"
    res = _run(["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "-x", "classifier", "-o", str(first)])
    assert res.exit_code == 0, res.output
    assert EngineArtifact.load(first).kept_higher_precision == ("/classifier/MatMul",)
    second = tmp_path / "b.onnx"
    res = _run(["build", str(model_dir), "-p", "int8", "--qdq", str(first), "-o", str(second)])
    assert res.exit_code == 0, res.output
    assert "(int8, onnxruntime Q/DQ layout, onnxruntime backend)" in " ".join(res.output.split())
    assert second.read_bytes() == first.read_bytes()
    art = EngineArtifact.load(second)
    assert Path(art.calibration_json).samefile(cal)  # carried over from the Q/DQ model's own sidecar
    assert art.kept_higher_precision == ("/classifier/MatMul",)


def _nothing_written(tmp_path: Path, out: Path) -> None:
    assert not out.exists() and not sidecar_path(out).exists()
    assert not [p for p in tmp_path.rglob("*.tmp")]


@pytest.mark.parametrize(
    ("extra", "code", "needle"),
    [
        (["-p", "int8"], 2, "exactly one of --calibration and --qdq"),
        (["-p", "int4"], 2, "unknown --precision"),
        (["-p", "fp32", "--backend", "tensorflow"], 2, "unknown --backend"),
        (["-p", "fp32", "--max-seq", "64"], 2, "only apply to --backend tensorrt"),
        (["-p", "fp16", "--target", "tensorrt"], 2, "--target only applies"),
        (["-p", "fp32", "-x", "classifier"], 2, "not to fp32"),
        (["-p", "fp16", "-x", "("], 2, "not a valid regular expression"),
        (["-p", "int8", "--calibration", "nowhere/calibration.json"], 5, "calibration file not found"),
    ],
)
def test_cli_errors(model_dir: Path, tmp_path: Path, extra: list[str], code: int, needle: str) -> None:
    out = tmp_path / "out.onnx"
    res = _run(["build", str(model_dir), *extra, "-o", str(out)])
    assert res.exit_code == code, res.output
    assert needle in " ".join(res.output.split())
    assert "Traceback" not in res.output
    _nothing_written(tmp_path, out)


def test_cli_missing_model_and_wrong_suffix(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "out.onnx"
    res = _run(["build", str(tmp_path / "nope"), "-o", str(out)])
    assert res.exit_code == 4 and "model not found" in res.output
    res = _run(["build", str(model_dir), "-o", str(tmp_path / "out.engine")])
    assert res.exit_code == 2 and ".onnx file" in res.output
    _nothing_written(tmp_path, out)


def test_cli_table_of_another_model(model_dir: Path, tmp_path: Path) -> None:
    cal = _calibration(model_dir, tmp_path / "calibration.json", sha="0" * 64)
    out = tmp_path / "out.onnx"
    res = _run(["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "-o", str(out)])
    assert res.exit_code == 5 and "another model" in res.output
    _nothing_written(tmp_path, out)


def test_cli_qdq_that_is_not_quantized(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    res = _run(["build", str(model_dir), "-p", "int8", "--qdq", str(model_dir / "model.onnx"), "-o", str(out)])
    assert res.exit_code == 4 and "not a Q/DQ INT8 model" in " ".join(res.output.split())
    _nothing_written(tmp_path, out)


@pytest.mark.parametrize(("flag", "saturates", "bits"), [
    ("--reduce-range", False, 7), ("--no-reduce-range", True, 8), (None, True, 7), (None, False, 8),
])
def test_int8_weight_bits_follow_the_flag_or_the_cpu(model_dir: Path, tmp_path: Path, monkeypatch,  # noqa: ANN001
                                                      flag: str | None, saturates: bool, bits: int) -> None:
    import calibkit.engines.cpu as cpu

    monkeypatch.setattr(cpu, "int8_gemm_saturates", lambda: saturates)
    cal = _calibration(model_dir, tmp_path / "cal" / "calibration.json", target="onnxruntime")
    out = tmp_path / "m.int8.onnx"
    res = _run(["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "-o", str(out),
                *([flag] if flag else [])])
    assert res.exit_code == 0, res.output
    assert EngineArtifact.load(out).extra.weight_bits == bits
    weights = [numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer
               if i.data_type == TensorProto.INT8]
    assert max(int(np.abs(w).max()) for w in weights) == (63 if bits == 7 else 127)
    from calibkit.engines.onnxruntime import EXACT_QDQ, OnnxRuntimeRunner

    ref = _logits(model_dir / "model.onnx")
    with OnnxRuntimeRunner(out, optimization=EXACT_QDQ) as r:  # 8-bit weights may saturate ORT's kernels here
        np.testing.assert_allclose(r.infer({"x": X})["logits"], ref, atol=0.05 * np.abs(ref).max())
    if bits == 7:  # cannot saturate: ORT's int8 kernels give the same on every CPU
        np.testing.assert_allclose(_logits(out), ref, atol=0.05 * np.abs(ref).max())


def test_reduce_range_with_the_tensorrt_layout_is_refused(model_dir: Path, tmp_path: Path) -> None:
    cal = _calibration(model_dir, tmp_path / "cal" / "calibration.json")
    res = _run(["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "--target", "tensorrt",
                "--reduce-range", "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code != 0 and "onnxruntime layout only" in res.output


def test_a_rebuild_cut_off_between_engine_and_sidecar_is_caught(model_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine is replaced before its sidecar is written: a kill in between must not leave an INT8 file that
    its old sidecar calls FP32, and an interrupt there must not leave the old sidecar without its engine."""
    cal = _calibration(model_dir, tmp_path / "cal" / "calibration.json")
    out = tmp_path / "x.onnx"
    assert _run(["build", str(model_dir), "-p", "fp32", "-o", str(out)]).exit_code == 0
    fp32_sidecar = sidecar_path(out).read_bytes()
    int8 = tmp_path / "int8.onnx"
    assert _run(["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "-o", str(int8)]).exit_code == 0
    # what SIGKILL after the engine's rename leaves: the new engine under the old sidecar
    out.write_bytes(int8.read_bytes())
    with pytest.raises(ModelError, match="describes another file"):
        EngineArtifact.load(out)
    res = _run(["compare", str(int8), str(out), "--eval-set", str(tmp_path / "none.jsonl")])
    assert res.exit_code != 0 and "Traceback" not in res.output
    # a rebuild into the same name is allowed (calibkit's sidecar is there) and repairs the pair
    assert _run(["build", str(model_dir), "-p", "fp32", "-o", str(out)]).exit_code == 0
    assert EngineArtifact.load(out).precision is Precision.FP32 and sidecar_path(out).read_bytes() == fp32_sidecar
    # an interrupt while the sidecar is written: neither the new engine nor the old sidecar stays

    def interrupted(self: EngineArtifact) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(EngineArtifact, "save", interrupted)
    res = _run(["build", str(model_dir), "-p", "int8", "--calibration", str(cal), "-o", str(out)])
    assert res.exit_code == 130, res.output
    assert not out.exists() and not sidecar_path(out).exists()


def test_a_full_disk_names_the_output_not_the_source(model_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import shutil

    def full(src: str, dst: str, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))

    monkeypatch.setattr(shutil, "copyfile", full)
    out = tmp_path / "e" / "fp32.onnx"
    res = _run(["build", str(model_dir), "-p", "fp32", "-o", str(out)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "No space left on device while writing" in text and str(tmp_path / "e") in text
    assert "model/model.onnx" not in text.split("while writing")[1]
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_calibrates_qdq_model_without_a_sidecar_says_what_to_build(model_dir: Path, tmp_path: Path) -> None:
    """compare given calibrate's model.int8.onnx: the hint is the build --qdq command that makes it an engine."""
    run = tmp_path / "runs" / "entropy"
    run.mkdir(parents=True)
    (run / "model.int8.onnx").write_bytes((model_dir / "model.onnx").read_bytes())
    table = CalibrationTable("0" * 64, "set", Method.MINMAX, MethodParams(), ())
    write_calibration_json(run / "calibration.json", table,
                           {"files": {"model": "model.int8.onnx"}, "source_model": str(model_dir / "model.onnx"),
                            "tokenizer": str(model_dir)})
    with pytest.raises(ModelError) as info:
        EngineArtifact.load(run / "model.int8.onnx")
    assert "has no calibkit sidecar" in info.value.message
    assert (f"calibkit build {model_dir} --precision int8 --qdq {run / 'model.int8.onnx'} -o engines/entropy.int8.onnx"
            in (info.value.hint or ""))
    other = tmp_path / "other.onnx"  # an .onnx file no calibration.json names keeps the general hint
    other.write_bytes(b"x")
    with pytest.raises(ModelError) as info:
        EngineArtifact.load(other)
    assert "--qdq" not in (info.value.hint or "") and "calibkit build" in (info.value.hint or "")


def test_build_tensorrt_without_tensorrt_prints_the_trtexec_command(model_dir: Path, tmp_path: Path) -> None:
    """Without TensorRT, `build --backend tensorrt` still fails with the missing-dependency code, but first prints
    the same build as commands to run where TensorRT is (strongly typed, one shape range per input)."""
    from calibkit._deps import available

    if available("tensorrt"):
        pytest.skip("TensorRT is installed here: the build runs instead")
    r = _run(["build", str(model_dir), "--precision", "fp16", "--backend", "tensorrt", "-o",
              str(tmp_path / "m.engine")])
    assert r.exit_code == 7, r.output
    assert "TensorRT is not installed here" in r.output and "trtexec" in r.output
    assert "--stronglyTyped" in r.output and "--minShapes=" in r.output and "--saveEngine=" in r.output
    assert not (tmp_path / "m.engine").exists()
