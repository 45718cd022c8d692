#!/bin/bash
# The never-hang proof and the Python checks after "every engine host -> device copy
# bounces; caller copies in the primary context while no op is alive" (2026-12-04), in one
# device call of about 8 minutes. Build first: tests/gpu/make-bundle.sh. On the device,
# carrying target/gpu-bundle:  OUT=$OUT benches/scripts/h200-after-bounce-checks.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-after-bounce}; mkdir -p "$OUT"
B=$PWD/target/gpu-bundle; H=$B/bin/hipfile-bench
chmod +x "$H" "$B"/tests/*
export HIPFILE_DEVICE=cuda

echo "== 1. C stream_sweep.c (52 cases) and cuda_async.c through libhipfile.so"
HIPFILE_GPU_SUITES="none" timeout -s KILL 230 tests/gpu/run-gpu-suite.sh "$B" > "$OUT/c-suite.txt" 2>&1
grep -cE " PASS " "$OUT/c-suite.txt" | sed 's/^/sweep lines PASS: /'; grep -E "HANG|FAIL" "$OUT/c-suite.txt" | head; sed -n '/GPU suite summary/,$p' "$OUT/c-suite.txt"

echo "== 2. 4 KiB and 1 MiB async reads and writes at 8..128 streams, fixed and none (the bounced sizes)"
timeout -s KILL 150 "$H" --mode sweep --case-timeout 20 --io-size 4K,1M --streams 8,24,32,33,64,128 \
  --sweep-flags fixed,none --file /tmp/hf-sweep > "$OUT/sweep.txt" 2>&1
echo "rc=$?"; grep -cE "PASS|ok" "$OUT/sweep.txt" | sed 's/^/ok lines: /'; grep -E "HANG|FAIL" "$OUT/sweep.txt" | head

echo "== 3. sync I/O beside held streams (default, and HIPFILE_CUDA_CALLER_COPY=engine)"
for t in sync_io_while_streams_hold_async_ops sync_io_while_the_application_holds_its_streams; do
  timeout -s KILL 60 "$B/tests/async_sweep" --exact "$t" --nocapture > "$OUT/$t.txt" 2>&1; echo "$t: rc=$? $(grep -E 'test result|sync I/O done' "$OUT/$t.txt" | tr '\n' ' ')"
done
HIPFILE_CUDA_CALLER_COPY=engine timeout -s KILL 60 "$B/tests/async_sweep" --exact sync_io_while_the_application_holds_its_streams \
  --nocapture > "$OUT/engine-mode.txt" 2>&1; echo "engine mode: rc=$? $(grep 'test result' "$OUT/engine-mode.txt")"

echo "== 4. Python on CUDA: pytest, then the safetensors loader"
PYTEST_TIMEOUT=120 BENCH_TIMEOUT=150 python/device-checks.sh "$B" "$OUT"
rm -f /tmp/hf-sweep* /tmp/hipfile-bench-checkpoint*
