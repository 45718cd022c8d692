#!/bin/bash
# #16's same-run report on the H200, one call, one binary: reads at 1, 8 and 16 streams
# and writes at 1, 8 and 16 streams, 16 MiB, every baseline on, --profile, --json
# (kept as benches/results/h200-lead.json); then A/B runs without baselines: buffered
# writes through io_uring (the previous default), read chunk sizes; O_DIRECT writes with
# baselines. Usage: OUT=dir BENCH=path/to/hipfile-bench benches/scripts/h200-lead.sh
set -u
bench=${BENCH:-target/release/hipfile-bench}
out=${OUT:-/tmp/h200-lead}; mkdir -p "$out"
file=/tmp/hf-lead.dat
b() { local name=$1 limit=$2; shift 2; echo "=== $name: $*"; timeout -s KILL "$limit" "$bench" --file "$file" --profile "$@" --json "$out/$name.json"; }
b lead 200 --mode read,write --io-size 16M --streams 1,8,16
env HIPFILE_BUFFERED_WRITES=io_uring bash -c "$(declare -f b); bench=$bench file=$file out=$out; b write-io-uring 60 --mode write --io-size 16M --streams 8,16 --no-baselines"
b write-thread-again 60 --mode write --io-size 16M --streams 8,16 --no-baselines
for kb in 512 256; do
  env HIPFILE_CHUNK_KB=$kb bash -c "$(declare -f b); bench=$bench file=$file out=$out; b read-chunk${kb}k 60 --mode read --io-size 16M --streams 1,8,16 --no-baselines"
done
b read-chunk1m-again 60 --mode read --io-size 16M --streams 1,8,16 --no-baselines
b write-direct 120 --mode write --io-size 16M --streams 8 --direct on
rm -f "$file"
