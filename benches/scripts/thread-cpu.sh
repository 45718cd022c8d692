#!/bin/bash
# Per-thread CPU time of a hipfile-bench run, sampled near its end: shows whether io_uring
# punts the engine's reads to io-wq workers (`iou-wrk-*` threads with CPU time) or the
# executors (`hipfile-io-*`) complete them inline. Usage:
#   benches/scripts/thread-cpu.sh [seconds-before-sampling] -- hipfile-bench ARGS...
# e.g. (cpu device, 2026-12-04, kernel 6.18: iou-wrk threads exist but used 0 ticks):
#   HIPFILE_DEVICE=cpu benches/scripts/thread-cpu.sh 9 -- target/release/hipfile-bench \
#     --mode read --streams 2 --io-size 16M --no-baselines --reps 8 --file /tmp/f --file-size 512M
wait_s=${1:-5}; shift; [ "$1" = "--" ] && shift
"$@" > /tmp/thread-cpu-run.txt 2>&1 &
pid=$!
sleep "$wait_s"
echo "# clock ticks (utime+stime) per thread of pid $pid after ${wait_s} s ($(getconf CLK_TCK) per second)"
for t in /proc/$pid/task/*; do
  echo "$(cat "$t/comm" 2>/dev/null) $(awk '{print $14+$15}' "$t/stat" 2>/dev/null)"
done | awk 'NF == 2 { sum[$1] += $2; n[$1]++ } END { for (k in sum) printf "%-20s %3d thread(s) %6d ticks\n", k, n[k], sum[k] }' | sort -k4 -n -r
wait $pid
grep -E "^(READ|WRITE) " /tmp/thread-cpu-run.txt
