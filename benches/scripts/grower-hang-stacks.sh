#!/bin/bash
# Host stacks of the hang seen with slots pinned ahead (thirteenth session,
# benches/results/h100-slot-grower-ab-2026-12-05/): the sweep case writes x 33 streams x
# 16 MiB x mixed flags under HIPFILE_STREAM_COPIES=all, with the patch applied. One device
# call of ~90 s after the machine starts. Build the binary here first:
#   git apply benches/results/h100-slot-grower-ab-2026-12-05/slot-grower.patch
#   cargo build --release -p hipfile-bench && mkdir -p target/ab
#   cp target/release/hipfile-bench target/ab/bench-grower && strip target/ab/bench-grower
#   git checkout runtime/src
# then run with carry ["target/ab"]:  OUT=dir benches/scripts/grower-hang-stacks.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/hf-grower-stacks}; mkdir -p "$out"
bench=${BENCH:-target/ab/bench-grower}; chmod +x "$bench"
gdb=$(command -v cuda-gdb || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuda-gdb")
HIPFILE_DEVICE=cuda HIPFILE_STREAM_COPIES=all timeout -s KILL 100 "$bench" --mode sweep \
  --case-timeout 60 --io-size 16M --streams 33 --sweep-flags mixed --file /tmp/hf-stacks.dat \
  > "$out/sweep.txt" 2>&1 &
# The read case passes in ~2 s; the write case is the newest process by ~5 s.
sleep 14
ps -eo pid,etimes,args | grep "$(basename "$bench")" | grep -v grep > "$out/ps.txt"
pid=$(pgrep -n -f "$(basename "$bench")")
timeout -s KILL 50 "$gdb" -batch -p "$pid" -ex "thread apply all bt 25" > "$out/bt.txt" 2>&1
echo "threads in the dump: $(grep -c '^Thread' "$out/bt.txt")"
pkill -9 -f "$(basename "$bench")"; sleep 1
grep -E "^sweep" "$out/sweep.txt"; rm -f /tmp/hf-stacks.dat
