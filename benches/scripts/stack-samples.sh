#!/bin/bash
# Thread stacks of a running hipfile-bench through cuda-gdb (the GPU machines have no gdb
# or perf): the bench reads in a loop while cuda-gdb attaches SAMPLES times and dumps
# every thread's stack; the summary counts, per thread kind (executors, arm poller,
# bench), the innermost frames that are ours or a library's. Not a profile on CUDA: the
# first attach loads the CUDA debugger backend into the process, whose lock every CUDA
# call then takes (benches/README); for where CPU time goes use HIPFILE_BENCH_CPU_SAMPLES. BENCH: a hipfile-bench with its symbol table (strip --strip-debug, not strip);
# ARGS: the bench's arguments (default: 16 MiB hot reads on 8 streams, unverified, for
# about a minute); ENV_VARS: settings for the run. Usage:
#   OUT=dir BENCH=target/gpu-bundle/bin/hipfile-bench-sym benches/scripts/stack-samples.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/hf-stack-samples}; mkdir -p "$out"
bench=${BENCH:-target/gpu-bundle/bin/hipfile-bench-sym}; chmod +x "$bench"
gdb=$(command -v cuda-gdb || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuda-gdb")
args=${ARGS:---mode read --streams 8 --io-size 16M --no-baselines --no-verify --reps 1000}
# shellcheck disable=SC2086 # ENV_VARS and ARGS are word lists on purpose
env ${ENV_VARS:-} timeout -s KILL "${RUN_LIMIT:-150}" "$bench" $args --file /tmp/hf-samples.dat \
  > "$out/bench.txt" 2>&1 &
runner=$!
# The file is written first (2 GiB, a few seconds), then the reads start.
sleep "${WARMUP_S:-15}"
pid=$(pgrep -n -f "$(basename "$bench") ")
for sample in $(seq 1 "${SAMPLES:-12}"); do
  timeout -s KILL 30 "$gdb" -batch -p "$pid" -ex "thread apply all bt 16" \
    > "$out/bt-$sample.txt" 2>&1
  sleep "${GAP_S:-1}"
done
kill -9 "$runner" 2>/dev/null; pkill -9 -f "$(basename "$bench") "; rm -f /tmp/hf-samples.dat
# Per thread, the first frame (innermost) in a named function, grouped by thread name.
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import collections, glob, re, sys
counts = collections.defaultdict(collections.Counter)
threads = collections.Counter()
for path in glob.glob(sys.argv[1] + "/bt-*.txt"):
    name, frames = None, []
    def flush():
        if name is not None:
            kind = re.sub(r"\d+", "N", name)
            threads[kind] += 1
            top = frames[0] if frames else "?"
            counts[kind][top] += 1
            # The first frame of our code, for where in the engine the thread was.
            ours = next((f for f in frames if "hipfile" in f or "glommio" in f), None)
            if ours and ours != top:
                counts[kind]["  (in ours) " + ours] += 1
    for line in open(path, errors="replace"):
        m = re.match(r'Thread \S+ \(Thread 0x[0-9a-f]+ \(LWP \d+\) "([^"]*)"\)', line)
        if m:
            flush(); name, frames = m.group(1), []
            continue
        m = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)", line)
        if m and name is not None:
            frames.append(re.sub(r"::h[0-9a-f]{16}$", "", m.group(1))[:110])
    flush()
for kind, n in threads.most_common():
    print(f"== {kind}: {n} thread samples")
    for frame, c in counts[kind].most_common(14):
        print(f"  {c:5d}  {frame}")
EOF
grep -E "^READ|^WRITE" "$out/bench.txt" | head -4
