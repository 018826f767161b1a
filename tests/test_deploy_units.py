"""deploy's pure parts: the profile choice (against brute force), batching from a token budget, trtexec's flag
table, the model I/O check, config.pbtxt against Triton's own schema, the traffic reader's refusals."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from deploy_helpers import model_config_pb2, parse_config, write_log
from onnx import TensorProto, helper

from calibkit.deploy import batching, profiles, trtexec
from calibkit.deploy.modelio import ModelIO, TensorIO, read_model_io
from calibkit.deploy.triton import TritonModelConfig, label_output, labels_text
from calibkit.errors import DataError, ModelError, UsageError
from calibkit.types import Backend

# ---------------------------------------------------------------- profiles


def _brute(lengths: np.ndarray, k: int, max_seq: int, round_to: int) -> int:
    """Least padded tokens over every choice of k bounds among the candidates (the last one is max_seq)."""
    arr = np.clip(lengths, 1, max_seq)
    cands = sorted({min(int(np.ceil(v / round_to) * round_to), max_seq) for v in arr} | {max_seq})
    inner = [c for c in cands if c != max_seq]
    best = None
    for r in range(0, min(k - 1, len(inner)) + 1):
        for combo in itertools.combinations(inner, r):
            bounds = [*combo, max_seq]
            cost = int(sum(next(b for b in bounds if v <= b) for v in arr))
            best = cost if best is None or cost < best else best
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("round_to", [1, 8])
def test_choose_buckets_matches_brute_force(seed: int, round_to: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    lengths = np.concatenate([rng.integers(1, 20, n), rng.integers(20, 90, int(rng.integers(0, 8)))])
    max_seq = int(rng.choice([64, 96, 128]))
    for k in range(1, 5):
        c = profiles.choose_buckets(lengths, k, max_seq=max_seq, round_to=round_to)
        assert c.padded_tokens == _brute(lengths, k, max_seq, round_to), (seed, k)
        # the buckets tile 1..max_seq and every request is counted once
        assert c.buckets[0].lo == 1 and c.buckets[-1].hi == max_seq
        assert all(a.hi + 1 == b.lo for a, b in zip(c.buckets, c.buckets[1:]))
        assert sum(b.requests for b in c.buckets) == lengths.size
        assert c.over_max == int((lengths > max_seq).sum())
        assert c.real_tokens == int(np.clip(lengths, 1, max_seq).sum())


def test_more_profiles_never_pad_more_and_waste_is_exact() -> None:
    lengths = np.array([5] * 60 + [12] * 30 + [40] * 9 + [200])
    cs = [profiles.choose_buckets(lengths, k, max_seq=256) for k in range(1, 5)]
    assert [c.padded_tokens for c in cs] == sorted((c.padded_tokens for c in cs), reverse=True)
    one = cs[0]
    assert one.padded_tokens == 256 * lengths.size  # a single bucket pads every request to max_seq
    assert one.waste == pytest.approx((256 * 100 - lengths.sum()) / lengths.sum())
    two = cs[1]
    # 90 short requests at 16 + 10 at 256 (4,000 tokens) beat 99 at 40 + 1 at 256 (4,216)
    assert [b.hi for b in two.buckets] == [16, 256] and two.padded_tokens == 4000
    assert two.bucket_of(12).hi == 16 and two.bucket_of(40).hi == 256 and two.bucket_of(300).hi == 256


def test_over_max_is_counted_and_truncated() -> None:
    c = profiles.choose_buckets([10, 20, 600, 700], 2, max_seq=512)
    assert c.over_max == 2 and c.over_max_share == 0.5
    assert c.real_tokens == 10 + 20 + 512 + 512


def test_auto_k_takes_the_fewest_within_tolerance() -> None:
    lengths = np.array([8] * 90 + [16] * 10)
    cs = [profiles.choose_buckets(lengths, k, max_seq=16, round_to=8) for k in (1, 2)]
    # k=1 pads 90 requests by 8 tokens (720 of 880 real): far outside 5 %; k=2 is exact
    assert profiles.auto_k(cs).k == 2
    flat = np.array([16] * 100)
    cs = [profiles.choose_buckets(np.append(flat, 15), k, max_seq=16, round_to=1) for k in (1, 2)]
    assert profiles.auto_k(cs).k == 1  # one token of padding in 1,615 is not worth a second profile


@pytest.mark.parametrize("k", [0, 5, -1])
def test_k_out_of_range(k: int) -> None:
    with pytest.raises(UsageError, match="out of range"):
        profiles.choose_buckets([10, 20], k, max_seq=64)


def test_largest_max_rounds_and_caps() -> None:
    assert profiles.largest_max(np.array([3, 17]), 512, None) == 24
    assert profiles.largest_max(np.array([3, 700]), 512, None) == 512
    assert profiles.largest_max(np.array([3, 700]), 512, 128) == 128
    with pytest.raises(UsageError, match="--max-seq"):
        profiles.largest_max(np.array([3]), 512, 1024)


def test_padded_by_arrival() -> None:
    assert profiles.padded_by_arrival([1, 5, 2, 2, 9], 2, 8) == 5 * 2 + 2 * 2 + 8 * 1


# ---------------------------------------------------------------- batching


def test_batch_sizes_come_from_the_token_budget() -> None:
    plan = batching.plan_batching([16, 64, 128, 512], batch_tokens=8192, max_batch=128)
    assert plan.per_bucket == (128, 128, 64, 16)
    assert all(b * n <= 8192 for b, n in zip(plan.per_bucket, [16, 64, 128, 512]))
    assert plan.preferred == (16, 64, 128) and plan.max_batch_size == 128
    assert plan.worst_tokens == 128 * 512
    assert batching.batch_for(100, 8192, 1000) == 64  # 81 fit: the power of two below
    assert batching.batch_for(10_000, 8192, 64) == 1  # a bucket longer than the budget still runs alone


@pytest.mark.parametrize("kw", [{"batch_tokens": 0}, {"max_batch": 0}, {"queue_delay_us": -1}])
def test_batching_rejects_bad_numbers(kw: dict) -> None:
    with pytest.raises(UsageError):
        batching.plan_batching([16], **kw)


# ---------------------------------------------------------------- trtexec


def _cmd(n_profiles: int = 2) -> list[str]:
    profs = [trtexec.ShapeProfile((1, 1), (64, 32), (128, 32)), trtexec.ShapeProfile((1, 33), (16, 128), (128, 128))]
    return trtexec.trtexec_command("model.int8.onnx", "1/model.plan", ["input_ids", "attention_mask"],
                                   profs[:n_profiles], timing_cache="t.cache", workspace_mib=2048, layer_info="l.json")


def test_trtexec_command_uses_only_documented_flags() -> None:
    argv = _cmd()
    assert argv[0] == "trtexec"
    for arg in argv[1:]:
        name = arg.split("=", 1)[0]
        assert name in trtexec.FLAGS, name
        assert ("=" in arg) == trtexec.FLAGS[name].takes_value
    assert "--stronglyTyped" in argv and not set(trtexec.REMOVED) & {a.split("=")[0] for a in argv}
    assert argv.count("--stronglyTyped") == 1
    mins = [a for a in argv if a.startswith("--minShapes=")]
    assert mins == ["--minShapes=input_ids:1x1,attention_mask:1x1", "--minShapes=input_ids:1x33,attention_mask:1x33"]
    assert "--optShapes=input_ids:16x128,attention_mask:16x128" in argv
    assert "--maxShapes=input_ids:128x32,attention_mask:128x32" in argv
    assert "--timingCacheFile=t.cache" in argv and "--memPoolSize=workspace:2048M" in argv
    assert "--saveEngine=1/model.plan" in argv and "--onnx=model.int8.onnx" in argv


@pytest.mark.parametrize("bad", [
    ["trtexec", "--onnx=m.onnx", "--int8"],  # removed with weak typing
    ["trtexec", "--onnx=m.onnx", "--bogus=1"],  # not documented
    ["trtexec", "--onnx"],  # missing value
    ["trtexec", "--stronglyTyped=1"],  # takes none
    ["trtexec", "--onnx=a", "--onnx=b"],  # not repeatable
    ["trtexec", "--minShapes=x:1x1", "--optShapes=x:1x1"],  # incomplete triple
])
def test_check_command_refuses(bad: list[str]) -> None:
    with pytest.raises(UsageError):
        trtexec.check_command(bad)


def test_shape_profile_must_be_ordered() -> None:
    with pytest.raises(UsageError):
        trtexec.ShapeProfile((1, 64), (1, 32), (1, 128))
    with pytest.raises(UsageError):
        trtexec.shape_spec(["in:put"], (1, 1))


# ---------------------------------------------------------------- model I/O


def _graph(input_shape: list, output_shape: list, out_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    node = helper.make_node("Cast", ["input_ids"], ["y"], to=out_type)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, input_shape)],
                          [helper.make_tensor_value_info("y", out_type, output_shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_model_io_dynamic_axes(tmp_path: Path) -> None:
    p = tmp_path / "m.onnx"
    onnx.save(_graph(["batch", "seq"], ["batch", "seq"]), str(p))
    io = read_model_io(p)
    assert io.inputs == (TensorIO("input_ids", "TYPE_INT64", (-1,)),)
    assert io.outputs == (TensorIO("y", "TYPE_FP32", (-1,)),)


@pytest.mark.parametrize("shape,axis", [([1, "seq"], "batch"), (["batch", 128], "sequence"), ([1, 128], "batch and")])
def test_model_without_dynamic_axes_is_refused(tmp_path: Path, shape: list, axis: str) -> None:
    p = tmp_path / "m.onnx"
    onnx.save(_graph(shape, ["batch", "seq"]), str(p))
    with pytest.raises(ModelError, match=f"fixed {axis}") as exc:
        read_model_io(p)
    assert exc.value.exit_code == 4 and "dynamic" in (exc.value.hint or "")


# ---------------------------------------------------------------- config.pbtxt against Triton's schema


def _io() -> ModelIO:
    return ModelIO((TensorIO("input_ids", "TYPE_INT64", (-1,)), TensorIO("attention_mask", "TYPE_INT64", (-1,))),
                   (TensorIO("logits", "TYPE_FP32", (3,)), TensorIO("score", "TYPE_FP32", (1,), scalar=True)))


def test_onnxruntime_config_parses_with_tritons_schema(tmp_path: Path) -> None:
    pb = model_config_pb2()
    cfg = TritonModelConfig("my-model_1.0", Backend.ONNXRUNTIME, _io(), 64, (16, 64), 500, instances=2,
                            intra_op_threads=4, label_output="logits")
    (tmp_path / "config.pbtxt").write_text(cfg.render())
    c = parse_config(tmp_path / "config.pbtxt")
    assert c.name == "my-model_1.0" and c.platform == "onnxruntime_onnx" and c.max_batch_size == 64
    assert [(i.name, i.data_type, list(i.dims)) for i in c.input] == [
        ("input_ids", pb.TYPE_INT64, [-1]), ("attention_mask", pb.TYPE_INT64, [-1])]
    assert [(o.name, list(o.dims), o.label_filename) for o in c.output] == [("logits", [3], "labels.txt"),
                                                                           ("score", [1], "")]
    assert c.output[1].HasField("reshape") and list(c.output[1].reshape.shape) == []
    assert list(c.dynamic_batching.preferred_batch_size) == [16, 64]
    assert c.dynamic_batching.max_queue_delay_microseconds == 500
    assert [(g.kind, g.count, list(g.profile)) for g in c.instance_group] == [
        (pb.ModelInstanceGroup.KIND_CPU, 2, [])]
    assert c.parameters["intra_op_thread_count"].string_value == "4"


def test_tensorrt_config_lists_every_profile(tmp_path: Path) -> None:
    pb = model_config_pb2()
    cfg = TritonModelConfig('we"ird\\name', Backend.TENSORRT, _io(), 128, (32, 128), 1000, profiles=3)
    (tmp_path / "config.pbtxt").write_text(cfg.render())
    c = parse_config(tmp_path / "config.pbtxt")
    assert c.name == 'we"ird\\name'  # quoted and escaped as protobuf text reads it
    assert c.platform == "tensorrt_plan" and c.default_model_filename == "model.plan"
    assert [(g.kind, list(g.profile)) for g in c.instance_group] == [(pb.ModelInstanceGroup.KIND_GPU, ["0", "1", "2"])]
    assert not c.parameters


def test_labels() -> None:
    io = _io()
    assert label_output(io, {0: "a", 1: "b", 2: "c"}) == "logits"
    assert label_output(io, {0: "a", 1: "b"}) is None  # no output of that width
    assert label_output(io, {0: "a", 2: "b", 3: "c"}) is None  # ids must run 0..n-1
    assert labels_text({1: "pos", 0: "neg"}) == "neg\npos\n"


@pytest.mark.parametrize("brk", ["\n", "\r", "\u2028", "\x85"])
def test_label_names_with_a_line_break_are_refused(brk: str) -> None:
    """A label name with a line break dropped labels.txt without a word; it would shift every later name."""
    labels = {0: "a", 1: f"b{brk}c", 2: "d"}
    with pytest.raises(ModelError, match="line break") as err:
        label_output(_io(), labels)
    assert "label name 1" in err.value.message and err.value.hint
    with pytest.raises(ModelError, match="line break"):
        labels_text(labels)


def test_names_outside_the_basic_multilingual_plane_parse(tmp_path: Path) -> None:
    """An output name outside the BMP was written as JSON's escaped surrogate pair, which Triton cannot parse."""
    odd = ["logits\U0001f600", 'q"uo\\te', "tab\tnew\nline\x01", "caf\u00e9 \u2028"]
    io = ModelIO((TensorIO("input_ids", "TYPE_INT64", (-1,)),),
                 tuple(TensorIO(n, "TYPE_FP32", (3,)) for n in odd))
    cfg = TritonModelConfig("m", Backend.ONNXRUNTIME, io, 8, (8,), 100, label_output=odd[0])
    text = cfg.render()
    assert text.isascii()
    (tmp_path / "config.pbtxt").write_text(text)
    c = parse_config(tmp_path / "config.pbtxt")
    assert [o.name for o in c.output] == odd and c.output[0].label_filename == "labels.txt"


