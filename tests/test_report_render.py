"""Rendering compare and tune documents: files, plots, escaping, Markdown tables, atomicity, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.errors import DataError, UsageError
from calibkit.report import plots as plots_module
from calibkit.report.render import render_report
from calibkit.results.codec import parse_result

EVIL = "<script>alert(1)</script>"
PIPE_NODE = "/encoder/layer.3/output|Add"
OPS = ("MatMul", "Add", "LayerNormalization", "Gelu", "Softmax")


def fake_compare(n_layers: int = 60, seed: int = 0) -> dict:
    """A compare document shaped like a 6-layer MiniLM run: 60 taps, three flagged, histograms for eight."""
    rng = np.random.default_rng(seed)
    layers, histograms = [], {}
    flagged = {i: f for i, f in {7: "keep-fp16", 31: "keep-fp32", 52: "keep-fp16"}.items() if i < n_layers}
    for i in range(n_layers):
        op = OPS[i % len(OPS)]
        node = f"/encoder/layer.{i // 10}/{op}_{i}"
        if i == 12:
            node = PIPE_NODE
        tensor = EVIL if i == 31 else f"{node}_output_0"
        scale = float(rng.uniform(0.5, 8.0)) * (60.0 if i in flagged else 1.0)
        x = np.abs(rng.laplace(0.0, scale / 6, 4000))
        upper = float(x.max())
        counts, _ = np.histogram(x, bins=256, range=(0.0, upper))
        amax = float(np.quantile(x, 0.9999))
        flag = flagged.get(i, "ok")
        layers.append({
            "index": i, "node": node, "op_type": op, "tensor": tensor, "amax": amax,
            "fp_min": -upper, "fp_max": upper, "fp_absmax": upper, "p99": float(np.quantile(x, 0.99)),
            "p9999": amax, "clipped_fraction": float(np.mean(x > amax)), "outlier_ratio": upper / float(np.median(x)),
            "nonfinite": 0, "sqnr_db": 12.0 if i in flagged else float(rng.uniform(25, 45)),
            "cosine": 0.97 if i in flagged else 0.9995,
            "sensitivity": {"only_this_int8": {"accuracy": 0.80, "delta": -0.04, "logit_mse": 0.1},
                            "all_but_this": {"accuracy": 0.84, "delta": -0.004, "logit_mse": 0.01}}
            if i in flagged else None,
            "flag": flag, "reasons": ["SQNR 12.0 dB < 20 dB", f"outliers {EVIL}"] if i in flagged else [],
        })
        if i in flagged or i < 5:
            histograms[tensor] = {
                "counts": counts.tolist(), "upper": upper,
                "thresholds": {"minmax": upper, "percentile": amax, "entropy": amax * 0.8, "mse": amax * 0.6,
                               "amax": amax},
            }
    return {
        "format": "calibkit-compare/1", "calibkit_version": "0.1.0",
        "eval_set": {"path": "eval_sets/movies", "count": 2114, "labels": ["negative", "positive"]},
        "engines": [
            {"name": "A", "path": "model.onnx", "precision": "fp32", "backend": "onnxruntime", "accuracy": 0.8444,
             "macro_f1": 0.84, "confusion_matrix": [[900, 150], [179, 885]], "labels": ["negative", "positive"],
             "latency_ms": {"mean": 5.1, "p50": 4.9, "p95": 7.2}, "throughput_per_s": 410.0, "batch_size": 16},
            {"name": "B", "path": "model.int8.onnx", "precision": "int8", "backend": "onnxruntime",
             "accuracy": 0.8079, "macro_f1": 0.80, "confusion_matrix": [[850, 200], [206, 858]],
             "labels": ["negative", "positive"], "latency_ms": {"mean": 3.9, "p50": 3.7, "p95": 5.5},
             "throughput_per_s": 520.0, "batch_size": 16},
        ],
        "agreement": 0.93,
        "outputs": {"cosine_mean": 0.991, "cosine_min": 0.71, "max_abs_error": 2.3, "mean_abs_error": 0.12},
        "disagreements": [
            {"index": 4, "text": f"a film {EVIL} that | breaks\ntables", "label": "positive", "pred_a": "positive",
             "pred_b": "negative"},
            {"index": 9, "text": "plain", "label": "negative", "pred_a": "negative", "pred_b": "positive",
             "confidence_a": 0.0417},
        ],
        "flips_by_confidence": [{"low": 0.0, "high": 0.1, "texts": 161, "flips": 97},
                                {"low": 0.1, "high": 0.5, "texts": 412, "flips": 41},
                                {"low": 0.5, "high": 1.0, "texts": 1641, "flips": 10}],
        "layers": layers,
        "thresholds": {"sqnr_db_min": 20.0, "clipped_fraction_max": 0.001},
        "recommendation": {"keep_in_higher_precision": [layers[i]["node"] for i in sorted(flagged)],
                           "precision": "fp16"},
        "histograms": histograms,
    }


def fake_tune(relative: bool = False) -> dict:
    rng = np.random.default_rng(1)
    candidates = []
    for i in range(25):
        frac = float(rng.uniform(0.7, 1.0))
        acc = 0.845 - 0.12 * (frac - 0.7) + float(rng.normal(0, 0.004))
        candidates.append({"id": i, "int8_flops_fraction": frac, "accuracy_search": acc,
                           "accuracy_holdout": acc - 0.002 if i % 3 == 0 else None,
                           "kept_nodes": [f"/encoder/layer.{j}/Add" for j in range(i % 4)], "method": "entropy",
                           "accepted": acc >= 0.8344})
    return {
        "format": "calibkit-tune/1", "calibkit_version": "0.1.0",
        "target": {"max_drop": 1.0, "relative": relative, "fp32_accuracy": 0.8444},
        "candidates": candidates,
        "final": {"kept_nodes": ["/encoder/layer.0/Add", EVIL], "int8_flops_fraction": 0.93,
                  "accuracy_search": 0.838, "accuracy_holdout": 0.836,
                  "reasons": {EVIL: ["SQNR 9 dB"], "/encoder/layer.0/Add": ["residual outliers"]}},
        "peers": [{"name": "ORT quantize_static MinMax", "accuracy": 0.8079},
                  {"name": "ModelOpt int8 entropy", "accuracy": 0.6272}],
    }


def _tables(md: str) -> list[list[str]]:
    tables, current = [], []
    for line in md.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _cells(row: str) -> int:
    return len(re.findall(r"(?<!\\)\|", row)) - 1


@pytest.fixture(scope="module")
def compare_report(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("r") / "run"
    return render_report(fake_compare(), out), out


def test_compare_report_writes_every_file_and_embeds_every_plot(compare_report) -> None:
    paths, out = compare_report
    assert {p.name for p in paths.plots} == {"sqnr.png", "ranges.png", "histograms.png", "confusion.png"}
    for p in (paths.json, paths.markdown, paths.html, *paths.plots):
        assert p.is_file() and out in p.parents
    for p in paths.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = paths.html.read_text()
    assert html.count("<img ") == len(paths.plots)
    assert html.count('src="data:image/png;base64,') == len(paths.plots)
    assert not re.search(r"""(src|href)=["'](?!data:)""", html), "the HTML must not load anything external"
    md = paths.markdown.read_text()
    for p in paths.plots:
        assert f"(plots/{p.name})" in md
    assert json.loads(paths.json.read_text()) == json.loads(json.dumps(fake_compare()))
    assert sorted(x.name for x in out.parent.iterdir()) == ["run"], "no temporary folder may be left behind"


