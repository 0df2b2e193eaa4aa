"""The dashboard run with Streamlit's AppTest (a real script run, no browser) against a Fleet API."""

from __future__ import annotations

from typing import Any

import pytest

from harness.paths import DASHBOARD_APP


def app(monkeypatch: pytest.MonkeyPatch, fleet: str, token: str) -> Any:
    """The dashboard's AppTest, reading this Fleet API with this token (and no client config)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_resource.clear()  # the Fleet API client is cached per process
    monkeypatch.setenv("GPUFLEET_FLEET", fleet)
    monkeypatch.setenv("GPUFLEET_TOKEN", token)
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", "/nonexistent/client.toml")
    return AppTest.from_file(str(DASHBOARD_APP), default_timeout=60)
