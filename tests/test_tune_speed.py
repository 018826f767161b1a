"""Speed in the verdict: the served model timed beside FP32 as a benchmark is (evaluate.speed), tune writing the
fastest confirmed plan, the served arithmetic checked against the certified one (evaluate.served)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from test_tune_pipeline import options, run_tune, tiny_setup  # noqa: F401  (the fixture)

import calibkit.evaluate.speed as speed
from calibkit.data.evalset import load_eval_set
from calibkit.data.modeldir import ModelDir
from calibkit.engines.base import FunctionRunner
from calibkit.results.runs import BatchSpeed, Speed
from calibkit.types import TensorSpec


class _Clock:
    """A clock that only the fake models advance: each inference costs its model's seconds per text."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fake_models(clock: _Clock, cost: dict[str, float], calls: list[str]):
    def make(model, *, threads=None, name=None):
        label = model

        def fn(feeds):
            calls.append(label)
            clock.now += cost[label] * len(feeds["x"])
            return {"y": np.zeros((len(feeds["x"]), 1), dtype=np.float32)}

        return FunctionRunner(fn, [TensorSpec("x", "float32", ("batch", 1))], ["y"], name=name or label)

    return make


def _batches(n: int = 200, sizes=(1, 8)) -> speed.SpeedBatches:
    texts = [f"text {i}" for i in range(n)]
    return speed.speed_batches(lambda chunk: {"x": np.zeros((len(chunk), 1), dtype=np.float32)},
                               [i % 17 for i in range(n)], texts, batch_sizes=sizes, seed=3,
                               single_texts=10, large_batches=2)


