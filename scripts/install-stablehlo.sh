#!/usr/bin/env bash
# Installs jax and jaxlib from PyPI into a virtual environment, for the `stablehlo` feature: the
# StableHLO device runs the StableHLO backend's modules with the StableHLO reference interpreter
# of jaxlib's MLIR bindings (CPU only, no accelerator needed; see docs/backends/stablehlo.md).
#
# Usage: scripts/install-stablehlo.sh [VENV_DIR]
#   VENV_DIR defaults to target/stablehlo-venv (under the git-ignored target/ folder), where
#   the device looks by default; elsewhere, set QFORGE_STABLEHLO_PYTHON to its bin/python.
# Prints the absolute path of the venv's python as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:-target/stablehlo-venv}"
PKGS=("jax==0.10.2" "jaxlib==0.10.2" "numpy==2.4.6")
PYTHON="${PYTHON:-python3}"

command -v "$PYTHON" >/dev/null || { echo "install-stablehlo: $PYTHON not found" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}" >&2
"$VENV/bin/python" -c "from jaxlib.mlir.dialects import stablehlo; print('stablehlo API', stablehlo.get_api_version())" >&2
echo "$(cd "$VENV/bin" && pwd)/python"
