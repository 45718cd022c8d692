#!/bin/bash
# Isolation A/B in one run, one binary: the default (engine context, every engine host ->
# device copy through the stream's device scratch, caller-thread copies in the primary
# context while no async op is alive) against HIPFILE_CUDA_CALLER_COPY=engine (iso-engine),
# against the engine copying straight into the application's memory from 64 KiB up
# (iso-64k: HIPFILE_CUDA_MIN_COPY_BYTES=65536, the previous default) and against the
# pre-isolation data path (HIPFILE_CUDA_ENGINE_CONTEXT=shared, no bounce); latency
# interleaved, two rounds. ROUNDS / READS=0 / WRITES=0 shorten it; VARIANTS picks the
# latency variants (also iso-nobounce: HIPFILE_CUDA_MIN_COPY_BYTES=0; iso-engine-staging:
# HIPFILE_CUDA_STAGING_CONTEXT=engine; off: HIPFILE_STREAM_COPIES=off and no reads inside the
# submit call, the engine's own
# copies; pre-isolation: shared-nobounce with stream copies and reads inside the submit
# call off, the data path before #14),
# READ_VARIANTS the read runs, WRITE_VARIANTS the write runs.
# Run with target/gpu-bundle built (tests/gpu/make-bundle.sh); results go to $OUT.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-ab-out}; mkdir -p "$OUT"
B=$PWD/target/gpu-bundle; H=${BENCH:-$B/bin/hipfile-bench}; F=/tmp/hf-ab
chmod +x $H
export HIPFILE_DEVICE=cuda
log=$OUT/ab.txt; : > $log
v() { case $1 in
  iso) echo "";; iso-engine) echo "HIPFILE_CUDA_CALLER_COPY=engine";;
  iso-64k) echo "HIPFILE_CUDA_MIN_COPY_BYTES=65536";;
  iso-nobounce) echo "HIPFILE_CUDA_MIN_COPY_BYTES=0";;
  iso-engine-staging) echo "HIPFILE_CUDA_STAGING_CONTEXT=engine";;
  shared-nobounce) echo "HIPFILE_CUDA_ENGINE_CONTEXT=shared HIPFILE_CUDA_MIN_COPY_BYTES=0";;
  off) echo "HIPFILE_STREAM_COPIES=off HIPFILE_INLINE_READ_KB=0";;
  pre-isolation) echo "HIPFILE_CUDA_ENGINE_CONTEXT=shared HIPFILE_CUDA_MIN_COPY_BYTES=0 HIPFILE_STREAM_COPIES=off HIPFILE_INLINE_READ_KB=0";; esac; }
for round in $(seq 1 ${ROUNDS:-2}); do for var in ${VARIANTS:-iso iso-engine shared-nobounce}; do
  echo "=== latency round=$round variant=$var" >> $log
  env $(v $var) timeout -s KILL 60 $H --latency --no-baselines --iterations 3000 --file $F --file-size 256M --json $OUT/lat-$var-$round.json >> $log 2>&1
done; done
if [ "${READS:-1}" != 0 ]; then for var in ${READ_VARIANTS:-iso shared-nobounce iso shared-nobounce}; do
  echo "=== read variant=$var" >> $log
  env $(v $var) timeout -s KILL 120 $H --mode read --streams 1,8,16 --io-size 16M --no-baselines --file $F --file-size 2G >> $log 2>&1
done; fi
if [ "${WRITES:-1}" != 0 ]; then for var in ${WRITE_VARIANTS:-iso shared-nobounce}; do
  echo "=== write variant=$var" >> $log
  env $(v $var) timeout -s KILL 120 $H --mode write --streams 8 --io-size 16M --no-baselines --file $F --file-size 2G >> $log 2>&1
done; fi
rm -f $OUT/lat-*-2.json
grep -E "^===|hipfile-rs|of which|GiB/s|^READ|^WRITE|^CPU_GPU" $log | head -150
