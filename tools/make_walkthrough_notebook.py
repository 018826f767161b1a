"""Writes notebooks/walkthrough.ipynb (the notebook is generated so its cells stay reviewable as code)."""

# ruff: noqa: E501  (the cells' text is notebook content)
from pathlib import Path

import nbformat as nbf

nb = nbf.v4.new_notebook()
cells = []


def md(text: str) -> None:
    cells.append(nbf.v4.new_markdown_cell(text))


def code(text: str) -> None:
    cells.append(nbf.v4.new_code_cell(text))



md("""# calibkit walkthrough: from production logs to a tuned INT8 model

This notebook runs the whole calibkit workflow through the Python API, on ONNX Runtime on the CPU:

1. prepare the demo assets (a MiniLM sentiment model, a labelled test split, a production request log);
2. **sample** a representative calibration set from the log;
3. **calibrate** with every method — the model runs once, every other method reuses the statistics;
4. look at one tensor's histogram and where each method puts the INT8 clipping range;
5. **build** FP32 / INT8 engines and **compare** them layer by layer;
6. **tune** a mixed-precision plan to an accuracy target;
7. render a **report**.

By default it uses the *fast* variant of the demo model (frozen encoder + logistic-regression head) so it runs in
a few minutes; set `CALIBKIT_NOTEBOOK_FULL=1` to use the fine-tuned model instead (about 15 minutes more).""")

code("""import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

WORK = Path(os.environ.get("CALIBKIT_NOTEBOOK_DIR", "notebook_run")).resolve()
ASSETS = Path(os.environ.get("CALIBKIT_DEMO_ASSETS", WORK / "demo_assets"))
FAST = os.environ.get("CALIBKIT_NOTEBOOK_FULL", "") != "1"
WORK.mkdir(parents=True, exist_ok=True)
print("work folder:", WORK, "| assets:", ASSETS, "| fast variant:", FAST)""")

md("## 1. Demo assets\n`prepare_demo` is idempotent: a second call reuses every finished step.")
code("""from calibkit.demo.prepare import PrepareOptions, prepare_demo

prep = prepare_demo(ASSETS, PrepareOptions(fast=FAST))
print(prep.variant, "model, FP32 held-out accuracy", f"{prep.accuracy:.2%}", "| made:", prep.made, "reused:", prep.reused)""")

md("## 2. A calibration set from the production log\nBroken lines are counted and skipped, duplicates removed, personal data redacted, and the sample is stratified by token length and topic. The manifest says how representative it is.")
code("""import calibkit as ck

cset = ck.sample(ASSETS / "logs.jsonl", WORK / "calibration_set", size=256, seed=0, tokenizer=prep.model_dir)
m = cset.manifest.sample  # what sample recorded: typed sections (calibkit.results.files.SampleRecord)
rep = m.representativeness
print(len(cset), "texts | broken lines by kind:", {k: v.count for k, v in m.lines.broken.items()})
print("redactions:", {"enabled": m.redaction.enabled, "counts": dict(m.redaction.counts)}, "| verdict:", rep.verdict,
      f"(PSI {rep.psi:.3f}, KS {rep.ks:.3f})")""")

code("""edges = rep.bin_edges
x = np.arange(len(rep.population_fraction))
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar(x - 0.2, rep.population_fraction, 0.4, label="whole log")
ax.bar(x + 0.2, rep.sample_fraction, 0.4, label="calibration sample")
names = [f"{a}-{b}" for a, b in zip(edges[:-1], edges[1:])]
names += [f"{edges[-1]}+"] * (len(x) - len(names))  # the last bin holds everything beyond the last edge
ax.set_xticks(x, names[: len(x)], rotation=45)
ax.set_xlabel("tokens"); ax.set_ylabel("fraction"); ax.legend(); ax.set_title("token-length distribution")
plt.show()""")

md("## 3. Calibrate with every method\nThe first call runs the FP32 model over the set and streams the statistics; the others reuse them.")
code("""results = {}
for method in ("entropy", "minmax", "percentile", "mse"):
    r = ck.calibrate(prep.model_dir, cset, WORK / f"calibrate-{method}", method=method, cache_dir=WORK / "stats-cache")
    results[method] = r
    print(f"{method:10s} statistics reused: {r.reused_stats!s:5s}  {len(r.quantized_nodes)} nodes quantized  "
          f"-> {r.model_path.name}, {r.cache_path.name}, {r.json_path.name}")""")

code("""table = pl.DataFrame({
    "tensor": [r.tensor for r in results["minmax"].table.ranges],
    **{m: [r.amax for r in res.table.ranges] for m, res in results.items()},
})
table.head(8)""")

md("## 4. One tensor, four thresholds\nThe input of the last feed-forward output projection (after GELU) is where transformers' outliers live.")
code("""from calibkit.calibrate.methods import compute_amax
from calibkit.calibrate.stats import StatsStore
from calibkit.types import Method, MethodParams

store = StatsStore.load(results["mse"].stats_path)
name = next(t for t in store if "layer.5/output/dense" in t) if any("layer.5/output/dense" in t for t in store) else next(iter(store))
s = store[name]
h = s.histogram
occupied = h.occupied()
centres = (np.arange(len(occupied)) + 0.5) * h.width
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.semilogy(centres, np.maximum(occupied, 0.5), lw=0.8, color="0.3")
for method, colour in zip(Method, ["C0", "C1", "C2", "C3"]):
    a = compute_amax(s, method, MethodParams())
    ax.axvline(a, color=colour, label=f"{method.value}: {a:.3g}")
ax.set_title(f"|x| histogram of {name}"); ax.set_xlabel("|x|"); ax.set_ylabel("count"); ax.legend()
plt.show()
print(f"values seen {s.count:,}, max |x| {s.absmax:.3g}, non-finite {s.nan_count + s.posinf_count + s.neginf_count}")""")

