"""`compare` end to end on a tiny text classifier (word-level tokenizer + Gather/MatMul/Relu net), every number
checked against an independent numpy / ONNX Runtime computation."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.metrics import accuracy_score, f1_score

from calibkit.data.evalset import load_eval_set
from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.evaluate.compare import compare_engines
from calibkit.graph import add_outputs, model_sha256
from calibkit.quantize.qdq import Target, quantize_model, save_model
from calibkit.requests.compare import CompareRequest
from calibkit.resources import Resources
from calibkit.results.codec import parse_result, to_document
from calibkit.results.flags import Thresholds
from calibkit.types import Backend, CalibrationTable, Method, MethodParams, Precision, TensorRange

WORDS = ["good", "great", "fine", "love", "bad", "awful", "hate", "poor", "movie", "plot", "the", "a", "is", "was"]
POS, NEG = WORDS[:4], WORDS[4:8]
H = 8


def make_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"id2label": {"0": "negative", "1": "positive"}}))


def make_model(seed: int = 0) -> onnx.ModelProto:
    """ids -> Gather(E) -> MatMul(W1) -> Add -> Relu -> MatMul(W2) -> ReduceMean(seq) -> MatMul(W3) -> logits.
    The embedding row of a positive word points one way, of a negative word the other."""
    rng = np.random.default_rng(seed)
    vocab = len(WORDS) + 4
    emb = (rng.standard_normal((vocab, H)) * 0.5).astype(np.float32)
    for w in POS:
        emb[WORDS.index(w) + 4, 0] += 2.0
    for w in NEG:
        emb[WORDS.index(w) + 4, 0] -= 2.0
    emb[WORDS.index("awful") + 4, 1] = 40.0  # an outlier activation that a tight clip range will cut
    w1 = (rng.standard_normal((H, H)) * 0.4).astype(np.float32)
    w1[0, 0] = 2.0
    b1 = (rng.standard_normal(H) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((H, H)) * 0.4).astype(np.float32)
    w2[0, 0] = 2.0
    w3 = (rng.standard_normal((H, 2)) * 0.2).astype(np.float32)
    w3[0] = [-1.0, 1.0]
    inits = [numpy_helper.from_array(a, n) for a, n in ((emb, "E"), (w1, "W1"), (b1, "B1"), (w2, "W2"), (w3, "W3"))]
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
        helper.make_node("MatMul", ["emb", "W1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "B1"], ["h1b"], name="fc1_bias"),
        helper.make_node("Relu", ["h1b"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "W2"], ["h2"], name="fc2"),
        helper.make_node("ReduceMean", ["h2"], ["pooled"], name="pool", axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "W3"], ["logits"], name="classifier"),
    ]
    g = helper.make_graph(
        nodes,
        "tiny-classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def make_texts(n: int, seed: int = 1) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    filler = WORDS[8:]
    for _ in range(n):
        pos = bool(rng.integers(2))
        k = int(rng.integers(1, 6))
        words = [str(rng.choice(filler)) for _ in range(k)]
        words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(POS if pos else NEG)))
        if rng.random() < 0.25:  # noise: a word of the other class
            words.append(str(rng.choice(NEG if pos else POS)))
        texts.append(" ".join(words))
        labels.append("positive" if pos else "negative")
    return texts, labels


def ort_run(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    want = {i.name for i in sess.get_inputs()}
    return sess.run(outputs, {k: v for k, v in feeds.items() if k in want})


def table_for(model: onnx.ModelProto, texts: list[str], tok: TextTokenizer, squeeze: float) -> CalibrationTable:
    """Minmax ranges of the MatMul inputs, with the first one (emb) shrunk by ``squeeze`` to force clipping."""
    tensors = ["emb", "r1", "pooled"]
    enc = tok.encode(texts)
    vals = ort_run(add_outputs(model, tensors), {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask},
                   tensors)
    amax = {t: float(np.abs(v).max()) for t, v in zip(tensors, vals)}
    amax["emb"] *= squeeze
    return CalibrationTable("sha", "set", Method.MINMAX, MethodParams(),
                            tuple(TensorRange(t, a, Method.MINMAX) for t, a in amax.items()))


def build_engines(root: Path, *, target: Target = Target.TENSORRT, squeeze: float = 0.1) -> dict[str, Path]:
    tokdir = root / "model"
    make_tokenizer(tokdir)
    fp = make_model()
    fp_path = root / "model" / "model.onnx"
    save_model(fp, fp_path)
    sha = model_sha256(fp_path)
    tok = TextTokenizer(tokdir)
    texts, labels = make_texts(80)
    table = table_for(fp, texts[:40], tok, squeeze)
    cal = root / "calibration.json"
    cal.write_text(json.dumps(table.to_dict()))
    q = quantize_model(fp, table, target=target)
    int8_path = root / "int8.onnx"
    save_model(q.model, int8_path)
    fp_engine = root / "fp32.onnx"
    save_model(fp, fp_engine)
    common = dict(
        backend=Backend.ONNXRUNTIME, source_model_sha256=sha, tokenizer=str(tokdir), source_model=str(fp_path)
    )
    EngineArtifact(path=fp_engine, precision=Precision.FP32, **common).save()  # type: ignore[arg-type]
    EngineArtifact(path=int8_path, precision=Precision.INT8, calibration_json=str(cal), **common).save()  # type: ignore[arg-type]
    evalp = root / "eval.jsonl"
    evalp.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in zip(texts, labels)))
    return {"fp": fp_engine, "int8": int8_path, "eval": evalp, "tok": tokdir, "cal": cal, "source": fp_path}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_engines(tmp_path_factory.mktemp("tiny"))


def compare_files(fp: Path, int8: Path, eval_set: Path, *, workers: int | None = 1, **options):  # type: ignore[no-untyped-def]
    """compare_engines on engine files and an eval file, without traffic unless asked."""
    request = CompareRequest(engine_a=EngineArtifact.load(fp), engine_b=EngineArtifact.load(int8),
                             eval_set=load_eval_set(eval_set), **{"traffic": None, **options})
    return compare_engines(request, Resources(workers=workers))


@pytest.fixture(scope="module")
def comparison(tiny: dict[str, Path]):
    return compare_files(tiny["fp"], tiny["int8"], tiny["eval"], batch_size=16, sensitivity=True,
                         sensitivity_samples=40)


def _engine_classes(engine: Path, texts: list[str], tok: TextTokenizer, batch_size: int) -> np.ndarray:
    """The classes compare's own engine runner (its ONNX Runtime session options) gives ``texts`` in batches of
    ``batch_size``: what compare computed, recomputed, so no INT8 kernel's near-tie can tell them apart."""
    from calibkit.enginefiles.registry import open_runner
    from calibkit.evaluate.predict import predict_logits

    with open_runner(engine) as runner:
        return predict_logits(runner, tok, texts, batch_size=batch_size).argmax(1)


