#!/usr/bin/env bash
# Installs jax with libtpu from PyPI into a virtual environment, for the Mosaic backend's checks:
# libtpu's Mosaic compiler compiles each emitted module for TPU generations on a machine without
# a TPU (`scripts/mosaic_check.py`, `tests/mosaic.rs`, docs/backends/mosaic.md). About 1.3 GB.
#
# Usage: scripts/install-mosaic.sh [VENV_DIR]
#   VENV_DIR defaults to target/mosaic-venv (under the git-ignored target/ folder), where the
#   tests look by default; elsewhere, set QFORGE_MOSAIC_PYTHON to its bin/python.
# Prints the absolute path of the venv's python as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:-target/mosaic-venv}"
# jax[tpu]==0.10.2 pins libtpu 0.0.42.1; the jax and jaxlib of the stablehlo venv.
PKGS=("jax[tpu]==0.10.2" "jaxlib==0.10.2" "libtpu==0.0.42.1" "numpy==2.4.6")
PYTHON="${PYTHON:-python3}"

command -v "$PYTHON" >/dev/null || { echo "install-mosaic: $PYTHON not found" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}" >&2
"$VENV/bin/python" -c "import libtpu, jax; from jax.experimental.mosaic import as_tpu_kernel; print('jax', jax.__version__, 'libtpu', libtpu.__file__)" >&2
echo "$(cd "$VENV/bin" && pwd)/python"
