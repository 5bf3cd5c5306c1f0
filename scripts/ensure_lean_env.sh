#!/usr/bin/env bash
# Create (or reuse) the *lean* environment and print its path on the last line: the bring-your-own-environment path
# as a cloud GPU notebook meets it, proved on CPU by `make test-lean` (README "Bring your own environment").
#
# It is built the way a learner's own environment is: a Python that already has a CUDA build of torch and torchvision
# (here torch 2.11 / torchvision 0.26 on Python 3.12, what a cloud GPU notebook ships; not the course's torch 2.14),
# then only `pip install -r requirements-byo.txt`. No TensorFlow, no tritonserver, plain onnxruntime, NumPy 2, and the
# project is NOT pip-installed: notebooks and tests must find utils/ from the plain clone.
# Cached like the course environment, keyed by this file, requirements-byo.txt and the Python version;
# override the folder with WORKBOOK_LEAN_ENV_DIR and the interpreter with WORKBOOK_LEAN_PYTHON.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/requirements-byo.txt"
# The "preinstalled" stack of the simulated cloud notebook.
PREINSTALLED="torch==2.11.0 torchvision==0.26.0"

py="${WORKBOOK_LEAN_PYTHON:-}"
if [ -z "$py" ]; then
  # pyenv's shims answer only for the selected version: ask pyenv for an installed 3.12 directly
  pyenv_py="$(command -v pyenv >/dev/null 2>&1 && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)"
  for cand in python3.12 $pyenv_py python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null; then
      py="$(command -v "$cand")"; break
    fi
  done
fi
if [ -z "$py" ]; then
  echo "error: the lean environment needs Python 3.10-3.12 (set WORKBOOK_LEAN_PYTHON to one)." >&2
  exit 2
fi
ver="$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
hash="$( (cat "$req" "${BASH_SOURCE[0]}"; "$py" -c 'import sys, platform; print(sys.version_info[:3], platform.machine())') | sha256sum | cut -c1-12)"
envdir="${WORKBOOK_LEAN_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ml-workbook/envs/lean-py$ver-$hash}"
mkdir -p "$(dirname "$envdir")"

(
  flock 9
  if [ ! -f "$envdir/.complete" ]; then
    echo ">> creating the lean environment in $envdir (first time: ~5 GB, 2-4 minutes from PyPI)" >&2
    rm -rf "$envdir"
    "$py" -m venv "$envdir"
    "$envdir/bin/python" -m pip install --quiet --upgrade "pip>=24" >&2
    echo ">> [1/2] the notebook's own stack: $PREINSTALLED" >&2
    # shellcheck disable=SC2086
    "$envdir/bin/python" -m pip install --quiet --progress-bar off $PREINSTALLED >&2
    echo ">> [2/2] what the course adds: pip install -r requirements-byo.txt" >&2
    before="$("$envdir/bin/python" -c 'import torch; print(torch.__version__)')"
    "$envdir/bin/python" -m pip install --quiet --progress-bar off -r "$req" >&2
    after="$("$envdir/bin/python" -c 'import torch; print(torch.__version__)')"
    if [ "$before" != "$after" ]; then
      echo "error: requirements-byo.txt replaced torch $before with $after; it must never do that" >&2
      exit 1
    fi
    sha256sum "$req" > "$envdir/.complete"
  fi
) 9>"$envdir.lock"
echo "$envdir"