@pytest.mark.parametrize("field, value, option", [
    ("instances", 2**31, "--instances"), ("queue_delay_us", 2**64, "--queue-delay-us"),
    ("max_batch_size", 2**31, "--max-batch"), ("queue_delay_us", -1, "--queue-delay-us"),
    ("intra_op_threads", 2**31, "--threads"),
])
def test_config_values_outside_the_schema_are_refused(field: str, value: int, option: str) -> None:
    """--queue-delay-us >= 2^64, --instances >= 2^31 or a huge --max-batch wrote values the schema cannot hold."""
    kw = {"instances": 1, "intra_op_threads": None, "queue_delay_us": 100, "max_batch_size": 8, field: value}
    with pytest.raises(UsageError, match=option):
        TritonModelConfig("m", Backend.ONNXRUNTIME, _io(), kw["max_batch_size"], (1,), kw["queue_delay_us"],
                          instances=kw["instances"], intra_op_threads=kw["intra_op_threads"])


def test_the_largest_schema_values_still_parse(tmp_path: Path) -> None:
    cfg = TritonModelConfig("m", Backend.TENSORRT, _io(), 2**31 - 1, (1, 2**31 - 1), 2**64 - 1, instances=2**31 - 1)
    (tmp_path / "config.pbtxt").write_text(cfg.render())
    c = parse_config(tmp_path / "config.pbtxt")
    assert c.max_batch_size == 2**31 - 1 and c.dynamic_batching.max_queue_delay_microseconds == 2**64 - 1
    assert c.instance_group[0].count == 2**31 - 1


