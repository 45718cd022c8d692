#!/usr/bin/env bash
# Builds the release test binaries the GPU suite runs and collects them in
# target/gpu-bundle/tests (run on a machine with the Rust toolchain).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/gpu-bundle
rm -rf "$out"; mkdir -p "$out/tests"
suites=(device_contract)
for suite in "${suites[@]}"; do
  exe=$(cargo test --release -p hipfile-runtime --test "$suite" --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
  cp "$exe" "$out/tests/$suite"
done
ls -la "$out/tests"
