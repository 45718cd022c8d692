#!/bin/bash
# #16's profile on the H200: every row with `--profile` (CPU per thread group, the
# engine's phases), cuFile and the raw baselines in the same run. Usage:
#   OUT=dir BENCH=path/to/hipfile-bench benches/scripts/h200-profile.sh
set -u
bench=${BENCH:-target/release/hipfile-bench}
out=${OUT:-/tmp/h200-profile}; mkdir -p "$out"
file=${FILE:-/tmp/hf-profile.dat}
run() { local name=$1; shift; echo "=== $name: $*"; timeout -s KILL 240 "$bench" --file "$file" --profile "$@" --json "$out/$name.json"; }
run read-16m --mode read --io-size 16M --streams 1,8,16
run write-16m --mode write --io-size 16M --streams 8
run randread-small --mode randread --io-size 4K,64K --streams 8 --file-size 1G --reps 1
rm -f "$file"