def test_the_speedup_is_the_ratio_of_medians_and_every_model_runs_every_batch_in_rotation(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    calls: list[str] = []
    got = speed.measure_speed({"fp32": "fp32", "int8": "int8", "slow": "slow"}, "fp32", _batches(),
                              make_runner=_fake_models(clock, {"fp32": 2.0, "int8": 1.0, "slow": 4.0}, calls),
                              threads=2, rounds=(3, 3), seconds=0.0)
    assert set(got) == {"int8", "slow"}
    for label, want in (("int8", 2.0), ("slow", 0.5)):
        s = got[label]
        assert [b.batch_size for b in s.at] == [1, 8] and s.rounds == 3 and s.threads == 2
        for b in s.at:
            assert b.speedup == pytest.approx(want) and b.speedup_low == pytest.approx(want)
            assert b.speedup_high == pytest.approx(want)
        assert s.at[0].batches == 10 and s.at[1].batches == 2
        assert s.at[0].reference_ms == pytest.approx(2000.0) and s.at[1].model_ms == pytest.approx(16000.0 / want)
    # a warm-up round and three counted ones, each batch run by every model, the order rotated batch by batch
    assert len(calls) == 4 * 12 * 3
    firsts = calls[::3]
    assert set(firsts[:3]) == {"fp32", "int8", "slow"}


def test_the_rounds_counted_follow_the_time_budget_within_their_bounds(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    make = _fake_models(clock, {"a": 1.0, "b": 1.0}, [])
    # one round is 2 models x (10 + 16 texts) x 1 s = 52 s
    assert speed.measure_speed({"a": "a", "b": "b"}, "a", _batches(), make_runner=make, rounds=(3, 9),
                               seconds=52 * 5.5)["b"].rounds == 5
    assert speed.measure_speed({"a": "a", "b": "b"}, "a", _batches(), make_runner=make, rounds=(3, 9),
                               seconds=1.0)["b"].rounds == 3
    assert speed.measure_speed({"a": "a", "b": "b"}, "a", _batches(), make_runner=make, rounds=(3, 9),
                               seconds=1e9)["b"].rounds == 9


def test_larger_batches_are_length_sorted_chunks_of_a_seeded_sample():
    lengths = [(7 * i) % 23 for i in range(300)]
    texts = [f"t{i}" for i in range(300)]
    seen: list[list[str]] = []

    def encode(chunk):
        seen.append(list(chunk))
        return {"x": np.zeros((len(chunk), 1))}

    b = speed.speed_batches(encode, lengths, texts, batch_sizes=(1, 16), seed=1, single_texts=12, large_batches=3)
    assert [len(f["x"]) for f in b.feeds[1]] == [1] * 12 and [len(f["x"]) for f in b.feeds[16]] == [16] * 3
    large = [lengths[int(t[1:])] for chunk in seen[12:] for t in chunk]
    assert large == sorted(large)
    again = speed.speed_batches(lambda c: {"x": np.asarray(c)}, lengths, texts, batch_sizes=(1, 16), seed=1,
                                single_texts=12, large_batches=3)
    assert [list(f["x"]) for f in again.feeds[16]] == seen[12:]
    # a batch size drawn from one length bucket holds only texts of that bucket (the batch a server forms of them)
    seen.clear()
    bucketed = speed.speed_batches(encode, lengths, texts, batch_sizes=(1, 16), seed=1, single_texts=12,
                                   large_batches=3, within={16: (3, 9)})
    inside = [lengths[int(t[1:])] for chunk in seen[12:] for t in chunk]
    assert len(bucketed.feeds[16]) == 3 and inside and all(3 <= n <= 9 for n in inside)
    assert any(not 3 <= lengths[int(t[1:])] <= 9 for chunk in seen[:12] for t in chunk)  # batch 1: any length


def _speed(b1: float, b32: float) -> Speed:
    return Speed("m", "FP32", "onnxruntime", 2, 5, 100, "cpu", "avx2",
                 (BatchSpeed(1, 10, 1.0, 1.0 / b1, b1, b1, b1), BatchSpeed(32, 2, 1.0, 1.0 / b32, b32, b32, b32)))


def test_the_fastest_is_judged_at_its_slowest_batch_size_and_a_tie_goes_to_fidelity():
    speeds = {0: _speed(1.7, 2.0), 1: _speed(2.6, 1.5), 2: _speed(1.95, 2.4)}
    assert speed.fastest(speeds, {0: 0.999, 1: 0.995, 2: 0.98}) == 2  # 1.95 at its slowest beats 1.7 and 1.5
    tied = {**speeds, 0: _speed(1.9, 2.35)}  # within 3 % of plan 2 at both sizes: the more faithful is written
    assert speed.fastest(tied, {0: 0.995, 1: 0.99, 2: 0.98}) == 0
    assert speed.fastest(tied, {0: float("nan"), 1: 0.9, 2: 0.98}) == 2


def test_a_tie_at_the_slowest_batch_size_goes_to_the_faster_at_the_other_before_fidelity():
    # the demo's tune: three confirmed plans within 3 % at batch 32, 12 % apart at batch 1
    speeds = {3: _speed(1.67, 1.31), 8: _speed(1.89, 1.33), 10: _speed(1.78, 1.33)}
    assert speed.fastest(speeds, {3: 0.9949, 8: 0.9935, 10: 0.9945}) == 8
    close = {3: _speed(1.67, 1.31), 8: _speed(1.70, 1.33)}  # within 3 % at both: fidelity decides
    assert speed.fastest(close, {3: 0.9949, 8: 0.9935}) == 3


def test_tune_writes_the_fastest_confirmed_plan_with_its_speed_and_the_served_check(tiny_setup):  # noqa: F811
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, min_agreement=85.0, sensitivity_samples=64, method="minmax", target="onnxruntime")
    run = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "speed-on", cfg)
    r = run.result
    cf, sc = r.confirmation, r.speed_choice
    assert cf is not None and cf.chosen is not None
    confirmed = [s.candidate for s in cf.steps if s.meets]
    sp = r.final.speed
    assert sp is not None and [b.batch_size for b in sp.at] == [1, 32] and sp.reference == "FP32"
    assert all(b.speedup > 0 and b.speedup_low <= b.speedup <= b.speedup_high for b in sp.at)
    if len(confirmed) > 1:
        assert sc is not None and list(sc.candidates) == confirmed and sc.chosen in confirmed
        assert sc.most_int8 == confirmed[-1] and cf.chosen == sc.chosen
        assert r.final.kept_nodes == r.candidates[sc.chosen].kept_nodes
        assert sp == sc.speeds[sc.candidates.index(sc.chosen)]
    served = r.final.served
    assert served is not None and served.texts > 0 and 0 <= served.changed <= served.texts
    assert served.changed_upper_share >= served.changed / served.texts
    plan = json.loads(run.run.plan_path.read_text())
    assert plan["speed"]["at"][0]["batch_size"] == 1 and plan["layout"] == "onnxruntime"
    assert r.final.kept_weights == "blockwise" and "MatMulNBits" in plan["precision_of_kept"]
    assert any(line.startswith("served speed (ONNX Runtime") for line in r.speed_lines)
    assert any(line.startswith("served model against the certified arithmetic") for line in r.speed_lines)


def test_a_tensorrt_plan_says_its_speed_was_not_measured(tiny_setup):  # noqa: F811
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, min_agreement=85.0, sensitivity_samples=64, method="minmax")
    r = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "speed-trt", cfg).result
    assert r.final.speed is None and r.speed_choice is None and r.final.served is None
    assert r.final.kept_weights is None
    assert "TensorRT, which is not installed here" in r.final.speed_note
    off = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "speed-off",
                   replace(cfg, target="onnxruntime", speed=False)).result
    assert off.final.speed is None and off.final.speed_note == "not measured (--no-speed)"