md("## 5. Engines and a layer-by-layer comparison")
code("""best = "mse"
fp32 = ck.build(prep.model_dir, WORK / "engines" / "fp32.onnx", precision="fp32")
int8 = ck.build(prep.model_dir, WORK / "engines" / "int8.onnx", precision="int8", calibration=results[best].json_path)
# the test split is ordered by label: --limit draws a stratified random subset, never its first rows
cmp = ck.compare(fp32.artifact, int8.artifact, ASSETS / "data" / "test.jsonl", limit=300, seed=0,
                 layer_samples=128, sensitivity_samples=64, sensitivity_layers=6, workers=1)
for e in cmp.engines:
    print(f"{e.name}: {e.precision:5s} accuracy {e.accuracy:.2%}  macro-F1 {e.macro_f1:.3f}")
print("agreement", f"{cmp.agreement:.2%}", "| keep in higher precision:", list(cmp.keep_in_higher_precision))
# were the flips coin tosses? texts by A's top-2 probability gap, and how many of each flipped
print("flips by A's confidence:", [(f"{b.low}-{b.high}", b.flips, b.texts) for b in cmp.flips_by_confidence])""")

code("""layers = pl.DataFrame([{"node": v.node, "tensor": v.tensor, "amax": v.amax, "fp_absmax": v.fp_absmax,
                        "clipped_fraction": v.clipped_fraction, "quant_sqnr_db": v.quant_sqnr_db,
                        "sqnr_db": v.sqnr_db, "flag": v.flag.value} for v in cmp.layers])
fig, ax = plt.subplots(figsize=(10, 3.5))
vals = [v if v is not None else 0 for v in layers["sqnr_db"].to_list()]
colours = ["C3" if f != "ok" else "C0" for f in layers["flag"].to_list()]
ax.bar(range(len(vals)), vals, color=colours)
ax.set_xlabel("quantized layer (graph order)"); ax.set_ylabel("output SQNR (dB)")
ax.set_title("per-layer SQNR, flagged layers in red")
plt.show()
layers.sort("quant_sqnr_db").head(8)""")

md("""## 5b. Smoothing: the outliers move into the weights
A few channels of the GELU and LayerNorm outputs are far larger than the rest, so a per-tensor INT8 range sized for them leaves the others few levels. `smooth` divides each such activation by per-channel scales that the weights absorb (the FP32 function is unchanged, and checked); the INT8 model of the smoothed copy flips fewer of FP32's predictions.""")
code("""sm = ck.smooth(prep.model_dir, cset, WORK / "smoothed-model")
print(f"{len(sm.smoothed)} of {sm.groups} activations smoothed; FP32 outputs equal within {sm.max_deviation:.1e}")
rows = []
for m in ("minmax", "mse"):
    s = ck.calibrate(sm.out_dir, cset, WORK / f"calibrate-{m}-smoothed", method=m, cache_dir=WORK / "stats-cache")
    for label, folder, res in (("plain", prep.model_dir, results[m]), ("smoothed", sm.out_dir, s)):
        eng = ck.build(folder, WORK / "engines" / f"int8-{m}-{label}.onnx", precision="int8",
                       calibration=res.json_path, target="tensorrt")  # run as the Q/DQ arithmetic TensorRT computes
        c = ck.compare(fp32.artifact, eng.artifact, ASSETS / "data" / "test.jsonl", limit=300, seed=0, layers=False)
        rows.append({"method": m, "model": label, "flips of FP32": round(c.flip_rate * c.eval_set.count),
                     "agreement": c.agreement, "texts": c.eval_set.count})
pl.DataFrame(rows)
""")

md("## 6. Tune a mixed-precision plan\nThe eval set is split into a search part (every decision) and a holdout part (measured only at the end).")
code("""tuned = ck.tune(prep.model_dir, cset, ASSETS / "data" / "test.jsonl", WORK / "tune", limit=300, seed=0,
                max_drop=1.0, method="mse", sensitivity_samples=64, sensitivity_layers=6, max_evaluations=10,
                workers=1)
t = tuned.result
print("FP32 search / holdout:", f"{t.target.fp32_accuracy:.2%} / {t.target.fp32_accuracy_holdout:.2%}")
print("plan   search / holdout:", f"{t.final.accuracy_search:.2%} / {t.final.accuracy_holdout:.2%}",
      f"| INT8 FLOPs {t.final.int8_flops_fraction:.1%} | kept: {list(t.final.kept_nodes)}")
pl.DataFrame([{"id": c.id, "stage": c.stage, "int8_flops_fraction": c.int8_flops_fraction,
               "accuracy_search": c.accuracy_search, "meets_target": c.meets_target} for c in t.candidates])""")

md("## 7. Reports\nThe same documents the CLI writes: `report.json` for machines, `report.md` and a self-contained `report.html` with plots.")
code("""paths = ck.render_report(cmp, WORK / "reports" / "compare")
tune_paths = ck.render_report(tuned.result, WORK / "reports" / "tune")
print(paths.html, tune_paths.html)
print(len(paths.plots), "plots in the compare report")""")

nb["cells"] = cells
nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, str(Path(__file__).resolve().parents[1] / "notebooks" / "walkthrough.ipynb"))
