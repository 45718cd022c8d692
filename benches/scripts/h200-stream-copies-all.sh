#!/bin/bash
# HIPFILE_STREAM_COPIES=all against the default engine path, one binary, one run, the
# variants (VARIANTS, default "off all all-late"; all takes HIPFILE_STREAM_COPY_MB's default,
# 1024 on the H200's 128 GiB: room for 64 ops of 16 MiB in flight; all-1g sets 1024 itself; all-late = all with
# streams registered with flags 5, so that every read is read into its slot when the
# stream reaches it: its file offset binds late; all-p4 = all with long ops in 4 MiB pieces, HIPFILE_STREAM_COPY_PIECE_MB=4;
# all-spare = all with HIPFILE_STREAM_COPY_MB=16, nearly every op through its stream's
# spare slots) interleaved ROUNDS times (default 1): 16 MiB reads at 1/8/16 streams, 16 MiB
# writes at 8 streams, 64 MiB reads at 1/8 streams (pieces), 4 KiB and 64 KiB random reads at 8 streams, the 4 KiB latency;
# every byte verified (the bench's default). The bench registers streams with flags 7
# (fully FIXED) except in all-late, so every op of 16 MiB or less may take a slot; the counters line says
# how many were copied on their streams (an op that finds no free slot, past
# HIPFILE_STREAM_COPY_MB of one size, goes through its stream's spare slot since the
# eleventh session, the engine's path before). Usage, with
# target/gpu-bundle built:
#   OUT=dir benches/scripts/h200-stream-copies-all.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
bench=${BENCH:-target/gpu-bundle/bin/hipfile-bench}; chmod +x "$bench"
out=${OUT:-/tmp/hf-copies-all}; mkdir -p "$out"
file=/tmp/hf-copies-all.dat
export HIPFILE_DEVICE=cuda
log=$out/copies-all.txt; : > "$log"
for round in $(seq 1 "${ROUNDS:-1}"); do
  for variant in ${VARIANTS:-off all all-late}; do
    flags=7
    unset HIPFILE_STREAM_COPY_PIECE_MB
    case $variant in
      all-1g) export HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_MB=1024;;
      all-late) export HIPFILE_STREAM_COPIES=all; unset HIPFILE_STREAM_COPY_MB; flags=5;;
      all-p4) export HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_PIECE_MB=4; unset HIPFILE_STREAM_COPY_MB;;
      all-spare) export HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_MB=16;;
      *) export HIPFILE_STREAM_COPIES=$variant; unset HIPFILE_STREAM_COPY_MB;;
    esac
    echo "=== round=$round $variant (HIPFILE_STREAM_COPIES=$HIPFILE_STREAM_COPIES ${HIPFILE_STREAM_COPY_MB:+HIPFILE_STREAM_COPY_MB=$HIPFILE_STREAM_COPY_MB} ${HIPFILE_STREAM_COPY_PIECE_MB:+HIPFILE_STREAM_COPY_PIECE_MB=$HIPFILE_STREAM_COPY_PIECE_MB})" >> "$log"
    timeout -s KILL 120 "$bench" --mode read --streams 1,8,16 --io-size 16M --no-baselines --flags "$flags" \
      --file "$file" --file-size 2G --json "$out/read-$variant-$round.json" >> "$log" 2>&1
    # Long ops: pieces of 16 MiB sharing a ring of 4 slots under `all` (the engine's path under off).
    timeout -s KILL 90 "$bench" --mode read --streams 1,8 --io-size 64M --reps 2 --no-baselines --flags "$flags" \
      --file "$file" --file-size 2G --json "$out/read64m-$variant-$round.json" >> "$log" 2>&1
    timeout -s KILL 90 "$bench" --mode write --streams 8 --io-size 16M --no-baselines --flags "$flags" \
      --file "$file" --file-size 2G --json "$out/write-$variant-$round.json" >> "$log" 2>&1
    timeout -s KILL 90 "$bench" --mode randread --io-size 4K,64K --streams 8 --reps 1 --no-baselines --flags "$flags" \
      --file "$file" --file-size 2G --json "$out/randread-$variant-$round.json" >> "$log" 2>&1
    timeout -s KILL 60 "$bench" --latency --no-baselines --flags "$flags" --file "$file" --file-size 256M \
      --json "$out/latency-$variant-$round.json" >> "$log" 2>&1
  done
done
rm -f "$file"
grep -E "^===|^READ|^WRITE|^RANDREAD|ASYNC|submit call|counters" "$log"
