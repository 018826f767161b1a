import numpy as np
import onnx
import pytest
from calib_helpers import texts, tiny_model, write_tokenizer

from calibkit.calibrate.collect import TensorLayout, collect_stats, tapped_runner, valid_values
from calibkit.calibrate.stats import StatsAccumulator, StatsStore
from calibkit.data.encode import bucketed_batches
from calibkit.data.tokenizer import TextTokenizer
from calibkit.errors import CalibrationError, UsageError
from calibkit.graph import tap_name
from calibkit.quantize.placement import plan_placement


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d, max_positions=12)
    return TextTokenizer(d)


def test_nan_and_inf_are_counted_and_excluded():
    acc = StatsAccumulator("t", 256)
    acc.observe(np.array([1.0, -2.0, np.nan, np.inf, -np.inf, -np.inf, 0.5], np.float32))
    acc.observe(np.array([-np.inf, 3.0], np.float32))
    st = acc.freeze()
    assert (st.nan_count, st.posinf_count, st.neginf_count) == (1, 1, 3)
    assert st.count == 4 and st.min == -2.0 and st.max == 3.0
    assert st.histogram.total == 4


def test_only_non_finite_values():
    acc = StatsAccumulator("t", 256)
    acc.observe(np.full(10, -np.inf, np.float32))
    st = acc.freeze()
    assert st.count == 0 and st.neginf_count == 10 and st.absmax == 0.0


def test_valid_values_masks_sequence_axes():
    mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    got = valid_values(x, TensorLayout(0, (1,)), mask)
    np.testing.assert_array_equal(got, np.concatenate([x[0, :2].ravel(), x[1, :1].ravel()]))
    att = np.arange(2 * 5 * 3 * 3, dtype=np.float32).reshape(2, 5, 3, 3)  # [b, h, s, s]
    got = valid_values(att, TensorLayout(0, (2, 3)), mask)
    want = np.concatenate([att[0, :, :2, :2].ravel(), att[1, :, :1, :1].ravel()])
    np.testing.assert_array_equal(np.sort(got), np.sort(want))
    kt = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)  # [b, d, s] (K transposed)
    assert valid_values(kt, TensorLayout(0, (2,)), mask).size == 4 * 3


def _single_text_stats(model, tok, items, tensors):
    """Brute force: each text alone (no padding at all), values concatenated."""
    runner = tapped_runner(model, tensors)
    vals = {t: [] for t in tensors}
    with runner:
        for t in items:
            enc = tok.encode([t])
            out = runner.infer(enc.feeds(["input_ids", "attention_mask"]))
            for name in tensors:
                vals[name].append(out[tap_name(name, model)].ravel())
    return {k: np.concatenate(v) for k, v in vals.items()}


def test_variable_lengths_with_padding_masked_match_unpadded_runs(tok):
    model = tiny_model()
    tensors = list(plan_placement(model).activations)
    items = texts(23, seed=1)
    batches = bucketed_batches(tok, items, ["input_ids", "attention_mask"], batch_size=4)
    assert len({b.feeds["input_ids"].shape[1] for b in batches}) > 1  # really variable lengths
    store = collect_stats(model, batches, tensors, num_bins=512)
    ref = _single_text_stats(model, tok, items, tensors)
    for t in tensors:
        st = store[t]
        if t == "pooled":  # [b, dim]: no sequence axis, nothing to mask
            assert st.count == ref[t].size
            continue
        assert st.count == ref[t].size, t  # exactly the real-token positions, for [b,s,d], [b,d,s], [b,s,s]
        assert st.max == pytest.approx(float(ref[t].max()), rel=1e-4, abs=1e-5)
        assert st.min == pytest.approx(float(ref[t].min()), rel=1e-4, abs=1e-5)
        assert st.non_finite == 0  # the -inf key mask sits on padded keys only
    assert store.meta["unmasked"] == ["pooled"]
    assert store.meta["padding_fraction"] > 0


def test_unmasked_collection_sees_padding_and_minus_inf(tok):
    model = tiny_model()
    items = texts(12, seed=2)
    batches = bucketed_batches(tok, items, ["input_ids", "attention_mask"], batch_size=6)
    tapped_model = model
    # tap the Where output (-inf on padded keys) by treating Softmax as a quantized op
    plain = [b.feeds for b in batches]
    store = collect_stats(tapped_model, plain, ["S2", "P"], num_bins=256)
    assert store["S2"].neginf_count > 0
    assert np.isfinite(store["S2"].absmax)


