#!/bin/bash
# The GPU measurements the open issues still owe, in priority order, in one device call
# under a time budget: each step runs only when the seconds it needs are left, so a call
# cut short keeps what its earlier steps wrote, and the next call names the rest in STEPS.
#
#   TOTAL=560 OUT=$OUT benches/scripts/owed-gpu.sh            # every step that fits
#   TOTAL=560 STEPS="lead hot" OUT=$OUT benches/scripts/owed-gpu.sh
#
# Steps (STEPS, default all; they run in the order of the `step` lines at the end):
#   isolation  #14 item 4 (any GPU, named in steps.txt; the issue asks for an H200, where
#              it last ran on the twenty-third session's binary): the default data path
#              against the one before #14 (scripts/isolation-ab.sh, two rounds of reads
#              and writes, latency).
#   contract   the device-contract suite on CUDA (the caller-thread round trip included).
#   c-async    tests/gpu/cuda_async.c against our libhipfile (needs the bundle built with
#              CAPI=1): case 6 is the twenty-ninth session's check that a small read on a
#              blocking stream waits for the legacy NULL stream (not yet run on a GPU).
#   sweep      #14: the whole never-hang sweep (`--mode sweep --case-timeout 30`, 336 cases:
#              1..256 streams x flags x 4 KiB..16 MiB x reads and writes), the first after
#              the reads inside the submit call (twenty-ninth session) widened to every
#              flag; about 380 s on the H200. The file is benches/results/h200-stream-sweep.txt
#              when it ran on an H200.
#   wtests     the write-pieces tests on CUDA (thirtieth session): held stream and stream
#              order, refused midway (faults), the lock check with writes in pieces, and
#              the earlier write-slot tests, each in a process of its own.
#   wsweep     the never-hang sweep's part that writes in pieces reach (4 and 16 MiB, fixed
#              and mixed flags, 1..256 streams, reads and writes: 88 cases), under
#              HIPFILE_STREAM_WRITE_PIECE_KB as the caller's environment sets it.
#   writes     #16: 16 MiB async writes at 1 / 8 / 16 streams, two rounds: the default (a
#              write copied on its stream whole before its one pwrite: 0.82x cuFile's sync
#              path at 1 stream) against 1 MiB and 4 MiB pieces (thirtieth session,
#              HIPFILE_STREAM_WRITE_PIECE_KB, off: within the noise on an H100, thirty-first session; each piece written
#              while the stream copies the next) and the engine's path
#              (HIPFILE_STREAM_COPIES=off). Run `wtests` and `wsweep` with
#              HIPFILE_STREAM_WRITE_PIECE_KB=1024 in the environment first.
#   batch      #16: `--mode batch` with every baseline, the ASYNC_T row (a submitting
#              thread per stream; not yet run on a GPU) among them, and its targets.
#   lead       #16: 16 MiB hot reads and writes at 1, 8 and 16 streams against CUFILE_SYNC
#              and every baseline in one run, under the default and then under
#              HIPFILE_LOADED_FAN_OUT=off (LEAD_VARIANTS, default "default off"), with
#              `hipfile-bench targets` of each.
#   hot        #16: where the CPU of 16 MiB hot reads at 8 async streams goes under the
#              default (HIPFILE_BENCH_CPU_SAMPLES; count with scripts/cpu-samples.py here):
#              0.34 CPU-s/GiB against cuFile's 0.32 on an H100, twenty-eighth session.
#   levers     #16: under the new default, what else moves 8- and 16-stream hot reads,
#              where the executors wait on their copies for half to two thirds of job time
#              (twenty-eighth session): fewer copies in flight per executor
#              (HIPFILE_QUEUE_DEPTH=2), 2 MiB chunks, 4 parts under load; two rounds.
#   latency    #16: where the CPU of 4 KiB round trips goes (HIPFILE_BENCH_CPU_SAMPLES,
#              100000 of them).
#   cold       #16: where the CPU of cold O_DIRECT reads at 8 streams goes
#              (HIPFILE_BENCH_CPU_SAMPLES).
#   ctxprobe   #14 item 4: benches/probes/context_switch_probe.c (host -> device copies in
#              a context of their own, or in the primary one, while 0 / 8 / 16
#              primary-context streams are held on wait-values; about 15 s).
#   gap        #14 item 4's remaining gap (thirty-second session, H200: 16 MiB hot reads
#              at 8 / 16 streams 0.91 / 0.90x the data path before #14), taken apart in
#              one run, two rounds of: the default; device slots capped at 4 GiB instead of
#              1 (half the reads of that run shared their stream's slot); the engine's
#              path in the engine context (HIPFILE_STREAM_COPIES=off, no slots); the data
#              path before #14 (shared context, no bounce, no slots).
#   unfixed    #14 (thirty-third session, not yet run on a GPU): ops over 16 MiB on streams
#              that fix no device range go in pieces copied on their stream instead of the
#              engine's path. The tests that cover it on CUDA, each in a process of its own
#              (the lock check with an application thread making streams, which the
#              engine's path failed; moved and shrunk ops; unfixed reads and writes through
#              spares), then 64 MiB hot writes (UNFIXED_MODES="read write" for reads
#              too, measured in the thirty-third session) with flags 0 at 1 / 8 streams,
#              two rounds: the default (since the thirty-fourth session a piece's copy
#              runs while the piece before it is written) against
#              HIPFILE_STREAM_COPIES=off (the engine's path, which these ops took before).
#   cold1      #16: cold O_DIRECT reads from one stream spend 0.68 CPU-s/GiB against
#              cuFile's 0.13 (thirty-second session, H200): --profile (CPU per thread
#              group, the engine's phases) and CPU samples of that row.
#   fence      #16: glommio's membarrier(PRIVATE_EXPEDITED) on every executor sleep (an
#              IPI to every CPU running a thread of the process) against SeqCst fences,
#              with target/gpu-bundle/bin/hipfile-bench-fence (scripts/glommio-fence-bench.sh,
#              GLOMMIO_BARRIER_FENCE=1): cold O_DIRECT reads at 1 / 8 streams and hot reads
#              at 8 / 16, two rounds (thirty-fourth session; 10-25 % less CPU per GiB on
#              the 2-core development VM).
#   coldfan    #16: the same cold O_DIRECT reads at 1 and 8 streams with a request in 14
#              (default), 4 or 2 parts (HIPFILE_REQUEST_PARALLELISM), two rounds: on the
#              development VM fewer parts cost less CPU per GiB (0.91 / 0.70 / 0.60 at 1
#              stream with 14 executors), but its disk was too noisy to tell the speed; if
#              a GPU machine keeps the speed, O_DIRECT requests could go in fewer parts.
# Done, results in benches/results/h100-2026-12-07-b/ (twenty-eighth session): the
# HIPFILE_CALLER_THREAD and HIPFILE_PARK_SPIN_US A/Bs; in h100-2026-12-07-c/ (twenty-ninth):
# lead (default), hot, levers, latency, cold, isolation; in h100-2026-12-07-d/ (thirty-first):
# contract, c-async, wtests, wsweep (1 MiB pieces), writes, batch, lead (default); in
# h200-2026-12-07-e/ (thirty-second, the H200): isolation and sweep; in h100-2026-12-07-f/
# (thirty-third) the tests of unfixed long ops and their reads A/B. Next, on any GPU
# (the thirty-fourth session got no machine in fourteen tries):
# `STEPS="ctxprobe unfixed fence gap cold1"` (about 450 s), then `STEPS="sweep contract"`
# (the never-hang sweep has not run since the thirty-second session; the contract suite's
# temp files were made unique in the thirty-fourth), then `STEPS="lead coldfan"` (on an
# H200 `lead` renews the twenty-third session's H200 report).
#
# Needs target/gpu-bundle/bin/hipfile-bench-sym (the bench, debug info stripped, symbols
# kept) and, for `contract`, target/gpu-bundle/bin/device_contract, both built here by
# scripts/owed-gpu-bundle.sh, and for `fence` target/gpu-bundle/bin/hipfile-bench-fence
# (scripts/glommio-fence-bench.sh, after it); carry that folder.
# Prints one line per step: ran, skipped (why) or failed (exit code).
set -u
cd "$(dirname "$0")/../.." || exit 1
# The device machine hands back at most 8 files from $OUT: the steps write into a folder
# of their own, packed into $OUT/owed.tgz after every step (so a call cut short keeps what
# its finished steps wrote); steps.txt is copied beside it.
dest=${OUT:-/tmp/hf-owed}; mkdir -p "$dest"
out=$(mktemp -d /tmp/hf-owed-out.XXXXXX)
pack() { tar czf "$dest/owed.tgz" -C "$out" . && cp "$out/steps.txt" "$dest/"; }
bin=$PWD/target/gpu-bundle/bin
bench=$bin/hipfile-bench-sym
total=${TOTAL:-560}
start=$(date +%s)
left() { echo $((total - ($(date +%s) - start))); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${gpu:-none}; budget ${total} s; results in $out" | tee "$out/steps.txt"
# Whether the executors' staging arenas (allocated by glommio, pinned at executor start)
# can be huge pages: on the development VM a pread out of the page cache into a THP
# buffer moved 7-14 % more per core than into 4 KiB pages (README, 27th session).
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)" | tee -a "$out/steps.txt"
wanted() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
# step NAME SECONDS FUNCTION: runs FUNCTION (killed after what is left) when wanted and
# SECONDS are left.
step() {
  local name=$1 need=$2; shift 2
  wanted "$name" || return 0
  if [ "$(left)" -lt "$need" ]; then
    echo "$name: skipped ($(left) s left, needs $need)" | tee -a "$out/steps.txt"
    return 0
  fi
  local began=$(date +%s)
  timeout -s KILL "$(left)" bash -c "$*"
  local rc=$?
  local took=$(($(date +%s) - began))
  if [ $rc -eq 0 ]; then
    echo "$name: ran in $took s" | tee -a "$out/steps.txt"
  else
    echo "$name: failed (exit $rc) after $took s" | tee -a "$out/steps.txt"
  fi
  pack
}

