"""Token/memory budgets for batches, and statistics that do not depend on batch size, budget or threads."""

import math

import numpy as np
import pytest
from calib_helpers import texts, tiny_model, write_tokenizer

from calibkit.calibrate.collect import TensorLayout, collect_stats, observe_real_tokens, valid_blocks, valid_values
from calibkit.calibrate.histogram import chunks
from calibkit.calibrate.stats import StatsAccumulator
from calibkit.data.encode import BatchCost, TokenBudget, bucketed_batches, budget_groups, parse_size
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import FunctionRunner
from calibkit.errors import UsageError
from calibkit.quantize.placement import plan_placement
from calibkit.types import TensorSpec

NAMES = ["input_ids", "attention_mask"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d, max_positions=24)
    return TextTokenizer(d)


def test_parse_size():
    assert parse_size("4G") == 4 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5g") == 3 << 29
    assert parse_size("800KiB") == 800 << 10
    assert parse_size("1000") == 1000
    for bad in ("", "4X", "-1G", "0"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_budget_groups_respect_batch_size_and_sequence_squared_cost():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 512, size=300)
    cost = BatchCost(per_token=100.0, per_pair=12.0)  # attention probabilities [12, s, s]
    budget = TokenBudget(memory_bytes=50_000_000)
    groups = budget_groups(lengths, 32, budget, cost)
    flat = np.concatenate(groups)
    assert sorted(flat.tolist()) == list(range(300))  # every text once
    assert np.all(np.diff(lengths[flat]) >= 0)  # still sorted by length
    for g in groups:
        assert 1 <= len(g) <= 32
        assert len(g) == 1 or cost.nbytes(len(g), int(lengths[g].max())) <= budget.memory_bytes
    sizes = [len(g) for g in groups]
    assert sizes[0] == 32 and sizes[-1] < 10  # short texts in full batches, long ones in small ones
    # a text over the budget on its own still forms a batch
    assert [len(g) for g in budget_groups(np.array([5, 400]), 8, TokenBudget(memory_bytes=10), cost)] == [1, 1]
    # padded-token cap
    groups = budget_groups(lengths, 32, TokenBudget(max_batch_tokens=2048))
    assert all(len(g) * int(lengths[g].max()) <= 2048 or len(g) == 1 for g in groups)
    # no budget: plain groups of the batch size
    assert [len(g) for g in budget_groups(np.arange(10), 4)] == [4, 4, 2]
    with pytest.raises(UsageError):
        TokenBudget(max_batch_tokens=0)


def test_chunks_tile_strided_views_without_copies():
    x = np.arange(2 * 3 * 50 * 50, dtype=np.float32).reshape(2, 3, 50, 50)[:, :, :40, :30]
    parts = list(chunks(x, limit=100))
    assert all(p.size <= 100 and np.shares_memory(p, x) for p in parts)
    np.testing.assert_array_equal(np.concatenate([p.ravel() for p in parts]), x.ravel())


def test_valid_blocks_are_views_of_the_real_tokens():
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0]], bool)  # last row: left padding
    att = np.random.default_rng(1).normal(size=(4, 2, 4, 4)).astype(np.float32)
    blocks = list(valid_blocks(att, TensorLayout(0, (2, 3)), mask))
    assert np.shares_memory(blocks[0], att) and blocks[1].shape == (2, 2, 2, 2)  # rows 1-2 share one view
    want = np.concatenate([att[i][:, mask[i]][:, :, mask[i]].ravel() for i in range(4)])
    np.testing.assert_array_equal(np.sort(valid_values(att, TensorLayout(0, (2, 3)), mask)), np.sort(want))


def _fake_runner():
    """Per-token and per-(query, key) values that depend only on the tokens, never on padding; padded
    positions hold a huge value (masking must drop them) and one word gives -inf / NaN (counted apart)."""

    def fn(feeds):
        ids = feeds["input_ids"].astype(np.float32)
        m = feeds["attention_mask"].astype(bool)
        pos = np.arange(ids.shape[1], dtype=np.float32)
        scale = np.float32(10.0) ** (ids % 7 - 3)
        h = np.stack([np.sin(ids * (pos + 1)) * scale, np.cos(ids + pos) * 3, ids - 8], axis=-1)
        h[~m] = 1e6
        h[..., 2][ids == 7] = np.nan
        a = np.stack([np.outer(r, r) for r in ids * scale])[:, None] * np.array([1, -0.5], np.float32)[:, None, None]
        a = np.ascontiguousarray(a.transpose(0, 1, 2, 3), dtype=np.float32)
        pair = m[:, None, :, None] & m[:, None, None, :]
        a = np.where(pair, a, np.float32(1e6))
        a[:, 1][np.broadcast_to((ids == 9)[:, :, None], a[:, 1].shape)] = -np.inf
        kt = np.ascontiguousarray(h.transpose(0, 2, 1))
        return {"H": h, "A": a.astype(np.float32), "Kt": kt}

    specs = [TensorSpec("input_ids", "int64", ("b", "s")), TensorSpec("attention_mask", "int64", ("b", "s"))]
    return FunctionRunner(fn, specs, ["H", "A", "Kt"])