def test_memory_does_not_grow_with_samples(tok):
    model = tiny_model()
    tensors = list(plan_placement(model).activations)
    small = collect_stats(model, bucketed_batches(tok, texts(4), ["input_ids", "attention_mask"]), tensors)
    big = collect_stats(model, bucketed_batches(tok, texts(200, seed=3), ["input_ids", "attention_mask"],
                                                batch_size=8), tensors)
    assert big.meta["samples"] == 200 and small.meta["samples"] == 4
    assert big.nbytes == small.nbytes == len(tensors) * 2048 * 8


def test_store_save_load_round_trip(tmp_path, tok):
    model = tiny_model()
    tensors = list(plan_placement(model).activations)
    store = collect_stats(model, bucketed_batches(tok, texts(10), ["input_ids", "attention_mask"]), tensors,
                          num_bins=256)
    path = store.save(tmp_path / "s.npz")
    back = StatsStore.load(path)
    assert list(back) == list(store) and back.num_bins == 256
    for t in tensors:
        a, b = store[t], back[t]
        np.testing.assert_array_equal(a.histogram.counts, b.histogram.counts)
        assert (a.count, a.min, a.max, a.histogram.upper) == (b.count, b.min, b.max, b.histogram.upper)
    assert back.meta["samples"] == 10
    with pytest.raises(CalibrationError, match="no statistics"):
        back["nope"]


def test_store_merge_equals_single_run(tok):
    model = tiny_model()
    tensors = ["E", "P"]
    items = texts(16, seed=5)
    names = ["input_ids", "attention_mask"]
    whole = collect_stats(model, bucketed_batches(tok, items, names, batch_size=5), tensors)
    a = collect_stats(model, bucketed_batches(tok, items[:8], names), tensors)
    b = collect_stats(model, bucketed_batches(tok, items[8:], names), tensors)
    m = a.merge(b)
    for t in tensors:
        assert m[t].count == whole[t].count
        assert m[t].absmax == pytest.approx(whole[t].absmax, rel=1e-5)


def test_truncation_is_counted(tok):
    long = " ".join(["good"] * 40)
    batches = bucketed_batches(tok, [long, "bad film"], ["input_ids", "attention_mask"])
    assert batches.truncated == 1
    assert max(b.feeds["input_ids"].shape[1] for b in batches) == 12


def test_errors():
    model = tiny_model()
    with pytest.raises(CalibrationError):
        collect_stats(model, [], [], num_bins=256)
    with pytest.raises(UsageError):
        collect_stats(model, [], ["E"], num_bins=1000)
    with pytest.raises(CalibrationError, match="empty"):
        collect_stats(model, [], ["E"], num_bins=256)
    assert isinstance(model, onnx.ModelProto)


def test_taps_appended_to_the_file_bytes_equal_a_serialized_tapped_model(tok):
    """The tapped session built from the model's own bytes plus a protobuf suffix (no re-serialization) returns
    what the tapped model serialized as a whole returns, graph inputs passed through Identity included."""
    from calibkit.calibrate.collect import tap_names

    model = tiny_model()
    data = model.SerializeToString()
    tensors = [*plan_placement(model).activations, "input_ids"]  # a graph input: tapped through an Identity
    assert tap_names(model, tensors) == [tap_name(t, model) for t in tensors]
    feeds = tok.encode(texts(3, seed=4)).feeds(["input_ids", "attention_mask"])
    outs = []
    for runner in (tapped_runner(model, tensors), tapped_runner(model, tensors, serialized=data),
                   tapped_runner(data, tensors)):
        with runner:
            outs.append(runner.infer(feeds))
    assert model.SerializeToString() == data  # the proto was restored, the bytes never touched
    for name in tap_names(model, tensors):
        np.testing.assert_array_equal(outs[0][name], outs[1][name])
        np.testing.assert_array_equal(outs[0][name], outs[2][name])
    items = texts(17, seed=5)
    tensors = list(plan_placement(model).activations)
    a = collect_stats(model, bucketed_batches(tok, items, ["input_ids", "attention_mask"], batch_size=4), tensors)
    b = collect_stats(model, bucketed_batches(tok, items, ["input_ids", "attention_mask"], batch_size=4), tensors,
                      serialized=data)
    for t in tensors:
        np.testing.assert_array_equal(a[t].histogram.counts, b[t].histogram.counts)
        assert (a[t].min, a[t].max, a[t].count) == (b[t].min, b[t].max, b[t].count)
    assert {"session_seconds", "probe_seconds"} <= set(b.meta)
