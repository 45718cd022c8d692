#!/bin/bash
# `HIPFILE_STREAM_COPIES=all` on the H200 in one device call, in order of what matters:
# (1) the lock checks of README "Known limits" (an application thread creating streams
#     while ops copied on their streams hold streams): the five `streams_made_while_*`
#     tests under `all`, each in a process of its own, under the default and 8 hardware
#     queues, two rounds; a run that outlives 38 s is a HANG, and the first two hangs get
#     host stacks from cuda-gdb (`bt-*.txt`) before the kill;
# (1b) the engine's path: tests/gpu/cuda-lock-probe.sh (which copies into application
#     memory wait while a cuStreamCreate is blocked: never run yet) and the engine-path
#     lock test with and without the bounce through the engine's scratch;
# (2) benches/probes/staging_footprint_probe.c: why 16 MiB slot reads ran at 0.63-0.79x
#     the engine's 1 MiB pipeline (footprint of the staging, overlap of read and copy);
# (3) 16 MiB hot reads at 1 and 8 streams with --profile under off, all, and all with
#     pieces of 4 and 1 MiB (HIPFILE_STREAM_COPY_PIECE_MB: the stream copies a piece as
#     soon as it is read, where a 16 MiB slot is read whole before its one copy), and
#     with the least slot cap (16 MiB: nearly every op through its stream's spare slot).
# Worst case about 430 s for (1) and (1b), 550 s for (2) and (3): one device call each
# (STEPS picks the sections, default all four). Usage, with target/gpu-bundle built
# (tests/gpu/make-bundle.sh):
#   OUT=dir STEPS="1 1b" LOCK_BUDGET_S=200 benches/scripts/h200-all-checks.sh
#   OUT=dir STEPS="2 3" benches/scripts/h200-all-checks.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/hf-all-checks}; mkdir -p "$out"
bundle=target/gpu-bundle
chmod +x "$bundle"/tests/* "$bundle"/bin/*
cuda=${CUDA_HOME:-/usr/local/cuda}
gdb=$(command -v cuda-gdb || echo "$cuda/bin/cuda-gdb")
t0=$(date +%s)
steps=" ${STEPS:-1 1b 2 3} "
step() { [[ $steps == *" $1 "* ]]; }

if step 1; then
echo "=== (1) lock checks under HIPFILE_STREAM_COPIES=all" | tee "$out/lock.txt"
tests=(streams::streams_made_while_reads_copied_on_their_streams_hold_streams
       streams::streams_made_while_writes_copied_into_slots_hold_streams
       streams::streams_made_while_long_ops_copied_in_pieces_hold_streams
       streams::streams_made_while_unfixed_long_ops_copied_in_pieces_hold_streams
       streams::streams_made_while_unfixed_ops_copied_on_their_streams_hold_streams
       streams::streams_made_while_ops_through_spare_slots_hold_streams)
stacks=0
for round in 1 2; do
  for variant in "HIPFILE_LOCK_CHECK=default" "CUDA_DEVICE_MAX_CONNECTIONS=8"; do
    for test in "${tests[@]}"; do
      started=$(date +%s); name=${test##*::}
      env "$variant" HIPFILE_DEVICE=cuda "$bundle/tests/async_api" \
        --test-threads=1 --exact "$test" > /tmp/hf-lock.log 2>&1 &
      pid=$!
      while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - started )) -lt 38 ]; do sleep 0.5; done
      if kill -0 $pid 2>/dev/null; then
        if [ $stacks -lt 2 ]; then
          stacks=$((stacks + 1))
          timeout -s KILL 60 "$gdb" -batch -p $pid -ex "thread apply all bt 25" \
            > "$out/bt-$name-$stacks.txt" 2>&1
        fi
        kill -9 $pid; wait $pid 2>/dev/null; verdict=HANG
      else
        wait $pid; rc=$?; [ $rc = 0 ] && verdict=PASS || verdict="FAIL ($rc)"
      fi
      echo "$verdict $name [$variant] round $round $(( $(date +%s) - started )) s" | tee -a "$out/lock.txt"
      if [ "$verdict" != PASS ]; then
        cp /tmp/hf-lock.log "$out/log-$name-$round.txt"
        grep -E "HANG:|stream 0x|async:|panicked|assert" /tmp/hf-lock.log | head -8 | tee -a "$out/lock.txt"
      fi
      [ $(( $(date +%s) - t0 )) -gt "${LOCK_BUDGET_S:-200}" ] && { echo "lock checks: time up" | tee -a "$out/lock.txt"; break 3; }
    done
  done
done

fi

if step 1b; then
echo "=== (1b) the engine's path: which copy into the application's memory waits for a blocked cuStreamCreate" | tee "$out/lock-engine.txt"
# The probe's calls 12 (device -> device from engine memory, the bounce's second copy) and
# 13 (host -> device straight into application memory) have never run; then the engine-path
# test with the bounce (default) and without it (HIPFILE_CUDA_MIN_COPY_BYTES=0).
timeout -s KILL 150 tests/gpu/cuda-lock-probe.sh 2>&1 \
  | grep -E "^===|creator|probe: |after the gate|^exit" | tee -a "$out/lock-engine.txt"
for variant in HIPFILE_LOCK_CHECK=default HIPFILE_CUDA_MIN_COPY_BYTES=0; do
  env "$variant" HIPFILE_DEVICE=cuda timeout -s KILL 40 "$bundle/tests/async_api" --test-threads=1 \
    --exact streams::streams_made_while_ops_hold_streams > /tmp/hf-lock-engine.log 2>&1
  rc=$?; case $rc in 0) verdict=PASS;; 137) verdict=HANG;; *) verdict="FAIL ($rc)";; esac
  echo "$verdict streams_made_while_ops_hold_streams [$variant]" | tee -a "$out/lock-engine.txt"
  [ $rc = 0 ] || grep -E "HANG:|stream 0x" /tmp/hf-lock-engine.log | head -3 | tee -a "$out/lock-engine.txt"
done

fi

if step 2; then
echo "=== (2) staging footprint probe" | tee "$out/footprint.txt"
gcc -O2 -std=c11 -pthread benches/probes/staging_footprint_probe.c -Ibenches/probes \
  -I"$cuda/include" -L"$cuda/lib64/stubs" -lcuda -o /tmp/hf-footprint-probe \
  && timeout -s KILL 150 /tmp/hf-footprint-probe /tmp/hf-footprint.dat "${PROBE_GIB:-4}" \
    2>&1 | tee -a "$out/footprint.txt"
rm -f /tmp/hf-footprint.dat

fi

if step 3; then
echo "=== (3) profiles" | tee "$out/profile.txt"
file=/tmp/hf-all-checks.dat
for variant in off all all-p4 all-p1 all-spare; do
  copies=${variant%%-*}; piece=16; cap=1024
  case $variant in all-p4) piece=4;; all-p1) piece=1;; all-spare) cap=16;; esac
  echo "--- HIPFILE_STREAM_COPIES=$copies HIPFILE_STREAM_COPY_PIECE_MB=$piece HIPFILE_STREAM_COPY_MB=$cap" | tee -a "$out/profile.txt"
  HIPFILE_DEVICE=cuda HIPFILE_STREAM_COPIES=$copies HIPFILE_STREAM_COPY_PIECE_MB=$piece \
    HIPFILE_STREAM_COPY_MB=$cap \
    timeout -s KILL 100 "$bundle/bin/hipfile-bench" \
    --mode read --streams 1,8 --io-size 16M --no-baselines --profile --file "$file" --file-size 2G \
    --json "$out/profile-$variant.json" >> "$out/profile.txt" 2>&1
done
rm -f "$file"
grep -E "^READ|cpu-s/GiB|engine:|prefetched|counters|^---" "$out/profile.txt"
fi
echo "total $(( $(date +%s) - t0 )) s"