def _same(a, b):
    for t in a:
        x, y = a[t], b[t]
        assert (x.count, x.nan_count, x.posinf_count, x.neginf_count) == (
            y.count, y.nan_count, y.posinf_count, y.neginf_count), t
        assert (x.min, x.max, x.histogram.upper) == (y.min, y.max, y.histogram.upper), t
        np.testing.assert_array_equal(x.histogram.counts, y.histogram.counts, err_msg=t)


@pytest.mark.parametrize("num_bins, views_from", [(2048, None), (16384, None), (2048, 0)])
def test_ranges_bit_identical_whatever_batch_size_budget_and_threads(tok, num_bins, views_from, monkeypatch):
    if views_from is not None:  # read views of the real tokens even for short texts (the long-text path)
        monkeypatch.setattr("calibkit.calibrate.collect._VIEWS_FROM", views_from)
    items = texts(60, seed=11)
    ref = collect_stats(_fake_runner, bucketed_batches(tok, items, NAMES, batch_size=60), ["H", "A", "Kt"],
                        num_bins=num_bins, threads=1)
    assert ref["H"].nan_count > 0 and ref["A"].neginf_count > 0 and ref.meta["unmasked"] == []
    seen_batches = {ref.meta["batches"]}
    for batch_size, budget, threads in [
        (1, None, 1),
        (7, None, 3),
        (32, TokenBudget(max_batch_tokens=40), 2),
        (32, TokenBudget(memory_bytes=3000), 4),
        (60, TokenBudget(memory_bytes=1), 2),  # one text per batch
        (5, None, 8),  # from _SORT_FROM threads on, the sort kernel counts
    ]:
        got = collect_stats(_fake_runner, bucketed_batches(tok, items, NAMES, batch_size=batch_size, budget=budget),
                            ["H", "A", "Kt"], num_bins=num_bins, threads=threads)
        _same(ref, got)
        seen_batches.add(got.meta["batches"])
    assert len(seen_batches) >= 4  # the budgets really changed the batches


def test_memory_budget_is_priced_by_the_probe_and_cuts_batches(tok):
    model = tiny_model()
    tensors = list(plan_placement(model).activations)
    items = texts(40, seed=4)
    free = collect_stats(model, bucketed_batches(tok, items, NAMES, batch_size=40), tensors, threads=2)
    small = collect_stats(model, bucketed_batches(tok, items, NAMES, batch_size=40,
                                                  budget=TokenBudget(memory_bytes=20_000)), tensors, threads=2)
    assert free.meta["batches"] == 1 and small.meta["batches"] > 3
    assert small.meta["largest_batch_tapped_bytes"] < free.meta["largest_batch_tapped_bytes"]
    for t in tensors:
        if t not in small.meta["unmasked"]:
            assert small[t].count == free[t].count
            assert small[t].max == pytest.approx(free[t].max, rel=1e-5)


def test_both_histogram_kernels_equal_brute_force():
    rng = np.random.default_rng(3)
    x = (rng.standard_cauchy(200_000) * 3).astype(np.float32)
    a, b = StatsAccumulator("t", 2048), StatsAccumulator("t", 2048, kernel="sort")
    for part in np.array_split(x, 7):
        a.observe(part)
        b.observe(part)
    np.testing.assert_array_equal(a.counts, b.counts)
    assert a.counts.sum() == x.size
    upper = 2.0**a.exponent
    brute = np.bincount(np.floor(np.abs(x.astype(np.float64)) * 2048 / upper).astype(np.int64), minlength=2048)
    np.testing.assert_array_equal(a.counts, brute)


@pytest.mark.parametrize("kernel", ["bincount", "add_at", "sort"])
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 7.5e4, 1e30])
def test_kernel_bins_strided_and_half_inputs_exactly(kernel, scale):
    from calibkit.calibrate.histogram import BinCounter

    rng = np.random.default_rng(11)
    base = rng.standard_normal((6, 5, 40)).astype(np.float32) * np.float32(scale)
    upper = 2.0 ** math.frexp(float(np.abs(base).max()))[1]
    for x in (base, base[:, ::2, 3:31], base.astype(np.float16) if 1e-3 <= scale <= 1.0 else base[::-1]):
        got = np.zeros(2048, np.int64)
        BinCounter(2048, kernel=kernel).add(got, x, upper, below_upper=True)
        exact = np.abs(x.astype(np.float64).ravel())
        want = np.bincount(np.floor(exact * (2048 / upper)).astype(np.int64), minlength=2048)
        np.testing.assert_array_equal(got, want)
        clamped = np.zeros(2048, np.int64)  # values at or above upper join the last bin
        BinCounter(2048, kernel=kernel).add(clamped, x, upper / 4)
        want = np.bincount(np.minimum(np.floor(exact * (2048 / (upper / 4))), 2047).astype(np.int64), minlength=2048)
        np.testing.assert_array_equal(clamped, want)


