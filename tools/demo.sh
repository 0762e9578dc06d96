#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/demo.sh - installs what is missing, builds libsdpa in ./build, and runs the
# main job on the bundled default input (`sdpa demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
builddir=$(tools/build.sh)
# One OpenMP thread per CPU: left to the OS, a VM sometimes runs both threads of a
# 2-CPU machine on one CPU for the whole process (the timing line then reads 2-3.5x slower).
export OMP_PROC_BIND=${OMP_PROC_BIND:-true}
exec "$builddir/tools/sdpa" demo "$@"
