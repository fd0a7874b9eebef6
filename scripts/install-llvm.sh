#!/usr/bin/env bash
# Makes LLVM 14 available for the `llvm` feature (the `cpu-llvm` device): Debian's llvm-14-dev
# (the shared libLLVM-14 and llvm-config-14, which the llvm-sys crate finds on PATH). Does
# nothing when it is already installed.
set -euo pipefail
if command -v llvm-config-14 >/dev/null 2>&1; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
$sudo apt-get update
$sudo apt-get install -y llvm-14-dev
command -v llvm-config-14 >/dev/null || { echo "llvm-14-dev installed but llvm-config-14 is not on PATH" >&2; exit 1; }
