#!/usr/bin/env bash
# One command from a fresh clone to the tests: installs the system packages the tests use
# (scripts/install-test-deps.sh), sets up .venv with the dev, dashboard and kubernetes extras,
# then lint (ruff) and pytest (which also checks that the generated protobuf code matches
# protos/*.proto).
#   scripts/test.sh                    the whole suite, slow tests too (what CI runs: .ci/run)
#   scripts/test.sh --fast             every test not marked slow (minutes)
#   scripts/test.sh tests/collector    one area (all of it; add --fast for its fast tests)
# The tests run in 6 pytest-xdist workers (GPUFLEET_TEST_WORKERS=N to choose, 0 for one
# process): on two cores most tests wait on the processes they start; with four, the cores were
# still idle a fifth of the run (vmstat), so six (docs/testing.md has the figures). Other arguments go to pytest (-k EXPR, -x, a test's
# node id...).
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
args=()
for arg in "$@"; do
  case "$arg" in
    --fast) select=(-m "not slow") ;;
    --all) select=() ;;  # the whole suite, as without a flag (kept for .ci/run and habit)
    *) args+=("$arg") ;;
  esac
done
workers="${GPUFLEET_TEST_WORKERS:-6}"
if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "scripts/test.sh: GPUFLEET_TEST_WORKERS=$workers: give a number of workers (0: no workers)" >&2
  exit 2
fi
parallel=()
if [ "$workers" != 0 ]; then
  # loadgroup: tests marked xdist_group(NAME) share one worker (a module's fixtures that must
  # see all of its tests); the rest go to whichever worker is free.
  parallel=(-n "$workers" --dist loadgroup)
fi
scripts/install-test-deps.sh
scripts/bootstrap.sh dev,dashboard,kubernetes
echo "== ruff"
.venv/bin/ruff check .
# The hundreds of gpufleet processes the tests start compile the project's modules once, into
# the checkout's __pycache__, instead of at every start (an environment that sets
# PYTHONDONTWRITEBYTECODE, as this machine's does, made each aggregator compile ~130 modules:
# 0.18 s of its 0.6 s of start-up CPU).
unset PYTHONDONTWRITEBYTECODE
echo "== pytest ${select[*]:-(every test)} ${parallel[*]:-(one process)}"
# --durations: the 50 slowest tests close every run, so where the minutes go is in CI's output;
# build/test-results.xml has every test's outcome, time and CPU (its cpu_s property).
mkdir -p build
exec .venv/bin/python -m pytest --durations=50 --junitxml=build/test-results.xml "${parallel[@]}" "${select[@]}" "${args[@]}"
