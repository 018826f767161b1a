"""`tune` end to end on the tiny text classifier of test_compare_tiny (no real model needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_compare_tiny import NEG, POS, WORDS, make_texts, make_tokenizer
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set
from calibkit.data.evalset import load_eval_set
from calibkit.data.modeldir import ModelDir
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.onnxruntime import OnnxRuntimeRunner
from calibkit.errors import UsageError
from calibkit.evaluate.predict import predict_logits
from calibkit.evaluate.tune import run_tune as _run_tune
from calibkit.evaluate.tune import split_eval
from calibkit.progress import no_progress
from calibkit.quantize.qdq import save_model
from calibkit.requests.tune import TuneRequest
from calibkit.resources import Resources
from calibkit.results.codec import parse_result, to_document


def make_sensitive_model(outlier: float = 2000.0):
    """ids -> Gather -> fc1 -> Relu -> fc2 -> mean over seq -> classifier. Sentiment lives in two embedding
    dimensions of size ~3; the word "the" carries a huge value in a third, so an INT8 range that covers it
    (scale ~ outlier/127) rounds the sentiment dimensions of fc1's input to zero: fc1 must stay in higher
    precision, the other layers are harmless."""
    rng = np.random.default_rng(0)
    h, vocab = 8, len(WORDS) + 4
    emb = (rng.standard_normal((vocab, h)) * 0.05).astype(np.float32)
    for w in POS:
        emb[WORDS.index(w) + 4, 0] = 3.0
    for w in NEG:
        emb[WORDS.index(w) + 4, 1] = 3.0
    emb[WORDS.index("the") + 4, 2] = outlier
    w1 = np.eye(h, dtype=np.float32)
    w1[2, 2] = 0.0  # the outlier dimension is dropped after fc1
    w2 = np.eye(h, dtype=np.float32)
    w3 = np.zeros((h, 2), dtype=np.float32)
    w3[0] = [-1.0, 1.0]
    w3[1] = [1.0, -1.0]
    return pooled_model(emb, w1, w2, w3, "tiny-sensitive", head=("logits", "classifier"))


def pooled_model(emb: np.ndarray, w1: np.ndarray, w2: np.ndarray, w3: np.ndarray, graph: str,
                 head: tuple[str, str]):
    """ids -> Gather(emb) -> fc1 (w1) -> Relu -> fc2 (w2) -> mean over seq -> head (w3): ``head`` names the
    output and its node; the output is ``[batch, w3's columns]``."""
    output, node = head
    inits = [numpy_helper.from_array(a, n) for a, n in ((emb, "E"), (w1, "W1"), (w2, "W2"), (w3, "W3"))]
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
        helper.make_node("MatMul", ["emb", "W1"], ["h1"], name="fc1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "W2"], ["h2"], name="fc2"),
        helper.make_node("ReduceMean", ["h2"], ["pooled"], name="pool", axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "W3"], [output], name=node),
    ]
    g = helper.make_graph(
        nodes, graph,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", int(w3.shape[1])])], inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tune")
    return sensitive_folder(root, 360)


def sensitive_folder(root: Path, texts: int) -> dict[str, Path]:
    """Under ``root``: the sensitive model's folder (:func:`make_sensitive_model`, a tokenizer beside it), a
    calibration set of the first 60 of ``texts`` seeded texts and a labelled eval set of the rest."""
    make_tokenizer(root / "model")
    save_model(make_sensitive_model(), root / "model" / "model.onnx")
    all_texts, labels = make_texts(texts, seed=5)
    write_calibration_set(root / "cset", all_texts[:60], None)
    ev = root / "eval.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n"
                          for t, lab in zip(all_texts[60:], labels[60:])))
    return {"model": root / "model", "cset": root / "cset", "eval": ev, "root": root}


def test_split_is_stratified_seeded_and_disjoint():
    labels = np.array([0] * 70 + [1] * 30)
    s, h = split_eval(labels, 0.3, seed=0)
    assert len(set(s) & set(h)) == 0 and len(s) + len(h) == 100
    assert (labels[h] == 0).sum() == 21 and (labels[h] == 1).sum() == 9
    s2, h2 = split_eval(labels, 0.3, seed=0)
    assert (h == h2).all()
    assert not (h == split_eval(labels, 0.3, seed=1)[1]).all()


