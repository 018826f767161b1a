"""The switchboard computes, for every plan and table, what the Q/DQ model of that plan computes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from calib_helpers import texts, tiny_model, write_model_dir

from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.registry import model_runner
from calibkit.errors import CalibrationError
from calibkit.evaluate.boardjobs import cut_units, run_on_boards, text_cost
from calibkit.evaluate.jobs import ALL_INT8, SensitivityJob, run_sensitivity_job
from calibkit.evaluate.switchboard import SCALES, SWITCHES, build_board, setting
from calibkit.executors import InProcessExecutor
from calibkit.executors.pool import ProcessPoolExecutor
from calibkit.quantize.placement import plan_placement
from calibkit.quantize.qdq import Target, quantize_model
from calibkit.quantize.tablefile import write_calibration_json
from calibkit.types import CalibrationTable, Method, MethodParams, TensorRange


def _table(model, scale: float = 1.0, zero: tuple[str, ...] = (), observed: bool = False) -> CalibrationTable:
    """Ranges 2.5 x scale x (1 + i/7); ``observed``: with observed extremes of every kind (one-sided, lopsided,
    both beyond amax), so the onnxruntime layout's grids are fitted ones with zero points other than 128."""
    tensors = plan_placement(model).activations
    sides = [(-0.17, 9.0), (-1.0, 0.8), (-9.0, 9.0), (0.0, 3.0)]

    def entry(i: int, t: str) -> TensorRange:
        a = 0.0 if t in zero else 2.5 * scale * (1 + i / 7)
        lo, hi = sides[i % len(sides)]
        return TensorRange(t, a, Method.MINMAX, *((lo, hi) if observed else (None, None)))

    ranges = tuple(entry(i, t) for i, t in enumerate(tensors))
    return CalibrationTable("sha", "cset", Method.MINMAX, MethodParams(), ranges)


