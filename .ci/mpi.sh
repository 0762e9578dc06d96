#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# .ci/mpi.sh - issue 19's CI step: libsdpa_mpi (ring attention over MPI) on a clean
# Debian 12 machine (as root). Installs Open MPI (libopenmpi-dev, openmpi-bin) and the
# build tools if missing, builds with -Dmpi=enabled in its own build directory
# (build-mpi-ci), and runs tests/mpi/test_ring under mpirun for N = 1, 2, 3, 4, then
# sdpa-ring forward and backward on 4 ranks against `sdpa` on one process (causal with
# key lengths, and a sliding window).
# Last line: "P passed, F failed" (one count per mpirun); exit status 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
start=$(date +%s)
stamp() { echo "[mpi $(( $(date +%s) - start ))s] $*"; }

need=()
for p in meson ninja-build gcc pkg-config libsleef-dev libcjson-dev libopenmpi-dev openmpi-bin python3-numpy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  stamp "installing ${need[*]}"
  apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null || { echo "apt-get failed"; echo "0 passed, 1 failed"; exit 1; }
fi

stamp "build with -Dmpi=enabled (build-mpi-ci)"
if [ ! -d build-mpi-ci ]; then
  meson setup build-mpi-ci -Dbuildtype=release -Dmpi=enabled >/dev/null || { echo "meson setup failed"; echo "0 passed, 1 failed"; exit 1; }
fi
ninja -C build-mpi-ci tests/mpi/test_ring tests/mpi/test_ring_small_messages tests/mpi/ring_attention_mpi \
  tests/mpi/header_alone_mpi tools/sdpa-ring tools/sdpa tests/librename_fault.so >/dev/null \
  || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
export OMP_NUM_THREADS=1
pass=0 fail=0
stamp "include/sdpa_mpi.h alone as strict C99 (built above with -Werror), linked"
if build-mpi-ci/tests/mpi/header_alone_mpi; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "header_alone_mpi failed"; fi
for n in 1 2 3 4; do
  stamp "test_ring, N = $n"
  if out=$(timeout 300 "${MPIRUN[@]}" -np "$n" build-mpi-ci/tests/mpi/test_ring 2>&1); then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "$out" | grep -E "FAIL|error" | head -20
  fi
  echo "$out" | grep -E "^mpi ring" || echo "test_ring N = $n: no summary (rc != 0)"
done
stamp "test_ring over 7-float message blocks, N = 3"
if out=$(timeout 300 "${MPIRUN[@]}" -np 3 build-mpi-ci/tests/mpi/test_ring_small_messages 2>&1); then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "$out" | grep -E "FAIL|error" | head -20
fi
echo "$out" | grep -E "^mpi ring" || echo "test_ring_small_messages: no summary (rc != 0)"

stamp "example, 4 ranks"
if timeout 120 "${MPIRUN[@]}" -np 4 build-mpi-ci/tests/mpi/ring_attention_mpi 1024 32 2 1; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "ring_attention_mpi failed"
fi

stamp "sdpa-ring on 4 ranks vs sdpa (forward and backward, GQA, causal, kv lengths)"
tmp=$(mktemp -d)
/usr/bin/python3 - "$tmp" <<'PY'
import sys, numpy as np
d = sys.argv[1]; r = np.random.default_rng(7)
for n, s in [('q', (2, 4, 48, 16)), ('k', (2, 2, 48, 16)), ('v', (2, 2, 48, 8)), ('do', (2, 4, 48, 8))]:
    np.save(f'{d}/{n}.npy', r.standard_normal(s).astype(np.float32))