def test_summary_comes_first_with_accuracy_delta_and_kept_layers(compare_report) -> None:
    paths, _ = compare_report
    md = paths.markdown.read_text()
    summary = md.index("## Summary")
    assert summary < md.index("## Layers to keep") < md.index("## Plots") < md.index("## Flagged layers")
    assert "84.44 %" in md and "80.79 %" in md
    assert "-3.65 pt" in md  # B vs A: 0.8079 - 0.8444
    assert "93.00 %" in md  # agreement
    keep = md[md.index("## Layers to keep"):md.index("## Plots")]
    assert "3 of 60" in keep
    doc = fake_compare()
    for i in (7, 31, 52):
        assert doc["layers"][i]["node"].replace("_", r"\_") in keep
    assert r"SQNR 12.0 dB \< 20 dB" in keep


def test_user_text_is_escaped_in_html_and_markdown(compare_report) -> None:
    paths, _ = compare_report
    html = paths.html.read_text()
    md = paths.markdown.read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert not re.search(r"(?<!\\)</?script", md, re.IGNORECASE), "a raw tag in Markdown renders as HTML"
    assert r"\<script\>alert(1)\</script\>" in md


def test_markdown_tables_keep_their_columns_with_pipes_and_newlines_in_names(compare_report) -> None:
    paths, _ = compare_report
    md = paths.markdown.read_text()
    tables = _tables(md)
    assert len(tables) >= 5
    for table in tables:
        widths = {_cells(row) for row in table}
        assert len(widths) == 1, f"ragged table: {table[0]}"
    assert PIPE_NODE.replace("|", r"\|").replace("_", r"\_") in md
    disagreements = md[md.index("## Flips: texts whose prediction changed"):]
    row = next(line for line in disagreements.splitlines() if line.startswith("| 4 "))
    assert r"that \| breaks tables" in row


