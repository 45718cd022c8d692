#!/bin/bash
# One binary under several settings, rounds interleaved (variant 1, 2, ..., then again), so
# that the machine's drift falls on every variant alike. Each variant is a set of
# environment assignments; `-` stands for the default. Prints one line per variant and
# round with GiB/s and CPU-s/GiB of every ASYNC and SYNC row, then the means per variant
# and their ratio to the first variant, and keeps every run's output in $OUT.
#
#   VARIANTS='-; HIPFILE_CHUNK_KB=2048; HIPFILE_REQUEST_PARALLELISM=4' \
#   ROUNDS=3 STREAMS=1,8,16 MODES="read write" OUT=/tmp/ab benches/scripts/variants-ab.sh
#
# BENCH: the binary (default target/gpu-bundle/bin/hipfile-bench-sym); FILE_SIZE (2G);
# IO_SIZE (16M); REPS (5 for reads, 3 for writes); EXTRA: more bench flags (--cold
# --direct on, say); LIMIT: seconds per run before it is killed (60).
set -u
cd "$(dirname "$0")/../.." || exit 1
bench=${BENCH:-$PWD/target/gpu-bundle/bin/hipfile-bench-sym}
out=${OUT:-/tmp/hf-variants}; mkdir -p "$out"
file=/tmp/hf-variants.dat
export HIPFILE_DEVICE=${HIPFILE_DEVICE:-cuda}
IFS=';' read -r -a variants <<< "${VARIANTS:--}"
rows() { grep -E '^(READ|WRITE) +(ASYNC|SYNC) ' "$1" | awk '{printf "%s/%s/%s=%s(%s) ", $1, $2, $3, $5, $10}'; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  for index in "${!variants[@]}"; do
    settings=$(echo "${variants[$index]}" | xargs)
    [ "$settings" = "-" ] && settings=""
    line=""
    for mode in ${MODES:-read}; do
      reps=${REPS:-$([ "$mode" = read ] && echo 5 || echo 3)}
      log="$out/v$index-$mode-$round.txt"
      # shellcheck disable=SC2086 # settings and EXTRA are word lists on purpose
      env $settings timeout -s KILL "${LIMIT:-60}" "$bench" --mode "$mode" \
        --streams "${STREAMS:-1,8,16}" --io-size "${IO_SIZE:-16M}" --no-baselines --profile \
        --reps "$reps" --file "$file" --file-size "${FILE_SIZE:-2G}" ${EXTRA:-} > "$log" 2>&1
      line+="$(rows "$log")"
    done
    echo "v$index [${settings:-default}] round $round: $line"
  done
done | tee "$out/summary.txt"
rm -f "$file"
# Means per variant and row, and the ratio to variant 0.
python3 - "$out/summary.txt" <<'EOF'
import collections, re, sys
runs = collections.defaultdict(list)
names = {}
for line in open(sys.argv[1]):
    head = re.match(r"v(\d+) \[(.*)\] round \d+: (.*)", line.strip())
    if not head:
        continue
    index = int(head.group(1))
    names[index] = head.group(2)
    for row, gib, cpu in re.findall(r"(\S+)=([\d.]+)\(([\d.]+)\)", head.group(3)):
        runs[(index, row)].append((float(gib), float(cpu)))
rows = sorted({row for _, row in runs}, key=lambda r: (r.split("/")[0], int(r.split("/")[2]), r.split("/")[1]))
print("means: GiB/s (CPU-s/GiB) ratio to v0")
for index in sorted(names):
    print(f"v{index} = {names[index]}")
for row in rows:
    base = runs.get((0, row))
    base_gib = sum(g for g, _ in base) / len(base) if base else None
    cells = []
    for index in sorted(names):
        got = runs.get((index, row))
        if not got:
            cells.append("-")
            continue
        gib = sum(g for g, _ in got) / len(got)
        cpu = sum(c for _, c in got) / len(got)
        ratio = f" {gib / base_gib:.2f}x" if base_gib else ""
        cells.append(f"{gib:.2f} ({cpu:.3f}){ratio}")
    print(f"{row}: " + " | ".join(cells))
EOF
