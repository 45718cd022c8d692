#!/bin/bash
# Slots of the engine's device memory (HIPFILE_STREAM_COPIES=all with
# HIPFILE_STREAM_COPY_SLOTS=device) on the H200, in the order of what decides:
# (a) benches/probes/device_slot_probe.c: can a stream of the application's context copy
#     device -> device out of the engine context's memory (bytes, rate), and does a read's
#     copy already queued that way run while another thread's cuStreamCreate waits for
#     the held streams (and the engine's path, as the control, not);
# (b) the lock checks (an application thread creating 200 streams while ops hold 8
#     streams): reads through device slots, through pinned slots, the engine's path;
#     a run past 45 s is a HANG;
# (c) the device-slot test and the other stream-copy tests of async_api on CUDA;
# (d) speed, one binary, one run: 16 MiB hot reads at 1, 8 and 16 streams under off,
#     all (pinned slots), all (device slots), off again, with --profile;
# (e) the never-hang sweep under all + device slots;
# (f) A/B of two builds under all + device slots, interleaved with off (BASE: the other
#     build's hipfile-bench, e.g. target/ab/bench-base carried beside the bundle), two
#     rounds (the admission rule it was written for was removed in the sixteenth session).
# (g) the device slots' cap (HIPFILE_STREAM_COPY_DEVICE_MB, sixteenth session): 16 MiB hot
#     reads at 1, 8 and 16 streams under all + device slots with caps CAPS (default
#     "256 512 1024 2048"), off before and after;
# (h) all + device slots as a default candidate against off, two rounds, one binary: hot
#     reads 16 MiB at 1/8/16 streams and 64 MiB at 1/8, writes 16 MiB at 8, random 4 KiB
#     and 64 KiB reads at 8 streams, the 4 KiB round trip (CANDIDATE: its environment;
#     ROUNDS: how many, default 2).
# (i) ASYNC against our SYNC path at 8 and 16 streams, one variant of the settings per run
#     (VARIANTS: the default, a 128 MiB arena, off, off with a 1 GiB read-ahead budget, and
#     with a 128 MiB arena too), --profile.
# (j) random 4 KiB and 64 KiB reads at 8 streams, baselines on (SYNC, CUFILE_SYNC), --profile,
#     under RANDOM_VARIANTS (default: the unset default and off).
# PROBE_MODES picks (a)'s modes (default "cross lock control"; also free and
# free-create: freeing engine device memory while application streams are held).
# STEPS picks sections (default "a b c d"; e and f are calls of their own). Usage, with
# target/gpu-bundle built (tests/gpu/make-bundle.sh):
#   OUT=dir benches/scripts/h200-device-slots.sh
#   OUT=dir STEPS=e benches/scripts/h200-device-slots.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/hf-device-slots}; mkdir -p "$out"
bundle=target/gpu-bundle
chmod +x "$bundle"/tests/* "$bundle"/bin/*
bench=$bundle/bin/hipfile-bench
cuda=${CUDA_HOME:-/usr/local/cuda}
steps=" ${STEPS:-a b c d} "
t0=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - t0 )) s]"; }
export HIPFILE_DEVICE=cuda
# 16 MiB hot reads at 1, 8 and 16 streams with --profile: hot_reads FILE-TAG BINARY ENV...
# (output in $out/FILE-TAG.txt, one summary line on stdout).
hot_reads() {
  local name=$1 binary=$2; shift 2
  env "$@" timeout -s KILL 60 "$binary" --mode read --streams 1,8,16 --io-size 16M \
    --no-baselines --profile --file /tmp/hf-ds.dat > "$out/$name.txt" 2>&1
  echo "$name (exit $?): $(grep -E '^READ +ASYNC' "$out/$name.txt" | awk '{printf "%s=%s ", $3, $5}')"
}

if [[ $steps == *" a "* ]]; then
  echo "== (a) device slot probe $(elapsed)"
  gcc -std=c11 -O2 -I"$cuda/include" benches/probes/device_slot_probe.c -o /tmp/hf-dsp \
    -L"$cuda/lib64/stubs" -lcuda -lpthread -ldl || echo "probe: build failed"
  for mode in ${PROBE_MODES:-cross lock control}; do
    CUDA_DEVICE_MAX_CONNECTIONS=32 timeout -s KILL 45 /tmp/hf-dsp 16 4 "$mode"
    echo "exit $?"
  done 2>&1 | tee "$out/probe.txt"
fi

if [[ $steps == *" b "* ]]; then
  echo "== (b) lock checks $(elapsed)"
  for test in streams::streams_made_while_reads_copied_from_device_slots_hold_streams \
              streams::streams_made_while_reads_copied_on_their_streams_hold_streams \
              streams::streams_made_while_ops_hold_streams \
              streams::streams_made_while_engine_path_ops_hold_streams; do
    timeout -s KILL 45 "$bundle/tests/async_api" --test-threads=1 --exact "$test" \
      > /tmp/hf-lock.log 2>&1
    rc=$?
    case $rc in 0) verdict=PASS;; 137) verdict=HANG;; *) verdict="FAIL ($rc)";; esac
    echo "$verdict $test"
    [ "$rc" = 0 ] || grep -E "panicked|HANG:|async:" /tmp/hf-lock.log | head -4
  done 2>&1 | tee "$out/lock.txt"
fi

if [[ $steps == *" c "* ]]; then
  echo "== (c) stream-copy tests on CUDA $(elapsed)"
  timeout -s KILL 120 "$bundle/tests/async_api" --test-threads=1 stream_copies \
    > "$out/stream-copies-tests.txt" 2>&1
  echo "exit $?"; grep -E "^test |test result" "$out/stream-copies-tests.txt" | grep -vE "\.\.\. ok$"
fi

if [[ $steps == *" d "* ]]; then
  echo "== (d) hot reads, off / all pinned / all device / off $(elapsed)"
  hot_reads read-off-1 "$bench" HIPFILE_STREAM_COPIES=off
  hot_reads read-all-pinned "$bench" HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=pinned
  hot_reads read-all-device "$bench" HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=device
  hot_reads read-off-2 "$bench" HIPFILE_STREAM_COPIES=off
  rm -f /tmp/hf-ds.dat
fi

if [[ $steps == *" e "* ]]; then
  echo "== (e) sweep under all + device slots $(elapsed)"
  HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=device timeout -s KILL 400 "$bench" \
    --mode sweep --streams 1,4,16,24,32,33,64,128 --io-size 4K,1M,4M,16M --ops-per-stream 4 \
    --case-timeout 30 > "$out/sweep-all-device.txt" 2>&1
  echo "exit $?: $(grep -c PASS "$out/sweep-all-device.txt") PASS"
  grep -E "HANG|FAIL|WRONG" "$out/sweep-all-device.txt" | head
  tail -2 "$out/sweep-all-device.txt"
fi
if [[ $steps == *" f "* ]]; then
  echo "== (f) A/B of device slots: ${BASE:-no BASE given} against the bundle $(elapsed)"
  device=(HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=device)
  for round in 1 2; do
    hot_reads "ab-off-$round" "$bench" HIPFILE_STREAM_COPIES=off
    [ -n "${BASE:-}" ] && hot_reads "ab-base-$round" "$BASE" "${device[@]}"
    hot_reads "ab-new-$round" "$bench" "${device[@]}"
  done
  hot_reads ab-off-3 "$bench" HIPFILE_STREAM_COPIES=off
  rm -f /tmp/hf-ds.dat
fi
if [[ $steps == *" g "* ]]; then
  echo "== (g) device slots' cap $(elapsed)"
  hot_reads cap-off-1 "$bench" HIPFILE_STREAM_COPIES=off
  for cap in ${CAPS:-256 512 1024 2048}; do
    hot_reads "cap-device-$cap" "$bench" HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=device \
      HIPFILE_STREAM_COPY_DEVICE_MB="$cap" HIPFILE_STREAM_COPY_MB="$(( cap > 1024 ? cap : 1024 ))"
  done
  hot_reads cap-off-2 "$bench" HIPFILE_STREAM_COPIES=off
  rm -f /tmp/hf-ds.dat
fi

if [[ $steps == *" i "* ]]; then
  # Whether and why ASYNC 16 MiB reads trail our own SYNC path at 8 and 16 streams (H100,
  # seventeenth session: SYNC led by 1.10x in one run and 1.47x in the next, the SYNC rows
  # themselves 26.7 and 35.9 GiB/s; the fifteenth session's H100: ASYNC 0.89x / 1.23x): the same
  # binary with the settings of each variant (VARIANTS: space-separated variants, each a
  # comma-separated list of NAME=VALUE; the read-ahead budget bounds the engine's path
  # only, so it is tried under off), each with --profile (executors' busy share, staging
  # waits, the round trip's halves).
  echo "== (i) async against sync, variants $(elapsed)"
  for variant in ${VARIANTS:-HIPFILE_LOG=warn HIPFILE_STAGING_MB=128 HIPFILE_STREAM_COPIES=off HIPFILE_STREAM_COPIES=off,HIPFILE_PREFETCH_MB=1024 HIPFILE_STREAM_COPIES=off,HIPFILE_PREFETCH_MB=1024,HIPFILE_STAGING_MB=128}; do
    IFS=, read -r -a settings <<< "$variant"
    # The device tool brings back only plain file names ('=' and ',' are not).
    log="$out/variant-$(tr -c 'A-Za-z0-9_.\n-' '_' <<< "$variant").txt"
    env "${settings[@]}" timeout -s KILL 60 "$bench" --mode read --streams 8,16 --io-size 16M \
      --no-baselines --profile --file /tmp/hf-ds.dat > "$log" 2>&1
    echo "$variant (exit $?): $(grep -E '^READ +(ASYNC|SYNC)' "$log" \
      | awk '{printf "%s/%s=%s ", $2, $3, $5}')"
    grep -E "executors busy" "$log" | head -4
  done
  rm -f /tmp/hf-ds.dat
fi

if [[ $steps == *" j "* ]]; then
  echo "== (j) small random reads, profiled, baselines on $(elapsed)"
  for variant in ${RANDOM_VARIANTS:-HIPFILE_LOG=warn HIPFILE_STREAM_COPIES=off}; do
    IFS=, read -r -a settings <<< "$variant"
    log="$out/random-$(tr -c 'A-Za-z0-9_.\n-' '_' <<< "$variant").txt"
    env "${settings[@]}" timeout -s KILL 90 "$bench" --mode randread --io-size 4K,64K --streams 8 \
      --reps 1 --profile --file /tmp/hf-ds.dat --file-size 1G > "$log" 2>&1
    echo "$variant (exit $?):"; grep -E '^RANDREAD' "$log" | head -12
    grep -E "executors busy|per op" "$log" | head -6
  done
  rm -f /tmp/hf-ds.dat
fi

if [[ $steps == *" h "* ]]; then
  echo "== (h) default candidate (${CANDIDATE:-HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=device}) against off $(elapsed)"
  file=/tmp/hf-cand.dat
  variant() {
    local name=$1; shift
    local log=$out/cand-$name.txt
    : > "$log"
    env "$@" timeout -s KILL 60 "$bench" --mode read --streams 1,8,16 --io-size 16M --no-baselines \
      --file "$file" --file-size 2G >> "$log" 2>&1
    env "$@" timeout -s KILL 60 "$bench" --mode read --streams 1,8 --io-size 64M --reps 2 --no-baselines \
      --file "$file" --file-size 2G >> "$log" 2>&1
    env "$@" timeout -s KILL 60 "$bench" --mode write --streams 8 --io-size 16M --no-baselines \
      --file "$file" --file-size 2G >> "$log" 2>&1
    env "$@" timeout -s KILL 60 "$bench" --mode randread --io-size 4K,64K --streams 8 --reps 1 --no-baselines \
      --file "$file" --file-size 2G >> "$log" 2>&1
    env "$@" timeout -s KILL 40 "$bench" --latency --no-baselines --file "$file" --file-size 256M >> "$log" 2>&1
    echo "$name:"; grep -E "^(READ|WRITE|RANDREAD) +ASYNC|round trip|submit call" "$log" | head -20
  }
  read -r -a candidate <<< "${CANDIDATE:-HIPFILE_STREAM_COPIES=all HIPFILE_STREAM_COPY_SLOTS=device}"
  for round in $(seq "${ROUNDS:-2}"); do
    variant "off-$round" HIPFILE_STREAM_COPIES=off
    variant "cand-$round" "${candidate[@]}"
  done
  rm -f "$file"
fi
echo "== done $(elapsed)"
