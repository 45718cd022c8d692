#!/usr/bin/env bash
# Builds the `hipfile` Python package into python/.venv and runs its pytest suite on
# hipfile's in-process cpu device (no GPU needed).
#
#   python/run-tests.sh [pytest args...]
#
# Needs Python >= 3.9 with venv (Debian: apt-get install python3-venv) and a Rust
# toolchain; downloads maturin, pytest, numpy and safetensors from PyPI on first use.
# Exits 0 with a SKIP line only when no Python >= 3.9 exists. Build output goes to
# $CARGO_TARGET_DIR (default: python/target); HIPFILE_PY_RELEASE=1 builds with --release.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

if ! command -v "$python" >/dev/null 2>&1 ||
    ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    echo "SKIP: the hipfile Python tests need Python >= 3.9 ($python not found or older)"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv"; then
        rm -rf "$venv"
        echo "error: '$python -m venv' failed; on Debian/Ubuntu install it with:" >&2
        echo "    apt-get install python3-venv" >&2
        exit 1
    fi
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "maturin>=1.5,<2" pytest numpy safetensors
# A debug build unless HIPFILE_PY_RELEASE=1 (the tests check behaviour, not speed).
release=()
[ "${HIPFILE_PY_RELEASE:-0}" = 1 ] && release=(--release)
(cd "$here" && "$venv/bin/maturin" develop "${release[@]}" --quiet)

cd "$here"
HIPFILE_DEVICE=cpu exec "$venv/bin/python" -m pytest -q tests "$@"
