#!/usr/bin/env bash
# One device call of docs/measured.md's "BERT-base shape, 2,000 traffic texts, 16-core host, every default"
# measurement, run from the repository root on the 16-core host:
#
#   LIMIT=590 bash benchmarks/results/bert-base-2026-12-06/run.sh new:rest [old:rest]
#
# Builds the model (bench_tune_scale.py's build: seed 0, so every build is the same bytes) and lets
# bench_tune_speed.py sample the calibration set, where this machine lacks them; restores a strategy's state and
# tune ledger from .devcache/bb-state/ (what an earlier call left under $OUT) where this machine lacks them; then
# runs bench_tune_speed.py for each STRATEGY:SECONDS ("rest": what is left of LIMIT seconds, less 30), the new
# strategy from this checkout, the old one from .devcache/old (commit bcfe8da's calibkit, the last before the
# switchboard), every tune default but the 2,000 traffic texts. Leaves each strategy's state, log, ledger and
# tune.json under $OUT.
set -u
T0=$(date +%s)
LIMIT=${LIMIT:-590}
W=${W:-/tmp/bb}
SHAPE=${SHAPE:-base}
PY=${PY:-python3}
export W SHAPE
C=.devcache
K=$C/bb-state
OUT=${OUT:-/tmp/bb-out}
mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u; nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2
  "$PY" -c "import sys, numpy, onnx, onnxruntime, torch, transformers, tokenizers; print(sys.version.split()[0], 'numpy', numpy.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
} 2>&1 | tee -a "$OUT/env.txt"
if [ ! -f "$W/bert-base/model.onnx" ]; then
  PYTHONPATH=$PWD "$PY" - <<'PY' 2>&1 | grep -v Warning | tee -a "$OUT/env.txt"
import os, sys, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
from bench_tune_scale import build
t = time.perf_counter()
build(os.environ["SHAPE"], Path(".devcache/demo/model"), Path(".devcache/demo/logs.jsonl"),
      Path(os.environ["W"]) / "bert-base")
print(f"model built in {time.perf_counter() - t:.0f} s", flush=True)
PY
fi
sha256sum "$W/bert-base/model.onnx" | tee -a "$OUT/env.txt"
for arg in "$@"; do
  S=${arg%%:*}
  B=${arg#*:}
  if [ "$B" = rest ]; then B=$(( LIMIT - ($(date +%s) - T0) - 30 )); fi
  if [ "$B" -lt 60 ]; then echo "$S: only $B s left, not started" | tee -a "$OUT/$S.log"; continue; fi
  [ -f "$W/$S.state.json" ] || [ ! -f "$K/$S.state.json" ] || cp "$K/$S.state.json" "$W/"
  if [ ! -f "$W/.tune-$S.tune/ledger.jsonl" ] && [ -f "$K/$S.ledger.jsonl.gz" ]; then
    mkdir -p "$W/.tune-$S.tune" && gunzip -c "$K/$S.ledger.jsonl.gz" > "$W/.tune-$S.tune/ledger.jsonl"
  fi
  CODE=()
  [ "$S" = old ] && CODE=(--code "$C/old")
  echo "=== $S: budget $B s at $(date -u +%T)" | tee -a "$OUT/$S.log"
  "$PY" benchmarks/bench_tune_speed.py --model "$W/bert-base" --log "$C/demo/logs.jsonl" --work "$W" \
    --strategy "$S" "${CODE[@]}" --traffic-size 2000 --budget "$B" 2>&1 | tee -a "$OUT/$S.log"
  cp "$W/$S.state.json" "$OUT/" 2>/dev/null
  [ -f "$W/.tune-$S.tune/ledger.jsonl" ] && gzip -c "$W/.tune-$S.tune/ledger.jsonl" > "$OUT/$S.ledger.jsonl.gz"
  [ -f "$W/tune-$S/tune.json" ] && cp "$W/tune-$S/tune.json" "$OUT/$S.tune.json"
done
ls -la "$W" "$W"/.tune-*.tune 2>&1 | tee -a "$OUT/env.txt"
echo "call took $(( $(date +%s) - T0 )) s"