def test_histograms_show_the_worst_layers_first() -> None:
    report = parse_result(fake_compare(), strict=False)
    chosen = plots_module._worst_histograms(report)
    assert len(chosen) == plots_module.MAX_HISTOGRAMS
    assert [layer.index for _, layer in chosen[:3]] == [7, 31, 52]  # flagged, equal SQNR: document order
    rest = [layer.sqnr_db for _, layer in chosen[3:]]
    assert rest == sorted(rest)


def test_missing_fields_render_as_dashes_and_nan_as_absent(tmp_path: Path) -> None:
    bare = render_report({"format": "calibkit-compare/1"}, tmp_path / "bare")
    assert "—" in bare.markdown.read_text()
    assert bare.plots == ()
    doc = fake_compare(n_layers=6)
    doc["engines"][0] = {"name": "A"}  # a hand-trimmed engine: every number missing
    doc["layers"][2] = {"index": 2, "flag": "ok"}
    doc["layers"][3]["amax"] = float("nan")  # what Python's json writes for NaN
    doc["histograms"] = {}
    doc["agreement"] = None
    del doc["outputs"]
    paths = render_report(doc, tmp_path / "odd")
    md, html = paths.markdown.read_text(), paths.html.read_text()
    assert "| A | — | — | — |" in md
    shown = re.sub(r"base64,[^\"]*", "", html)
    assert not re.search(r"\bnan\b", md, re.IGNORECASE) and not re.search(r"\bnan\b", shown, re.IGNORECASE)
    assert json.loads(paths.json.read_text())["layers"][3]["amax"] is None  # NaN written as null


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d["engines"][0].update(accuracy="high"), r"\$\.engines\[0\]\.accuracy should be a finite number"),
    (lambda d: d["engines"][0].update(latency_ms=5), r"\$\.engines\[0\]\.latency_ms should be an object"),
    (lambda d: d["layers"][2].update(index="two"), r"\$\.layers\[2\]\.index should be an integer"),
    (lambda d: d["layers"][2].pop("flag"), r"lacks \$\.layers\[2\]\.flag"),
])
def test_mistyped_fields_are_refused_naming_the_file_and_the_field(tmp_path: Path, edit, field: str) -> None:
    doc = fake_compare(n_layers=3)
    edit(doc)
    src = tmp_path / "edited.json"
    src.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=field):
        render_report(doc, tmp_path / "r")
    result = CliRunner().invoke(app, ["report", str(src), "--out", str(tmp_path / "r")])
    assert result.exit_code == DataError.exit_code
    message = " ".join(result.output.split())
    assert str(src) in message.replace(" ", "") or src.name in message
    assert "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_tune_report_plots_candidates_and_target(tmp_path: Path) -> None:
    paths = render_report(fake_tune(), tmp_path / "tune")
    assert [p.name for p in paths.plots] == ["tune.png"]
    md = paths.markdown.read_text()
    assert "83.44 %" in md  # 0.8444 - 0.01
    assert "Meets the target: yes" in md
    assert "+2.81 pt" in md  # hold-out 0.836 vs ORT 0.8079
    html = paths.html.read_text()
    assert html.count("<img ") == 1
    assert "<script" not in html.lower()
    relative = render_report(fake_tune(relative=True), tmp_path / "rel")
    assert "83.60 %" in relative.markdown.read_text()  # 0.8444 * 0.99
    for table in _tables(md):
        assert len({_cells(row) for row in table}) == 1