def test_accuracy_matches_ort_argmax(tiny, comparison) -> None:
    ev = load_eval_set(tiny["eval"])
    tok = TextTokenizer(tiny["tok"])
    y = np.array([1 if lab == "positive" else 0 for lab in ev.labels])
    logits = comparison.per_text.by_engine
    for eng, path in zip(comparison.engines, (tiny["fp"], tiny["int8"])):
        # the same texts in the same batches through the same runner give the same classes
        assert (_engine_classes(path, list(ev.texts), tok, 16) == logits[eng.name].argmax(axis=1)).all()
        assert eng.accuracy == pytest.approx(accuracy_score(y, logits[eng.name].argmax(axis=1)))
        assert eng.macro_f1 == pytest.approx(f1_score(y, logits[eng.name].argmax(axis=1), average="macro"))
        assert sum(map(sum, eng.confusion_matrix)) == len(ev)
    a, b = logits["A"], logits["B"]
    assert comparison.agreement == pytest.approx(np.mean(a.argmax(1) == b.argmax(1)))
    assert comparison.outputs.max_abs_error == pytest.approx(np.abs(a - b).max(), rel=1e-6)
    dis = [d.index for d in comparison.disagreements]
    assert dis == [int(i) for i in np.flatnonzero(a.argmax(1) != b.argmax(1))][:50]


def test_layers_found_in_graph_order_with_amax(tiny, comparison) -> None:
    table = json.loads(tiny["cal"].read_text())
    amax = {r["tensor"]: r["amax"] for r in table["ranges"]}
    layers = list(comparison.layers)
    assert [(s.node, s.tensor) for s in layers] == [("fc1", "emb"), ("fc2", "r1"), ("classifier", "pooled")]
    for s in layers:
        assert s.amax == pytest.approx(amax[s.tensor], rel=1e-6)


