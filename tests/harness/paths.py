"""Where things are in the checkout the tests run from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_DATA = REPO / "tests" / "data"
DASHBOARD_APP = REPO / "dashboard" / "app.py"
