#!/usr/bin/env bash
# Same-call A/B of two hipfile-bench binaries on one machine: the bundle's and a baseline
# built from an earlier commit (`BASELINE=REV tests/gpu/make-bundle.sh` puts it in
# target/gpu-bundle/bin/hipfile-bench-base), rounds interleaved A, B, A, B so that drift
# of the machine falls on both. Per binary and round: 16 MiB hot reads at 1, 8 and 16
# streams (ASYNC and our SYNC path of the same process), random 4 KiB and 64 KiB reads at
# 8 streams (one submitting thread and a thread per stream), the 4 KiB round trip and
# submit cost. Extra NAME=VALUE arguments go to both (e.g. HIPFILE_STREAM_COPIES=off).
# FILE_SIZE (default 2G) sizes the test file. BASE_ENV / NEW_ENV (space-separated
# NAME=VALUE) go to one side only: one binary against itself under two settings, e.g.
#   BASE_ENV=HIPFILE_CUDA_ENGINE_MEMORY=context ab-binaries.sh target/gpu-bundle/bin/hipfile-bench target/gpu-bundle/bin/hipfile-bench
# Usage:
#   OUT=dir ROUNDS=2 benches/scripts/ab-binaries.sh [BASE-BINARY [NEW-BINARY]] [NAME=VALUE...]
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/hf-ab}; mkdir -p "$out"
base=target/gpu-bundle/bin/hipfile-bench-base
new=target/gpu-bundle/bin/hipfile-bench
[ $# -gt 0 ] && [[ $1 != *=* ]] && { base=$1; shift; }
[ $# -gt 0 ] && [[ $1 != *=* ]] && { new=$1; shift; }
for binary in "$base" "$new"; do
  [ -x "$binary" ] || { echo "no binary $binary (BASELINE=REV tests/gpu/make-bundle.sh)"; exit 2; }
done
export HIPFILE_DEVICE=${HIPFILE_DEVICE:-cuda}
file=/tmp/hf-ab.dat
t0=$(date +%s)
one() {
  local name=$1 binary=$2; shift 2
  local log=$out/$name.txt
  : > "$log"
  env "$@" timeout -s KILL 60 "$binary" --mode read --streams 1,8,16 --io-size 16M --no-baselines \
    --file "$file" --file-size "${FILE_SIZE:-2G}" >> "$log" 2>&1
  env "$@" timeout -s KILL 60 "$binary" --mode randread --io-size 4K,64K --streams 8 --reps 1 \
    --no-baselines --file "$file" --file-size "${FILE_SIZE:-2G}" >> "$log" 2>&1
  env "$@" timeout -s KILL 40 "$binary" --latency --no-baselines --file "$file" --file-size 256M \
    >> "$log" 2>&1
  echo "$name [$(( $(date +%s) - t0 )) s]: $(grep -E '^(READ|RANDREAD) +(ASYNC|ASYNC_MT|SYNC) ' "$log" \
    | awk '{printf "%s/%s/%s=%s ", $2, $3, $4, $5}')"
  grep -E "submit_async \+ stream sync|of which the submit call" "$log" | head -2
}
read -r -a base_env <<< "${BASE_ENV:-}"
read -r -a new_env <<< "${NEW_ENV:-}"
for round in $(seq "${ROUNDS:-2}"); do
  one "base-$round" "$base" "$@" "${base_env[@]}"
  one "new-$round" "$new" "$@" "${new_env[@]}"
done
rm -f "$file"