def test_layer_ranges_and_sqnr_match_brute_force(tiny, comparison) -> None:
    """Stream vs. hold everything: the per-layer numbers equal a direct numpy computation on the same batches."""
    from calibkit.evaluate.predict import length_batches

    tok = TextTokenizer(tiny["tok"])
    ev = load_eval_set(tiny["eval"])
    # layer statistics stream the layer subset in its canonical order (all rows here: the set is small)
    sub = comparison.subsets.layers
    assert sub is not None and sub.count == len(ev)
    texts = [ev.texts[i] for i in sub.indices]
    fp = onnx.load(str(tiny["fp"]))
    q = onnx.load(str(tiny["int8"]))
    xs: dict[str, list[np.ndarray]] = {"emb": [], "r1": [], "pooled": []}
    err: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"h1": [], "h2": [], "logits": []}
    lengths = tok.token_lengths(texts)
    for idx in length_batches(lengths, 16):
        enc = tok.encode([texts[i] for i in idx])
        feeds = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}
        m = enc.attention_mask.astype(bool)
        fv = ort_run(add_outputs(fp, list(xs) + list(err)), feeds, list(xs) + list(err))
        qv = ort_run(add_outputs(q, list(err)), feeds, list(err))
        fd = dict(zip(list(xs) + list(err), fv))
        qd = dict(zip(err, qv))
        for t in xs:
            xs[t].append(fd[t][m] if fd[t].ndim == 3 else fd[t].reshape(-1, H))
        for t in err:
            a, b = fd[t], qd[t]
            err[t].append((a[m], b[m]) if a.ndim == 3 else (a, b))
    by_tensor = {r.tensor: r for r in comparison.layers}
    for t, parts in xs.items():
        v = np.concatenate([p.reshape(-1) for p in parts])
        meas = by_tensor[t]
        spec = meas
        assert meas.fp_min == pytest.approx(v.min(), rel=1e-6)
        assert meas.fp_max == pytest.approx(v.max(), rel=1e-6)
        width = 2 * np.abs(v).max() / 8192
        srt = np.sort(np.abs(v))
        for p, got in ((99.0, meas.p99), (99.99, meas.p9999)):
            k = math.ceil(p / 100 * len(srt))  # the histogram's percentile lies between neighbouring order stats
            assert srt[max(0, k - 2)] - width <= got <= srt[min(len(srt) - 1, k)] + width
        # values within float noise of amax (the calibration text that set it, padded differently) may go
        # either way
        lo, hi = np.mean(np.abs(v) > spec.amax * (1 + 1e-5)), np.mean(np.abs(v) > spec.amax * (1 - 1e-5))
        assert lo - 1e-12 <= meas.clipped_fraction <= hi + 1e-12
    assert by_tensor["emb"].clipped_fraction > 1e-3  # squeezed on purpose
    by_output = {r.output: r for r in comparison.layers}
    for t, pairs in err.items():
        a = np.concatenate([p[0].reshape(-1) for p in pairs]).astype(np.float64)
        b = np.concatenate([p[1].reshape(-1) for p in pairs]).astype(np.float64)
        sqnr = 10 * math.log10((a**2).sum() / ((a - b) ** 2).sum())
        cos = (a * b).sum() / math.sqrt((a**2).sum() * (b**2).sum())
        assert by_output[t].sqnr_db == pytest.approx(sqnr, abs=1e-6)
        assert by_output[t].cosine == pytest.approx(cos, abs=1e-9)


def test_weight_sqnr_against_dequantized_initializers(tiny, comparison) -> None:
    fp = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tiny["fp"])).graph.initializer}
    q = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tiny["int8"])).graph.initializer}
    for r in comparison.layers:
        w_name = {"fc1": "W1", "fc2": "W2", "classifier": "W3"}[r.node]
        w = fp[w_name].astype(np.float64)
        deq = q[f"{w_name}_quantized"].astype(np.float64) * q[f"{w_name}_scale"].astype(np.float64).reshape(1, -1)
        want = 10 * math.log10((w**2).sum() / ((w - deq) ** 2).sum())
        assert r.weight_sqnr_db == pytest.approx(want, abs=1e-6)
        assert r.weight_zeroed_fraction == pytest.approx(np.mean(deq[w != 0] == 0))


