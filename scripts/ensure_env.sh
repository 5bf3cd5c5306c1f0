#!/usr/bin/env bash
# Create (or reuse) the course's Python environment and print its path on the last line.
#
# The environment lives outside the clone, in a cache folder keyed by the hash of requirements.txt and the
# Python version, so a fresh clone with an unchanged lock reuses it and a changed lock builds a new one.
# Override the folder with WORKBOOK_ENV_DIR (e.g. WORKBOOK_ENV_DIR=$PWD/.venv for an in-tree environment).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/requirements.txt"

py="${WORKBOOK_PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      py="$(command -v "$cand")"; break
    fi
  done
fi
if [ -z "$py" ]; then
  echo "error: Python 3.11 is required (found: $(python3 --version 2>&1 || echo none))." >&2
  echo "       Install Python 3.11 (pyenv, conda: 'conda env create -f environment.yml', or your OS packages)," >&2
  echo "       or point WORKBOOK_PYTHON at a 3.11 interpreter." >&2
  exit 2
fi

hash="$( (cat "$req"; "$py" -c 'import sys, platform; print(sys.version_info[:3], platform.machine())') | sha256sum | cut -c1-12)"
envdir="${WORKBOOK_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ml-workbook/envs/py311-$hash}"
mkdir -p "$(dirname "$envdir")"

(
  flock 9
  if [ ! -f "$envdir/.complete" ]; then
    echo ">> creating the course environment in $envdir (first time: ~8.5 GB, a few minutes with a warm pip cache)" >&2
    rm -rf "$envdir"
    "$py" -m venv "$envdir"
    "$envdir/bin/python" -m pip install --quiet --upgrade "pip>=24" >&2
    "$envdir/bin/python" -m pip install --quiet --progress-bar off -r "$req" >&2
    sha256sum "$req" > "$envdir/.complete"
  fi
  # The helper package is installed editable, pointing at *this* clone (cheap; redone when the clone moves).
  # (-P: do not put the current folder on sys.path, or a run from the checkout would find ./utils and skip this)
  here="$(cd / && "$envdir/bin/python" -P -c 'import pathlib, utils; print(pathlib.Path(utils.__file__).resolve().parents[1])' 2>/dev/null || true)"
  if [ "$here" != "$root" ]; then
    "$envdir/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$root" >&2
  fi
) 9>"$envdir.lock"
echo "$envdir"
