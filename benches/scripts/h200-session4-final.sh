#!/bin/bash
# Last checks of 2026-12-04 (fourth session), one device call of about 8 minutes: Python on
# CUDA (pytest, the safetensors loader with the page-cache-aware O_DIRECT policy), the
# batch mode with every path warmed, and the default run (the README's main job).
# Build first: tests/gpu/make-bundle.sh; on the device, carrying target/gpu-bundle:
#   OUT=$OUT benches/scripts/h200-session4-final.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-final}; mkdir -p "$OUT"
B=$PWD/target/gpu-bundle; H=$B/bin/hipfile-bench
chmod +x "$H"
export HIPFILE_DEVICE=cuda
echo "kernel $(uname -r)"
echo "== 1. Python on CUDA"
PYTEST_TIMEOUT=100 BENCH_TIMEOUT=150 python/device-checks.sh "$B" "$OUT"
echo "== 2. batch mode, every path warmed first"
timeout -s KILL 150 "$H" --mode batch --iterations 8000 --file /tmp/hf-batch --file-size 1G \
  > "$OUT/batch.txt" 2>&1
echo "rc=$?"; sed -n '/^Path/,/^$/p' "$OUT/batch.txt"
rm -f /tmp/hf-batch
echo "== 3. the default run"
timeout -s KILL 200 "$H" --json "$OUT/default.json" > "$OUT/default.txt" 2>&1
echo "rc=$?"; grep -vE "^\s*$" "$OUT/default.txt" | tail -30