class _DocumentWriter:
    """The report layer's tune.json writer, as calibkit.tune passes it (no report folder)."""

    def document(self, result, path: Path) -> None:
        from calibkit._io import write_json

        write_json(path, to_document(result))

    def report(self, result, folder: Path) -> None:
        raise AssertionError("no report was asked for")


def options(**kw) -> TuneRequest:
    """A tune request's options; run_tune below sets its inputs. No traffic unless asked."""
    return TuneRequest(model="", calibration_set="", **{"traffic": None, **kw})


def run_tune(model, cset, eval_set, out, request: TuneRequest, *, traffic=None, progress=None, workers=1):
    """The library's tune on ``request`` with these inputs, one worker and the tune.json writer; the returned
    run carries ``doc``: its result as the JSON document, which must parse back into the same result."""
    request = replace(request, model=model, calibration_set=cset, eval_set=eval_set, out=out,
                      traffic=traffic if traffic is not None else request.traffic)
    resources = Resources(workers=workers, progress=progress or no_progress, writer=_DocumentWriter())
    run = _run_tune(request, resources)
    doc = json.loads((run.out_dir / "tune.json").read_text())
    from calibkit.evaluate.tune import _traffic_beside

    # the same result, its traffic log named relative to tune.json's folder
    assert parse_result(doc) == _traffic_beside(run.result, run.out_dir)
    return Run(run, doc)


class Run:
    def __init__(self, run, doc) -> None:
        self.run, self.doc = run, doc

    def __getattr__(self, name: str):
        return getattr(self.run, name)


def test_tune_writes_a_plan_whose_accuracy_is_measured(tiny_setup):
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    out = tiny_setup["root"] / "out"
    cfg = options(max_drop=1.0, sensitivity_samples=64, method="auto", smooth=False)
    res = run_tune(md, tiny_setup["cset"], ev, out, cfg)
    doc = res.doc
    assert doc["target"]["fp32_accuracy"] > 0.75
    all_int8 = next(c for c in doc["candidates"] if c["stage"] == "all-int8")
    assert all_int8["accuracy_search"] < doc["target"]["threshold"]  # the outlier breaks plain INT8
    assert res.met_target and res.kept_nodes == ("fc1",)
    assert 0.0 < res.int8_flops_fraction < 1.0
    for f in ("model.int8.onnx", "calibration.cache", "calibration.json", "plan.json", "tune.json"):
        assert (out / f).is_file(), f
    plan = json.loads((out / "plan.json").read_text())
    assert plan["kept_nodes"] == list(res.kept_nodes)
    assert set(plan["reasons"]) == set(res.kept_nodes)
    from calibkit.results.codec import load_typed
    from calibkit.results.documents import PlanDocument

    typed = load_typed(out / "plan.json", PlanDocument)  # through the codec, with the layout it was measured in
    assert typed.layout == cfg.target == "tensorrt" and typed.kept_nodes == res.kept_nodes
    assert typed.claim == res.result.claim
    # every candidate is a measurement; the final one is the accepted candidate
    accepted = [c for c in doc["candidates"] if c["accepted"]]
    assert len(accepted) == 1 and accepted[0]["kept_nodes"] == list(res.kept_nodes)
    # independent check: run the written INT8 model on the holdout split and compare with the reported number
    from calibkit.data.evalset import label_ids

    y = label_ids(ev, md.id2label, 2)
    _, hold = split_eval(y, cfg.holdout_fraction, cfg.seed, texts=ev.texts)
    tok = TextTokenizer(md.tokenizer_path)
    with OnnxRuntimeRunner(res.model_path) as r:
        logits = predict_logits(r, tok, [ev.texts[i] for i in hold])
    assert doc["final"]["accuracy_holdout"] == pytest.approx(float(np.mean(logits.argmax(1) == y[hold])))
    with OnnxRuntimeRunner(md.onnx_path) as r:
        ref = predict_logits(r, tok, list(ev.texts)).argmax(1)[hold]  # as tune runs FP32: once, on everything
    hold_ev = doc["final"]["holdout_evidence"]
    assert hold_ev["flips"] == int((logits.argmax(1) != ref).sum()) and hold_ev["n"] == len(hold)
    assert doc["final"]["agreement_holdout"] == pytest.approx(float(np.mean(logits.argmax(1) == ref)))
    d = hold_ev["accuracy_minus_fp32"]
    assert d["estimate"] == pytest.approx(float(np.mean(logits.argmax(1) == y[hold]) - np.mean(ref == y[hold])))
    assert d["low"] <= d["estimate"] <= d["high"]
    verdict = doc["final"]["holdout_verdict"]
    assert verdict["by_constraint"]["accuracy"] in ("supported", "not confirmed", "contradicted")
    assert verdict["supported"] == (verdict["by_constraint"]["accuracy"] == "supported")
    # the method is chosen by flips, not by accuracy
    flips = doc["methods"]["all_int8_flip_rate_search"]
    kl = doc["methods"]["all_int8_mean_kl_search"]
    assert doc["methods"]["chosen"] == min(flips, key=lambda k: (flips[k], kl[k], k != "auto"))
    assert doc["split"]["holdout"]["count"] == len(hold)
    if res.met_target:
        assert doc["final"]["accuracy_search"] >= doc["target"]["threshold"] - 1e-12
    # the quantized nodes of the written model are exactly the nodes not kept
    cal = json.loads((out / "calibration.json").read_text())
    assert set(cal["kept_nodes"]) >= set(res.kept_nodes)
    assert not set(cal["quantized_nodes"]) & set(res.kept_nodes)


