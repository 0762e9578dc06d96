#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/build.sh - installs what is missing (tools/install-deps.sh) and builds libsdpa in
# $BUILD_DIR (default ./build). Used by tools/demo.sh and tools/test.sh; prints the build dir.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh >&2
builddir=${BUILD_DIR:-build}
if [[ -f "$builddir/build.ninja" ]]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir" >/dev/null
fi
ninja -C "$builddir" >/dev/null
echo "$builddir"
