#!/bin/bash
# Does staging that stays in the CPU caches read faster? Hot 16 MiB reads at 8 and 16
# streams (two rounds, `--profile`), writes at 1 and 8 streams and cold O_DIRECT reads at
# 8 streams, under the default (32 MiB arena per executor, 1 MiB chunks) and under smaller
# arenas and chunks, which reuse the same few staging chunks while they are still in the
# cache. The idea: a hot read is the kernel's copy from the page cache into staging,
# then the device's DMA out of it; into a 448 MiB ring of staging (14 executors × 32 MiB)
# every copy misses the cache. cuFile's compat mode reads through a small per-thread bounce
# buffer and reads 8 threads faster than our executors with less CPU per GiB; the H200
# footprint probe (results/h200-all-profile-2026-12-05/footprint.txt) read 1.37x faster at
# 14 threads through two reused buffers per thread than through a 1 GiB pool. On the 2-core
# development VM one thread's `pread` of 1 MiB from the page cache ran at 14.5 GiB/s into
# a 1 MiB ring, 11.6 into 32 MiB and 10.4 into 448 MiB.
# VARIANTS picks (d: default; s4: HIPFILE_STAGING_MB=4; c256s2: 256 KiB chunks, 2 MiB
# arena; c512s4; c4m: 4 MiB chunks); FILE_SIZE (default 2G). Run with target/gpu-bundle/bin built; results to $OUT.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-locality}; mkdir -p "$OUT"
H=${BENCH:-$PWD/target/gpu-bundle/bin/hipfile-bench}; F=/tmp/hf-locality.dat
export HIPFILE_DEVICE=${HIPFILE_DEVICE:-cuda}
v() { case $1 in d) echo "";; s4) echo HIPFILE_STAGING_MB=4;;
  c256s2) echo "HIPFILE_CHUNK_KB=256 HIPFILE_STAGING_MB=2";;
  c512s4) echo "HIPFILE_CHUNK_KB=512 HIPFILE_STAGING_MB=4";; c4m) echo HIPFILE_CHUNK_KB=4096;; esac; }
rows() { grep -E '^(READ|WRITE) +(ASYNC|SYNC) ' "$1" | awk '{printf "%s/%s/%s=%s(%s) ", $1, $2, $3, $5, $10}'; }
variants=${VARIANTS:-d s4 c256s2}
for round in 1 2; do for x in $variants; do
  env $(v $x) timeout -s KILL 40 $H --mode read --streams 8,16 --io-size 16M --no-baselines \
    --profile --reps 5 --file $F --file-size ${FILE_SIZE:-2G} > $OUT/read-$x-$round.txt 2>&1
  echo "read $x $round: $(rows $OUT/read-$x-$round.txt)"
done; done
for x in $variants; do
  env $(v $x) timeout -s KILL 40 $H --mode write --streams 1,8 --io-size 16M --no-baselines \
    --profile --reps 3 --file $F --file-size ${FILE_SIZE:-2G} > $OUT/write-$x.txt 2>&1
  echo "write $x: $(rows $OUT/write-$x.txt)"
  env $(v $x) timeout -s KILL 40 $H --mode read --cold --direct on --streams 8 --io-size 16M \
    --no-baselines --reps 3 --file $F --file-size ${FILE_SIZE:-2G} > $OUT/cold-$x.txt 2>&1
  echo "cold $x: $(rows $OUT/cold-$x.txt)"
done
