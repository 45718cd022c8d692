#!/usr/bin/env bash
# The Python package on a GPU machine without a Rust toolchain (the device machine):
# installs the wheel of a GPU bundle (tests/gpu/make-bundle.sh puts it in
# BUNDLE/python), runs the pytest suite with HIPFILE_DEVICE=cuda, then the safetensors
# loader benchmark (python/bench_safetensors.py; skipped with BENCH_GIB=0).
#
#   python/device-checks.sh BUNDLE OUT
#
# Results: OUT/pytest-cuda.txt and OUT/safetensors.txt, and a summary on stdout. Both run
# from outside python/, where the source folder would shadow the installed package.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle=$1 out=$2
mkdir -p "$out"
wheel=$(ls "$bundle"/python/hipfile-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "SKIP: no wheel in $bundle/python"
  exit 0
fi
site=$(mktemp -d /tmp/hf-site.XXXXXX)
python3 -m pip install -q --no-index --no-deps --target "$site" "$wheel" || exit 1
export PYTHONPATH=$site HIPFILE_DEVICE=${HIPFILE_DEVICE:-cuda}
(cd /tmp && timeout -s KILL "${PYTEST_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider \
  "$here/tests" > "$out/pytest-cuda.txt" 2>&1)
echo "pytest rc=$?: $(tail -1 "$out/pytest-cuda.txt")"
if [ "${BENCH_GIB:-4}" != 0 ]; then
  cp "$here/bench_safetensors.py" "$site/bench_safetensors.py"
  (cd /tmp && timeout -s KILL "${BENCH_TIMEOUT:-240}" python3 "$site/bench_safetensors.py" \
    --gib "${BENCH_GIB:-4}" --reps 3 > "$out/safetensors.txt" 2>&1)
  echo "safetensors bench rc=$?"
  cat "$out/safetensors.txt"
fi
rm -rf "$site" /tmp/hipfile-bench-checkpoint*
