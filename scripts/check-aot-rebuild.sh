#!/usr/bin/env bash
# The build-script contract of qforge-build under real cargo, on examples/aot (built on its own,
# as scripts/check-aot-example.sh does):
#   1. touching a file no kernel comes from does not rerun the build script;
#   2. a build-script change that leaves every kernel equal rewrites no artifact;
#   3. changing the example's kernel regenerates only that kernel's artifacts (the old ones are
#      removed) and the program still runs bit-exact;
#   4. QFORGE_AOT_LEVELS reruns the build with the levels it names;
#   5. a kernel that fails to build fails the cargo build with the kernel's name and source line.
# It edits examples/aot/src and restores it on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
example=examples/aot
backup=$(mktemp -d)
cp -p "$example/src/main.rs" "$example/src/custom.rs" "$backup/"
trap 'cp -p "$backup/main.rs" "$backup/custom.rs" "$example/src/" && rm -rf "$backup"' EXIT

fail() { echo "check-aot-rebuild: FAILED: $*" >&2; exit 1; }

# Builds the example (extra cargo arguments in "$@") and prints its OUT_DIR.
build() {
    cargo build -q -j2 -p qforge-example-aot --message-format=json "$@" \
        | grep '"reason":"build-script-executed"' | grep 'qforge-example-aot' \
        | sed 's/.*"out_dir":"\([^"]*\)".*/\1/'
}
# Every file of the build's output with its modification time (nanoseconds) and checksum.
state() { (cd "$1" && find . -type f ! -name timings.txt -printf '%p %T@ ' -exec sha256sum {} \; | awk '{print $1, $2, $3}' | sort); }
# Whether the build's qforge/ folder has a file matching the glob $2.
has() { compgen -G "$1/qforge/$2" >/dev/null; }
runs() { cargo run -q -j2 -p qforge-example-aot >/dev/null || fail "the example does not run: $1"; }

out=$(build)
[ -d "$out/qforge" ] || fail "no OUT_DIR/qforge after the first build (got '$out')"
before=$(state "$out")
timings=$(stat -c %Y.%y "$out/timings.txt")

# 1. An unrelated file.
touch "$example/src/main.rs"
out=$(build)
[ "$(stat -c %Y.%y "$out/timings.txt")" = "$timings" ] || fail "touching src/main.rs reran the build script"
[ "$(state "$out")" = "$before" ] || fail "touching src/main.rs changed the artifacts"
echo "ok: touching src/main.rs does not rerun the build script"

# 2. The build script's source changes, no kernel does.
echo "// a comment" >>"$example/src/custom.rs"
out=$(build)
[ "$(stat -c %Y.%y "$out/timings.txt")" != "$timings" ] || fail "changing src/custom.rs did not rerun the build script"
[ "$(state "$out")" = "$before" ] || fail "an unchanged kernel's artifacts were rewritten:
$(diff <(echo "$before") <(state "$out"))"
echo "ok: a build-script change with equal kernels rewrites nothing"

# 3. The example's kernel changes.
sed -i 's/fma(x\[i\], scale, residual\[i\])/fma(residual[i], scale, x[i])/' "$example/src/custom.rs"
grep -q 'fma(residual\[i\], scale, x\[i\])' "$example/src/custom.rs" || fail "could not edit the kernel"
out=$(build)
after=$(state "$out")
changed=$( { diff <(echo "$before") <(echo "$after") || true; } | grep '^[<>]' | awk '{print $2}' | sort -u)
grep -q 'scaled_residual_f32' <<<"$changed" || fail "the changed kernel's artifacts were not regenerated"
if grep 'qforge/' <<<"$changed" | grep -v 'scaled_residual_' | grep -v 'manifest.json' >/dev/null; then
    fail "artifacts of unchanged kernels were rewritten: $(grep -v scaled_residual_ <<<"$changed")"
fi
old_hash=$(grep -o 'scaled_residual_f32-[0-9a-f]*' <<<"$before" | head -1)
has "$out" "$old_hash*" && fail "the old artifacts of $old_hash were left behind"
runs "after changing the kernel"
echo "ok: a changed kernel regenerates only its own artifacts, and runs"

# 4. The level list from the environment.
out=$(QFORGE_AOT_LEVELS=x86-64 build)
has "$out" '*cpu-obj-x86-64-v3.o' && fail "QFORGE_AOT_LEVELS=x86-64 still built x86-64-v3"
has "$out" '*cpu-obj-x86-64.o' || fail "QFORGE_AOT_LEVELS=x86-64 built no baseline object"
out=$(build)
has "$out" '*cpu-obj-x86-64-v3.o' || fail "unsetting QFORGE_AOT_LEVELS did not rebuild x86-64-v3"
echo "ok: QFORGE_AOT_LEVELS reruns the build with its levels"

# 5. A kernel that fails to verify: bf16 stores round to nearest even only.
sed -i 's/Rounding::NearestEven);/Rounding::TowardZero);/' "$example/src/custom.rs"
line=$(grep -n 'Rounding::TowardZero);' "$example/src/custom.rs" | cut -d: -f1)
[ -n "$line" ] || fail "could not break the kernel"
if log=$(cargo build -q -j2 -p qforge-example-aot 2>&1); then
    fail "a broken kernel built"
fi
grep -q "scaled_residual" <<<"$log" || fail "the build error does not name the kernel:
$log"
grep -q "custom.rs:$line" <<<"$log" || fail "the build error does not give custom.rs:$line:
$log"
echo "ok: a broken kernel fails the build naming it: $(grep -m1 'qforge-build' <<<"$log")"
