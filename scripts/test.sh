#!/usr/bin/env bash
# One command from a fresh clone to the whole test suite: installs the system packages
# the tests use (scripts/install-test-deps.sh), sets up .venv with the dev, dashboard and
# kubernetes extras, then lint (ruff) and every test (pytest, which also checks that the generated
# protobuf code matches protos/*.proto). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
scripts/bootstrap.sh dev,dashboard,kubernetes
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
exec .venv/bin/python -m pytest "$@"