@pytest.mark.parametrize("doc", [[1, 2], {"layers": []}, {"format": "calibkit-sample/1"}, {"format": 3}])
def test_documents_that_are_not_reports_are_refused(doc: object, tmp_path: Path) -> None:
    with pytest.raises(DataError):
        render_report(doc, tmp_path / "x")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


def test_failed_render_keeps_the_previous_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    first = render_report(fake_tune(), out)
    before = first.html.read_bytes()

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr("calibkit.report.render.write_text", broken)
    with pytest.raises(RuntimeError):
        render_report(fake_tune(relative=True), out)
    assert first.html.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_folder_with_other_files_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="notes.txt"):
        render_report(fake_tune(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_cli_renders_and_re_renders_in_place(tmp_path: Path) -> None:
    src = tmp_path / "compare.json"
    src.write_text(json.dumps(fake_tune()))  # the quickest document: this tests the command, not the plots
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(src), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").is_file()
    (tmp_path / "r" / "report.md").unlink()
    again = runner.invoke(app, ["report", str(tmp_path / "r" / "report.json")])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "r" / "report.md").is_file()
    default = runner.invoke(app, ["report", str(src)])
    assert default.exit_code == 0, default.output
    assert (tmp_path / "compare-report" / "report.html").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [("{\"format\": \"calibkit-compare/1\", ", "not valid JSON"), ("[]", "JSON object"),
     ("{\"format\": \"nope/1\"}", "unknown report format")],
)
def test_cli_reports_malformed_files_in_one_message(tmp_path: Path, content: str, message: str) -> None:
    src = tmp_path / "bad.json"
    src.write_text(content)
    result = CliRunner().invoke(app, ["report", str(src), "--out", str(tmp_path / "r")])
    assert result.exit_code == DataError.exit_code
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_cli_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path / "none.json")])
    assert result.exit_code != 0
    assert "does not exist" in " ".join(result.output.split())


def test_names_with_dollars_and_other_scripts_plot_without_warnings(tmp_path: Path) -> None:
    doc = fake_compare(n_layers=3)
    doc["engines"][0]["labels"] = ["负面", "正面"]
    doc["layers"][0]["node"] = "层/加法 $x$ \\frac"  # "$" would switch matplotlib to mathtext
    paths = render_report(doc, tmp_path / "r")  # warnings are errors in this suite
    assert len(paths.plots) == 4
    assert "层/加法 $x$" in paths.html.read_text()


def test_watched_layers_are_listed_but_not_kept(tmp_path: Path) -> None:
    from calibkit.report.render import render_report

    doc = {
        "format": "calibkit-compare/1",
        "layers": [
            {"index": 0, "node": "fc1", "tensor": "a", "flag": "watch", "quant_sqnr_db": 12.0,
             "reasons": ["quantization SQNR of its input 12.0 dB < 20 dB", "but measured: harmless"]},
            {"index": 1, "node": "fc2", "tensor": "b", "flag": "ok", "quant_sqnr_db": 30.0, "reasons": []},
        ],
        "recommendation": {"keep_in_higher_precision": [], "precision": "fp16"},
    }
    md = render_report(doc, tmp_path / "r").markdown.read_text()
    assert "None: all 2 quantized layers can run in INT8." in md
    assert "1 layer to watch" in md and "but measured: harmless" in md


