#!/bin/bash
# Builds what `owed-gpu.sh` runs on the device machine (which has no cargo), on the
# development machine: target/gpu-bundle/bin/hipfile-bench-sym (the release bench, debug
# info stripped, symbols kept for scripts/cpu-samples.py) and target/gpu-bundle/bin/
# device_contract (the device-contract test binary), and the runtime test binaries named
# in TESTS (say TESTS="async_api faults"). Then carry target/gpu-bundle/bin.
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
