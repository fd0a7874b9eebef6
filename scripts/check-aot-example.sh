#!/usr/bin/env bash
# Builds and runs examples/aot on its own (not as part of the workspace, where cargo unifies
# features and links the JIT): the kernels compiled by its build.rs must run bit-exact with no
# compiler linked. Fails unless the example succeeds and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo run -q -j2 -p qforge-example-aot)
echo "$out"
grep -qx "JIT compiler linked: no" <<<"$out" || { echo "examples/aot linked a JIT compiler" >&2; exit 1; }
# The build-script contract under cargo (rerun and rewrite rules, levels, a broken kernel).
scripts/check-aot-rebuild.sh
