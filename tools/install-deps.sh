#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/install-deps.sh - installs the Debian packages libsdpa needs, only if missing.
# (libopenblas0-openmp: only `sdpa bench` uses it, loaded at run time for its naive-blas rows.)
#   tools/install-deps.sh          build + test dependencies (native)
#   tools/install-deps.sh --cross  also the aarch64 cross toolchain, arm64 libraries and qemu-user
#   tools/install-deps.sh --fuzz   also clang with libFuzzer and the sanitizer runtimes (the
#                                  -Dfuzzing=enabled build and the ThreadSanitizer run of .ci/run)
#   (flags combine: --cross --fuzz)
# Needs root (or sudo). Never removes anything.
set -euo pipefail

native=(meson ninja-build pkg-config gcc libc6-dev libsleef-dev libcriterion-dev libcjson-dev libopenblas0-openmp)
cross_native=(qemu-user gcc-aarch64-linux-gnu)
cross_arm64=(libsleef-dev:arm64 libgomp1:arm64 libc6-dev:arm64 libcjson-dev:arm64)
fuzz=(clang libclang-rt-dev)   # Debian 12: clang 14 and libclang-rt-14-dev (libFuzzer, ASan, UBSan, TSan)

cross=0
want=("${native[@]}")
for arg in "$@"; do
  case "$arg" in
    --cross) cross=1; want+=("${cross_native[@]}" "${cross_arm64[@]}") ;;
    --fuzz) want+=("${fuzz[@]}") ;;
    *) echo "install-deps: unknown option $arg (--cross, --fuzz)" >&2; exit 2 ;;
  esac
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "install-deps: not root and no sudo; install these yourself: ${want[*]}" >&2; exit 1; fi
fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $cross == 1 ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed ${missing[*]}"