# ---------------------------------------------------------------- traffic


def test_traffic_with_no_usable_text(tmp_path: Path) -> None:
    from calibkit.deploy.traffic import read_traffic

    log = tmp_path / "log.jsonl"
    log.write_text('{"text": ""}\n{"text": 3}\nnot json\n{"text": "\\u200b"}\n')
    with pytest.raises(DataError, match="no usable text in 4 lines") as exc:
        read_traffic(log, text_field="text")
    assert exc.value.exit_code == 3
    with pytest.raises(DataError, match="no text field"):
        read_traffic(write_log(tmp_path / "other.jsonl", ["a b"], field="payload.body"))


def test_traffic_reader_redacts_and_keeps_duplicates(tmp_path: Path) -> None:
    from calibkit.deploy.traffic import read_traffic

    log = write_log(tmp_path / "log.jsonl", ["mail me at a.b@example.com", "hot", "hot", "<script>x</script>ok"],
                    field="request.text")
    t = read_traffic(log)
    assert t.texts == ("mail me at <EMAIL>", "hot", "hot", "ok") and t.text_fields == ("request.text",)
    assert read_traffic(log, redact=False).texts[0] == "mail me at a.b@example.com"
    s = read_traffic(log, max_texts=2, seed=1)
    assert len(s.texts) == 2 and s.sampled and s.usable == 4


