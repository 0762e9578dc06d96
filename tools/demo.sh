#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/demo.sh - installs what is missing, builds libsdpa in ./build, and runs the
# main job on the bundled default input (`sdpa demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
builddir=${BUILD_DIR:-build}
if [[ -f "$builddir/build.ninja" ]]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir" >/dev/null
fi
ninja -C "$builddir" >/dev/null
exec "$builddir/tools/sdpa" demo "$@"
