#!/usr/bin/env bash
# Finds which thread spins when a test binary, run whole in one process, hangs.
#
#   tests/gpu/hang-probe.sh BINARY TEST GRACE_S [ARGS...]
#
# Runs target/gpu-bundle/tests/BINARY --test-threads=1 --nocapture ARGS... with
# HIPFILE_DEVICE=cuda; GRACE_S seconds after libtest starts TEST ("test TEST ..."), if the
# process is still there, writes for every thread its name, state, CPU time now and 3 s
# later, its kernel wait channel and kernel stack (and backtraces from gdb, or cuda-gdb,
# where installed), then kills it. TEST "-" means any test: the dump is taken when the
# run's output has not grown for GRACE_S seconds (no test finished or started). Output
# under $OUT (or /tmp/hang-probe): BINARY.log (the run), BINARY.threads.txt (the dump). The thread whose CPU time grows is the spinner:
# the test's own thread or an unnamed helper (run_guarded) in a CUDA call = a blocking
# CUDA wait (stream sync, cuMemFreeHost); hipfile-io-N = an executor loop; hipfile-arm =
# the arm poller.
set -uo pipefail
cd "$(dirname "$0")/../.."
binary=$1 test=$2 grace=$3; shift 3
out=${OUT:-/tmp/hang-probe}; mkdir -p "$out"
log=$out/$binary.log dump=$out/$binary.threads.txt
HIPFILE_DEVICE=${HIPFILE_DEVICE:-cuda} target/gpu-bundle/tests/"$binary" --test-threads=1 \
  --nocapture "$@" >"$log" 2>&1 &
pid=$!
seen=0 size=-1
while kill -0 "$pid" 2>/dev/null; do
  if [ "$test" = - ]; then
    now=$(stat -c %s "$log")
    if [ "$now" != "$size" ]; then size=$now seen=$(date +%s); fi
  elif [ "$seen" = 0 ] && grep -q -- "test $test " "$log"; then seen=$(date +%s); fi
  if [ "$seen" != 0 ] && [ $(( $(date +%s) - seen )) -ge "$grace" ]; then
    echo "HUNG: $(grep -o '^test [^ ]*' "$log" | tail -1) still running after $grace s" | tee "$dump"
    threads() { for t in /proc/"$pid"/task/*; do
      echo "$(basename "$t") [$(cat "$t"/comm)] state $(awk '{print $3}' "$t"/stat) utime $(awk '{print $14}' "$t"/stat) wchan $(cat "$t"/wchan 2>/dev/null)"
    done; }
    threads >>"$dump"; sleep 3; echo "--- 3 s later" >>"$dump"; threads >>"$dump"
    for t in /proc/"$pid"/task/*; do
      echo "--- kernel stack of $(basename "$t") [$(cat "$t"/comm)]"; cat "$t"/stack 2>/dev/null
    done >>"$dump"
    # gdb, else cuda-gdb (the GPU machine has only the latter; it attaches for host stacks).
    debugger=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
    if [ -n "$debugger" ]; then
      timeout 90 "$debugger" -batch -p "$pid" -ex "set pagination off" -ex "info threads" \
        -ex "thread apply all bt 25" >>"$dump" 2>&1
    fi
    kill -9 "$pid"; wait "$pid" 2>/dev/null
    exit 1
  fi
  sleep 1
done
wait "$pid"; rc=$?
echo "exit $rc (no hang)" | tee "$dump"
exit "$rc"
