#!/bin/bash
# #16 groundwork (2026-12-04): where do 8-stream hot 16 MiB reads and writes lose to cuFile's
# sync path? One call of about 6 minutes: the same-run baseline with cuFile, then the
# engine's knobs interleaved (two rounds, --no-baselines), then per-thread CPU of the base
# read. Build first: tests/gpu/make-bundle.sh; on the device, carrying target/gpu-bundle:
#   OUT=$OUT benches/scripts/h200-read-write-knobs.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-knobs}; mkdir -p "$OUT"
H=$PWD/target/gpu-bundle/bin/hipfile-bench; F=/tmp/hf-knobs
chmod +x "$H"
export HIPFILE_DEVICE=cuda
log=$OUT/knobs.txt; : > "$log"
echo "=== base with baselines" >> "$log"
timeout -s KILL 120 "$H" --mode read,write --streams 8 --io-size 16M --reps 3 --file $F --file-size 2G >> "$log" 2>&1
for round in 1 2; do
  for v in base HIPFILE_THREADS=16 HIPFILE_CHUNK_KB=4096 HIPFILE_QUEUE_DEPTH=8 "HIPFILE_THREADS=16 HIPFILE_CHUNK_KB=4096"; do
    echo "=== round $round: $v" >> "$log"
    env $([ "$v" = base ] || echo $v) timeout -s KILL 60 "$H" --mode read,write --streams 8 --io-size 16M --reps 3 \
      --no-baselines --file $F --file-size 2G >> "$log" 2>&1
  done
done
echo "=== thread CPU, base read" >> "$log"
timeout -s KILL 60 "$H" --profile --mode read --streams 8 --io-size 16M \
  --no-baselines --reps 8 --file $F --file-size 2G >> "$log" 2>&1
rm -f $F
grep -E "^===|^(READ|WRITE) +(ASYNC|SYNC|CPUONLY|CPU_GPU|GPU_COPY|CUFILE_SYNC) |cpu-s/GiB by thread" "$log"