def test_tune_records_its_calibration_set_for_deploy(tiny_setup):
    from calibkit.quantize.tablefile import load_calibration_json

    md = ModelDir.resolve(tiny_setup["model"])
    out = tiny_setup["root"] / "records-set"
    run_tune(md, tiny_setup["cset"], load_eval_set(tiny_setup["eval"]), out,
             options(max_drop=1.0, sensitivity_samples=32, method="minmax", smooth=False, confirm=False))
    # deploy reads the set from here to leave its texts out of the texts it measures the served model on
    assert load_calibration_json(out / "calibration.json").calibration_set == Path(tiny_setup["cset"]).resolve()


def test_tune_resumes_from_its_ledger(tiny_setup):
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    out = tiny_setup["root"] / "resume"
    cfg = options(max_drop=0.5, sensitivity_samples=64, method="minmax")
    first = run_tune(md, tiny_setup["cset"], ev, out, cfg)
    second = run_tune(md, tiny_setup["cset"], ev, out, cfg)
    assert first.doc["evaluations_reused"] == 0
    assert second.doc["evaluations_reused"] > 0
    assert second.kept_nodes == first.kept_nodes
    assert second.doc["final"]["accuracy_search"] == first.doc["final"]["accuracy_search"]


def test_tune_cli_errors_are_clear(tiny_setup, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["tune", str(tiny_setup["model"]), "-c", str(tiny_setup["cset"]), "-e",
                            str(tiny_setup["eval"]), "--method", "nope", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "unknown --method" in r.output
    r = runner.invoke(app, ["tune", str(tiny_setup["model"]), "-c", str(tmp_path / "missing"), "-e",
                            str(tiny_setup["eval"]), "--out", str(tmp_path / "o"), "--no-report"])
    assert r.exit_code != 0 and "calibration set not found" in r.output
    assert not (tmp_path / "o").exists()
    # an unknown label anywhere in the file is refused, whichever rows --limit draws
    bad = tmp_path / "bad.jsonl"
    bad.write_text(Path(tiny_setup["eval"]).read_text() + '{"text": "good movie", "label": "neutral"}\n')
    r = runner.invoke(app, ["tune", str(tiny_setup["model"]), "-c", str(tiny_setup["cset"]), "-e", str(bad),
                            "--limit", "20", "--out", str(tmp_path / "o"), "--no-report"])
    assert r.exit_code == 3 and "labels the model does not know" in " ".join(r.output.split()), r.output
    assert not (tmp_path / "o").exists()


def test_min_agreement_is_a_constraint_of_the_search(tiny_setup):
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=5.0, min_agreement=100.0, sensitivity_samples=64, method="minmax")
    res = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "agree", cfg)
    doc = res.doc
    assert doc["target"]["min_agreement"] == 100.0
    for c in doc["candidates"]:
        assert c["meets_target"] == (c["accuracy_search"] >= doc["target"]["threshold"] - 1e-12
                                     and c["agreement_search"] >= 1.0 - 1e-12)
    if res.met_target:
        assert doc["final"]["agreement_search"] == pytest.approx(1.0)
    assert "agreement" in doc["final"]["holdout_verdict"]["by_constraint"]
    with pytest.raises(UsageError):
        run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "bad", options(min_agreement=150.0))


