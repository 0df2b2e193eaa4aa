#!/usr/bin/env bash
# Create .venv (if missing) and install gpufleet into it, editable, with the given extras.
# Idempotent and quick when nothing changed: the install is skipped while pyproject.toml,
# setup.py, the package folders (setup.py maps each whole, so a new one needs a new install)
# and the extras are the same as last time.
#   scripts/bootstrap.sh dashboard        # for the demo
#   scripts/bootstrap.sh dev,dashboard    # for the tests
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dashboard}"
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "bootstrap: $python not found; install Python 3.11 or newer (or set PYTHON=...)" >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: gpufleet needs Python 3.11 or newer; $python is $("$python" -V 2>&1). Set PYTHON=python3.11 (or newer)." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $("$python" -V 2>&1)"
  "$python" -m venv .venv || {
    echo "bootstrap: could not create a virtual environment; on Debian/Ubuntu: apt-get install python3-venv" >&2
    exit 1
  }
fi
stamp=".venv/.gpufleet-installed"
want="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1) $(ls -d */__init__.py | tr '\n' ' ')$extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing gpufleet[$extras] into .venv (first time takes a minute or two)"
  log=".venv/bootstrap-pip.log"
  # pip's output goes to a log, shown only if the install fails.
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check -e ".[$extras]"; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "bootstrap: pip install failed; the full log is $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
