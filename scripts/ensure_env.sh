#!/usr/bin/env bash
# Create (or reuse) one of the course's Python environments and print its path on the last line.
#
#   scripts/ensure_env.sh          the course environment: Python 3.11 + the pinned requirements.txt (~8.5 GB)
#   scripts/ensure_env.sh lean     the bring-your-own-environment path as a cloud GPU notebook meets it (`make test-lean`)
#
# Each lives outside the clone, in a cache folder keyed by the hash of what it is built from and the Python version,
# so a fresh clone with unchanged inputs reuses it and a changed input builds a new one. Override the folder with
# WORKBOOK_ENV_DIR / WORKBOOK_LEAN_ENV_DIR and the interpreter with WORKBOOK_PYTHON / WORKBOOK_LEAN_PYTHON.
#
# The lean environment is built the way a learner's own is: a Python that already has a CUDA build of torch and
# torchvision (torch 2.11 / torchvision 0.26 on Python 3.12, what a cloud GPU notebook ships; not the course's 2.14),
# then only `pip install -r requirements-byo.txt`. No TensorFlow, no tritonserver, plain onnxruntime, NumPy 2, and the
# project is NOT pip-installed: notebooks and tests must find utils/ from the plain clone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${1:-course}"
LEAN_PREINSTALLED="torch==2.11.0 torchvision==0.26.0"  # the simulated cloud notebook's own stack

# $1: a Python version test (its exit status); prints the first interpreter on PATH (or pyenv's 3.12) that passes
find_python() {
  local cand pyenv_py
  # pyenv's shims answer only for the selected version: ask pyenv for an installed 3.12 directly
  pyenv_py="$(command -v pyenv >/dev/null 2>&1 && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)"
  for cand in $2 $pyenv_py python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import sys; sys.exit(not ($1))" 2>/dev/null; then
      command -v "$cand"; return 0
    fi
  done
  return 1
}

case "$kind" in
  course)
    req="$root/requirements.txt"
    py="${WORKBOOK_PYTHON:-$(find_python 'sys.version_info[:2] == (3, 11)' python3.11 || true)}"
    if [ -z "$py" ]; then
      echo "error: Python 3.11 is required (found: $(python3 --version 2>&1 || echo none))." >&2
      echo "       Install Python 3.11 (pyenv, conda: 'conda env create -f environment.yml', or your OS packages)," >&2
      echo "       or point WORKBOOK_PYTHON at a 3.11 interpreter; or use your own environment (README)." >&2
      exit 2
    fi
    hash="$( (cat "$req"; "$py" -c 'import sys, platform; print(sys.version_info[:3], platform.machine())') | sha256sum | cut -c1-12)"
    envdir="${WORKBOOK_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ml-workbook/envs/py311-$hash}"
    what="the course environment (first time: ~8.5 GB, a few minutes with a warm pip cache)"
    ;;
  lean)
    req="$root/requirements-byo.txt"
    py="${WORKBOOK_LEAN_PYTHON:-$(find_python '(3, 10) <= sys.version_info[:2] <= (3, 12)' 'python3.12 python3.10' || true)}"
    if [ -z "$py" ]; then
      echo "error: the lean environment needs Python 3.10-3.12 (set WORKBOOK_LEAN_PYTHON to one)." >&2
      exit 2
    fi
    ver="$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
    hash="$( (cat "$req"; echo "$LEAN_PREINSTALLED"; "$py" -c 'import sys, platform; print(sys.version_info[:3], platform.machine())') | sha256sum | cut -c1-12)"
    envdir="${WORKBOOK_LEAN_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ml-workbook/envs/lean-py$ver-$hash}"
    what="the lean environment (first time: ~5 GB, 2-4 minutes from PyPI)"
    ;;
  *)
    echo "usage: scripts/ensure_env.sh [course|lean]" >&2
    exit 2
    ;;
esac
mkdir -p "$(dirname "$envdir")"