# ---------------------------------------------------------------- calibkit's TensorRT builder, several profiles


def test_tensorrt_builder_adds_one_optimization_profile_per_bucket(tmp_path: Path, monkeypatch) -> None:
    """A fake `tensorrt` module records the builder's calls: each SeqProfile becomes one optimization profile
    with its min/opt/max on every input, in order (the real build needs a GPU; see test_engine_tensorrt.py)."""
    import sys
    import types

    import calibkit.engines.tensorrt.builder as builder
    from calibkit.engines.tensorrt.profile import SeqProfile

    calls: list = []

    class Obj:
        def __init__(self, **kw: object) -> None:
            self.__dict__.update(kw)

    class Logger:
        WARNING = 0

        def __init__(self, *a: object) -> None:
            pass

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict = {}
            calls.append(self)

        def set_shape(self, name, mn, op, mx):  # noqa: ANN001, ANN201
            self.shapes[name] = (tuple(mn), tuple(op), tuple(mx))

    class Config:
        profiles: list = []

        def set_memory_pool_limit(self, *a):  # noqa: ANN002, ANN201
            pass

        def add_optimization_profile(self, p):  # noqa: ANN001, ANN201
            self.profiles.append(p)

        def create_timing_cache(self, data):  # noqa: ANN001, ANN201
            return Obj(serialize=lambda: b"cache")

        def set_timing_cache(self, *a):  # noqa: ANN002, ANN201
            pass

        def get_timing_cache(self):  # noqa: ANN201
            return Obj(serialize=lambda: b"cache")

    inputs = [Obj(name="input_ids", shape=(-1, -1)), Obj(name="attention_mask", shape=(-1, -1))]
    network = Obj(num_inputs=2, get_input=lambda i: inputs[i])
    config = Config()
    engine = Obj(create_engine_inspector=lambda: Obj(get_engine_information=lambda fmt: "{}"))
    fake = types.SimpleNamespace(
        __version__="11.0-fake", Logger=Logger, Dims=lambda v: tuple(v),
        NetworkDefinitionCreationFlag=Obj(STRONGLY_TYPED=0), MemoryPoolType=Obj(WORKSPACE=0),
        ProfilingVerbosity=Obj(DETAILED=0), LayerInformationFormat=Obj(JSON=0),
        Builder=lambda logger: Obj(create_network=lambda flags: network, create_builder_config=lambda: config,
                                   create_optimization_profile=Profile,
                                   build_serialized_network=lambda n, c: b"plan"),
        OnnxParser=lambda n, logger: Obj(parse=lambda data: True, num_errors=0),
        Runtime=lambda logger: Obj(deserialize_cuda_engine=lambda data: engine),
    )
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(builder, "load_tensorrt", lambda: fake)
    profs = [SeqProfile(1, 16, 16, 1, 128, 128), SeqProfile(17, 64, 64, 1, 64, 128)]
    res = builder.build_engine(b"onnx", tmp_path / "model.plan", profs)
    assert res.engine.read_bytes() == b"plan" and res.tensorrt_version == "11.0-fake"
    assert config.profiles == calls and len(calls) == 2
    assert calls[0].shapes["input_ids"] == ((1, 1), (128, 16), (128, 16))
    assert calls[1].shapes["attention_mask"] == ((1, 17), (64, 64), (128, 64))


# ---------------------------------------------------------------- the documented examples are valid configs


@pytest.mark.parametrize("doc", ["README.md", "docs/deploying.md"])
def test_documented_config_examples_parse(doc: str) -> None:
    """Every config.pbtxt example in the docs parses with Triton's schema."""
    import re

    from google.protobuf import text_format

    text = (Path(__file__).resolve().parents[1] / doc).read_text(encoding="utf-8")
    blocks = re.findall(r"^```\n(name: .*?)^```", text, flags=re.S | re.M)
    assert blocks, f"no config.pbtxt example in {doc}"
    for b in blocks:
        c = text_format.Parse(b, model_config_pb2().ModelConfig())
        assert c.max_batch_size > 0 and list(c.input[0].dims) == [-1] and c.dynamic_batching.preferred_batch_size
