"""Regenerate the README's demo rows of "## Measured" from the summary `calibkit demo run` writes.

    python tools/readme_measured.py                      # reports/demo-fine-tuned/index/summary.json -> README.md
    python tools/readme_measured.py path/to/summary.json --readme README.md
    python tools/readme_measured.py --check              # exit 1 when README.md's block differs

Only the text between ``<!-- measured:begin -->`` and ``<!-- measured:end -->`` is replaced; every number in it
comes from the summary (calibkit-demo/1, read into its typed value by calibkit's codec).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from calibkit.demo.workflow import SMOOTHED, confidence_text  # SMOOTHED: the key suffix of a smoothed variant
from calibkit.errors import DataError
from calibkit.report.formatting import fraction_pct as _pct
from calibkit.report.formatting import interval_text
from calibkit.results.codec import parse_document
from calibkit.results.files import DemoSummary
from calibkit.results.runs import Difference, Range

BEGIN = "<!-- measured:begin -->"
END = "<!-- measured:end -->"
HEADER = ("| what | result | command |", "|---|---|---|")
DEFAULT_SUMMARY = Path("reports/demo-fine-tuned/index/summary.json")


def summary_of(doc: Any) -> DemoSummary:
    """A parsed summary.json as its typed value (ValueError naming what is wrong with it)."""
    try:
        return parse_document(DemoSummary, doc)
    except DataError as exc:
        raise ValueError(f"not a calibkit demo summary: {exc.message}") from None


def _ci(r: Range | Difference | None, signed: bool = False) -> str:
    return interval_text(None if r is None else {"low": r.low, "high": r.high}, signed)


def render_block(s: DemoSummary) -> str:
    """The Markdown between the markers: an intro line and a three-column table, one row per measured claim."""
    n = s.eval_examples
    fid = s.method_fidelity
    methods = ", ".join(
        f"{m} {_pct(a)} ({fid[m].flips} flips)" if m in fid else f"{m} {_pct(a)}"
        for m, a in s.method_accuracy.items()
    )
    best = s.best_method
    bf = fid.get(best)
    c = s.compare_fp32_vs_int8
    d = c.accuracy_difference
    keep = c.keep_in_higher_precision
    t = s.tune
    hv = t.holdout_verdict.supported if t.holdout_verdict is not None else None
    verdict = {True: "holdout supports the claim", False: "holdout does not support the claim"}.get(hv, "no verdict")
    agree = f" --min-agreement {t.min_agreement_percent:g}" if t.min_agreement_percent is not None else ""
    estimate = d.estimate if d is not None and d.estimate is not None else float("nan")
    rows = [
        (f"INT8 by calibration method, every MatMul/Gemm INT8 (TensorRT layout), {s.calibration_texts}-text "
         f"log-sampled calibration set, {n} test texts",
         f"{methods} (FP32 {_pct(s.fp32_accuracy)})", "`calibkit demo run`"),
        ("best single method by fidelity (fewest flips of FP32's predictions)",
         f"{best}: {bf.flips} of {bf.n} flipped ({_pct(bf.flips / bf.n)}), agreement "
         f"{_pct(bf.agreement.estimate)}{_ci(bf.agreement)}" if bf else best, "`calibkit demo run`"),
        (f"compare FP32 vs INT8 ({best}), {n} test texts",
         f"accuracy {100 * estimate:+.2f} points{_ci(d, signed=True)} "
         f"({d.verdict if d is not None else '—'}); agreement {_pct(c.agreement)}{_ci(c.agreement_ci)}; "
         f"{len(keep)} layers advised to stay in higher precision"
         + (f"; {confidence_text(c.flips_by_confidence)}" if c.flips_by_confidence else ""),
         "`calibkit demo run`"),
        (f"tune --max-drop {t.max_drop_points:g}{agree}, holdout split ({t.holdout_examples} texts "
         "the search never saw)",
         f"plan {_pct(t.accuracy_holdout)} vs FP32 {_pct(t.fp32_accuracy_holdout)}, agreement "
         f"{_pct(t.agreement_holdout)}{_ci(t.holdout_evidence.agreement if t.holdout_evidence else None)}, "
         f"{100 * t.int8_flops_fraction:.1f} % of MatMul/Gemm FLOPs in INT8 ({t.method or '—'}; "
         f"{len(t.kept_nodes)} layers kept); {verdict}", "`calibkit demo run`"),
    ]
    if t.speed is not None:
        rows.append((f"the tuned plan served on ONNX Runtime ({t.layout} layout), beside FP32, {t.speed.threads} "
                     f"threads, {t.speed.rounds} interleaved rounds on {t.speed.texts} holdout texts "
                     f"({t.speed.cpu}: {t.speed.isa})", f"{t.speed.words} (spread: lowest–highest round)",
                     "`calibkit demo run`"))
    dp = s.deploy
    if dp is not None and dp.speed is not None:
        agreement = (f"; agreement {_pct(dp.agreement_with_fp32)}{_ci(dp.agreement_ci)} on {dp.agreement_texts} "
                     f"log texts" if dp.agreement_with_fp32 is not None else "")
        rows.append((f"`calibkit deploy` of the tuned plan ({dp.layout} layout): the served model measured "
                     f"beside FP32 at batch 1 and at the batch Triton forms of the length bucket most log requests "
                     f"fall in", f"{dp.speed.words}{agreement}", "`calibkit demo run`"))
    sm = s.smoothing
    if sm:
        gains = sm.gain_db or (0.0,)
        pairs = [f"{m} {fid[m].flips} → {fid[k].flips}" for m in s.method_accuracy
                 for k in [m + SMOOTHED] if m in fid and k in fid]
        rows.insert(1, (
            f"`calibkit smooth` (alpha {sm.alpha}), then every method again on the smoothed model",
            f"{sm.smoothed} of {sm.groups} activations smoothed, INT8 product error {min(gains):.1f}–"
            f"{max(gains):.1f} dB lower on the calibration rows, FP32 outputs equal to the original's within "
            f"{sm.max_output_deviation:.1e} of their range; flips of FP32's predictions, plain → smoothed: "
            + ", ".join(pairs), "`calibkit demo run`"))
    for m, r in s.tune_by_method.items():
        rows.append((f"tune restricted to {m}, holdout split",
                     f"plan {_pct(r.accuracy_holdout)} vs FP32 {_pct(r.fp32_accuracy_holdout)} "
                     f"(all-INT8 {_pct(r.all_int8_accuracy_holdout)}), {100 * r.int8_flops_fraction:.1f} % "
                     f"of FLOPs in INT8, {len(r.kept_nodes)} layers kept", "`calibkit demo run`"))
    e = s.embedder
    if e:
        def cos(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.4f}"

        rows.append((f"the same weights as a sentence embedder, `tune --traffic auto` from the log alone (no labels),"
                     f" holdout of {e.traffic_holdout} traffic texts",
                     f"nearest neighbour in the FP32 index kept: all-INT8 {_pct(e.all_int8_agreement_holdout)} → "
                     f"plan {_pct(e.agreement_holdout)}; mean cosine {cos(e.all_int8_cosine_holdout)} → "
                     f"{cos(e.cosine_holdout)}; {100 * e.int8_flops_fraction:.1f} % of FLOPs in INT8 "
                     f"({len(e.kept_nodes)} layers kept, {e.method}); target "
                     f"{e.min_agreement_percent:g} % / {e.min_cosine:g} "
                     f"{'met' if e.met_target else 'NOT met'} on the search split", "`calibkit demo run`"))
    # within one run the first method of each model collects the statistics and the others reuse them; a run
    # whose every method reused them found them cached by an earlier run, as tune's reused evaluations are
    stats = s.statistics_reused
    earlier = [w for w, on in (("statistics from the cache", bool(stats) and all(stats.values())),
                               (f"{t.evaluations_reused} tune evaluations from its ledger",
                                bool(t.evaluations_reused))) if on]
    warm = f" (a warm re-run: {', '.join(earlier)})" if earlier else " (cold: no cache, no tune ledger)"
    rows.append(("`calibkit demo run`, whole workflow", f"{s.timings_s.get('total', '—')} s{warm}",
                 "`calibkit demo run`"))
    lines = [
        f"Generated by `python tools/readme_measured.py` from `{DEFAULT_SUMMARY}` (written by `calibkit demo run`, "
        f"calibkit {s.calibkit_version or '—'}); 95 % intervals in brackets.",
        "",
        *HEADER,
        *[f"| {a} | {b} | {cmd} |" for a, b, cmd in rows],
    ]
    return "\n".join(lines)


def replace_block(readme: str, block: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n(?:.*?\n)?" + re.escape(END), re.S)
    if len(pattern.findall(readme)) != 1:
        raise ValueError(f"README must hold exactly one {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", readme)


def read_block(readme: str) -> str:
    m = re.search(re.escape(BEGIN) + r"\n(?:(.*?)\n)?" + re.escape(END), readme, re.S)
    if m is None:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    return m.group(1) or ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summary", nargs="?", type=Path, default=DEFAULT_SUMMARY)
    ap.add_argument("--readme", type=Path, default=Path("README.md"))
    ap.add_argument("--check", action="store_true", help="exit 1 when the README's block is not up to date")
    args = ap.parse_args(argv)
    summary = summary_of(json.loads(args.summary.read_text(encoding="utf-8")))
    old = args.readme.read_text(encoding="utf-8")
    new = replace_block(old, render_block(summary))
    if args.check:
        if new != old:
            print(f"{args.readme}: measured block is out of date (run tools/readme_measured.py)", file=sys.stderr)
            return 1
        return 0
    if new != old:
        tmp = args.readme.with_name(f".{args.readme.name}.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(args.readme)
    print(f"{args.readme}: measured block {'updated' if new != old else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