def test_tune_cli_reports_agreement_and_the_holdout_verdict(tiny_setup, tmp_path):
    r = CliRunner().invoke(app, ["tune", str(tiny_setup["model"]), "-c", str(tiny_setup["cset"]), "-e",
                                 str(tiny_setup["eval"]), "--method", "minmax", "--max-drop", "2",
                                 "--min-agreement", "95", "--limit", "200", "--workers", "1", "--out",
                                 str(tmp_path / "o"), "--no-report", "--sensitivity-samples", "32"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "share of FP32's predictions kept" in flat and "fewest flips" in flat
    assert "one-sided 90 % lower bound of the agreement" in flat
    assert "(model.int8.onnx, calibration.cache, calibration.json, plan.json, tune.json)" in flat
    doc = json.loads((tmp_path / "o" / "tune.json").read_text())
    assert f"{parse_result(doc).holdout_says}: " in flat  # the verdict in the claim's terms
    assert doc["eval_set"]["count"] == 200 and doc["target"]["min_agreement"] == 95.0
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["holdout_verdict"]["text"] and plan["agreement_with_fp32"]["holdout"] is not None


def test_tune_on_an_unlabeled_eval_set_targets_agreement_with_fp32(tiny_setup):
    unlabeled = tiny_setup["root"] / "unlabeled.jsonl"
    rows = [json.loads(line) for line in tiny_setup["eval"].read_text().splitlines()]
    unlabeled.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(unlabeled)
    assert not ev.has_labels
    # 0.5: the point estimate (about 210 search examples: at 0.9 only a plan with no flip at all clears 99 %)
    cfg = options(max_drop=0.0, sensitivity_samples=64, method="minmax", agreement_confidence=0.5)
    events = []
    res = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "unlabeled-out", cfg, progress=events.append)
    doc = res.doc
    # the search says which candidate it measures, then what each one measured
    search = [e for e in events if e.task == "plan search"]
    assert search[0].done == 0 and search[0].message == "measuring candidate 1"
    assert search[-1].done == len(doc["candidates"]) and search[-1].total == cfg.max_evaluations
    measured = [e.message for e in search if not e.message.startswith("measuring")]
    assert len(measured) >= 2 and all("% INT8" in m and "the target on" in m for m in measured), measured
    assert doc["eval_set"]["labels"].startswith("FP32 predictions")
    assert doc["target"]["min_agreement"] == 99.0 and doc["target"]["max_drop"] is None
    # FP32's predictions stand in for labels: accuracy against them would be agreement under another name
    assert doc["target"]["fp32_accuracy"] is None and doc["final"]["accuracy_holdout"] is None
    from statistics import NormalDist

    from calibkit.evidence.intervals import wilson_lower

    z = NormalDist().inv_cdf(doc["target"]["agreement_confidence"])
    n = doc["eval_set"]["search"]
    for c in doc["candidates"]:  # only agreement constrains
        assert c["accuracy_search"] is None
        a = c["agreement_search"]  # met when the one-sided 90 % lower bound reaches 99 % (or nothing flipped)
        assert c["meets_target"] == (a >= 0.99 and (a >= 1.0 or wilson_lower(a, n, z) >= 0.99))
    assert res.met_target and "fc1" in res.kept_nodes  # the outlier layer flips predictions in INT8
    assert set(doc["final"]["holdout_verdict"]["by_constraint"]) == {"agreement"}
    text = doc["final"]["holdout_verdict"]["text"]  # no labelled examples, no accuracy change to state
    assert "labelled" not in text and "accuracy" not in text and "% of FP32's predictions" in text, text


def test_tune_json_dash_prints_the_document_and_piped_kept_layers_say_why(tiny_setup, tmp_path):
    args = ["tune", str(tiny_setup["model"]), "-c", str(tiny_setup["cset"]), "-e", str(tiny_setup["eval"]),
            "--method", "minmax", "--max-drop", "1", "--workers", "1", "--no-report", "--sensitivity-samples", "32",
            "--holdout", "0.3"]  # a search split where plain INT8 misses the target: layers are kept
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a"), "--json", "-"])
    assert r.exit_code == 0, r.output
    result = parse_result(json.loads(r.stdout))
    assert result == parse_result(json.loads((tmp_path / "a" / "tune.json").read_text()))
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b")])
    kept = [line for line in r.stdout.splitlines() if line.startswith("  keep ")]
    assert kept and all(": " in line for line in kept), r.stdout  # piped: each kept layer with a short reason
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "c"), "--json", "x.json"])
    assert r.exit_code == 2 and "--json takes '-'" in r.output and not (tmp_path / "c").exists()


