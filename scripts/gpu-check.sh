#!/usr/bin/env bash
# Runs qforge's CUDA checks on a GPU machine from a binary built elsewhere (the GPU machine needs
# no Rust toolchain, only the NVIDIA driver): `qforge check` and `qforge bench` on the `cuda`
# device, plus what the machine is. Every step has a timeout; the whole script stays under about
# 4 minutes. See docs/backends/ptx.md, "Running on a GPU".
#
# Usage: scripts/gpu-check.sh OUTDIR
#   QFORGE_BIN   the qforge binary (default target/release/qforge, built with
#                `cargo build --release --features cuda`)
#
# Writes into OUTDIR:
#   env.txt          date, kernel, qforge version
#   nvidia-smi.txt   `nvidia-smi` and a CSV line per GPU (name, compute capability, driver, memory)
#   check.jsonl      `qforge check --device cuda --json` (one JSON line per kernel and backend)
#   check.stderr     its stderr
#   bench.jsonl      `qforge bench --device cuda --json`
#   bench.stderr     its stderr
#   exit-codes.txt   `step: code` per step (124: the step timed out)
#   summary.txt      the ptx rows of check.jsonl counted by status, and the exit codes
# Exit code: 0 when check and bench both exit 0, 1 otherwise, 2 for a usage error.
set -uo pipefail

OUT="${1:-}"
if [ -z "$OUT" ]; then
    echo "usage: scripts/gpu-check.sh OUTDIR (QFORGE_BIN=path/to/qforge to pick the binary)" >&2
    exit 2
fi
BIN="${QFORGE_BIN:-target/release/qforge}"
if [ ! -x "$BIN" ]; then
    echo "gpu-check: '$BIN' is not an executable; build it with" \
        "'cargo build --release --features cuda' or set QFORGE_BIN" >&2
    exit 2
fi
command -v timeout >/dev/null || { echo "gpu-check: 'timeout' (coreutils) is missing" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
: > "$OUT/exit-codes.txt"

# step NAME SECONDS STDOUT STDERR COMMAND...: runs COMMAND under a timeout, records its exit code.
step() {
    local name="$1" secs="$2" out="$3" err="$4"
    shift 4
    timeout -k 5 "$secs" "$@" > "$out" 2> "$err"
    local code=$?
    echo "$name: $code" >> "$OUT/exit-codes.txt"
    echo "gpu-check: $name exited $code" >&2
    return "$code"
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "uname: $(uname -a)"
    echo "binary: $BIN"
    echo "version: $(timeout 10 "$BIN" --version 2>&1)"
} > "$OUT/env.txt"

if command -v nvidia-smi >/dev/null; then
    step nvidia-smi 20 "$OUT/nvidia-smi.txt" "$OUT/nvidia-smi.stderr" nvidia-smi
    timeout 20 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
        --format=csv >> "$OUT/nvidia-smi.txt" 2>> "$OUT/nvidia-smi.stderr"
else
    echo "nvidia-smi: not found" > "$OUT/nvidia-smi.txt"
    echo "nvidia-smi: 127" >> "$OUT/exit-codes.txt"
fi

step check 120 "$OUT/check.jsonl" "$OUT/check.stderr" "$BIN" check --device cuda --json
check=$?
step bench 90 "$OUT/bench.jsonl" "$OUT/bench.stderr" "$BIN" bench --device cuda --json
bench=$?

{
    echo "ptx rows in check.jsonl by status:"
    for status in exact mismatch skipped; do
        echo "  $status: $(grep -c "\"backend\":\"ptx\",\"status\":\"$status\"" "$OUT/check.jsonl")"
    done
    echo "bench rows: $(grep -c . "$OUT/bench.jsonl")"
    echo "exit codes:"
    sed 's/^/  /' "$OUT/exit-codes.txt"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"

if [ "$check" -eq 0 ] && [ "$bench" -eq 0 ]; then
    exit 0
fi
exit 1