def test_flags_and_document(tiny, comparison) -> None:
    doc = to_document(comparison)
    assert parse_result(json.loads(json.dumps(doc, allow_nan=False))) == comparison  # every field round-trips
    emb = next(x for x in doc["layers"] if x["tensor"] == "emb")
    assert any("clipped" in r for r in emb["reasons"])
    # the clipping heuristic fires; the measured sensitivity decides between keep-fp16 and watch
    sens = emb["sensitivity"]
    t = doc["thresholds"]
    abt, only = sens["all_but_this"], sens["only_this_int8"]
    over = (abt["delta"] * 100 > t["min_recovery_points"], -only["delta"] * 100 > t["max_cost_points"])
    harmful = (over[0] and abt["significant"]) or (over[1] and only["significant"])
    unsure = not harmful and any(over)
    worse = doc["difference"]["accuracy"]["verdict"] == "loss"
    want = ("keep-fp16" if worse else "watch") if harmful else ("insufficient-evidence" if unsure else "watch")
    assert emb["flag"] == want
    assert ("fc1" in doc["recommendation"]["keep_in_higher_precision"]) == (want == "keep-fp16")
    assert doc["difference"]["accuracy"]["low"] <= doc["difference"]["accuracy"]["estimate"]
    bands = doc["flips_by_confidence"]
    assert sum(b["texts"] for b in bands) == doc["eval_set"]["count"]
    assert sum(b["flips"] for b in bands) == round(doc["flip_rate"] * doc["eval_set"]["count"])
    for d in doc["disagreements"]:
        assert 0.0 <= d["confidence_a"] <= 1.0
    assert doc["subsets"]["sensitivity"]["count"] == 40
    assert doc["histograms"], "histograms of the worst layers"
    for h in doc["histograms"].values():
        assert len(h["counts"]) <= 256 and set(h["thresholds"]) >= {"entropy", "minmax", "percentile", "mse", "amax"}
    json.dumps(doc, allow_nan=False)


def test_sensitivity_matches_direct_variants(tiny, comparison) -> None:
    """Only-fc1-INT8 variant built and scored by hand gives the same accuracy as the pooled work unit."""
    from calibkit.evaluate.sensitivity import load_calibration_table

    assert comparison.sensitivity_samples == 40
    full = load_eval_set(tiny["eval"])
    sub = comparison.subsets.sensitivity
    assert sub is not None and sub.count == 40 and sub.of == len(full)
    # a stratified random subset, not the first 40 rows
    assert sorted(sub.indices) != list(range(40))
    assert sum(full.labels[i] == "positive" for i in sub.indices) == round(40 * full.labels.count("positive") / 80)
    ev = replace(full, texts=tuple(full.texts[i] for i in sub.indices),
                 labels=tuple(full.labels[i] for i in sub.indices))
    tok = TextTokenizer(tiny["tok"])
    y = np.array([1 if lab == "positive" else 0 for lab in ev.labels])
    table = load_calibration_table(tiny["cal"])
    fp = onnx.load(str(tiny["source"]))
    variant = quantize_model(fp, table, keep_nodes=("fc2", "classifier")).model
    p = tiny["tok"].parent / "variant.onnx"
    save_model(variant, p)
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    with OnnxRuntimeRunner(p) as r:
        logits = predict_logits(r, tok, list(ev.texts), batch_size=16)
    fc1 = comparison.layer("fc1").sensitivity
    assert fc1.only_this_int8.accuracy == pytest.approx(np.mean(logits.argmax(1) == y))
    reference = comparison.per_text.by_engine["A"][list(sub.indices)]  # FP32 (A) gives the reference logits
    assert fc1.only_this_int8.delta == pytest.approx(fc1.only_this_int8.accuracy - np.mean(reference.argmax(1) == y))
    assert fc1.all_but_this.accuracy is not None and fc1.all_but_this.delta is not None


def test_onnxruntime_layout_uint8_zero_point_128(tmp_path: Path) -> None:
    paths = build_engines(tmp_path, target=Target.ONNXRUNTIME)
    q = onnx.load(str(paths["int8"]))
    zps = [i for i in q.graph.initializer if i.name.endswith("_zero_point") and i.data_type == TensorProto.UINT8]
    assert zps, "the ONNX Runtime target writes uint8 activations"
    c = compare_files(paths["fp"], paths["int8"], paths["eval"], workers=None, batch_size=16, sensitivity=False,
                      thresholds=Thresholds(min_sqnr_db=200.0))
    assert c.engine_b.layout == "onnxruntime" and c.engine_a.layout is None  # the layout measured, recorded
    table = json.loads(paths["cal"].read_text())
    amax = {r["tensor"]: r["amax"] for r in table["ranges"]}
    specs = list(c.layers)
    assert specs and all(s.amax == pytest.approx(amax[s.tensor], rel=1e-6) for s in specs)
    # every layer is below a 200 dB SQNR bar; keep advice only where INT8 is significantly less accurate
    want = "keep-fp16" if c.accuracy_diff.significant and c.accuracy_diff.estimate < 0 else "watch"
    assert all(r.flag.value == want for r in c.layers)
    if want == "watch":
        assert all("not significantly less accurate" in r.reasons[-1] for r in c.layers)
        assert c.keep_in_higher_precision == ()


