"""calibkit deploy end to end on a tiny calibrated model (onnx.helper graph, word-level tokenizer): the repository
is checked by Triton's own schema and by ONNX Runtime, against calibkit's engine, and bad inputs fail clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from calib_helpers import texts, write_model_dir
from deploy_helpers import model_config_pb2, parse_config, write_log
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.data.tokenizer import TextTokenizer
from calibkit.deploy import DeployRequest, deploy
from calibkit.deploy.perfdata import padded_feeds
from calibkit.errors import ModelError
from calibkit.results.codec import dumps
from calibkit.types import Backend, Precision


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """model/, logs.jsonl (request.text; one broken line), calibration_sets/logs-n48-s0, cal/ (minmax)."""
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.sample_pipeline import sample_log
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.requests.sample import SampleRequest
    from calibkit.types import Method

    root = tmp_path_factory.mktemp("deploy")
    model = write_model_dir(root / "model", max_positions=16)
    log = write_log(root / "logs.jsonl", texts(300, seed=3, max_words=13), field="request.text")
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("not json\n")
    cset = sample_log(SampleRequest(logs=log, out=root / "calibration_sets" / "logs-n48-s0", size=48, tokenizer=model))
    cal = calibrate(CalibrateRequest(model=ModelDir.resolve(model), calibration_set=cset, method=Method.MINMAX,
                                     out=root / "cal")).out_dir
    return {"root": root, "model": model, "log": log, "cset": cset.path, "cal": cal}


def _session(path: Path):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def test_onnxruntime_repository(work: dict[str, Path], tmp_path: Path) -> None:
    pb = model_config_pb2()
    res = deploy(DeployRequest(source=work["cal"], out=tmp_path / "repo", name="sentiment"))
    name = tmp_path / "repo" / "sentiment"
    assert res.model_path == name / "1" / "model.onnx" and res.model_path.is_file()
    c = parse_config(name / "config.pbtxt")
    assert c.name == "sentiment" and c.platform == "onnxruntime_onnx"
    assert c.max_batch_size == res.batching.max_batch_size > 0
    assert list(c.dynamic_batching.preferred_batch_size) == list(res.batching.preferred)
    assert c.dynamic_batching.max_queue_delay_microseconds == 1000
    assert [(g.kind, g.count) for g in c.instance_group] == [(pb.ModelInstanceGroup.KIND_CPU, 1)]
    assert [o.label_filename for o in c.output] == ["labels.txt"]
    assert (name / "labels.txt").read_text() == "negative\npositive\n"
    # ONNX Runtime loads the repository's model with exactly the declared inputs, outputs and dims
    sess = _session(res.model_path)
    assert [(i.name, i.type) for i in sess.get_inputs()] == [(i.name, "tensor(int64)") for i in c.input]
    assert all(i.data_type == pb.TYPE_INT64 for i in c.input)
    for decl, real in zip(c.input, sess.get_inputs()):
        assert len(real.shape) == 1 + len(decl.dims) and all(isinstance(d, str) for d in real.shape)
        assert list(decl.dims) == [-1]
    assert [o.name for o in sess.get_outputs()] == [o.name for o in c.output]
    for decl, real in zip(c.output, sess.get_outputs()):
        assert isinstance(real.shape[0], str) and list(decl.dims) == [d if isinstance(d, int) else -1
                                                                       for d in real.shape[1:]]
        assert decl.data_type == pb.TYPE_FP32 and real.type == "tensor(float)"
    # the layout calibrate wrote and measured (tensorrt: int8 activations): calibrate's own Q/DQ model, as it is
    assert res.layout.shipped == res.layout.measured == "tensorrt"
    assert res.model_path.read_bytes() == (work["cal"] / "model.int8.onnx").read_bytes()
    # the repository's own files
    doc = json.loads((tmp_path / "repo" / "deploy.json").read_text())
    assert doc["format"] == "calibkit-deploy/2" and res.traffic.path == str(work["log"])  # the set's log
    from calibkit.provenance import document_path

    # in the repository, relative to it (nothing of this machine's absolute paths)
    assert document_path(tmp_path / "repo" / "deploy.json", doc["traffic"]["path"]) == Path(work["log"])
    assert doc["traffic"]["broken"] == {"invalid_json": 1} and doc["traffic"]["usable"] == 300
    assert "tritonserver --model-repository" in res.readme.read_text()
    assert (tmp_path / "repo" / "perf_analyzer.sh").stat().st_mode & 0o100
    assert not res.build_script


def test_repository_model_equals_calibkit_engine(work: dict[str, Path], tmp_path: Path) -> None:
    """Bucket-padded requests (as perf_analyzer and clients send them) through the repository's model, at several
    batch sizes, give the outputs of calibkit's own engine (`calibkit build --target onnxruntime`) for the same
    batches. (This tiny model mean-pools over padding, so padding changes its outputs: the padding-invariance
    of a real model is checked in test_deploy_demo.py.)"""
    from calibkit.building import BuildRequest, build
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner

    res = deploy(DeployRequest(source=work["cal"], out=tmp_path / "repo", profiles=3, perf_requests=40))
    eng = build(BuildRequest(model=work["model"], output=tmp_path / "int8.onnx", precision=Precision.INT8,
                             calibration=work["cal"])).artifact
    tok = TextTokenizer(work["model"])
    data = json.loads(res.perf_data.read_text())["data"]
    assert len(data) == 40
    sess = _session(res.model_path)
    names = [i.name for i in sess.get_inputs()]
    corpus = texts(24, seed=9, max_words=13)
    with OnnxRuntimeRunner(eng.path, intra_op_threads=1) as r:
        for bs in (1, 3, 8):
            for s in range(0, len(corpus), bs):
                chunk = corpus[s : s + bs]
                lens = tok.token_lengths(chunk)
                width = int(max(res.choice.bucket_of(int(n)).hi for n in lens))
                feeds = [padded_feeds(tok, t, width, res.choice.max_seq, names) for t in chunk]
                batch = {n: np.concatenate([f[n] for f in feeds]) for n in names}
                got = sess.run(None, batch)[0]
                want = r.infer(batch)[r.output_names[0]]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the perf_analyzer entries are what a client sends: shapes per entry, bucket lengths, masked padding
    his = {b.hi for b in res.choice.buckets}
    for entry in data:
        assert set(entry) == set(names)
        width = entry["input_ids"]["shape"][0]
        assert width in his and len(entry["input_ids"]["content"]) == width
        assert entry["attention_mask"]["shape"] == [width]
        mask = entry["attention_mask"]["content"]
        assert mask[0] == 1 and sorted(mask, reverse=True) == mask
        real = sum(mask)
        assert all(v == 0 for v in entry["input_ids"]["content"][real:])  # the pad id of this tokenizer


def test_tensorrt_repository(work: dict[str, Path], tmp_path: Path) -> None:
    from calibkit.deploy import trtexec
    from calibkit.deploy.engine import read_spec

    pb = model_config_pb2()
    res = deploy(DeployRequest(source=work["cal"], out=tmp_path / "repo", backend=Backend.TENSORRT, profiles=2,
                                                                batch_tokens=64, max_batch=32))
    name = res.out_dir / res.name
    c = parse_config(name / "config.pbtxt")
    assert c.platform == "tensorrt_plan" and c.default_model_filename == "model.plan"
    assert [(g.kind, list(g.profile)) for g in c.instance_group] == [(pb.ModelInstanceGroup.KIND_GPU, ["0", "1"])]
    assert res.model_path is None and not (name / "1" / "model.plan").exists() and (name / "1").is_dir()
    # the ONNX the engine is built from: the TensorRT layout (int8 activations), calibrate's own Q/DQ model
    m = onnx.load(str(res.engine_onnx))
    zps = [i for i in m.graph.initializer if i.name.endswith("zero_point")]
    assert zps and all(z.data_type == onnx.TensorProto.INT8 for z in zps)
    script = res.build_script.read_text()
    assert trtexec.render(res.trtexec[1:]) in script and "--calibkit" in script
    trtexec.check_command(list(res.trtexec))
    b0, b1 = res.choice.buckets
    bs = res.batching.per_bucket
    assert bs == tuple(max(1, min(32, 1 << ((64 // b.hi).bit_length() - 1))) for b in res.choice.buckets)
    ins = [i.name for i in c.input]
    assert f"--minShapes={','.join(f'{n}:1x{b1.lo}' for n in ins)}" in res.trtexec
    assert f"--optShapes={','.join(f'{n}:{bs[1]}x{b1.hi}' for n in ins)}" in res.trtexec
    assert f"--maxShapes={','.join(f'{n}:{res.batching.max_batch_size}x{b0.hi}' for n in ins)}" in res.trtexec
    spec = read_spec(name)
    assert spec.onnx == res.engine_onnx.name and len(spec.profiles) == 2
    assert spec.profiles[1] == {"min_seq": b1.lo, "opt_seq": b1.hi, "max_seq": b1.hi, "min_batch": 1,
                                "opt_batch": bs[1], "max_batch": res.batching.max_batch_size}
    readme = res.readme.read_text()
    assert "TensorRT is not installed where this repository was written" in readme
    assert "build_engine.sh" in readme and "--stronglyTyped" in readme


def test_calibkit_trt_build_uses_every_profile(work: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    """The `--calibkit` path of build_engine.sh hands every profile to calibkit's TensorRT builder."""
    import calibkit.engines.tensorrt.builder as builder
    from calibkit.deploy.engine import build_plan

    res = deploy(DeployRequest(source=work["cal"], out=tmp_path / "repo", backend=Backend.TENSORRT, profiles=2))
    seen = {}

    def fake(data, path, profiles, *, workspace_bytes, progress=None):  # noqa: ANN001, ANN202
        seen.update(data=data, path=path, profiles=profiles, ws=workspace_bytes)
        return builder.TrtBuildResult(path, path, path, "fake")

    monkeypatch.setattr(builder, "build_engine", fake)
    build_plan(res.out_dir / res.name)
    assert seen["data"] == res.engine_onnx.read_bytes() and seen["path"] == res.out_dir / res.name / "1/model.plan"
    assert [(p.min_seq, p.opt_seq, p.max_seq) for p in seen["profiles"]] == [(b.lo, b.hi, b.hi)
                                                                             for b in res.choice.buckets]
    assert seen["ws"] == 4096 << 20


