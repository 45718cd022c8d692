#!/bin/bash
# Builds what `owed-gpu.sh` runs on the device machine (which has no cargo), on the
# development machine: target/gpu-bundle/bin/hipfile-bench-sym (the release bench, debug
# info stripped, symbols kept for scripts/cpu-samples.py) and target/gpu-bundle/bin/
# device_contract (the device-contract test binary), and the runtime test binaries named
# in TESTS (say TESTS="async_api faults"); with CAPI=1 also the C library, its headers and
# tests/gpu/cuda_async.c (target/gpu-bundle/{lib,include,c}, for the `c-async` step). Then
# carry target/gpu-bundle/bin (and those folders).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/gpu-bundle/bin
mkdir -p "$bin"
cargo build --release --locked -p hipfile-bench
strip --strip-debug -o "$bin/hipfile-bench-sym" target/release/hipfile-bench
contract=$(cargo test --release --locked -p hipfile-runtime --test device_contract --no-run \
  --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
strip --strip-debug -o "$bin/device_contract" "$contract"
for suite in ${TESTS:-}; do
  exe=$(cargo test --release --locked -p hipfile-runtime --test "$suite" --no-run \
    --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
  strip --strip-debug -o "$bin/$suite" "$exe"
done
ls -l "$bin"
if [ "${CAPI:-0}" = 1 ]; then
  cargo build --release --locked -p hipfile-capi
  mkdir -p target/gpu-bundle/lib target/gpu-bundle/include target/gpu-bundle/c
  strip -o target/gpu-bundle/lib/libhipfile.so.0 target/release/libhipfile.so
  ln -sf libhipfile.so.0 target/gpu-bundle/lib/libhipfile.so
  cp capi/include/*.h target/gpu-bundle/include/
  cp tests/gpu/cuda_async.c tests/gpu/gpu_check.h target/gpu-bundle/c/
fi