isolation() {
  BENCH=$bench OUT=$out/isolation VARIANTS="iso pre-isolation" \
    READ_VARIANTS="iso pre-isolation iso pre-isolation" \
    WRITE_VARIANTS="iso pre-isolation iso pre-isolation" benches/scripts/isolation-ab.sh
}
contract() {
  HIPFILE_DEVICE=cuda "$bin/device_contract" --test-threads 1 > "$out/device_contract.txt" 2>&1
  local rc=$?
  tail -3 "$out/device_contract.txt"
  return $rc
}
c_async() {
  local bundle=$PWD/target/gpu-bundle cuda=${CUDA_HOME:-/usr/local/cuda}
  gcc -std=c11 -Wall -Wextra -I"$bundle/include" -I"$cuda/include" "$bundle/c/cuda_async.c" \
    -L"$bundle/lib" -lhipfile -L"$cuda/lib64" -lcudart -lcuda -o /tmp/hf-cuda-async \
    && HIPFILE_DEVICE=cuda LD_LIBRARY_PATH="$bundle/lib:$cuda/lib64" timeout -s KILL 60 \
      /tmp/hf-cuda-async > "$out/cuda_async.txt" 2>&1
  local rc=$?
  tail -3 "$out/cuda_async.txt"
  return $rc
}
# run_sweep NAME SECONDS [BENCH ARGS...]: the bench's sweep mode into $out/NAME.txt; prints
# the cases that did not pass and the summary.
run_sweep() {
  local name=$1 limit=$2; shift 2
  HIPFILE_DEVICE=cuda timeout -s KILL "$limit" "$bench" --mode sweep --case-timeout 30 "$@" \
    --file "/tmp/hf-owed-$name.dat" > "$out/$name.txt" 2>&1
  local rc=$?
  rm -f "/tmp/hf-owed-$name.dat"
  grep -E "HANG|FAIL|WRONG" "$out/$name.txt" | grep -v "^sweep: " | head
  tail -2 "$out/$name.txt"
  return $rc
}
sweep() {
  run_sweep sweep 470
}
wsweep() {
  run_sweep wsweep 300 --io-size 4M,16M --sweep-flags fixed,mixed \
    --streams "${WSWEEP_STREAMS:-1,2,8,16,24,28,32,33,64,128,256}"
}
# each_test NAME SUITE:TEST...: every test on CUDA in a process of its own (60 s each),
# into $out/NAME-TEST.txt; PASS or FAIL per test; fails when any did.
each_test() {
  local name=$1 t rc=0 bin_dir=$PWD/target/gpu-bundle/bin
  shift
  for t in "$@"; do
    HIPFILE_DEVICE=cuda timeout -s KILL 60 "$bin_dir/${t%%:*}" --test-threads 1 --exact "${t#*:}" \
      > "$out/$name-${t##*::}.txt" 2>&1
    local r=$?
    echo "${t#*:}: $([ $r = 0 ] && echo PASS || echo "FAIL ($r)")"
    [ $r = 0 ] || rc=1
  done
  return $rc
}
wtests() {
  each_test wtest \
    async_api:stream_copies::with_all_long_fixed_writes_go_in_pieces_written_once_their_stream_copied_them \
    async_api:stream_copies::writes_with_a_late_file_offset_or_pieces_off_go_whole \
    async_api:stream_copies::with_all_page_cache_writes_go_straight_from_the_slot \
    async_api:streams::streams_made_while_writes_in_pieces_hold_streams \
    async_api:streams::streams_made_while_writes_copied_into_slots_hold_streams \
    faults:a_write_in_pieces_refused_midway_leaves_its_stream_working
}
writes() {
  BENCH=$bench OUT=$out/writes STREAMS=1,8,16 ROUNDS=2 MODES=write \
    VARIANTS="${PIECE_VARIANTS:--; HIPFILE_STREAM_WRITE_PIECE_KB=1024; HIPFILE_STREAM_WRITE_PIECE_KB=4096; HIPFILE_STREAM_COPIES=off}" \
    benches/scripts/variants-ab.sh | tail -8
}
batch() {
  HIPFILE_DEVICE=cuda timeout -s KILL 150 "$bench" --mode batch --io-size 4K,64K \
    --file /tmp/hf-owed-batch.dat --file-size 1G --json "$out/batch.json" > "$out/batch.txt" 2>&1
  local rc=$?
  rm -f /tmp/hf-owed-batch.dat
  grep -E "^(Path|BATCH|ASYNC|SYNC|CUFILE)" "$out/batch.txt"
  "$bench" targets "$out/batch.json" > "$out/batch-targets.txt" 2>&1
  return $rc
}
lead() {
  local variant rc=0
  for variant in ${LEAD_VARIANTS:-default off}; do
    local settings=""
    [ "$variant" = off ] && settings="HIPFILE_LOADED_FAN_OUT=off"
    # shellcheck disable=SC2086 # settings is a word list on purpose
    env HIPFILE_DEVICE=cuda $settings timeout -s KILL 150 "$bench" --mode read,write \
      --streams 1,8,16 --io-size 16M --reps 3 --file /tmp/hf-owed.dat --file-size 2G \
      --json "$out/lead-$variant.json" > "$out/lead-$variant.txt" 2>&1 || rc=$?
    # The rows to compare: ours (ASYNC, SYNC) against cuFile's sync path, per stream count.
    echo "lead, $variant:"
    grep -E "^(READ|WRITE) +(ASYNC|SYNC|CUFILE_SYNC) " "$out/lead-$variant.txt"
    # #16's goals on this report (ratios within it): met, missed by how much.
    "$bench" targets "$out/lead-$variant.json" > "$out/lead-$variant-targets.txt" 2>&1
    grep -E "MET|MISSED" "$out/lead-$variant-targets.txt" | grep "vs CUFILE_SYNC:"
  done
  rm -f /tmp/hf-owed.dat
  return $rc
}
hot() {
  HIPFILE_DEVICE=cuda HIPFILE_BENCH_CPU_SAMPLES=$out/hot-cpu-samples.txt \
    "$bench" --mode read --streams 8 --io-size 16M --reps 5 --no-baselines --profile \
    --file /tmp/hf-owed-hot.dat --file-size 2G > "$out/hot.txt" 2>&1
  local rc=$?
  rm -f /tmp/hf-owed-hot.dat
  grep -E "^READ|cpu-s/GiB by|engine:" "$out/hot.txt"
  return $rc
}
levers() {
  BENCH=$bench OUT=$out/levers STREAMS=8,16 ROUNDS=2 MODES=read \
    VARIANTS='-; HIPFILE_QUEUE_DEPTH=2; HIPFILE_CHUNK_KB=2048; HIPFILE_LOADED_FAN_OUT=4' \
    benches/scripts/variants-ab.sh
}
latency() {
  # Where a 4 KiB round trip's CPU goes (the submit call on the bench's thread, the arm
  # poller, the executors): many iterations, for enough 10 ms samples.
  HIPFILE_DEVICE=cuda HIPFILE_BENCH_CPU_SAMPLES=$out/latency-cpu-samples.txt \
    "$bench" --latency --no-baselines --iterations 100000 --file /tmp/hf-owed-lat.dat \
    --file-size 256M > "$out/latency.txt" 2>&1
  local rc=$?
  rm -f /tmp/hf-owed-lat.dat
  grep -E "ASYNC|SYNC|submit call" "$out/latency.txt" | head -4
  return $rc
}
# The gap's first hypothesis in isolation (benches/probes/context_switch_probe.c): do host
# -> device copies in a context of their own lose speed while streams of the primary
# context are held on wait-values (the GPU time-slicing between the two contexts)?
ctxprobe() {
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  gcc -O2 -std=c11 benches/probes/context_switch_probe.c -Ibenches/probes -I"$cuda/include" \
    -L"$cuda/lib64/stubs" -lcuda -o /tmp/hf-ctx-probe || return 1
  timeout -s KILL 60 /tmp/hf-ctx-probe --rounds 5 > "$out/context-probe.txt" 2>&1
  local rc=$?
  cat "$out/context-probe.txt"
  return $rc
}
gap() {
  BENCH=$bench OUT=$out/gap STREAMS=8,16 ROUNDS=2 MODES=read \
    VARIANTS='-; HIPFILE_STREAM_COPY_DEVICE_MB=4096; HIPFILE_STREAM_COPIES=off HIPFILE_INLINE_READ_KB=0; HIPFILE_CUDA_ENGINE_CONTEXT=shared HIPFILE_CUDA_MIN_COPY_BYTES=0 HIPFILE_STREAM_COPIES=off HIPFILE_INLINE_READ_KB=0' \
    benches/scripts/variants-ab.sh
}
# Cold O_DIRECT 16 MiB reads from $2 streams, profiled with CPU samples, into $out/$1.txt.
cold_profiled() {
  local name=$1 streams=$2
  HIPFILE_DEVICE=cuda HIPFILE_BENCH_CPU_SAMPLES=$out/$name-cpu-samples.txt \
    "$bench" --mode read --cold --direct on --streams "$streams" --io-size 16M --reps 2 \
    --no-baselines --profile --file /tmp/hf-owed-cold.dat --file-size 2G \
    > "$out/$name.txt" 2>&1
  local rc=$?
  rm -f /tmp/hf-owed-cold.dat
  grep -E "^READ|by thread|engine:" "$out/$name.txt"
  return $rc
}
cold1() {
  cold_profiled cold1 1
}
unfixed() {
  local rc=0
  each_test unfixed \
    async_api:streams::streams_made_while_unfixed_long_ops_copied_in_pieces_hold_streams \
    async_api:stream_copies::with_all_unfixed_long_ops_whose_range_moved_decline_piece_by_piece \
    async_api:stream_copies::with_all_long_reads_are_copied_on_their_stream_in_pieces \
    async_api:stream_copies::with_all_reads_that_find_no_slot_go_through_their_streams_spare \
    async_api:stream_copies::with_all_writes_that_find_no_slot_go_through_their_streams_spare \
    || rc=1
  BENCH=$bench OUT=$out/unfixed STREAMS=1,8 ROUNDS=2 MODES="${UNFIXED_MODES:-write}" IO_SIZE=64M REPS=3 \
    EXTRA="--flags 0" VARIANTS='-; HIPFILE_STREAM_COPIES=off' \
    benches/scripts/variants-ab.sh | tail -8 || rc=1
  return $rc
}
coldfan() {
  BENCH=$bench OUT=$out/coldfan STREAMS=1,8 ROUNDS=2 MODES=read REPS=2 EXTRA="--cold --direct on" \
    VARIANTS='-; HIPFILE_REQUEST_PARALLELISM=4; HIPFILE_REQUEST_PARALLELISM=2' \
    benches/scripts/variants-ab.sh
}
cold() {
  cold_profiled cold 8
}
# glommio's membarrier on every executor sleep against SeqCst fences
# (scripts/glommio-fence-bench.sh): cold O_DIRECT reads at 1 / 8 streams, then hot reads
# at 8 / 16 streams, two rounds each, GiB/s and CPU-s/GiB.
fence() {
  local fenced=$PWD/target/gpu-bundle/bin/hipfile-bench-fence rc=0
  BENCH=$fenced OUT=$out/fence-cold STREAMS=1,8 ROUNDS=2 MODES=read REPS=2 \
    EXTRA="--cold --direct on" VARIANTS='-; GLOMMIO_BARRIER_FENCE=1' \
    benches/scripts/variants-ab.sh | tail -8 || rc=1
  BENCH=$fenced OUT=$out/fence-hot STREAMS=8,16 ROUNDS=2 MODES=read REPS=3 \
    VARIANTS='-; GLOMMIO_BARRIER_FENCE=1' benches/scripts/variants-ab.sh | tail -8 || rc=1
  return $rc
}