def test_intervals_verdict_warnings_and_subsets_are_rendered(tmp_path: Path) -> None:
    doc = {
        "format": "calibkit-compare/1",
        "engines": [{"name": "A", "accuracy": 0.85, "accuracy_ci": {"estimate": 0.85, "low": 0.83, "high": 0.87}},
                    {"name": "B", "accuracy": 0.852,
                     "accuracy_ci": {"estimate": 0.852, "low": 0.832, "high": 0.871}}],
        "agreement": 0.97, "agreement_ci": {"estimate": 0.97, "low": 0.962, "high": 0.977},
        "difference": {"accuracy": {"estimate": 0.002, "low": -0.004, "high": 0.008, "verdict": "not significant",
                                    "mcnemar_p": 0.6, "examples_to_settle": 9000}},
        "warnings": ["class 'neg' has only 10 examples (< 30)"],
        "subsets": {"sensitivity": {"count": 256, "of": 2114, "strategy": "stratified", "seed": 0,
                                    "content_sha256": "ab" * 32}},
        "layers": [{"index": 0, "node": "fc1", "tensor": "a", "flag": "insufficient-evidence",
                    "reasons": ["recovers 0.78 points: insufficient evidence on 256 examples"],
                    "sensitivity": {"all_but_this": {"delta": 0.0078, "delta_low": -0.004, "delta_high": 0.02}}}],
        "recommendation": {"keep_in_higher_precision": [], "precision": "fp16"},
    }
    md = render_report(doc, tmp_path / "r").markdown.read_text().replace("\\", "")
    assert "+0.20 pt [-0.40, +0.80]" in md and "not significant" in md and "9,000 examples" in md
    assert "85.00 % [83.00, 87.00]" in md and "97.00 % [96.20, 97.70]" in md
    assert "flips, texts whose prediction changed: 3.00 %" in md
    assert "Warning:" in md and "only 10 examples" in md
    assert "256 of 2114 rows, stratified, seed 0" in md
    assert "1 layer with insufficient evidence" in md and "+0.78 pt [-0.40, +2.00]" in md
    assert "None shown to need it, but 1 layer is not settled" in md and "None: all" not in md


def test_tune_report_shows_agreement_and_the_holdout_verdict(tmp_path: Path) -> None:
    doc = {
        "format": "calibkit-tune/1",
        "target": {"max_drop": 0.5, "relative": False, "fp32_accuracy": 0.85, "threshold": 0.845,
                   "min_agreement": 99.0},
        "methods": {"chosen": "mse", "all_int8_flip_rate_search": {"mse": 0.021, "entropy": 0.06}},
        "warnings": ["the holdout split has 90 examples: its verdict has wide intervals"],
        "candidates": [{"id": 0, "int8_flops_fraction": 0.97, "accuracy_search": 0.849, "agreement_search": 0.991,
                        "kept_nodes": ["a"], "accepted": True}],
        "final": {"kept_nodes": ["a"], "int8_flops_fraction": 0.97, "accuracy_search": 0.849,
                  "accuracy_holdout": 0.846, "agreement_search": 0.991, "agreement_holdout": 0.989,
                  "holdout_evidence": {"accuracy_minus_fp32": {"estimate": -0.002, "low": -0.01, "high": 0.006,
                                                               "verdict": "not significant"},
                                       "agreement": {"estimate": 0.989, "low": 0.98, "high": 0.994}},
                  "holdout_verdict": {"supported": False, "text": "agreement target: not confirmed"}},
    }
    md = render_report(doc, tmp_path / "t").markdown.read_text().replace("\\", "")
    assert "at least 99 % of FP32's predictions unchanged" in md and "mse 2.10 %" in md
    assert "98.90 % [98.00, 99.40]" in md and "-0.20 pt [-1.00, +0.60]" in md and "not significant" in md
    assert "does not support" in md.lower() and "agreement target: not confirmed" in md and "Warning:" in md
    assert "99.10 %" in md  # the candidate's agreement


def _task_doc(kind: str, fidelity: dict, gold: dict | None = None) -> dict:
    return {"format": "calibkit-compare/1", "agreement": fidelity["agreement"],
            "task": {"kind": kind, "output": "logits" if kind != "embedding" else "last_hidden_state",
                     "labelled": gold is not None, "fidelity": fidelity, "gold": gold}}


