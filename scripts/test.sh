#!/usr/bin/env bash
# One command from a fresh clone to the tests: installs the system packages the tests use
# (scripts/install-test-deps.sh), sets up .venv with the dev, dashboard and kubernetes extras,
# then lint (ruff) and pytest (which also checks that the generated protobuf code matches
# protos/*.proto).
#   scripts/test.sh                    the fast default: every test not marked slow (minutes)
#   scripts/test.sh --all              the whole suite, slow tests too (what CI runs: .ci/run)
#   scripts/test.sh tests/collector    one area (the fast tests; add --all for all of it)
# Other arguments go to pytest (-k EXPR, -x, a test's node id...).
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not slow")
args=()
for arg in "$@"; do
  if [ "$arg" = "--all" ]; then select=(); else args+=("$arg"); fi
done
scripts/install-test-deps.sh
scripts/bootstrap.sh dev,dashboard,kubernetes
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest ${select[*]:-(every test)}"
exec .venv/bin/python -m pytest "${select[@]}" "${args[@]}"