np.save(f'{d}/kl.npy', np.array([40, 17], dtype=np.int64))
np.save(f'{d}/slopes.npy', np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32))
np.save(f'{d}/sinks.npy', np.array([0.3, -1.0, 2.0, -np.inf], dtype=np.float32))
PY
S=build-mpi-ci/tools/sdpa; RG=build-mpi-ci/tools/sdpa-ring
ring_vs_sdpa() {  # the options after -q/-k/-v, for sdpa and sdpa-ring alike; KV=suffix: other K, V files
  local common=(-q "$tmp/q.npy" -k "$tmp/k${KV:-}.npy" -v "$tmp/v${KV:-}.npy" "$@") ds1=() ds4=()
  rm -f "$tmp"/ds?.npy
  if [[ " $* " == *" --sinks "* ]]; then ds1=(--dsinks "$tmp/ds1.npy"); ds4=(--dsinks "$tmp/ds4.npy"); fi
  $S forward "${common[@]}" -o "$tmp/o1.npy" --lse "$tmp/l1.npy" &&
  $S backward "${common[@]}" --do "$tmp/do.npy" --dq "$tmp/dq1.npy" --dk "$tmp/dk1.npy" --dv "$tmp/dv1.npy" "${ds1[@]}" &&
  timeout 120 "${MPIRUN[@]}" -np 4 $RG forward "${common[@]}" -o "$tmp/o4.npy" --lse "$tmp/l4.npy" &&
  timeout 120 "${MPIRUN[@]}" -np 4 $RG backward "${common[@]}" -o "$tmp/o4.npy" --lse "$tmp/l4.npy" \
    --do "$tmp/do.npy" --dq "$tmp/dq4.npy" --dk "$tmp/dk4.npy" --dv "$tmp/dv4.npy" "${ds4[@]}" &&
  /usr/bin/python3 - "$tmp" <<'PY'
import os, sys, numpy as np
d = sys.argv[1]; ok = True
rel = os.environ.get('REL')  # 16-bit types: |x - y| / (1 + |x|) below REL (their rounding), else |x - y| < 1e-5
for a in ['o', 'l', 'dq', 'dk', 'dv'] + (['ds'] if os.path.exists(f'{d}/ds1.npy') else []):
    x, y = np.load(f'{d}/{a}1.npy'), np.load(f'{d}/{a}4.npy')
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    e = float((np.abs(x64 - y64) / (1 + np.abs(x64)) if rel else np.abs(x64 - y64)).max())
    ok &= x.shape == y.shape and x.dtype == y.dtype and e < (float(rel) if rel else 1e-5)
    print(f'sdpa-ring vs sdpa {a}: shape {y.shape} {y.dtype}, max {"relative " if rel else ""}diff {e:.3g}')
sys.exit(0 if ok else 1)
PY
}
if ring_vs_sdpa --causal top-left --kv-len "$tmp/kl.npy"; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "sdpa-ring vs sdpa failed (causal, kv lengths)"; fi
stamp "sdpa-ring on 4 ranks vs sdpa (sliding window --window-left 7 --window-right 3)"
if ring_vs_sdpa --window-left 7 --window-right 3; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "sdpa-ring vs sdpa failed (window)"; fi
stamp "sdpa-ring on 4 ranks vs sdpa (causal, ALiBi, sinks and their gradient)"
if ring_vs_sdpa --causal top-left --alibi-slopes "$tmp/slopes.npy" --sinks "$tmp/sinks.npy"; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "sdpa-ring vs sdpa failed (ALiBi, sinks)"; fi
stamp "sdpa-ring on 4 ranks vs sdpa, 16-bit tensors (--dtype bf16; --dtype fp16 --kv-dtype bf16: float16 files)"
if REL=2e-2 ring_vs_sdpa --causal top-left --kv-len "$tmp/kl.npy" --dtype bf16 &&
   REL=2e-2 ring_vs_sdpa --window-left 7 --window-right 3 --dtype fp16 --kv-dtype bf16; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "sdpa-ring vs sdpa failed (16-bit types)"; fi
stamp "sdpa-ring on 4 ranks vs sdpa (48 queries against 96 keys, causal bottom-right)"
/usr/bin/python3 - "$tmp" <<'PY'
import sys, numpy as np
d = sys.argv[1]; r = np.random.default_rng(9)
for n, s in [('k96', (2, 2, 96, 16)), ('v96', (2, 2, 96, 8))]:
    np.save(f'{d}/{n}.npy', r.standard_normal(s).astype(np.float32))
