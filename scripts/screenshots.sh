#!/usr/bin/env bash
# Regenerate the dashboard pictures in docs/screenshots/ from the demo, so they cannot go stale:
# runs the browser test that reads every page of the hidden-failures and gpu-faults demos in
# Chromium (tests/fleet/test_demo_screens.py), with its screenshots written to docs/screenshots/.
# A picture is only written by a run whose checks of that page passed.
#   scripts/screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
scripts/bootstrap.sh dev,dashboard,kubernetes
export GPUFLEET_SCREENSHOTS="$PWD/docs/screenshots"
exec .venv/bin/python -m pytest -p no:cacheprovider -q tests/fleet/test_demo_screens.py
