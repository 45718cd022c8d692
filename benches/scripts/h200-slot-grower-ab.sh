#!/bin/bash
# The slot grower (thirteenth session) on the H200, one device call: `all` before and after
# against the engine path (`off`), same machine, same run, interleaved
#   before: off all   after: all off   (benches/scripts/h200-stream-copies-all.sh each,
#   BENCH=target/ab/bench-before for the first), then
# 16 MiB reads at 1/8/16 streams under `all` with --profile (submit call p50/p99, the round
# trip, the threads), the lock checks of step 1 of h200-all-checks.sh (one round), and a
# short stream sweep under `all` (mixed flags x 24, 28, 32, 33, 64 streams x 4 KiB, 16 MiB).
# Usage, with target/gpu-bundle built and the earlier bench copied to target/ab/bench-before:
#   OUT=dir benches/scripts/h200-slot-grower-ab.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/hf-grower}; mkdir -p "$out"
chmod +x target/ab/* target/gpu-bundle/bin/* target/gpu-bundle/tests/*
new=target/gpu-bundle/bin/hipfile-bench
t0=$(date +%s)
summary() { # the ASYNC rows and submit percentiles of a bench JSON
  python3 - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    try: d = json.load(open(path))
    except Exception as e: print(path, "unreadable", e); continue
    for r in d["results"]:
        s = r.get("submit_us") or {}
        rt = (r.get("profile") or {}).get("round_trip")
        print(f'{path.split("/")[-1]:28} {r["io_type"]:8} {r["xfer"]:8} S={r["streams"]:<3} {r["io_size"]>>10:>6} KiB '
              f'{r["gib_per_s"]:7.2f} GiB/s reps {[round(x,1) for x in r.get("rep_gib_per_s", [])]} '
              f'submit p50 {s.get("p50", 0):.1f} avg {s.get("avg", 0):.1f} p99 {s.get("p99", 0):.1f} us'
              + (f' round trip {rt["arm_to_release_us"]:.0f}/{rt["release_to_arm_us"]:.0f} us' if rt else ''))
PY
}
BENCH=target/ab/bench-before VARIANTS="off all" OUT=$out/before timeout -s KILL 150 \
  benches/scripts/h200-stream-copies-all.sh > "$out/before.txt" 2>&1
BENCH=$new VARIANTS="all off" OUT=$out/after timeout -s KILL 150 \
  benches/scripts/h200-stream-copies-all.sh > "$out/after.txt" 2>&1
for side in before after; do
  echo "=== $side"; summary "$out/$side"/*.json; grep -E "submit call" "$out/$side/copies-all.txt"
done | tee "$out/ab-summary.txt"
rm -rf "$out/before" "$out/after"
echo "=== profile, all, after" | tee "$out/profile.txt"
HIPFILE_DEVICE=cuda HIPFILE_STREAM_COPIES=all timeout -s KILL 60 "$new" --mode read --streams 1,8,16 \
  --io-size 16M --no-baselines --profile --file /tmp/hf-grower.dat --file-size 2G \
  --json "$out/profile-all.json" >> "$out/profile.txt" 2>&1
summary "$out/profile-all.json" | tee -a "$out/profile.txt"
grep -E "cpu-s/GiB by thread|engine:" "$out/profile.txt" | head -12
rm -f /tmp/hf-grower.dat
OUT=$out/lock STEPS=1 LOCK_BUDGET_S=${LOCK_BUDGET_S:-90} timeout -s KILL 150 benches/scripts/h200-all-checks.sh \
  > /dev/null 2>&1; grep -cE "^PASS" "$out/lock/lock.txt"; grep -vE "^PASS" "$out/lock/lock.txt"
HIPFILE_DEVICE=cuda HIPFILE_STREAM_COPIES=all timeout -s KILL 120 "$new" --mode sweep --case-timeout 20 \
  --io-size 4K,16M --streams 24,28,32,33,64 --sweep-flags mixed --file /tmp/hf-grower-sweep.dat \
  > "$out/sweep.txt" 2>&1
echo "sweep rc $?: $(grep -cE '\bPASS\b' "$out/sweep.txt") PASS, $(grep -cE '\b(HANG|FAIL|WRONG)\b' "$out/sweep.txt") not"
rm -f /tmp/hf-grower-sweep.dat
echo "total $(( $(date +%s) - t0 )) s"
