#!/bin/bash
# Builds, for an A/B only, target/gpu-bundle/bin/hipfile-bench-fence: the release bench
# against a copy of glommio 0.9.0 (from the cargo registry, into target/glommio-fence) in
# which GLOMMIO_BARRIER_FENCE=1 in the environment makes the reactor's memory barriers
# SeqCst fences instead of membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED).
#
# Why: glommio issues that system call every time an executor goes to sleep (its foreign
# wake-up protocol, `sys/uring.rs`: `membarrier::heavy()` before parking), and the kernel
# answers it with an IPI to every CPU that runs a thread of the process. On the
# development VM, 14 executors reading a cold file with O_DIRECT made 4.5 k of these
# calls per GiB, 18 % of the executors' CPU in perf (thirty-fourth session). SeqCst
# fences on both sides (glommio's own fallback where the call is missing) keep the
# protocol correct. Without the variable the binary behaves as the ordinary bench.
#
#   benches/scripts/glommio-fence-bench.sh        # after owed-gpu-bundle.sh
set -eu
cd "$(dirname "$0")/../.."
registry=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/glommio-0.9.0 | head -1)
copy=$PWD/target/glommio-fence
rm -rf "$copy"
cp -r "$registry" "$copy"
python3 - "$copy/src/sys/membarrier.rs" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
old = """    static ref STRATEGY: Strategy = {
        if syscall::is_supported() {"""
new = """    static ref STRATEGY: Strategy = {
        if std::env::var_os("GLOMMIO_BARRIER_FENCE").is_some() {
            Strategy::Fallback
        } else if syscall::is_supported() {"""
assert old in text, "glommio's membarrier.rs is not the one this patch expects"
open(path, "w").write(text.replace(old, new))
EOF
CARGO_TARGET_DIR=$PWD/target/fence cargo build --release -p hipfile-bench \
  --config "patch.crates-io.glommio.path=\"$copy\""
mkdir -p target/gpu-bundle/bin
strip --strip-debug -o target/gpu-bundle/bin/hipfile-bench-fence target/fence/release/hipfile-bench
echo "built target/gpu-bundle/bin/hipfile-bench-fence"
