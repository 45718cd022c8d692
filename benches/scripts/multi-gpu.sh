#!/bin/bash
# Several GPUs in one process (issue #19), one device call of about 8 minutes on a machine
# with 2-8 GPUs: the multi-device tests on every GPU, each GPU loading its own shard at
# once (hot and cold) against one GPU alone and the pinned-copy ceiling, and the
# never-hang sweep with every case's streams spread over all GPUs.
# Build first: tests/gpu/make-bundle.sh; on the device, carrying target/gpu-bundle:
#   OUT=$OUT SHARD=4G benches/scripts/multi-gpu.sh     (output: $OUT/multi-gpu.txt)
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/hf-multi}; mkdir -p "$OUT"
B=$PWD/target/gpu-bundle; H=$B/bin/hipfile-bench
SHARD=${SHARD:-4G}
chmod +x "$H" "$B"/tests/*
export HIPFILE_DEVICE=cuda
{
echo "kernel $(uname -r), $(nproc) CPUs"
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader 2>&1
nvidia-smi topo -m 2>&1 | head -20
echo "== 1. multi-device tests on every GPU (async_api::multi_device, device_contract)"
for t in $("$B/tests/async_api" --list 2>/dev/null | sed -n 's/: test$//p' | grep '^multi_device::'); do
  timeout -s KILL 120 "$B/tests/async_api" --exact "$t" --nocapture 2>&1 | tail -3
done
timeout -s KILL 120 "$B/tests/device_contract" 2>&1 | grep -E "^test result|FAILED|panicked"
echo "== 2. every GPU loads its own $SHARD shard at once (hot, then cold)"
timeout -s KILL 300 "$H" --mode shards --file /tmp/hf-shard --file-size "$SHARD" --reps 3 --cold 2>&1
echo "rc=$?"
rm -f /tmp/hf-shard.gpu*
echo "== 3. the never-hang sweep, streams spread over every GPU"
timeout -s KILL 240 "$H" --mode sweep --spread-devices --streams 8,24,32,33,64,128,256 \
  --io-size 4K,1M --sweep-flags fixed,none,mixed --file /tmp/hf-sweep --case-timeout 60 2>&1 \
  | grep -E "^sweep|HANG|FAIL|WRONG" | tail -60
echo "rc=${PIPESTATUS[0]}"
rm -f /tmp/hf-sweep
} 2>&1 | tee "$OUT/multi-gpu.txt"