def test_tune_with_traffic_judges_agreement_on_traffic_and_accuracy_on_labels(tiny_setup):
    """--traffic: unlabeled log texts (calibration texts excluded) join the evidence; candidates' agreement is
    measured on the traffic rows of the search split, accuracy on the labelled rows, and the holdout evidence
    says how many of each it holds."""
    from calibkit.api import load_traffic
    from calibkit.data.calibset import load_calibration_set

    cset = load_calibration_set(tiny_setup["cset"])
    texts, _ = make_texts(500, seed=11)
    log = tiny_setup["root"] / "traffic.jsonl"
    log.write_text("".join(json.dumps({"request": {"text": t}}) + "\n" for t in [*cset.texts[:12], *texts]))
    md = ModelDir.resolve(tiny_setup["model"])
    traffic = load_traffic(log, cset, size=300, text_field="request.text", seed=0, model=md)
    assert traffic is not None and 0 < len(traffic) <= 300
    assert traffic.excluded.get("calibration_set", 0) >= 1
    assert not set(traffic.texts) & set(cset.texts)

    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, min_agreement=95.0, sensitivity_samples=64, method="minmax")
    res = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "traffic-out", cfg, traffic=traffic)
    doc, r = res.doc, res.result
    es = r.eval_set
    # a traffic text that is also an eval text is dropped (it could sit in the search split as one and in the
    # holdout as the other) and counted
    from calibkit.data.dedup import digest, normalize

    shared = sum(digest(normalize(t)) in {digest(normalize(x)) for x in ev.texts} for t in traffic.texts)
    assert shared > 0  # this generator's texts repeat: the case is exercised
    n_traffic = len(traffic) - shared
    assert es.traffic is not None and es.traffic.count == n_traffic and not es.traffic.labelled
    assert f"eval set: {shared}" in es.traffic.exclusions
    assert es.traffic_search + es.traffic_holdout == n_traffic
    assert es.search + es.holdout == len(ev) + n_traffic
    assert any(x.startswith("calibration set:") for x in es.traffic.exclusions)
    # accuracy counts the labelled rows only: FP32's accuracy is the eval set's, not inflated by traffic rows
    # whose "labels" are FP32's own predictions
    fp32_alone = options(max_drop=1.0, sensitivity_samples=64, method="minmax")
    plain = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "traffic-plain", fp32_alone)
    assert r.target.fp32_accuracy < 1.0
    assert r.target.fp32_accuracy == pytest.approx(plain.result.target.fp32_accuracy, abs=0.05)
    assert res.met_target and "fc1" in res.kept_nodes
    hold = r.final.holdout_evidence
    assert hold is not None and hold.agreement_n == es.traffic_holdout and hold.n == es.holdout - es.traffic_holdout
    assert "traffic texts never used by the search" in r.final.holdout_verdict.text
    assert doc["eval_set"]["traffic"]["count"] == n_traffic


