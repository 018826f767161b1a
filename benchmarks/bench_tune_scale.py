"""tune at BERT-base scale from traffic alone: time from start to verified plan, per decision rule (issue 19).

    python benchmarks/bench_tune_scale.py --log LOG --tokenizer DIR [--shape base] [--traffic-size 2000]
        [--rules sequential,whole-split] [--workers 4] [--method minmax] [--sensitivity-layers 12]
        [--max-evaluations 16] [--work DIR] [--json PATH]

The model is a random-initialised BERT shape (``bench_scale.py``'s, nothing downloaded) whose classifier head is
re-scaled and centred on the log's own texts so that its two classes split them about evenly (an untrained head
predicts one class for almost every text, and agreement with FP32 would then prove nothing). The calibration set
is 512 texts sampled from the log; there is no labelled eval set: ``tune --traffic auto`` draws ``--traffic-size``
texts of the same log outside the calibration set, searches on 70 % and verifies the plan on the other 30 %
(``--min-agreement 99``, the default without labels). Each decision rule runs on the same model, calibration set
and traffic, one after the other, with a fresh work folder (no ledger reused); the row gives the wall time from
tune's start to the verified plan, the INT8 share, the holdout agreement and its interval, and the texts each
candidate cost (median, total).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def log_texts(log: Path) -> list[str]:
    """The usable texts of a log, in order (the demo log is dirty on purpose: broken lines, bad bytes)."""
    texts = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            t = json.loads(line).get("text")
        except (ValueError, AttributeError):
            continue
        if isinstance(t, str) and t.strip():
            texts.append(t)
    return texts


def build(shape: str, tokenizer: Path, log: Path, out: Path) -> Path:
    """The random-initialised shape with a head centred on the log's texts (classes split about evenly)."""
    import torch
    from bench_scale import bert_shape, export_bert  # type: ignore[import-not-found]

    from calibkit.data.tokenizer import TextTokenizer

    if (out / "model.onnx").is_file():
        return out
    model = bert_shape(shape)
    hidden = model.config.hidden_size
    texts = log_texts(log)[:256]
    enc = TextTokenizer(tokenizer, max_length=128).encode(texts)
    with torch.no_grad():
        pooled = model.bert(input_ids=torch.tensor(enc.input_ids), attention_mask=torch.tensor(enc.attention_mask),
                            token_type_ids=torch.zeros_like(torch.tensor(enc.input_ids))).pooler_output
        w = torch.randn(2, hidden) * (4.0 / hidden ** 0.5)
        gap = pooled @ (w[1] - w[0])
        model.classifier.weight.copy_(w / gap.std())
        model.classifier.bias.copy_(torch.tensor([0.0, -float(gap.median() / gap.std())]))
    export_bert(model, out, tokenizer)
    return out


def run(rule: str, model: Path, cset, args: argparse.Namespace) -> dict:  # noqa: ANN001
    import calibkit as ck

    out = args.work / f"tune-{rule}"
    t0 = time.perf_counter()
    res = ck.tune(model, cset, None, out, traffic="auto", traffic_size=args.traffic_size, method=args.method,
                  workers=args.workers, sensitivity_layers=args.sensitivity_layers,
                  max_evaluations=args.max_evaluations, decision_rule=rule, seed=0).result
    seconds = time.perf_counter() - t0
    f, hold = res.final, res.final.holdout_evidence
    per = [c.texts_search for c in res.candidates if c.texts_search is not None]
    return {
        "rule": rule, "seconds": round(seconds, 1), "met_target": res.met_target,
        "int8_flops_fraction": f.int8_flops_fraction, "kept": len(f.kept_nodes), "method": res.methods.chosen,
        "agreement_holdout": f.agreement_holdout,
        "agreement_holdout_low": hold.agreement.low if hold else None,
        "agreement_holdout_high": hold.agreement.high if hold else None,
        "holdout_texts": (hold.agreement_n or hold.n) if hold else 0,
        "candidates": len(res.candidates),
        "texts_per_candidate_median": statistics.median(per) if per else res.eval_set.search,
        "texts_total": sum(per) if per else res.eval_set.search * len(res.candidates),
        "verdict": f.holdout_verdict.text if f.holdout_verdict else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--shape", default="base")
    ap.add_argument("--traffic-size", type=int, default=2000)
    ap.add_argument("--rules", default="sequential,whole-split")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--method", default="minmax")
    ap.add_argument("--sensitivity-layers", type=int, default=12)
    ap.add_argument("--max-evaluations", type=int, default=16)
    ap.add_argument("--work", type=Path, default=Path("runs/bench-tune-scale"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import calibkit as ck

    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = build(args.shape, args.tokenizer, args.log, args.work / f"bert-{args.shape}")
    print(f"model built in {time.perf_counter() - t0:.0f} s", flush=True)
    cset = ck.sample(args.log, args.work / "cset", size=512, tokenizer=model)
    rows = []
    for rule in args.rules.split(","):
        r = run(rule, model, cset, args)
        rows.append(r)
        print(f"{rule}: {r['seconds']} s to a verified plan, {100 * r['int8_flops_fraction']:.1f} % INT8 "
              f"({r['kept']} kept, {r['method']}), holdout agreement {100 * (r['agreement_holdout'] or 0):.2f} % "
              f"[{100 * (r['agreement_holdout_low'] or 0):.2f}, {100 * (r['agreement_holdout_high'] or 0):.2f}] on "
              f"{r['holdout_texts']} texts, met {r['met_target']}; {r['candidates']} candidates, texts per "
              f"candidate median {r['texts_per_candidate_median']}, total {r['texts_total']}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
