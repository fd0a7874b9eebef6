#!/usr/bin/env bash
# Installs torch, transformers and bitsandbytes from PyPI into a virtual environment, for the
# tests that check that transformers loads what `qforge quantize` writes (tests/transformers.rs,
# scripts/hf_models.py). CPU only: no GPU is needed or used.
#
# PyPI's Linux x86_64 torch wheel is the CUDA build, and `import torch` needs the CUDA libraries
# it links (libcudart, cuBLAS, cuDNN, ...) even on a machine without a GPU. Everything is installed
# with --no-deps from the pinned list below: the CUDA libraries that torch links, but not triton,
# cuda-bindings, cuSOLVER or NVTX (loaded only when used on a GPU), which saves about 1.5 GB.
# About 4.4 GB on disk; about 2 minutes from scratch on the 2-core development VM.
#
# Usage: scripts/install-transformers.sh [VENV_DIR]
#   VENV_DIR defaults to target/transformers-venv (under the git-ignored target/ folder), where
#   the tests look by default; elsewhere, set QFORGE_TRANSFORMERS_PYTHON to its bin/python.
# Prints the absolute path of the venv's python as the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:-target/transformers-venv}"
PYTHON="${PYTHON:-python3}"
# torch 2.15.0 and the CUDA 13 libraries its shared objects link (versions as torch pins them).
TORCH=(
    "torch==2.15.0"
    "nvidia-cuda-runtime==13.2.86" "nvidia-cuda-cupti==13.2.86" "nvidia-cuda-nvrtc==13.2.86"
    "nvidia-cublas==13.4.1.3" "nvidia-cufft==12.2.0.57" "nvidia-cufile==1.17.1.22"
    "nvidia-cusparse==12.7.10.12" "nvidia-nvjitlink==13.5.37"
    "nvidia-cudnn-cu13==9.26.0.51" "nvidia-cusparselt-cu13==0.8.1" "nvidia-nccl-cu13==2.30.7"
    "nvidia-nvshmem-cu13==3.7.2"
)
# transformers, bitsandbytes, accelerate (transformers' 4-bit loader needs it) and the closure of their and torch's dependencies.
PKGS=(
    "transformers==5.24.0" "bitsandbytes==0.50.2" "accelerate==1.15.0" "psutil==7.2.2" "safetensors==0.8.0" "tokenizers==0.23.3"
    "huggingface_hub==2.4.0" "hf-xet==1.8.0" "numpy==2.4.6" "packaging==26.4" "PyYAML==6.0.4"
    "regex==2026.11.19" "tqdm==4.70.1" "filelock==4.3.1" "fsspec==2026.9.0"
    "typing_extensions==4.16.0" "sympy==1.14.0" "mpmath==1.3.0" "networkx==3.6.1"
    "Jinja2==3.1.6" "MarkupSafe==3.0.4" "typer==0.29.2" "click==8.5.1" "rich==15.0.0"
    "shellingham==1.5.4" "markdown-it-py==4.3.0" "mdurl==0.1.2" "Pygments==2.21.0"
    "annotated-doc==0.0.7" "httpx2==2.16.2" "httpcore2==2.16.2" "h11==0.16.0" "anyio==4.16.0"
    "idna==3.20" "truststore==0.10.5" "pydantic==2.14.4" "pydantic_core==2.50.5"
    "annotated-types==0.8.0" "typing-inspection==0.4.5"
)
CHECK='import torch, transformers, bitsandbytes; print("torch", torch.__version__, "transformers", transformers.__version__, "bitsandbytes", bitsandbytes.__version__)'

command -v "$PYTHON" >/dev/null || { echo "install-transformers: $PYTHON not found" >&2; exit 1; }

want="torch 2.15.0 transformers 5.24.0 bitsandbytes 0.50.2"
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c "$CHECK" 2>/dev/null)" = "$want" ]; then
    echo "install-transformers: $want already in $VENV" >&2
else
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV" >&2
    fi
    # No cache: the wheels are 3 GB and would be kept twice.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --no-deps "${TORCH[@]}" "${PKGS[@]}" >&2
    "$VENV/bin/python" -c "$CHECK" >&2
fi
echo "$(cd "$VENV/bin" && pwd)/python"
