#!/usr/bin/env bash
# One command from a fresh clone to a running demo fleet: sets up .venv, then runs
# `gpufleet demo` (4 nodes x 8 simulated GPUs, embedded store, dashboard on :8501).
# Extra arguments go to `gpufleet demo`, e.g. scripts/demo.sh --nodes 16 --no-dashboard
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dashboard
exec .venv/bin/gpufleet demo "$@"
