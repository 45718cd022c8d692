#!/usr/bin/env bash
# Builds the release test binaries the GPU suite runs and collects them in
# target/gpu-bundle/tests (run on a machine with the Rust toolchain).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/gpu-bundle
rm -rf "$out"; mkdir -p "$out/tests"
# The integration test crates of hipfile-runtime (runtime/tests: one per area, plus the
# ones that need a process of their own).
suites=(device_contract async_api sync_api async_sweep async_soak faults stats
        start_anywhere write_short engine engine_overload engine_fallback arm_poller)
for suite in "${suites[@]}"; do
  exe=$(cargo test --release -p hipfile-runtime --test "$suite" --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
  cp "$exe" "$out/tests/$suite"
  # Debug info makes each test binary tens of MiB; the bundle stays small without it.
  # The symbol table stays, so a (cuda-)gdb backtrace of a hung test names our functions.
  strip --strip-debug "$out/tests/$suite"
done
# The C library, our headers and the GPU C program (written against the CUDA runtime:
# Debian's HIP 5.2 NVIDIA-platform headers do not compile against CUDA 13).
cargo build --release -p hipfile-capi >/dev/null
mkdir -p "$out/lib" "$out/include" "$out/c"
cp target/release/libhipfile.so "$out/lib/libhipfile.so.0"
ln -sf libhipfile.so.0 "$out/lib/libhipfile.so"
cp capi/include/*.h "$out/include/"
cp tests/gpu/cuda_async.c tests/gpu/stream_sweep.c tests/gpu/gpu_check.h "$out/c/"
# hipfile-bench, for the measurements.
cargo build --release -p hipfile-bench >/dev/null
mkdir -p "$out/bin" && cp target/release/hipfile-bench "$out/bin/"
# Without debug info the bundle fits the device tool's 64 MiB carry limit.
strip "$out/bin/hipfile-bench" "$out/lib/libhipfile.so.0"
# BASELINE=REV: hipfile-bench as of that commit too, for same-call A/B runs
# (benches/scripts/ab-binaries.sh), built in a worktree of its own.
if [ -n "${BASELINE:-}" ]; then
  base_tree=$(mktemp -d /tmp/hipfile-baseline.XXXXXX)
  git worktree add -q --detach "$base_tree" "$BASELINE"
  CARGO_TARGET_DIR=${BASELINE_TARGET_DIR:-/tmp/hipfile-baseline-target} \
    cargo build --release -p hipfile-bench --manifest-path "$base_tree/Cargo.toml" >/dev/null
  cp "${BASELINE_TARGET_DIR:-/tmp/hipfile-baseline-target}/release/hipfile-bench" "$out/bin/hipfile-bench-base"
  strip "$out/bin/hipfile-bench-base"
  git worktree remove --force "$base_tree"
  echo "baseline: hipfile-bench of $(git rev-parse --short "$BASELINE") in $out/bin/hipfile-bench-base"
fi
# The Python wheel (abi3), when python/run-tests.sh has made python/.venv with maturin.
if [ -x python/.venv/bin/maturin ]; then
  mkdir -p "$out/python"
  (cd python && CARGO_TARGET_DIR="$PWD/../target/python-wheel" .venv/bin/maturin build --release --quiet \
    --out "../$out/python") || echo "warning: the Python wheel was not built"
fi
ls -la "$out/tests" "$out/lib" "$out/bin"
