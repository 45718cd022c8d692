#!/bin/bash
# #16 levers on the H200, one call: (1) the mmap + cuMemHostRegister probe (can hot reads
# skip the page-cache copy?), (2) writes at 8 streams x 16 MiB with the knobs that change
# how a chunk reaches the file (chunk size; blocking executors, i.e. pwrite from the
# executor thread instead of io_uring), every row with --profile. Usage:
#   OUT=dir BENCH=path/to/hipfile-bench benches/scripts/h200-levers.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
bench=${BENCH:-target/release/hipfile-bench}
out=${OUT:-/tmp/h200-levers}; mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}
echo "=== mmap_register_probe"
gcc -O2 -std=c11 -pthread "$here/../probes/mmap_register_probe.c" -I"$cuda/include" \
  -L"$cuda/lib64/stubs" -lcuda -o /tmp/mmap_register_probe \
  && timeout -s KILL 200 /tmp/mmap_register_probe /tmp/hf-mmreg.dat 2048
rm -f /tmp/hf-mmreg.dat
file=/tmp/hf-levers.dat
w() { local name=$1; shift; echo "=== write $name"; env "$@" timeout -s KILL 120 "$bench" --file "$file" --profile --mode write --io-size 16M --streams 8 --json "$out/write-$name.json" $extra; }
extra="" w default HIPFILE_UNUSED=1
extra="--no-baselines" w chunk4m HIPFILE_CHUNK_KB=4096
extra="--no-baselines" w chunk16m HIPFILE_CHUNK_KB=16384
extra="--no-baselines" w blocking HIPFILE_IO_URING=0
extra="--no-baselines" w default-again HIPFILE_UNUSED=1
rm -f "$file"