def test_tune_confirms_its_plan_on_the_holdout_by_fixed_sequence(tiny_setup):
    """The passing candidates are tested on the holdout from the least INT8 up, stopping at the first that fails;
    the plan is the last confirmed. --no-confirm writes the search's own choice, the same search."""
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, min_agreement=95.0, sensitivity_samples=64, method="minmax")
    r = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "confirm-on", cfg).result
    cf = r.confirmation
    assert cf is not None and cf.steps and cf.holdout_texts == r.eval_set.holdout
    shares = [s.int8_flops_fraction for s in cf.steps]
    assert shares == sorted(shares) and all(s.meets for s in cf.steps[:-1])
    assert all(r.candidates[s.candidate].meets_target for s in cf.steps)
    passing = sum(c.meets_target for c in r.candidates)
    assert len(cf.steps) == passing or not cf.steps[-1].meets
    assert cf.search_choice is not None and r.candidates[cf.search_choice].meets_target
    if cf.chosen is not None:
        assert r.final.kept_nodes == r.candidates[cf.chosen].kept_nodes
        assert "fixed-sequence" in r.final.holdout_verdict.text
    said = [w for w in r.warnings if "the holdout split (" in w and "confirmed" in w]
    assert bool(said) == (cf.chosen != cf.search_choice)
    if cf.chosen is None:  # 90 holdout texts cannot certify 95 % here: the search's choice, and why
        assert "confirmed none" in said[0] and r.final.kept_nodes == r.candidates[cf.search_choice].kept_nodes
    loose = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "confirm-loose",
                     replace(cfg, min_agreement=85.0)).result
    assert loose.confirmation is not None and loose.confirmation.chosen is not None
    assert loose.final.kept_nodes == loose.candidates[loose.confirmation.chosen].kept_nodes
    assert "fixed-sequence" in loose.final.holdout_verdict.text
    assert r.evidence_cost is not None and r.evidence_cost.confirm_texts == sum(s.texts for s in cf.steps)
    off = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "confirm-off", replace(cfg, confirm=False))
    assert off.result.confirmation is None
    assert off.result.final.kept_nodes == r.candidates[cf.search_choice].kept_nodes
    assert "fixed-sequence" not in off.result.final.holdout_verdict.text


def test_all_int8_is_measured_on_a_holdout_sample_unless_it_may_be_written(tiny_setup, monkeypatch):
    """All-INT8's holdout numbers are context where no decision rests on them: a random sample of the holdout
    (its size recorded), the whole holdout where it is under twice the sample. Where the holdout confirmed
    nothing, all-INT8 may be written instead of the search's choice, so it is measured on the whole holdout."""
    import calibkit.evaluate.tune_defaults as tune_module

    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, min_agreement=97.0, sensitivity_samples=64, method="minmax")
    monkeypatch.setattr(tune_module, "TUNE_ALL_INT8_HOLDOUT_TEXTS", 30)
    r = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "all-int8-sample", replace(cfg, confirm=False))
    f = r.result.final
    assert f.kept_nodes and r.result.eval_set.holdout > 2 * 30 and f.all_int8_texts_holdout == 30
    assert f.all_int8_agreement_holdout is not None
    assert abs(f.all_int8_agreement_holdout * 30 - round(f.all_int8_agreement_holdout * 30)) < 1e-9
    monkeypatch.setattr(tune_module, "TUNE_ALL_INT8_HOLDOUT_TEXTS", r.result.eval_set.holdout // 2)
    small = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "all-int8-small", replace(cfg, confirm=False))
    assert small.result.final.all_int8_texts_holdout == small.result.eval_set.holdout
    monkeypatch.setattr(tune_module, "TUNE_ALL_INT8_HOLDOUT_TEXTS", 30)
    unconfirmed = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / "all-int8-whole", cfg).result
    assert unconfirmed.confirmation is not None and unconfirmed.confirmation.chosen is None
    assert unconfirmed.final.all_int8_texts_holdout == unconfirmed.eval_set.holdout


def test_tune_cli_traffic_auto_needs_a_log_in_the_manifest(tiny_setup, tmp_path):
    r = CliRunner().invoke(app, ["tune", str(tiny_setup["model"]), "-c", str(tiny_setup["cset"]), "-e",
                                 str(tiny_setup["eval"]), "--traffic", "auto", "--workers", "1", "--out",
                                 str(tmp_path / "o"), "--no-report"])
    assert r.exit_code == 3, r.output
    assert "--traffic" in r.output and "Traceback" not in r.output