def test_padding_overwrite_equals_reading_real_tokens_only():
    rng = np.random.default_rng(5)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], bool)
    lay = TensorLayout(0, (2, 3))
    x = (rng.standard_normal((3, 4, 5, 5)) * 50).astype(np.float32)
    x[~(mask[:, None, :, None] & mask[:, None, None, :]).repeat(4, axis=1)] = -np.inf  # padding only
    fast, slow = StatsAccumulator("t", 2048), StatsAccumulator("t", 2048)
    observe_real_tokens(fast, x.copy(), lay, mask)
    ro = x.copy()
    ro.setflags(write=False)  # read-only: falls back to views of the real tokens
    observe_real_tokens(slow, ro, lay, mask)
    a, b = fast.freeze(), slow.freeze()
    assert a.count == b.count == 4 * (16 + 4 + 9) and a.neginf_count == b.neginf_count == 0
    assert (a.min, a.max) == (b.min, b.max)
    np.testing.assert_array_equal(a.histogram.counts, b.histogram.counts)


def test_cli_budget_options(tmp_path, monkeypatch):
    import json

    from calib_helpers import write_model_dir
    from typer.testing import CliRunner

    from calibkit.cli import app
    from calibkit.data.calibset import write_calibration_set

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    r = CliRunner().invoke(app, ["calibrate", str(model), "-c", str(tmp_path / "set"), "--out", str(tmp_path / "o"),
                                 "--memory-budget", "64K", "--max-batch-tokens", "40"])
    assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "o" / "calibration.json").read_text())["statistics"]
    assert stats["memory_budget_bytes"] == 64 << 10 and stats["max_batch_tokens"] == 40 and stats["batches"] > 1
    r = CliRunner().invoke(app, ["calibrate", str(model), "-c", str(tmp_path / "set"), "--out", str(tmp_path / "b"),
                                 "--memory-budget", "lots"])
    assert r.exit_code == 2 and "4G" in r.output


def test_overlap_halves_the_budget_holds_at_most_two_batches_and_changes_no_statistic(tok):
    """Batch k+1 is inferred while batch k's statistics run: each batch gets half the budget, so the two alive
    together fit it, and the statistics are those of running one batch at a time."""
    import weakref

    alive: list[weakref.ref] = []
    most_alive = [0]

    def counting_runner():
        inner = _fake_runner()

        def fn(feeds):
            most_alive[0] = max(most_alive[0], sum(1 for r in alive if r() is not None))
            with inner:
                out = dict(inner.infer(feeds))
            alive.extend(weakref.ref(x) for x in out.values())
            return out

        return FunctionRunner(fn, inner.input_specs, ["H", "A", "Kt"])

    items = texts(80, seed=12)
    budget = TokenBudget(memory_bytes=12_000)
    args = (["H", "A", "Kt"],)
    turn = collect_stats(_fake_runner, bucketed_batches(tok, items, NAMES, batch_size=64, budget=budget), *args,
                         threads=2, overlap=False)
    ahead = collect_stats(counting_runner, bucketed_batches(tok, items, NAMES, batch_size=64, budget=budget), *args,
                          threads=2, overlap=True)
    _same(turn, ahead)
    assert ahead.meta["overlapped"] and not turn.meta["overlapped"]
    assert ahead.meta["batches"] > turn.meta["batches"] > 2
    assert turn.meta["largest_batch_tapped_bytes"] > budget.memory_bytes // 2
    assert ahead.meta["largest_batch_tapped_bytes"] <= budget.memory_bytes // 2
    assert most_alive[0] <= 3  # one batch's three outputs alive when the next inference starts, never two batches
    one = collect_stats(_fake_runner, bucketed_batches(tok, items, NAMES, batch_size=64, budget=budget), *args,
                        threads=1, overlap=True)
    assert not one.meta["overlapped"]  # nothing to overlap with on one statistics thread


@pytest.mark.parametrize("where", ["inference", "statistics"])
def test_overlap_fails_cleanly_on_either_thread(tok, where):
    """An error in the model run (second thread) or while batch k is consumed reaches the caller as itself."""
    from calibkit.errors import BackendError

    calls = {"n": 0}

    def failing_runner():
        inner = _fake_runner()

        def fn(feeds):
            calls["n"] += 1
            if where == "inference" and calls["n"] == 4:  # after the two probe runs and the first batch
                raise BackendError("boom in inference")
            with inner:
                return dict(inner.infer(feeds))

        return FunctionRunner(fn, inner.input_specs, ["H", "A", "Kt"])

    def progress(event):
        if where == "statistics" and event.done == 2:
            raise RuntimeError("boom in statistics")

    batches = bucketed_batches(tok, texts(80, seed=12), NAMES, batch_size=64, budget=TokenBudget(memory_bytes=12_000))
    with pytest.raises((BackendError, RuntimeError), match="boom in " + where):
        collect_stats(failing_runner, batches, ["H", "A", "Kt"], threads=2, overlap=True, progress=progress)
    assert calls["n"] >= 4
