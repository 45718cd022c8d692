#!/usr/bin/env bash
# Builds and runs tests/gpu/cuda_lock_probe.c (which CUDA calls wait while another thread's
# cuStreamCreate waits for streams held on wait-values) in the variants that matter:
# CUDA's default hardware queues and CUDA_DEVICE_MAX_CONNECTIONS=32 (what hipfile-rs sets
# when it starts CUDA), with no idle streams and with 2000 made first. Needs gcc and
# cuda.h (CUDA_HOME, default /usr/local/cuda). Output on stdout.
set -uo pipefail
cd "$(dirname "$0")"
cuda=${CUDA_HOME:-/usr/local/cuda}
gcc -std=c11 -O2 -I"$cuda/include" cuda_lock_probe.c -o /tmp/hf-cuda-lock-probe \
  -L"$cuda/lib64/stubs" -lcuda -lpthread -ldl || exit 1
for connections in default 32; do
  for first in 0 2000; do
    echo "=== CUDA_DEVICE_MAX_CONNECTIONS=$connections, 16 held, $first idle streams first"
    if [ "$connections" = default ]; then
      env -u CUDA_DEVICE_MAX_CONNECTIONS timeout -s KILL 60 /tmp/hf-cuda-lock-probe 16 3000 "$first"
    else
      CUDA_DEVICE_MAX_CONNECTIONS=$connections timeout -s KILL 60 /tmp/hf-cuda-lock-probe 16 3000 "$first"
    fi
    echo "exit $?"
  done
done
# The engine's path of a write copies out of the application's memory: those probes alone
# (in a process where no earlier probe already waits), then device -> host by itself.
for connections in default 32; do
  for probes in 16,17 16; do
    echo "=== CUDA_DEVICE_MAX_CONNECTIONS=$connections, 16 held, probes $probes alone"
    if [ "$connections" = default ]; then
      env -u CUDA_DEVICE_MAX_CONNECTIONS PROBES=$probes timeout -s KILL 60 /tmp/hf-cuda-lock-probe 16 3000 0
    else
      CUDA_DEVICE_MAX_CONNECTIONS=$connections PROBES=$probes timeout -s KILL 60 /tmp/hf-cuda-lock-probe 16 3000 0
    fi
    echo "exit $?"
  done
done