def test_tune_finds_smoothing_itself_and_its_out_rebuilds(tiny_setup, tmp_path):
    """Smoothing is a candidate of tune (no prior `calibkit smooth`): on the tiny model whose fc1 input carries a
    huge outlier, the smoothed variant's all-INT8 model flips fewer predictions, so the plan is searched on it and
    needs less in higher precision than on the model as given; OUT holds the smoothed model, and `calibkit
    build` rebuilds the plan's engine from OUT unchanged."""
    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, sensitivity_samples=64, method="minmax")
    plain = run_tune(md, tiny_setup["cset"], ev, tmp_path / "plain", replace_smooth(cfg, False))
    res = run_tune(md, tiny_setup["cset"], ev, tmp_path / "out", cfg)
    r = res.result
    assert plain.result.smoothing is None and "fc1" in plain.kept_nodes
    assert r.smoothing is not None and r.smoothing.tried and r.smoothing.chosen
    flips = r.methods.all_int8_flip_rate_search
    assert set(flips) == {"minmax", "minmax+smooth"} and flips["minmax+smooth"] < flips["minmax"]
    assert r.methods.chosen == "minmax+smooth" and res.met_target
    assert res.int8_flops_fraction > plain.int8_flops_fraction
    out = tmp_path / "out"
    assert (out / "smoothed-model" / "model.onnx").is_file()
    cal = json.loads((out / "calibration.json").read_text())
    assert cal["source_model"] == "smoothed-model/model.onnx"  # relative to OUT: a copy of OUT names its own
    b = CliRunner().invoke(app, ["build", str(out / "smoothed-model"), "--precision", "int8", "--qdq",
                                 str(out / "model.int8.onnx"), "-o", str(tmp_path / "plan.onnx")])
    assert b.exit_code == 0, b.output
    import onnx

    g = onnx.load(str(tmp_path / "plan.onnx")).graph
    dq = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    fed = {n.name for n in g.node if n.op_type == "MatMul" and any(i in dq for i in n.input)}
    assert fed and not fed & set(res.kept_nodes)  # the plan: kept nodes read no dequantized input


def replace_smooth(cfg: TuneRequest, smooth: bool) -> TuneRequest:
    from dataclasses import replace

    return replace(cfg, smooth=smooth)