# `timeout` runs each step in a shell of its own.
export out bin bench LEAD_VARIANTS WSWEEP_STREAMS PIECE_VARIANTS UNFIXED_MODES
export -f isolation contract c_async run_sweep sweep wsweep each_test wtests writes batch lead hot levers latency cold_profiled cold gap unfixed cold1 coldfan fence ctxprobe

# Before and after on one machine in one run: the card is named in steps.txt (the issue
# asks for an H200; an H100 of the same run is as good a same-machine comparison).
if [ -n "$gpu" ]; then
  step isolation 300 isolation
else
  wanted isolation && echo "isolation: skipped (no GPU)" | tee -a "$out/steps.txt"
fi
[ -x "$bin/device_contract" ] && step contract 60 contract
[ -f target/gpu-bundle/c/cuda_async.c ] && step c-async 70 c_async
step wtests 120 wtests
step wsweep 150 wsweep
step writes 200 writes
step sweep 400 sweep
step batch 150 batch
step lead 200 lead
step hot 40 hot
step levers 100 levers
step latency 40 latency
step cold 60 cold
step ctxprobe 30 ctxprobe
step unfixed 120 unfixed
[ -x target/gpu-bundle/bin/hipfile-bench-fence ] && step fence 100 fence
step gap 150 gap
step cold1 60 cold1
step coldfan 150 coldfan
echo "done after $(($(date +%s) - start)) s" | tee -a "$out/steps.txt"
pack
