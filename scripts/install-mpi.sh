#!/usr/bin/env bash
# Makes the MPI engine buildable and runnable for the `mpi` feature (docs/distributed.md): Debian's
# OpenMPI (libopenmpi-dev, which brings mpirun) and libclang (rsmpi generates its MPI bindings
# with bindgen). Does nothing when both are already installed.
set -euo pipefail
if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1 \
    && ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
$sudo apt-get update
$sudo apt-get install -y libopenmpi-dev libclang-dev
command -v mpirun >/dev/null || { echo "libopenmpi-dev installed but mpirun is not on PATH" >&2; exit 1; }
