"""Benchmark `calibkit sample` on a 1,000,000-line synthetic production log.

Targets (2 cores): <= 60 s wall time, <= 2 GB peak RSS. The log is generated once and cached under
.cache/bench/. Usage: .venv/bin/python benchmarks/bench_sample.py [--lines N] [--size 512]
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0
TARGET_GB = 2.0

_VOCAB = {
    "movie": "film actor plot scene director cinema sequel screenplay soundtrack cast ending twist".split(),
    "tweet": "lol today phone coffee friends weekend traffic game party monday bus rain".split(),
    "product": "battery charger delivery refund quality price seller box cable screen warranty size".split(),
    "news": "government policy economy election senate budget court reform minister tax vote crisis".split(),
}
_COMMON = "the a is was and very not really but so great terrible boring amazing awful decent".split()


def sources(n: int = 30_000, seed: int = 0):
    from calibkit.demo.traffic import SourceText

    rng = random.Random(seed)
    out = []
    kinds = sorted(_VOCAB)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        words = [rng.choice(_VOCAB[kind] + _COMMON) for _ in range(int(rng.lognormvariate(2.7, 0.6)) + 2)]
        out.append(SourceText(" ".join(words).capitalize() + ".", kind, rng.choice(("pos", "neg"))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=512)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from calibkit.demo.traffic import generate_log

    cache = ROOT / ".cache" / "bench" / f"traffic-{args.lines}-s0.jsonl"
    if not cache.is_file():
        t = time.perf_counter()
        generate_log(sources(), cache, args.lines, seed=0)
        print(f"generated {cache} in {time.perf_counter() - t:.1f} s", flush=True)
    out = Path(tempfile.mkdtemp(prefix="bench-sample-"))
    cli = Path(sys.executable).with_name("calibkit")
    cmd = [str(cli), "sample", str(cache), "--size", str(args.size), "--out", str(out / "set")]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_gb = r1.ru_maxrss / 1024**2  # ru_maxrss is KiB on Linux; the only child is `calibkit sample`
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        raise SystemExit(f"calibkit sample failed with exit code {proc.returncode}")
    size_mb = cache.stat().st_size / 1e6
    print(f"\ncalibkit sample, {args.lines:,} lines ({size_mb:.0f} MB), --size {args.size} (2 shared cores: noisy)")
    print(f"{'metric':<14}{'measured':>12}{'target':>10}{'ok':>6}")
    print(f"{'wall time':<14}{wall:>10.1f} s{TARGET_S:>8.0f} s{'yes' if wall <= TARGET_S else 'NO':>6}")
    print(f"{'peak RSS':<14}{peak_gb:>9.2f} GB{TARGET_GB:>7.0f} GB{'yes' if peak_gb <= TARGET_GB else 'NO':>6}")
    print(f"{'CPU time':<14}{cpu:>10.1f} s{'':>10}  (user+sys: what wall time would be on idle cores)")
    print(f"{'lines/s':<14}{args.lines / wall:>12,.0f}")


if __name__ == "__main__":
    main()
