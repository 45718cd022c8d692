#!/bin/bash
# The H200 checks left open on 2026-12-04 (issues #16, #17, #18), in one device call of
# about 9 minutes. Build first, here: tests/gpu/make-bundle.sh (it also builds the
# Python wheel into target/gpu-bundle/python when python/.venv has maturin: run
# python/run-tests.sh once). Then on the device, carrying target/gpu-bundle:
#   OUT=$OUT benches/scripts/h200-open-checks.sh
# Results go to $OUT (default /tmp/hf-open-checks); a summary is printed.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-open-checks}; mkdir -p "$OUT"
B=$PWD/target/gpu-bundle; H=$B/bin/hipfile-bench; F=/tmp/hf-open
chmod +x "$H"
export HIPFILE_DEVICE=cuda TMPDIR=${TMPDIR:-/tmp}
# SECTIONS="1 2b" runs only those sections (default: all).
want() { [ -z "${SECTIONS:-}" ] || [[ " $SECTIONS " == *" $1 "* ]]; }

if want 1; then
echo "== 1. what statistics cost: 4 KiB latency, recording on / off, interleaved, 2 rounds"
for round in 1 2; do for stats in on off; do
  env $([ $stats = off ] && echo HIPFILE_STATS=off) timeout -s KILL 60 "$H" --latency --no-baselines \
    --iterations 3000 --file $F --file-size 256M > "$OUT/latency-stats-$stats-$round.txt" 2>&1
  echo "stats=$stats round=$round: $(grep -E '^hipfile-rs (ASYNC|SYNC)' "$OUT/latency-stats-$stats-$round.txt" | tr -s ' ' | cut -c1-90 | tr '\n' '|')"
done; done
fi

if want 2; then
echo "== 2. batch mode (cuFile's batch polled with a 30 s deadline)"
timeout -s KILL 200 "$H" --mode batch --iterations 8000 --file $F --file-size 1G \
  --json "$OUT/batch.json" > "$OUT/batch.txt" 2>&1
echo "rc=$?"; sed -n '/^Path/,$p' "$OUT/batch.txt" | head -30
fi

if want 2b; then
echo "== 2b. the 8-thread sync path stays at ~66k IOPS for 4K and 64K alike: engine context or not?"
for ctx in default shared default shared; do
  env $([ $ctx = shared ] && echo HIPFILE_CUDA_ENGINE_CONTEXT=shared) timeout -s KILL 60 "$H" --mode batch \
    --batch-entries 32 --io-size 4K --iterations 8000 --no-baselines --file $F --file-size 1G \
    > "$OUT/batch-sync-$ctx.txt" 2>&1
  echo "context=$ctx: $(grep -E '^(SYNC|BATCH|ASYNC) ' "$OUT/batch-sync-$ctx.txt" | tr -s ' ' | cut -d' ' -f1,5 | tr '\n' ' ')"
  grep -E '^0 +sync' "$OUT/batch-sync-$ctx.txt" | head -1
done
fi

if want 2c; then
echo "== 2c. #16: do io-wq workers (iou-wrk) take CPU in an 8-stream hot read on this kernel?"
timeout -s KILL 60 "$H" --profile --mode read --streams 8 --io-size 16M \
  --no-baselines --reps 6 --file $F --file-size 2G > "$OUT/thread-cpu.txt" 2>&1
head -12 "$OUT/thread-cpu.txt"
fi

if want 3; then
echo "== 3. Rust GPU tests of the statistics (explain and batch are modules of sync_api and async_api now)"
HIPFILE_GPU_C=0 HIPFILE_GPU_SUITES="stats" timeout -s KILL 100 \
  tests/gpu/run-gpu-suite.sh "$B" > "$OUT/suite.txt" 2>&1
sed -n '/GPU suite summary/,$p' "$OUT/suite.txt"
fi

if want 4; then
echo "== 4. Python package on CUDA: pytest, then the safetensors loader against safetensors and torch.load"
python/device-checks.sh "$B" "$OUT"
fi

rm -f $F