@pytest.mark.slow  # two spawned interpreters importing ONNX Runtime: several seconds
def test_sensitivity_pool_matches_in_process(tiny) -> None:
    """The work unit is serialisable: a 2-process pool returns what running the jobs in-process returns."""
    import pickle

    from calibkit.evaluate.sensitivity import ALL_BUT_THIS, SensitivityJob, run_jobs

    ev = load_eval_set(tiny["eval"]).head(24)
    base = dict(source_model=str(tiny["source"]), calibration_json=str(tiny["cal"]), tokenizer=str(tiny["tok"]),
                texts=ev.texts, labels=tuple(1 if x == "positive" else 0 for x in ev.labels),
                reference_logits=tuple((0.0, 1.0) for _ in ev.texts), mode=ALL_BUT_THIS, batch_size=8)
    jobs = [SensitivityJob(keep_nodes=(n,), node=n, **base) for n in ("fc1", "fc2", "classifier")]  # type: ignore[arg-type]
    assert pickle.loads(pickle.dumps(jobs[0])) == jobs[0]
    pooled = run_jobs(jobs, workers=2)
    local = run_jobs(jobs, workers=1)
    assert [(r.node, r.accuracy, r.logit_mse) for r in pooled] == [(r.node, r.accuracy, r.logit_mse) for r in local]
    assert all(r.error is None for r in pooled)


def test_sensitivity_limited_to_worst_layers(tiny, comparison) -> None:
    c = compare_files(tiny["fp"], tiny["int8"], tiny["eval"], batch_size=16, sensitivity=True,
                      sensitivity_samples=40, sensitivity_layers=1)
    measured = {v.node for v in c.layers if v.sensitivity is not None}
    assert len(measured) == 1
    chosen = next(iter(measured))

    def own(r):
        q = r.quant_sqnr_db
        w = r.weight_sqnr_db
        z = r.weight_zeroed_fraction or 0.0
        return min(q if q is not None else float("inf"), w if w is not None else float("inf")) - 100 * z

    worst = min(comparison.layers, key=own).node
    assert chosen == worst
    # the full analysis covers every node
    assert all(v.sensitivity is not None for v in comparison.layers)


def test_same_rows_in_another_order_give_the_same_flags(tiny, comparison, tmp_path: Path) -> None:
    rows = [json.loads(x) for x in Path(tiny["eval"]).read_text().splitlines()]
    perm = np.random.default_rng(7).permutation(len(rows))
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(rows[i]) + "\n" for i in perm))
    again = compare_files(tiny["fp"], tiny["int8"], shuffled, batch_size=16, sensitivity=True,
                          sensitivity_samples=40)
    assert comparison.subsets.sensitivity.content_sha256 == again.subsets.sensitivity.content_sha256
    assert comparison.subsets.layers.content_sha256 == again.subsets.layers.content_sha256
    assert [(r.node, r.flag, r.reasons) for r in comparison.layers] == \
        [(r.node, r.flag, r.reasons) for r in again.layers]
    assert comparison.accuracy_diff == again.accuracy_diff


def test_a_recovery_within_its_uncertainty_is_insufficient_evidence() -> None:
    from calibkit.evidence.intervals import paired_difference
    from calibkit.results.flags import Flag, flag_layer

    n = 256
    base = np.zeros(n, dtype=bool)
    base[:200] = True
    kept = base.copy()
    kept[200:202] = True  # 2 more correct of 256: +0.78 points
    noisy = paired_difference(base, kept)
    common = dict(sqnr_db=40.0, clipped_fraction=0.0, outlier_ratio=2.0, nonfinite=0, fp_absmax=5.0,
                  quant_sqnr_db=40.0, only_this_delta=0.0)
    f = flag_layer(Thresholds(), **common, all_but_this_delta=2 / n, all_but_this_diff=noisy)
    assert f.flag is Flag.INSUFFICIENT
    assert any("insufficient evidence on 256 examples" in r and "would settle it" in r for r in f.reasons)
    kept[202:240] = True  # 40 more: real
    real = paired_difference(base, kept)
    f = flag_layer(Thresholds(), **common, all_but_this_delta=40 / n, all_but_this_diff=real)
    assert f.flag is Flag.KEEP_FP16