def _feeds(n: int = 12):
    rng = np.random.default_rng(3)
    ids = rng.integers(4, 16, size=(n, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[::3, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _run(model_bytes: bytes, feeds, extra=None):
    with model_runner(model_bytes, layout="tensorrt", threads=1) as r:
        return r.infer({**feeds, **(extra or {})})


@pytest.mark.parametrize("keep", [(), ("proj",), ("scores", "context"), ("classifier", "out_proj", "proj")])
@pytest.mark.parametrize("zero_branch", [False, True])
def test_a_setting_computes_the_qdq_model_of_its_plan_bit_for_bit(keep, zero_branch):
    model = tiny_model(zero_branch=zero_branch)
    table = _table(model, zero=("E",) if zero_branch else ())  # a zero range keeps its readers in FP32
    board = build_board(model, plan_placement(model))
    feeds = _feeds()
    want = _run(quantize_model(model, table, keep_nodes=keep, target=Target.TENSORRT).model.SerializeToString(),
                feeds)
    got = _run(board.model, feeds, setting(board, table, keep).feeds())
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("observed", [False, True])
@pytest.mark.parametrize("keep", [(), ("proj",), ("classifier", "out_proj")])
def test_weights_only_computes_the_onnxruntime_layouts_qdq_model_bit_for_bit(keep, observed):
    """The onnxruntime layout (uint8 activations on fitted grids; activation x activation MatMuls in FP32) as
    exact Q/DQ arithmetic is a setting of the same board: its switches off for the nodes without a weight."""
    model = tiny_model()
    table = _table(model, observed=observed)
    zeros = {r.uint8_grid()[1] for r in table.ranges}
    assert (zeros == {128}) is not observed  # fitted grids move the zero point
    board = build_board(model, plan_placement(model))
    feeds = _feeds()
    ort = quantize_model(model, table, keep_nodes=keep, target=Target.ONNXRUNTIME)
    want = _run(ort.model.SerializeToString(), feeds)
    on = setting(board, table, keep, weights_only=True)
    assert {n for n, s in zip(board.nodes, on.switches) if s} == set(ort.quantized_nodes)
    got = _run(board.model, feeds, on.feeds())
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_all_switches_off_is_the_fp32_model_and_tables_are_feeds():
    model = tiny_model()
    board = build_board(model, plan_placement(model))
    feeds = _feeds()
    fp32 = _run(model.SerializeToString(), feeds)["logits"]
    off = setting(board, _table(model), board.nodes)
    assert not off.switches.any()
    np.testing.assert_array_equal(_run(board.model, feeds, off.feeds())["logits"], fp32)
    a = _run(board.model, feeds, setting(board, _table(model, 1.0), ()).feeds())["logits"]
    b = _run(board.model, feeds, setting(board, _table(model, 0.05), ()).feeds())["logits"]
    assert not np.array_equal(a, b)  # the scales are read from the feed, not baked in
    assert {SWITCHES, SCALES} <= {i.name for i in __import__("onnx").load_from_string(board.model).graph.input}


def test_a_setting_refuses_the_ranges_quantize_model_refuses():
    model = tiny_model()
    board = build_board(model, plan_placement(model))
    bad = _table(model)
    bad = replace(bad, ranges=(TensorRange(bad.ranges[0].tensor, float("inf"), Method.MINMAX), *bad.ranges[1:]))
    with pytest.raises(CalibrationError):
        setting(board, bad, ())


def test_jobs_on_boards_give_what_each_variant_gives(tmp_path):
    folder = write_model_dir(tmp_path / "m")
    model = tiny_model()
    table_path = tmp_path / "calibration.json"
    write_calibration_json(table_path, _table(model), {"target": "tensorrt"})
    # texts of many lengths: the tiny model pools its padding too, so only the same batches give the same outputs
    xs = tuple(texts(150, seed=2))
    tok = TextTokenizer(folder, max_length=16)
    with model_runner(folder / "model.onnx") as r:
        from calibkit.evaluate.predict import predict_logits

        ref = predict_logits(r, tok, xs)
    jobs = [SensitivityJob(str(folder / "model.onnx"), str(table_path), str(folder), xs, tuple([0] * len(xs)), ref,
                           keep, "plan" if keep else ALL_INT8, max_length=16)
            for keep in [(), ("proj",), ("context", "classifier")]]
    seen: list[int] = []
    for executor in (InProcessExecutor(), ProcessPoolExecutor(2)):
        with executor:
            got = run_on_boards(jobs, executor, lambda i, r: seen.append(i))
        for job, r in zip(jobs, got, strict=True):
            want = run_sensitivity_job(job)
            assert r.error is None
            assert r.predictions == want.predictions
            assert r.agreement_values == want.agreement_values and r.mean_kl == want.mean_kl
    assert sorted(seen) == [0, 0, 1, 1, 2, 2]


def test_units_are_cut_by_cost_at_whole_batches_and_the_longest_texts_are_spread():
    """Short texts: units of whole batches. The longest texts (here 32 of 512 tokens, a batch alone worth most of
    the work) are cut into several units, so no unit runs alone while the other workers wait."""
    lengths = np.sort(np.concatenate([np.full(480, 20), np.full(32, 512)]))
    total = float(text_cost(lengths).sum())
    units = cut_units(lengths, 32, total / 16)
    assert units[0][0] == 0 and units[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(units, units[1:]))  # a partition, in order
    costs = [float(text_cost(lengths[a:b]).sum()) for a, b in units]
    assert max(costs) <= total / 16 * 1.01 + float(text_cost(np.array([512]))[0])
    assert sum(1 for a, b in units if lengths[a] == 512) >= 8  # the long batch is spread over many units
    short = [(a, b) for a, b in units if lengths[b - 1] == 20]
    assert all(a % 32 == 0 and (b % 32 == 0 or b == 480) for a, b in short)  # whole batches
    assert cut_units(np.full(10, 5), 32, 1e9) == [(0, 10)]
    assert cut_units(np.zeros(0), 32, 10.0) == [(0, 0)]