def test_embedding_fidelity_block_is_rendered(tmp_path: Path) -> None:
    doc = _task_doc("embedding", {"agreement": 0.8833, "cosine_mean": 0.999912, "cosine_min": 0.999634,
                                  "retrieval_top1_agreement": 0.8833, "retrieval_overlap_at_k": 0.94625, "k": 10.0})
    paths = render_report(doc, tmp_path / "r")
    md, html = paths.markdown.read_text().replace("\\", ""), paths.html.read_text()
    for out in (md, html):
        assert "Task fidelity: embedding" in out
        assert "0.99963" in out and "0.99991" in out  # cosine min and mean
        assert "same nearest neighbour" in out and "88.33 %" in out
        assert "top-10 neighbour overlap" in out and "0.9463" in out
    row = next(r for table in _tables(md) for r in table if "top-10" in r)
    assert _cells(row) == 3


def test_token_fidelity_and_gold_blocks_are_rendered(tmp_path: Path) -> None:
    gold = {"words": 812, "unscored_words": 9, "entities": 140,
            "engines": {"A": {"token_accuracy": 0.71, "token_accuracy_ci": {"estimate": 0.71, "low": 0.68,
                                                                               "high": 0.74},
                              "entity_f1": 0.4321, "entity_precision": 0.41, "entity_recall": 0.46},
                        "B": {"token_accuracy": 0.705, "entity_f1": 0.4288, "entity_precision": 0.40,
                              "entity_recall": 0.45}}}
    doc = _task_doc("token-classification", {"agreement": 0.9773, "cosine_mean": 0.9991, "cosine_min": 0.9876,
                                             "entity_f1": 0.9634}, gold)
    paths = render_report(doc, tmp_path / "r")
    md, html = paths.markdown.read_text().replace("\\", ""), paths.html.read_text()
    for out in (md, html):
        assert "Task fidelity: token classification" in out
        assert "same label per token" in out and "97.73 %" in out
        assert "entity F1 against A" in out and "0.9634" in out
        assert "Against the gold labels" in out and "812 words scored" in out and "140 gold entities" in out
        assert "9 words past the token limit" in out
        assert "71.00 % [68.00, 74.00]" in out and "0.4321" in out and "0.4288" in out and "70.50 %" in out


def test_no_task_block_renders_no_fidelity_section(tmp_path: Path) -> None:
    md = render_report({"format": "calibkit-compare/1"}, tmp_path / "r").markdown.read_text()
    assert "Task fidelity" not in md


def test_flips_are_shown_by_how_sure_a_was(compare_report) -> None:
    paths, _ = compare_report
    md = paths.markdown.read_text()
    summary = md[md.index("## Summary"):md.index("## Layers to keep")]
    assert "Of the 148 flips, **97** are texts on which A's top two classes were within 0.10" in summary
    band = next(t for t in _tables(summary) if "A's top-2 probability gap" in t[0])
    assert [r.split("|")[1].strip() for r in band[2:]] == ["0.00 to 0.10", "0.10 to 0.50", "0.50 to 1.00"]
    assert "| 1641 | 10 | 0.61 % |" in band[4]
    listed = md[md.index("## Flips: texts whose prediction changed"):]
    assert "| 0.042 |" in listed, "each disagreement shows A's top-2 gap"


TRAFFIC_EVIDENCE = {"path": "logs/prod.jsonl", "count": 2000, "labelled": False,
                    "rows": {"count": 2000, "of": 48211, "seed": 0, "strategy": "stratified by token length",
                             "content_sha256": "c4d016a089cec1b4" * 4},
                    "exclusions": ["log sha256: 113a1b5e", "calibration set: 128", "duplicate lines: 6819"]}


