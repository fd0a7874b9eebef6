#!/usr/bin/env bash
# Installs NVIDIA's `ptxas` (the PTX assembler) from PyPI into a virtual environment, so the PTX
# backend's output can be validated on machines without CUDA or a GPU (see docs/backends/ptx.md).
#
# Usage: scripts/install-ptxas.sh [VENV_DIR]
#   VENV_DIR defaults to target/ptxas-venv (under the git-ignored target/ folder).
# Prints the absolute path of the ptxas binary as the last line of stdout; tests/ptx.rs finds it
# there by default, or through QFORGE_PTXAS.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:-target/ptxas-venv}"
PKG="nvidia-cuda-nvcc-cu12==12.9.86"
PYTHON="${PYTHON:-python3}"

command -v "$PYTHON" >/dev/null || { echo "install-ptxas: $PYTHON not found" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$PKG" >&2

PTXAS="$(ls "$VENV"/lib/python*/site-packages/nvidia/cuda_nvcc/bin/ptxas 2>/dev/null | head -n1)"
if [ -z "$PTXAS" ] || [ ! -x "$PTXAS" ]; then
    echo "install-ptxas: ptxas not found under $VENV after installing $PKG" >&2
    exit 1
fi
"$PTXAS" --version >&2
echo "$(cd "$(dirname "$PTXAS")" && pwd)/ptxas"
