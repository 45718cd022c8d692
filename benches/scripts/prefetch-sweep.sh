#!/usr/bin/env bash
# Sweeps HIPFILE_PREFETCH_MB (default, 64 MiB, off) x executors (8, 16) for 16 MiB async
# reads on 1 and 8 streams, hot page cache, with a hipfile-bench binary (for a GPU machine:
# tests/gpu/make-bundle.sh puts one in target/gpu-bundle/bin). Prints the ASYNC rows.
#   benches/scripts/prefetch-sweep.sh [path/to/hipfile-bench] [test file]
set -uo pipefail
bench=${1:-target/gpu-bundle/bin/hipfile-bench}
file=${2:-${TMPDIR:-/tmp}/hipfile-prefetch-sweep.dat}
run() {
  echo "## $*"
  env "$@" "$bench" --mode read --streams 1,8 --file-size 4G --reps 2 --no-baselines \
    --file "$file" 2>&1 | grep -E "^READ +ASYNC|^config"
}
for threads in 8 16; do
  run HIPFILE_THREADS=$threads
  run HIPFILE_THREADS=$threads HIPFILE_PREFETCH_MB=64
  run HIPFILE_THREADS=$threads HIPFILE_PREFETCH_MB=0
done
rm -f "$file"