def test_traffic_measures_fidelity_without_labels(tiny, tmp_path: Path) -> None:
    """compare --traffic: B's fidelity to A on unlabeled log texts, with where they came from; agreement and its
    interval equal a direct count over the same texts; the document round-trips."""
    import calibkit as ck
    from calibkit.results.codec import parse_result, to_document

    texts, _ = make_texts(300, seed=23)
    log = tmp_path / "traffic.jsonl"
    log.write_text("".join(json.dumps({"text": t, "status": 200}) + "\n" for t in texts) + "{broken\n")
    res = ck.compare(tiny["fp"], tiny["int8"], tiny["eval"], layers=False, batch_size=16, traffic=log,
                     traffic_size=200)
    tr = res.traffic
    assert tr is not None and 0 < tr.evidence.count <= 200 and not tr.evidence.labelled
    assert tr.evidence.path == str(log) and any("broken" in x for x in tr.evidence.exclusions)
    assert tr.agreement_ci is not None and tr.flips is not None and tr.fidelity.agreement is not None
    # the same texts, run directly: the flips are B's argmax against A's
    from calibkit.evaluate.traffic import TrafficOptions, draw_traffic

    drawn = draw_traffic(log, TrafficOptions(size=200, seed=0))
    tok = TextTokenizer(tiny["tok"])
    a = _engine_classes(tiny["fp"], list(drawn.texts), tok, 16)  # as compare ran them (--batch-size 16)
    b = _engine_classes(tiny["int8"], list(drawn.texts), tok, 16)
    assert tr.flips == int((a != b).sum())
    assert tr.fidelity.agreement == pytest.approx(1 - tr.flips / len(drawn))
    assert parse_result(to_document(res)) == res


def test_no_layer_advice_without_sensitivity_says_not_measured(tiny) -> None:
    from typer.testing import CliRunner

    from calibkit.cli import app

    r = CliRunner().invoke(app, ["compare", str(tiny["fp"]), str(tiny["int8"]), "-e", str(tiny["eval"]),
                                 "--no-sensitivity", "--no-report", "--batch-size", "16"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "no layer needs higher precision" not in flat
    assert "recommendation" not in flat or "not measured" in flat or "keep" in flat


def test_compare_without_an_eval_set_judges_on_traffic_alone(tiny, tmp_path: Path, monkeypatch) -> None:
    """No --eval-set: the traffic texts are the (unlabeled) eval set, evaluated once; the traffic block agrees
    with it; with neither, the command says what to pass."""
    import calibkit as ck
    from calibkit.evaluate import compare as cmp

    texts, _ = make_texts(300, seed=29)
    log = tmp_path / "traffic.jsonl"
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    calls = []
    real = cmp._traffic_outputs
    monkeypatch.setattr(cmp, "_traffic_outputs", lambda *a, **k: calls.append(1) or real(*a, **k))
    res = ck.compare(tiny["fp"], tiny["int8"], layers=False, batch_size=16, traffic=log, traffic_size=150)
    assert calls == []  # the traffic outputs are the eval set's, not a second run
    assert res.eval_set.count == res.traffic.evidence.count == 150 and res.eval_set.path == str(log)
    assert res.traffic.fidelity.agreement == pytest.approx(res.agreement)
    assert all(e.accuracy is None for e in res.engines)
    with pytest.raises(ck.UsageError, match="an eval set, or traffic"):
        ck.compare(tiny["fp"], tiny["int8"], layers=False, traffic=None)
    from typer.testing import CliRunner

    from calibkit.cli import app

    r = CliRunner().invoke(app, ["compare", str(tiny["fp"]), str(tiny["int8"]), "--traffic", str(log),
                                 "--traffic-size", "100", "--no-layers", "--no-report", "--batch-size", "16"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["compare", str(tiny["fp"]), str(tiny["int8"]), "--no-traffic", "--no-report"])
    assert r.exit_code != 0 and "eval set, or traffic" in " ".join(r.output.split())

