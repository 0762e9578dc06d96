#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/test.sh - installs what is missing, builds libsdpa in ./build, and runs the
# whole test suite: the per-ISA kernel harness (checkasm), the end-to-end
# conformance sweep, and the
# Criterion suite (every test on every ISA this machine supports). The last line
# is Criterion's "Synthesis:" summary.
set -euo pipefail
cd "$(dirname "$0")/.."
builddir=$(tools/build.sh)
echo "== checkasm: every ISA's micro-kernels against scalar and float64 =="
"$builddir/tests/checkasm" | tail -n 4
echo "== conformance: every ISA end to end against the float64 reference =="
"$builddir/tests/conformance" | grep -E "^\[|^FAIL|passed, .* failed"
echo "== mask geometry: the driver's masks against the contract, without kernels =="
"$builddir/tests/mask_geometry" | tail -n 1
echo "== paged tiles: a paged prefill's key tiles inside its pages (the pair products' blocks) =="
"$builddir/tests/paged_pair_tiles" | tail -n 2
echo "== Criterion suite =="
exec "$builddir/tests/sdpa_tests" "$@"