# pip install with progress a person can follow: a line per 25 packages resolved, each large download with its size,
# the install step, and every error; pip's own exit status is kept (pipefail). $1: what is being installed.
pip_install() {
  local label="$1"
  shift
  "$envdir/bin/python" -m pip install --progress-bar off "$@" 2>&1 | awk -v label="$label" '
    /^(Collecting|Processing) / { n++; if (n % 25 == 1) { printf ">>    %s: resolving package %d\n", label, n; fflush() } }
    /Downloading .*\([0-9.]+ (MB|GB)\)/ {
      match($0, /\([0-9.]+ (MB|GB)\)/); split(substr($0, RSTART + 1, RLENGTH - 2), size, " ")
      if (size[2] == "GB" || size[1] + 0 >= 50) { line = $0; sub(/^ +/, "", line); print ">>    " line; fflush() } }
    /^Installing collected packages/ { print ">>    " label ": installing " (n ? n " packages " : "") "(unpacking: the longest quiet step)"; fflush() }
    /^Successfully installed/ { print ">>    " label ": installed"; fflush() }
    /^ERROR|^error:|[Ee]rror: / { print; fflush() }
  ' >&2
}

# Each environment is several GB and a changed lock makes a new one: keep this one and the newest previous one of
# the same kind, remove older ones (only in the default cache folder, never a folder set by hand), and say so.
prune_old() {
  local prefix old keep=1
  [ -n "${WORKBOOK_ENV_DIR:-}${WORKBOOK_LEAN_ENV_DIR:-}" ] && return 0
  prefix="$(basename "$envdir" | sed 's/-[0-9a-f]*$//')"
  # newest first; skip this one, keep one more, remove the rest that are not in use (flock -n)
  for old in $(ls -1dt "$(dirname "$envdir")/$prefix"-* 2>/dev/null | grep -v '\.lock$'); do
    [ "$old" = "$envdir" ] && continue
    if [ "$keep" -gt 0 ]; then keep=$((keep - 1)); continue; fi
    if flock -n "$old.lock" true 2>/dev/null; then
      echo ">> removing an older environment (its lock changed since): $old ($(du -sh "$old" 2>/dev/null | cut -f1))" >&2
      rm -rf "$old" "$old.lock"
    fi
  done
}

(
  flock 9
  if [ ! -f "$envdir/.complete" ]; then
    echo ">> creating $what in $envdir" >&2
    rm -rf "$envdir"
    "$py" -m venv "$envdir"
    "$envdir/bin/python" -m pip install --quiet --upgrade "pip>=24" >&2
    if [ "$kind" = course ]; then
      echo ">> installing the pinned requirements.txt (the slow part: torch, TensorFlow, ONNX Runtime, Triton)" >&2
      pip_install "requirements.txt" -r "$req"
    else
      echo ">> [1/2] the notebook's own stack: $LEAN_PREINSTALLED" >&2
      # shellcheck disable=SC2086
      pip_install "the notebook's torch" $LEAN_PREINSTALLED
      echo ">> [2/2] what the course adds: pip install -r requirements-byo.txt" >&2
      before="$("$envdir/bin/python" -c 'import torch; print(torch.__version__)')"
      pip_install "requirements-byo.txt" -r "$req"
      after="$("$envdir/bin/python" -c 'import torch; print(torch.__version__)')"
      if [ "$before" != "$after" ]; then
        echo "error: requirements-byo.txt replaced torch $before with $after; it must never do that" >&2
        exit 1
      fi
    fi
    sha256sum "$req" > "$envdir/.complete"
    echo ">> done: $envdir" >&2
  fi
  # every run, not only when this one was built: stale environments left by earlier clones or older scripts go too
  prune_old
  if [ "$kind" = course ]; then
    # The helper package is installed editable, pointing at *this* clone (cheap; redone when the clone moves).
    # (-P: do not put the current folder on sys.path, or a run from the checkout would find ./utils and skip this)
    here="$(cd / && "$envdir/bin/python" -P -c 'import pathlib, utils; print(pathlib.Path(utils.__file__).resolve().parents[1])' 2>/dev/null || true)"
    if [ "$here" != "$root" ]; then
      "$envdir/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$root" >&2
    fi
  fi
) 9>"$envdir.lock"
echo "$envdir"