def test_compare_traffic_fidelity_is_rendered(tmp_path: Path) -> None:
    doc = {"format": "calibkit-compare/1", "agreement": 0.93,
           "traffic": {"evidence": TRAFFIC_EVIDENCE,
                       "fidelity": {"agreement": 0.9865, "cosine_mean": 0.9987, "cosine_min": 0.912},
                       "agreement_ci": {"estimate": 0.9865, "low": 0.9806, "high": 0.9907}, "flips": 27,
                       "mean_kl": 0.0031}}
    paths = render_report(doc, tmp_path / "r")
    md, html = paths.markdown.read_text().replace("\\", ""), paths.html.read_text()
    for out in (md, html):
        assert "Traffic fidelity" in out and "logs/prod.jsonl" in out and "2000 of 48211 rows" in out
        assert "98.65 % [98.06, 99.07]" in out and "prediction changed: 27" in out and "mean KL 0.003" in out
        assert "calibration set: 128" in out and "duplicate lines: 6819" in out
    assert "Traffic fidelity" not in render_report({"format": "calibkit-compare/1"}, tmp_path / "b"
                                                   ).markdown.read_text()


@pytest.mark.parametrize(("smoothing", "expected"), [
    ({"tried": True, "chosen": True, "model": "smoothed-model", "activations_smoothed": 25,
      "max_output_deviation": 5.46e-07}, ["built on the **smoothed** model", "calibration table minmax+smooth",
                                          "25 activations smoothed", "5.46e-07", "smoothed-model"]),
    ({"tried": True, "chosen": False, "activations_smoothed": 25}, ["built on the **plain** model"]),
    ({"tried": False, "note": "--no-smooth"}, ["Smoothing: **not tried** (--no-smooth)"]),
])
def test_tune_smoothing_choice_and_traffic_split_are_rendered(tmp_path: Path, smoothing: dict,
                                                              expected: list[str]) -> None:
    doc = {**fake_tune(), "smoothing": smoothing,
           "methods": {"chosen": "minmax+smooth", "all_int8_flip_rate_search": {"minmax": 0.04, "minmax+smooth": 0.01}},
           "eval_set": {"path": "eval.jsonl", "count": 300, "search": 180, "holdout": 120, "sensitivity_samples": 64,
                        "labels": "given", "traffic": TRAFFIC_EVIDENCE, "traffic_search": 1400, "traffic_holdout": 600}}
    paths = render_report(doc, tmp_path / "t")
    md, html = paths.markdown.read_text().replace("\\", ""), paths.html.read_text()
    for out in (md, html.replace("<b>", "**").replace("</b>", "**")):
        for text in expected:
            assert text in out
        assert "judged on **2000** unlabeled texts" in out and "logs/prod.jsonl" in out
        assert "1400 in the search split, 600 in the hold-out split" in out
        assert "calibration set: 128" in out


def test_a_typed_result_renders_as_its_document_does(tmp_path: Path) -> None:
    from calibkit.results.codec import to_document

    result = parse_result(fake_compare(n_layers=4), strict=False)
    typed = render_report(result, tmp_path / "typed")
    doc = render_report(to_document(result), tmp_path / "doc")
    assert typed.markdown.read_text() == doc.markdown.read_text()
    assert json.loads(typed.json.read_text()) == to_document(result)


@pytest.mark.parametrize(("cost", "expected"), [
    ({"rule": "sequential", "split_texts": 1400, "candidates": 9, "texts_median": 350.0, "texts_total": 4200,
      "completion_texts": 1050},
     ["Evidence per decision (sequential: each candidate judged on growing chunks", "**350** texts per candidate",
      "of 1400 in the search split; 4200 in all for 9 candidates", "remaining 1050 texts"]),
    ({"rule": "whole-split", "split_texts": 1400, "candidates": 9, "texts_median": 1400.0, "texts_total": 12600},
     ["(whole-split: each candidate judged on the whole search split): **1400** texts per candidate"]),
])
def test_tune_report_says_what_each_decision_cost(tmp_path: Path, cost: dict, expected: list[str]) -> None:
    paths = render_report({**fake_tune(), "evidence_cost": cost}, tmp_path / "t")
    md, html = paths.markdown.read_text().replace("\\", ""), paths.html.read_text()
    for out in (md, html.replace("<b>", "**").replace("</b>", "**")):
        for text in expected:
            assert text in out
    assert "Evidence per decision" not in render_report(fake_tune(), tmp_path / "none").markdown.read_text()
