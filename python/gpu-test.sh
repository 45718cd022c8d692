#!/usr/bin/env bash
# Runs the hipfile Python test suite on a CUDA GPU with torch (the same tests as
# run-tests.sh; device memory and streams come from torch there).
#
#   python/gpu-test.sh [pytest args...]
#
# Needs an NVIDIA GPU with its driver, Python >= 3.9 with venv and a Rust toolchain.
# torch is taken from the environment if importable by $PYTHON, else pip-installed into
# python/.venv-gpu (PyPI's default CUDA build).
# On a GPU machine without Rust or network: build the wheel elsewhere
# (`maturin build --release` in python/) and set HIPFILE_WHEEL=path/to/hipfile-*.whl; then
# nothing is downloaded (torch, numpy, safetensors and pytest must be importable).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-gpu"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
if [ -z "${HIPFILE_WHEEL:-}" ]; then
    "$venv/bin/python" -m pip install --quiet "maturin>=1.5,<2" pytest numpy safetensors
    "$venv/bin/python" -c 'import torch' 2>/dev/null || "$venv/bin/python" -m pip install --quiet torch
fi
"$venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "error: torch sees no CUDA GPU" >&2
    exit 1
}
if [ -n "${HIPFILE_WHEEL:-}" ]; then
    "$venv/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall "$HIPFILE_WHEEL"
else
    (cd "$here" && "$venv/bin/maturin" develop --release --quiet)
fi

cd "$here"
HIPFILE_DEVICE=cuda exec "$venv/bin/python" -m pytest -q tests "$@"
