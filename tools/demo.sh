#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/demo.sh - installs what is missing, builds libsdpa in ./build, and runs the
# main job on the bundled default input (`sdpa demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
builddir=$(tools/build.sh)
exec "$builddir/tools/sdpa" demo "$@"
