import struct
from pathlib import Path

import numpy as np
import pytest

from calibkit.calibrate.trtcache import (
    float_to_hex,
    hex_to_float,
    parse_cache,
    read_cache,
    write_cache,
)
from calibkit.errors import CalibrationError
from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange

FIXTURE = Path("/work/shared/fixtures/trt-caches/radioml-transformer-entropy2.cache")


def test_known_bit_patterns():
    assert float_to_hex(1 / 127) == "3c010204"  # REFERENCES §3: amax 1.0
    assert float_to_hex(0.0) == "0"
    assert hex_to_float("7f800000") == float("inf")
    assert hex_to_float("3c010204") == struct.unpack("<f", bytes.fromhex("0402013c"))[0]


def test_write_read_round_trip_is_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    scales = {f"/layer.{i}/MatMul_output_0": float(np.float32(s)) for i, s in enumerate(rng.lognormal(-4, 2, 200))}
    scales["zero"] = 0.0
    scales["(Unnamed Layer* 64) [Shuffle]_output"] = 0.125
    path = write_cache(tmp_path / "c.cache", scales, "MinMaxCalibration", 8601)
    text = path.read_text()
    assert text.splitlines()[0] == "TRT-8601-MinMaxCalibration"
    assert "zero: 0\n" in text
    back = read_cache(path)
    assert back.algorithm == "MinMaxCalibration" and back.version == 8601
    assert back.scales == scales  # float32 values survive exactly
    assert back.zero == ["zero"]
    assert list(back.scales) == list(scales)


def test_table_writes_amax_over_127_and_method_algorithm(tmp_path):
    table = CalibrationTable("sha", "set", Method.PERCENTILE, MethodParams(),
                             (TensorRange("a", 1.0, Method.PERCENTILE), TensorRange("b", 0.0, Method.PERCENTILE)))
    text = write_cache(tmp_path / "t.cache", table).read_text().splitlines()
    assert text[0].endswith("-LegacyCalibration")
    assert "a: 3c010204" in text and "b: 0" in text
    ent = CalibrationTable("sha", "set", Method.ENTROPY, MethodParams(), (TensorRange("a", 1.0, Method.ENTROPY),))
    assert write_cache(tmp_path / "e.cache", ent).read_text().startswith("TRT-101303-EntropyCalibration2\n")


def test_real_tensorrt_cache_fixture():
    cache = read_cache(FIXTURE)
    assert cache.algorithm == "EntropyCalibration2" and cache.version == 101000
    lines = [ln for ln in FIXTURE.read_text().splitlines()[1:] if ln.strip()]
    assert len(cache.scales) + len(cache.non_finite) == len(lines)
    assert cache.scales["input"] == pytest.approx(hex_to_float("3e30f86c"))
    assert cache.scales["/encoder/layers.0/Add_output_0"] == pytest.approx(0.5790, abs=1e-4)
    assert any(n.startswith("ONNXTRT_Broadcast_") for n in cache.scales)


def test_zero_inf_and_unnamed_layers():
    text = (
        "TRT-8401-EntropyCalibration2\n"
        "input: 3c010204\n"
        "/Log_output_0: 7f800000\n"
        "/Relu_output_0: 0\n"
        "(Unnamed Layer* 64) [Shuffle]_output: 3d000000\n"
        "\n"
    )
    c = parse_cache(text)
    assert c.non_finite == ["/Log_output_0"] and "/Log_output_0" not in c.scales
    assert c.zero == ["/Relu_output_0"] and c.scales["/Relu_output_0"] == 0.0
    assert c.scales["(Unnamed Layer* 64) [Shuffle]_output"] == 0.03125
    assert c.amax["input"] == pytest.approx(1.0)


@pytest.mark.parametrize("text, match", [
    ("input 0.5\n", "not a TensorRT calibration cache"),
    ("TRT-8401-EntropyCalibration2\nbroken line\n", ":2:"),
    ("TRT-8401-EntropyCalibration2\na: xyz\n", "not a hex"),
    ("", "not a TensorRT"),
])
def test_malformed_caches_give_clear_errors(text, match):
    with pytest.raises(CalibrationError, match=match):
        parse_cache(text)
