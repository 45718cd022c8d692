#!/bin/bash
# Isolation A/B in one run, one binary: default (engine context) vs
# HIPFILE_CUDA_ENGINE_CONTEXT=shared, and the 64 KiB bounce on/off; latency interleaved.
# Run with target/gpu-bundle built (tests/gpu/make-bundle.sh); results go to $OUT.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-ab-out}; mkdir -p "$OUT"
B=$PWD/target/gpu-bundle; H=$B/bin/hipfile-bench; F=/tmp/hf-ab
chmod +x $H
export HIPFILE_DEVICE=cuda
log=$OUT/ab.txt; : > $log
v() { case $1 in
  iso) echo "";; shared) echo "HIPFILE_CUDA_ENGINE_CONTEXT=shared";;
  iso-nobounce) echo "HIPFILE_CUDA_MIN_COPY_BYTES=0";; shared-nobounce) echo "HIPFILE_CUDA_ENGINE_CONTEXT=shared HIPFILE_CUDA_MIN_COPY_BYTES=0";; esac; }
for round in 1 2; do for var in iso shared iso-nobounce shared-nobounce; do
  echo "=== latency round=$round variant=$var" >> $log
  env $(v $var) timeout -s KILL 60 $H --latency --no-baselines --iterations 3000 --file $F --file-size 256M --json $OUT/lat-$var-$round.json >> $log 2>&1
done; done
for var in iso shared iso shared; do
  echo "=== read variant=$var" >> $log
  env $(v $var) timeout -s KILL 120 $H --mode read --streams 1,8,16 --io-size 16M --no-baselines --file $F --file-size 2G >> $log 2>&1
done
for var in iso shared; do
  echo "=== write variant=$var" >> $log
  env $(v $var) timeout -s KILL 120 $H --mode write --streams 8 --io-size 16M --no-baselines --file $F --file-size 2G >> $log 2>&1
done
rm -f $OUT/lat-*-2.json
grep -E "^===|hipfile-rs|of which|GiB/s|^READ|^WRITE" $log | head -150
