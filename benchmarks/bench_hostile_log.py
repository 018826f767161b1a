"""Benchmark what one oversized record costs `calibkit sample --tokenizer`.

A 201-line log whose last line is one 50 MB request once took 146 s and 7.1 GB; texts are now cut to
65,536 characters before anything else sees them. Targets (2 cores): <= 30 s wall time, <= 1 GB peak RSS.
Usage: .venv/bin/python benchmarks/bench_hostile_log.py [--tokenizer MODEL_DIR] [--mb 50]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 30.0
TARGET_GB = 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".cache" / "test-assets" / "fast" / "model")
    ap.add_argument("--mb", type=int, default=50)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    log = tmp / "log.jsonl"
    rng = random.Random(0)
    words = "good bad movie film great awful plot actors fun dull very not".split()
    with open(log, "w", encoding="utf-8") as fh:
        for i in range(200):
            fh.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(12)) + f" {i}"}) + "\n")
        fh.write(json.dumps({"text": "word " * (args.mb * 200_000)}) + "\n")
    log_mb = log.stat().st_size / 1e6
    cmd = [sys.executable, "-m", "calibkit", "sample", str(log), "--size", "64", "--tokenizer", str(args.tokenizer),
           "--out", str(tmp / "set")]
    try:
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t
        rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
        if proc.returncode != 0:
            sys.exit(f"sample failed:\n{proc.stderr}")
        oversized = json.loads((tmp / "set" / "manifest.json").read_text())["lines"]["oversized"]["count"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the benchmark's own temporary folder
    print(f"log {log_mb:.1f} MB, 201 lines: {wall:.1f} s, peak RSS {rss_gb:.2f} GB, "
          f"{oversized} oversized record(s) cut")
    ok = wall <= TARGET_S and rss_gb <= TARGET_GB and oversized == 1
    print(f"targets <= {TARGET_S:.0f} s, <= {TARGET_GB:.0f} GB: {'met' if ok else 'NOT met'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