PY
if KV=96 ring_vs_sdpa --causal bottom-right; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "sdpa-ring vs sdpa failed (Tq != Tk)"; fi
stamp "sdpa-ring refusals: an output that cannot be written, an LSE of the wrong shape, outputs naming one file or an input, a failing rename"
/usr/bin/python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.zeros((48, 4, 2), np.float32))" "$tmp/lse_bad.npy"
rm -f "$tmp"/r_*.npy
refusals_ok=1
timeout 120 "${MPIRUN[@]}" -np 2 $RG backward -q "$tmp/q.npy" -k "$tmp/k.npy" -v "$tmp/v.npy" --do "$tmp/do.npy" \
  --dq "$tmp/r_dq.npy" --dk "$tmp/r_dk.npy" --dv "$tmp/no-such-dir/r_dv.npy" >/dev/null 2>&1
[ $? -eq 2 ] && ! ls "$tmp"/r_* >/dev/null 2>&1 || { refusals_ok=0; echo "sdpa-ring: partial outputs left behind"; }
timeout 120 "${MPIRUN[@]}" -np 2 $RG backward -q "$tmp/q.npy" -k "$tmp/k.npy" -v "$tmp/v.npy" -o "$tmp/o4.npy" \
  --lse "$tmp/lse_bad.npy" --do "$tmp/do.npy" --dq "$tmp/r_dq.npy" --dk "$tmp/r_dk.npy" --dv "$tmp/r_dv.npy" >/dev/null 2>&1
[ $? -eq 2 ] && ! ls "$tmp"/r_* >/dev/null 2>&1 || { refusals_ok=0; echo "sdpa-ring: an LSE of shape (48, 4, 2) was accepted"; }
# outputs are checked before the ring computes (as sdpa's): two naming one file (the
# LSE wrote over O, exit 0, before), an output naming an input (replaced it, before)
timeout 120 "${MPIRUN[@]}" -np 2 $RG forward -q "$tmp/q.npy" -k "$tmp/k.npy" -v "$tmp/v.npy" -o "$tmp/r_o.npy" \
  --lse "$tmp/./r_o.npy" >/dev/null 2>&1
[ $? -eq 2 ] && ! ls "$tmp"/r_* >/dev/null 2>&1 || { refusals_ok=0; echo "sdpa-ring: -o X --lse ./X accepted"; }
cp "$tmp/k.npy" "$tmp/k_before.npy"
timeout 120 "${MPIRUN[@]}" -np 2 $RG forward -q "$tmp/q.npy" -k "$tmp/k.npy" -v "$tmp/v.npy" -o "$tmp/k.npy" >/dev/null 2>&1
[ $? -eq 2 ] && cmp -s "$tmp/k.npy" "$tmp/k_before.npy" || { refusals_ok=0; echo "sdpa-ring: an output naming an input accepted"; }
# a later output whose rename fails (tests/rename_fault.c, preloaded: onto fail-rename*)
# leaves an existing earlier output as it was (before: removed) and creates none
cp "$tmp/k.npy" "$tmp/r_dq.npy"
timeout 120 "${MPIRUN[@]}" -np 2 -x LD_PRELOAD="$PWD/build-mpi-ci/tests/librename_fault.so" $RG backward \
  -q "$tmp/q.npy" -k "$tmp/k.npy" -v "$tmp/v.npy" --do "$tmp/do.npy" --dq "$tmp/r_dq.npy" --dk "$tmp/r_dk.npy" \
  --dv "$tmp/fail-rename_dv.npy" >/dev/null 2>&1
[ $? -eq 2 ] && cmp -s "$tmp/r_dq.npy" "$tmp/k.npy" && [ ! -e "$tmp/r_dk.npy" ] && ! ls "$tmp"/.sdpa-* >/dev/null 2>&1 \
  || { refusals_ok=0; echo "sdpa-ring: a failing rename left the earlier outputs changed"; }
if [ $refusals_ok = 1 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
rm -rf "$tmp"

stamp "done"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