def test_tune_folder_keeps_the_plan_and_finds_the_set(work: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    """A tune output: kept nodes stay FP32 in the served model; the calibration set (recorded only by its id)
    is found under ./calibration_sets and its log is the default traffic."""
    tune = tmp_path / "tune"
    shutil.copytree(work["cal"], tune)
    (tune / ".calibkit-output.json").unlink()  # hand-made from a calibrate folder: no record of calibkit's files
    cal = json.loads((tune / "calibration.json").read_text())
    cal.pop("calibration_set")
    cal.update(source_model=str(work["model"] / "model.onnx"), tokenizer=str(work["model"]))  # moved: absolute
    cal["kept_nodes"] = ["out_proj"]
    cal["files"].pop("model")  # no Q/DQ model of the plan: deploy builds it from the table and the kept nodes
    cal.pop("sha256", None)
    (tune / "model.int8.onnx").unlink()
    (tune / "calibration.json").write_text(json.dumps(cal))
    (tune / "tune.json").write_text(dumps(_tune_result(met=True)))
    monkeypatch.chdir(work["root"])
    res = deploy(DeployRequest(source=tune, out=tmp_path / "repo"))
    assert res.source.kind == "tune" and res.traffic.path == str(work["log"])
    assert not any("the tune run" in w for w in res.warnings)
    m = onnx.load(str(res.model_path))
    node = next(n for n in m.graph.node if n.name == "out_proj")
    assert node.op_type == "MatMul" and not any("DequantizeLinear" in i for i in node.input)
    assert any(n.name == "proj" for n in m.graph.node)


def _tune_result(*, met: bool, traffic: Path | None = None, sha: str = ""):  # type: ignore[no-untyped-def]
    from calibkit.results.runs import Evidence, MethodChoice, TuneEvalSet, TunePlan, TuneResult, TuneTarget

    ev = Evidence(str(traffic), 100, exclusions=(f"log sha256: {sha}",)) if traffic else None
    return TuneResult("0", TuneEvalSet("eval.jsonl", 10, 8, 2, 4, "given", traffic=ev),
                      TuneTarget(False, 0.9, 0.9, 0.85, met), MethodChoice("minmax", "minmax"),
                      TunePlan(("out_proj",), 0.8, "minmax", 0.9))


def test_a_tune_folder_is_measured_on_the_traffic_tune_judged_on(work: dict[str, Path], tmp_path: Path) -> None:
    """No --traffic: the log tune.json names (the one tune judged agreement on) is the traffic, while it holds the
    bytes tune read."""
    from calibkit._io import sha256_file
    from calibkit.errors import DataError

    prod = write_log(tmp_path / "prod.jsonl", texts(90, seed=21, max_words=13))
    tune = work["root"] / "tune-own-traffic"
    shutil.copytree(work["cal"], tune)
    (tune / ".calibkit-output.json").unlink()
    (tune / "tune.json").write_text(dumps(_tune_result(met=True, traffic=prod, sha=sha256_file(prod))))
    res = deploy(DeployRequest(source=tune, out=tmp_path / "repo", measure_texts=500))
    assert res.traffic.path == str(prod) and res.traffic.origin == "tune" and res.traffic.usable == 90
    assert res.measurement.texts + res.measurement.calibration_texts_left_out == 90  # all of it, none calibrated
    (tune / "tune.json").write_text(dumps(_tune_result(met=True, traffic=prod, sha="0" * 64)))
    with pytest.raises(DataError, match="changed since calibkit recorded it"):
        deploy(DeployRequest(source=tune, out=tmp_path / "repo2"))


def test_tune_json_is_read_through_the_codec(work: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    """tune.json is parsed as a TuneResult: a plan that misses its target is deployed with tune's own words as a
    warning, and a file that is not a tune document is refused."""
    tune = work["root"] / "tune-not-met"  # beside the model: calibration.json names it relative to its folder
    shutil.copytree(work["cal"], tune)
    (tune / ".calibkit-output.json").unlink()
    (tune / "tune.json").write_text(dumps(_tune_result(met=False)))
    res = deploy(DeployRequest(source=tune, out=tmp_path / "repo", measure_texts=0))
    assert res.source.kind == "tune"
    assert any("says: target NOT met" in w for w in res.warnings)
    assert "target NOT met" in res.readme.read_text()
    (tune / "tune.json").write_text(json.dumps({"format": "calibkit-tune/1", "final": "x"}))
    from calibkit.errors import UsageError

    with pytest.raises(UsageError, match="is not a calibkit tune document"):
        deploy(DeployRequest(source=tune, out=tmp_path / "repo2"))


def test_engine_source(work: dict[str, Path], tmp_path: Path) -> None:
    from calibkit.building import BuildRequest, build

    eng = build(BuildRequest(model=work["model"], output=tmp_path / "fp16.onnx", precision=Precision.FP16)).artifact
    res = deploy(DeployRequest(source=eng.path, out=tmp_path / "repo", traffic=work["log"], profiles=1))
    assert res.precision is Precision.FP16 and res.name == "model-fp16" and res.choice.k == 1
    assert onnx.load(str(res.model_path)).graph.node  # an ONNX model, converted like the engine
    c = parse_config(res.config_path)
    assert c.output[0].data_type == model_config_pb2().TYPE_FP32  # logits stay float32 in calibkit's FP16 layout


# ---------------------------------------------------------------- CLI and bad inputs


def _cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["deploy", *args], catch_exceptions=False, env={"COLUMNS": "400"})


def test_cli_writes_and_summarises(work: dict[str, Path], tmp_path: Path) -> None:
    r = _cli(str(work["cal"]), "--backend", "tensorrt", "--out", str(tmp_path / "repo"), "--profiles", "2")
    assert r.exit_code == 0, r.output
    assert "chosen" in r.output and "TensorRT is NOT installed here" in r.output
    again = _cli(str(work["cal"]), "--backend", "onnxruntime", "--out", str(tmp_path / "repo"))
    assert again.exit_code == 0, again.output  # a repository calibkit wrote is replaced


@pytest.mark.parametrize("case,code,text", [
    ("not-output", 2, "is not a calibkit output"),
    ("no-text", 3, "no usable text"),
    ("k5", 2, "out of range"),
    ("k-word", 2, "'many' is neither auto nor a whole number"),
    ("backend", 2, "unknown --backend"),
    ("fixed-axes", 4, "fixed batch"),
    ("foreign-out", 2, "holds files calibkit did not write"),
    ("threads-trt", 2, "does not apply to --backend tensorrt"),
    ("bad-name", 2, "is not a Triton model name"),
    ("max-seq", 2, "--max-seq 999 is outside 1..16"),
])
def test_cli_bad_inputs(work: dict[str, Path], tmp_path: Path, case: str, code: int, text: str) -> None:
    out = tmp_path / "repo"
    args = [str(work["cal"]), "--backend", "onnxruntime", "--out", str(out)]
    if case == "not-output":
        (tmp_path / "folder").mkdir()
        (tmp_path / "folder" / "notes.txt").write_text("x")
        args[0] = str(tmp_path / "folder")
    elif case == "no-text":
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"text": ""}\n{"text": null}\n')
        args += ["--traffic", str(bad), "--text-field", "text"]
    elif case == "k5":
        args += ["--profiles", "5"]
    elif case == "k-word":
        args += ["--profiles", "many"]
    elif case == "backend":
        args[2] = "tvm"
    elif case == "fixed-axes":
        from calib_helpers import tiny_model

        src = tmp_path / "fixed"
        shutil.copytree(work["model"], src)
        m = tiny_model()
        for vi in m.graph.input:
            vi.type.tensor_type.shape.dim[0].dim_value = 1
        onnx.save(m, str(src / "model.onnx"))
        from calibkit._io import sha256_file

        cal = tmp_path / "cal"
        shutil.copytree(work["cal"], cal)
        (cal / ".calibkit-output.json").unlink()  # a hand-made folder naming another model, by its own sha256
        doc = json.loads((cal / "calibration.json").read_text())
        doc.update(source_model=str(src / "model.onnx"), tokenizer=str(work["model"]), sha256={})
        doc["table"]["model_sha256"] = sha256_file(src / "model.onnx")
        (cal / "calibration.json").write_text(json.dumps(doc))
        args[0] = str(cal)
    elif case == "threads-trt":
        args[2] = "tensorrt"
        args += ["--threads", "2"]
    elif case == "bad-name":
        args += ["--name", "a/b"]
    elif case == "max-seq":
        args += ["--max-seq", "999"]
    elif case == "foreign-out":
        out.mkdir()
        (out / "mine.txt").write_text("x")
    r = _cli(*args)
    assert r.exit_code == code, r.output
    said = " ".join(r.output.replace("│", " ").split())
    usage = case == "k-word"  # refused by the command line's number parser, as every numeric option is
    assert text in said and ("Try 'calibkit deploy --help'" if usage else "hint:") in said
    assert "Traceback" not in r.output
    assert case == "foreign-out" or not out.exists()