def test_tune_says_when_its_search_split_cannot_certify_a_better_candidate():
    """A candidate with more INT8 whose agreement reached --min-agreement but whose lower bound did not: the
    warning names the texts the split had and how many would settle it."""
    from calibkit.evaluate.tune import _uncertified
    from calibkit.evidence.candidates import Measured
    from calibkit.evidence.sequential import texts_needed
    from calibkit.evidence.split import split_evidence
    from calibkit.tasks import ClassificationTask

    n = 400
    labels = np.array([0, 1] * (n // 2))
    ref = np.eye(2)[labels].astype(np.float32)
    ev = split_evidence([f"t{i}" for i in range(n)], labels, ref, labelled=True, class_names=["a", "b"],
                        holdout_fraction=0.3, sensitivity_samples=32, seed=0, kind=ClassificationTask)
    cfg = options(max_drop=1.0, min_agreement=99.0, agreement_confidence=0.9)
    final = Measured(("x", "y"), 1.0, 0.5, "prefix", True, 1.0)
    close = Measured(("x",), 1.0, 0.9, "prefix", False, 0.9929)
    msg = _uncertified(cfg, ev, [final, close], final)
    # the sequential rule (the default) certifies at the split's end with 3/4 of alpha: at 92.5 %, not 90 %
    assert msg is not None and "one-sided 92.5 % lower bound" in msg and f"{len(ev.search)} agreement texts" in msg
    assert f"about {texts_needed(0.9929, 0.99, 0.925):,} would settle it" in msg
    whole = _uncertified(replace(cfg, decision_rule="whole-split"), ev, [final, close], final)
    assert whole is not None and "one-sided 90 % lower bound" in whole
    assert f"about {texts_needed(0.9929, 0.99, 0.9):,} would settle it" in whole
    assert _uncertified(cfg, ev, [final], final) is None
    assert _uncertified(options(max_drop=1.0), ev, [final, close], final) is None


@pytest.mark.parametrize("claim", ["target NOT met: no plan met it on the search split",
                                   "plan NOT confirmed: the holdout confirmed no candidate",
                                   "plan NOT supported: the holdout does not support the claim"])
@pytest.mark.parametrize("gate", [False, True])
def test_tune_fail_if_missed_is_a_ci_gate(tmp_path, monkeypatch, gate: bool, claim: str) -> None:
    """A missed target, an unconfirmed plan or one the holdout does not support exits 0 and says so; with
    --fail-if-missed it exits 8 (TargetMissedError), after the outputs are written (here: a stand-in run)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import calibkit.api
    import calibkit.cli.tune as cli_tune
    from calibkit.cli import app

    calls = []
    monkeypatch.setattr(calibkit.api, "run", lambda request, *a: calls.append(request) or SimpleNamespace(
        result=SimpleNamespace(met_target=not claim.startswith("target"), claim_holds=False, claim=claim)))
    monkeypatch.setattr(cli_tune, "_summary", lambda run, report_dir: None)
    args = ["tune", str(tmp_path / "model"), "-c", str(tmp_path / "cset"), "-e", str(tmp_path / "eval.jsonl"),
            "--out", str(tmp_path / "out"), "--no-report"]
    r = CliRunner().invoke(app, args + (["--fail-if-missed"] if gate else []))
    assert calls and r.exit_code == (8 if gate else 0), r.output
    if gate:
        assert claim in r.output


def test_the_claim_holds_only_when_met_confirmed_and_supported(tiny_setup):
    """What --fail-if-missed reads: a plan the holdout did not confirm, or whose holdout verdict does not support
    it, is not a met target, whatever the search split said."""
    md = ModelDir.resolve(tiny_setup["model"])
    cfg = options(max_drop=1.0, sensitivity_samples=64, method="minmax", smooth=False)
    r = run_tune(md, tiny_setup["cset"], load_eval_set(tiny_setup["eval"]), tiny_setup["root"] / "claim", cfg).result
    assert r.met_target and r.claim_holds and r.claim.startswith("target met")
    assert r.confirmation is not None and r.confirmation.chosen is not None
    unconfirmed = replace(r, confirmation=replace(r.confirmation, chosen=None))
    assert not unconfirmed.claim_holds and "NOT confirmed" in unconfirmed.claim
    verdict = replace(r.final.holdout_verdict, supported=False)
    refuted = replace(r, final=replace(r.final, holdout_verdict=verdict))
    assert not refuted.claim_holds and "NOT supported" in refuted.claim
    missed = replace(r, target=replace(r.target, met=False))
    assert not missed.claim_holds and "NOT met" in missed.claim
    assert r.phases and r.phases[0].phase == "FP32 reference" and r.fp32_passes is not None
    assert all(p.seconds >= 0 and p.texts >= 0 for p in r.phases)
    assert sum(p.texts for p in r.phases if p.phase == "FP32 reference") == len(load_eval_set(tiny_setup["eval"]))


def test_ranking_reuses_method_autos_one_node_runs_exactly(tiny_setup, monkeypatch):
    """Method auto measures every node alone under its two best methods on the sensitivity texts; the ranking
    reads those runs instead of running the nodes again, and what it finds is what fresh runs find."""
    import calibkit.evaluate.tune as tune_mod
    from calibkit.progress import ProgressEvent

    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    cfg = options(max_drop=1.0, sensitivity_samples=32, method="auto", smooth=False)

    def tune(out: str) -> tuple[dict, int]:
        ran = []

        def progress(e: ProgressEvent) -> None:
            if e.task == "sensitivity (quantize one node)":
                ran.append(e.total)

        r = run_tune(md, tiny_setup["cset"], ev, tiny_setup["root"] / out, cfg, progress=progress)
        return r.doc, max(ran, default=0)

    reused, ran_reused = tune("reuse-on")
    monkeypatch.setattr(tune_mod, "_known_one_node_runs", lambda *a: {})
    fresh, ran_fresh = tune("reuse-off")
    assert ran_fresh > 0 and ran_reused < ran_fresh
    assert reused["final"]["reasons"] == fresh["final"]["reasons"]
    assert any("quantizing only it" in r for rs in fresh["final"]["reasons"].values() for r in rs)
    assert reused["final"]["kept_nodes"] == fresh["final"]["kept_nodes"]
    assert [c["kept_nodes"] for c in reused["candidates"]] == [c["kept_nodes"] for c in fresh["candidates"]]
