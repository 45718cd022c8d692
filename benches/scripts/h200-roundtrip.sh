#!/bin/bash
# #16: the async path's per-op round trip on the H200 (small random reads, 4 KiB latency)
# with --profile, by poller and executor spin settings. Usage:
#   OUT=dir BENCH=path/to/hipfile-bench benches/scripts/h200-roundtrip.sh [variant...]
# A variant is NAME:ENV=VALUE[,ENV=VALUE], e.g. "off:HIPFILE_STREAM_COPIES=off" (default:
# one run with the environment as it is); LATENCY=0 skips the latency mode.
set -u
bench=${BENCH:-target/release/hipfile-bench}
out=${OUT:-/tmp/h200-roundtrip}; mkdir -p "$out"
file=/tmp/hf-roundtrip.dat
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(default: )
for variant in "${variants[@]}"; do
  name=${variant%%:*}; envs=${variant#*:}
  echo "=== $name ($envs)"
  env ${envs//,/ } timeout -s KILL 90 "$bench" --file "$file" --file-size 1G --profile --no-baselines \
    --mode randread --io-size 4K,64K --streams 8 --reps 1 --json "$out/randread-$name.json" 2>&1 | grep -E "^RANDREAD|round trip|engine:|gate|cpu-s"
  [ "${LATENCY:-1}" = 1 ] || continue
  env ${envs//,/ } timeout -s KILL 60 "$bench" --file "$file" --file-size 1G --latency --no-baselines \
    --json "$out/latency-$name.json" 2>&1 | grep -Ei "p50|submit" | head -8
done
rm -f "$file"