def test_cli_help_teaches() -> None:
    r = CliRunner().invoke(app, ["deploy", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for s in ("Examples:", "calibkit deploy runs/tune-model", "--traffic", "--profiles", "perf_analyzer",
              "build_engine.sh", "trtexec"):
        assert s in r.output


def test_build_tensorrt_without_tensorrt_prints_trtexec(work: dict[str, Path], tmp_path: Path) -> None:
    from calibkit.deploy import trtexec
    from calibkit.engines import tensorrt as trt_backend

    if trt_backend.available():
        pytest.skip("a real TensorRT is installed here")
    r = CliRunner().invoke(app, ["build", str(work["model"]), "--precision", "int8", "--calibration",
                                 str(work["cal"]), "--backend", "tensorrt", "-o", str(tmp_path / "x.engine")],
                           env={"COLUMNS": "400"})
    assert r.exit_code == 7, r.output
    assert "calibkit[tensorrt]" in r.output and not (tmp_path / "x.engine").exists()
    flags = [ln.strip().rstrip(" \\") for ln in r.output.splitlines() if ln.strip().startswith("--")]
    argv = ["trtexec", *flags]
    trtexec.check_command(argv)
    assert f"--onnx={work['cal'] / 'model.int8.onnx'}" in argv and f"--saveEngine={tmp_path / 'x.engine'}" in argv
    assert "--stronglyTyped" in argv and any(a.startswith("--timingCacheFile=") for a in argv)
    assert any(a.startswith("--minShapes=input_ids:1x1,attention_mask:1x1") for a in argv)


def test_engine_without_calibration_table(work: dict[str, Path], tmp_path: Path) -> None:
    """An INT8 engine built from a bare Q/DQ model (no calibration.json anywhere): TensorRT gets it as it is;
    ONNX Runtime gets it too, with a warning that it is not the CPU-fast layout."""
    from calibkit.building import BuildRequest, build

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(work["cal"] / "model.int8.onnx", alone / "q.onnx")
    eng = build(BuildRequest(model=work["model"], output=tmp_path / "eng" / "int8.onnx", precision=Precision.INT8,
                             qdq=alone / "q.onnx")).artifact
    assert eng.calibration_json is None
    trt = deploy(DeployRequest(source=eng.path, out=tmp_path / "trt", backend=Backend.TENSORRT, traffic=work["log"]))
    assert trt.engine_onnx.read_bytes() == (alone / "q.onnx").read_bytes() and not trt.warnings
    ort_res = deploy(DeployRequest(source=eng.path, out=tmp_path / "ort", traffic=work["log"]))
    assert ort_res.model_path.read_bytes() == (alone / "q.onnx").read_bytes()
    assert "served as measured" in ort_res.warnings[0]
    with pytest.raises(ModelError, match="cannot rebuild it in the onnxruntime layout"):  # no table to rebuild from
        deploy(DeployRequest(source=eng.path, out=tmp_path / "other", traffic=work["log"], layout="onnxruntime"))
    from calibkit.errors import UsageError

    with pytest.raises(UsageError, match="calibration set behind") as exc:  # no --traffic, no set to find a log in
        deploy(DeployRequest(source=eng.path, out=tmp_path / "none"))
    assert "--traffic" in (exc.value.hint or "") and not (tmp_path / "none").exists()


def test_build_tensorrt_fallback_refuses_an_onnxruntime_layout_qdq(work: dict[str, Path], tmp_path: Path) -> None:
    from calibkit.building import BuildRequest, build
    from calibkit.engines import tensorrt as trt_backend

    if trt_backend.available():
        pytest.skip("a real TensorRT is installed here")
    ort_layout = build(BuildRequest(model=work["model"], output=tmp_path / "ort.onnx", precision=Precision.INT8,
                                    calibration=work["cal"], target="onnxruntime")).artifact.path
    r = CliRunner().invoke(app, ["build", str(work["model"]), "--precision", "int8", "--qdq", str(ort_layout),
                                 "--backend", "tensorrt", "-o", str(tmp_path / "x.engine")], env={"COLUMNS": "400"})
    assert r.exit_code == 7 and "--stronglyTyped" not in r.output
    assert "uint8 activations" in " ".join(r.output.split())


# ---------------------------------------------------------------- what ships is what was measured


def test_deploy_measures_what_it_writes(work: dict[str, Path], tmp_path: Path) -> None:
    """deploy.json (and the README, and the terminal) carry the written model against FP32 on traffic texts the
    calibration did not see: agreement with its 95 % interval, recomputed here from the two models, and the
    per-batch latency of both on the same batches."""
    from calibkit.data.calibset import load_calibration_set
    from calibkit.deploy.measure import pick_texts
    from calibkit.results.codec import load_typed
    from calibkit.results.documents import DeployResult

    res = deploy(DeployRequest(source=work["cal"], out=tmp_path / "repo", measure_texts=120, measure_batch=4,
                               threads=1))
    m = res.measurement
    assert m is not None and res.measurement_note is None
    assert m.texts == 120 and m.task == "classification" and m.calibration_texts_left_out > 0
    assert m.agreement_ci.low <= m.agreement <= m.agreement_ci.high and m.agreement_ci.high - m.agreement_ci.low > 0
    lat = m.latency
    assert lat.batch_size == 4 and lat.threads == 1
    assert lat.fp32_median_ms > 0 and lat.served_median_ms > 0 and lat.speedup > 0
    # speed as a benchmark measures it, at batch 1 and at the measurement's batch: latency is its batch-4 row
    sp = m.speed
    assert sp is not None and [b.batch_size for b in sp.at] == [1, 4] and sp.threads == 1 and sp.rounds >= 3
    at4 = sp.at_batch(4)
    assert at4 is not None and (lat.batches, lat.speedup, lat.fp32_median_ms) == (
        at4.batches, at4.speedup, at4.reference_ms)
    assert all(b.speedup_low <= b.speedup <= b.speedup_high for b in sp.at)
    # the same texts through both models again: the same agreement. Recomputed exactly as deploy measured
    # (the run's default runner factory, so ONNX Runtime's session options; the threads and batch size the
    # measurement records; texts in the order picked), because INT8 kernels and padding move near-tie texts
    # from one class to the other: another batching or ISA could flip them, this recomputation cannot.
    from calibkit.deploy.traffic import read_traffic
    from calibkit.evaluate.predict import predict_logits
    from calibkit.resources import Runners

    traffic = read_traffic(work["log"], text_field=None).texts
    picked = pick_texts(traffic, load_calibration_set(work["cset"]).texts, 120, 0)
    assert not set(picked.texts) & set(load_calibration_set(work["cset"]).texts)
    tok = TextTokenizer(work["model"])

    def classes(path: Path) -> np.ndarray:
        with Runners()(path, threads=lat.threads) as runner:
            return predict_logits(runner, tok, list(picked.texts), batch_size=m.agreement_batch).argmax(1)

    assert m.agreement == float((classes(work["model"] / "model.onnx") == classes(res.model_path)).mean())
    # deploy.json is the result, through the codec; the README and the terminal say it
    from calibkit.deploy.repository import shipped_result

    assert load_typed(tmp_path / "repo" / "deploy.json", DeployResult) == shipped_result(res, tmp_path / "repo")
    assert f"agreement with FP32 **{100 * m.agreement:.2f} %**" in res.readme.read_text()
    r = _cli(str(work["cal"]), "--backend", "onnxruntime", "--out", str(tmp_path / "cli"), "--measure-texts", "50")
    assert r.exit_code == 0, r.output
    assert "measured on 50 traffic texts: agreement with FP32" in r.output
    assert "speed: " in r.output and "FP32 at batch 1 [" in r.output
    # by default the second batch size is the one Triton is told to prefer for the bucket most requests fall in
    shipped = load_typed(tmp_path / "cli" / "deploy.json", DeployResult)
    buckets = shipped.choice.buckets
    i = max(range(len(buckets)), key=lambda k: buckets[k].requests)
    busiest = shipped.batching.per_bucket[i]
    assert shipped.measurement is not None and shipped.measurement.latency.batch_size == busiest
    assert [b.batch_size for b in shipped.measurement.speed.at] == sorted({1, busiest})
    # of the requests that bucket holds: a server forms that batch size of them only
    lat = shipped.measurement.latency
    assert busiest == 1 or (lat.shortest, lat.longest) == (buckets[i].lo, buckets[i].hi)


def test_measurement_can_be_skipped_and_is_not_made_for_tensorrt(work: dict[str, Path], tmp_path: Path) -> None:
    off = deploy(DeployRequest(source=work["cal"], out=tmp_path / "off", measure_texts=0))
    assert off.measurement is None and "--measure-texts 0" in off.measurement_note
    trt = deploy(DeployRequest(source=work["cal"], out=tmp_path / "trt", backend=Backend.TENSORRT))
    assert trt.measurement is None and "serving GPU" in trt.measurement_note


def test_the_layout_shipped_is_the_measured_one_unless_asked(work: dict[str, Path], tmp_path: Path) -> None:
    """calibrate measured the tensorrt layout: deploy ships it; --layout onnxruntime ships ONNX Runtime's fused
    layout with a loud warning in deploy.json, the README and on the terminal, and deploy measures that model."""
    from calibkit.errors import UsageError

    asked = deploy(DeployRequest(source=work["cal"], out=tmp_path / "ort", layout="onnxruntime", measure_texts=40))
    assert asked.layout.shipped == "onnxruntime" and asked.layout.measured == "tensorrt"
    assert not asked.layout.as_measured and asked.layout.requested == "onnxruntime"
    m = onnx.load(str(asked.model_path))
    assert any(i.name.endswith("zero_point") and i.data_type == onnx.TensorProto.UINT8 for i in m.graph.initializer)
    assert any("SHIPPING AN UNMEASURED LAYOUT" in w for w in asked.warnings)
    assert "SHIPPING AN UNMEASURED LAYOUT" in asked.readme.read_text()
    assert asked.measurement is not None and asked.measurement.texts == 40
    r = _cli(str(work["cal"]), "--backend", "onnxruntime", "--out", str(tmp_path / "cli"), "--layout", "onnxruntime",
             "--measure-texts", "0")
    assert r.exit_code == 0 and "SHIPPING AN UNMEASURED LAYOUT" in r.output
    assert "NOT the measured tensorrt layout" in r.output
    with pytest.raises(UsageError, match="cannot be built by TensorRT"):
        deploy(DeployRequest(source=work["cal"], out=tmp_path / "x", backend=Backend.TENSORRT, layout="onnxruntime"))
    with pytest.raises(UsageError, match="unknown --layout"):
        deploy(DeployRequest(source=work["cal"], out=tmp_path / "x", layout="int4"))


def test_ck_deploy_returns_the_typed_result(work: dict[str, Path], tmp_path: Path) -> None:
    import calibkit as ck
    from calibkit.errors import UsageError

    res = ck.deploy(work["cal"], tmp_path / "repo", profiles=2, measure_texts=30)
    assert isinstance(res, ck.DeployResult) and res.out_dir == tmp_path / "repo" and res.choice.k == 2
    assert res.measurement.texts == 30
    for bad, message in (({"measure_texts": -1}, "--measure-texts must be at least 0"),
                         ({"profiles": "2"}, "--profiles must be a whole number"),
                         ({"max_batch": True}, "--max-batch must be a whole number"),
                         ({"backend": "tvm"}, "unknown --backend"), ({"layout": "int4"}, "unknown --layout")):
        with pytest.raises(UsageError, match=message):
            ck.deploy(work["cal"], tmp_path / "bad", **bad)
    assert not (tmp_path / "bad").exists()


def test_tensorrt_ships_its_own_layout_with_a_warning_when_another_was_measured(work: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    cal = work["root"] / "cal-ort-layout"  # beside the model: calibration.json names it relative to its folder
    if not cal.exists():
        shutil.copytree(work["cal"], cal)
        (cal / ".calibkit-output.json").unlink()
        doc = json.loads((cal / "calibration.json").read_text())
        doc["target"] = "onnxruntime"  # as `calibrate --target onnxruntime` records it
        doc["files"].pop("model")
        doc.pop("sha256", None)
        (cal / "model.int8.onnx").unlink()
        (cal / "calibration.json").write_text(json.dumps(doc))
    res = deploy(DeployRequest(source=cal, out=tmp_path / "trt", backend=Backend.TENSORRT))
    assert res.layout.shipped == "tensorrt" and res.layout.measured == "onnxruntime" and not res.layout.as_measured
    assert any("SHIPPING AN UNMEASURED LAYOUT" in w and "TensorRT builds only its own layout" in w
               for w in res.warnings)
    # ONNX Runtime: as measured, no warning
    ort = deploy(DeployRequest(source=cal, out=tmp_path / "ort", measure_texts=0))
    assert ort.layout.as_measured and not ort.warnings


def test_the_served_model_is_named_after_the_users_model_not_a_smoothed_copy(work: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    """A tune plan on the smoothed model lives in OUT/smoothed-model: the Triton model is named after the model
    the user gave (model/, the smoothing record's original), and --name still overrides it."""
    from calibkit.calibrate.pipeline import calibrate
    from calibkit.calibrate.smoothing import smooth
    from calibkit.data.calibset import load_calibration_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.requests.smooth import SmoothRequest
    from calibkit.types import Method

    cset = load_calibration_set(work["cset"])
    smoothed = tmp_path / "tune" / "smoothed-model"
    smooth(SmoothRequest(model=ModelDir.resolve(work["model"]), calibration_set=cset, out=smoothed))
    cal = calibrate(CalibrateRequest(model=ModelDir.resolve(smoothed), calibration_set=cset, method=Method.MINMAX,
                                     out=tmp_path / "cal")).out_dir
    res = deploy(DeployRequest(source=cal, out=tmp_path / "repo", measure_texts=0))
    assert res.name == f"{work['model'].name}-int8" != "smoothed-model-int8"
    assert (tmp_path / "repo" / res.name / "config.pbtxt").is_file()
    named = deploy(DeployRequest(source=cal, out=tmp_path / "repo2", measure_texts=0, name="sentiment"))
    assert named.name == "sentiment"


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorrt"])
def test_the_repository_holds_no_absolute_path_of_this_machine(work: dict[str, Path], tmp_path: Path,
                                                              backend: str) -> None:
    """README, deploy.json, the engine sidecar and every other text file name what deploy read relative to
    the repository, so it can be copied to the serving machine; the sidecar still reads back."""
    from calibkit.enginefiles.artifact import EngineArtifact

    out = tmp_path / "repo"
    res = deploy(DeployRequest(source=work["cal"], out=out, backend=backend))
    roots = {str(work["root"]), str(work["root"].resolve()), str(tmp_path), str(tmp_path.resolve())}
    leaked = []
    for f in sorted(out.rglob("*")):
        if not f.is_file() or f.suffix in (".onnx", ".plan"):
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        leaked += [f"{f.relative_to(out)}: {r}" for r in roots if r in text]
    assert leaked == []
    import os

    assert f"from `{os.path.relpath(work['cal'].resolve(), out.resolve())}`" in (out / "README.md").read_text()
    if res.model_path is not None:
        art = EngineArtifact.load(res.model_path)
        assert Path(art.source_model or "") == (work["model"] / "model.onnx").resolve()
