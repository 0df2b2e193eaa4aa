"""Chromium (Debian's, driven by Playwright) on the dashboard, and what the browser was sent:
every Streamlit message the page receives over its WebSocket is decoded with Streamlit's own
protobuf classes, so a test reads each chart's Vega-Lite spec and each table's cells exactly
as the browser got them (Vega draws on a canvas and the table grid too: neither is in the DOM
as text a test can trust)."""

from __future__ import annotations

import io
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from harness.paths import REPO
from harness.processes import Cluster, free_port, gpufleet_argv
from harness.waiting import wait_until

# Where a test saves what it saw (docs/components.md).
SHOTS = Path(os.environ.get("GPUFLEET_SCREENSHOTS") or REPO / "build" / "screenshots")

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: scripts/install-test-deps.sh installs Debian's chromium")
    return chromium


def serve_dashboard(cluster: Cluster, fleet: str, name: str = "dashboard", port: int = 0) -> str:
    port = port or free_port()
    cluster.spawn(
        name,
        gpufleet_argv(
            "dashboard", "--port", str(port), "--fleet", fleet, "--token", cluster.secrets.tokens["viewer"]
        ),
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200,
        60,
        "the dashboard to serve",
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    return url


def open_page(page: Any, label: str) -> None:
    page.locator('[data-testid="stSidebar"]').get_by_text(label, exact=True).click()
    page.get_by_role("heading", name=label).first.wait_for(timeout=60_000)


def settled(page: Any, label: str) -> None:
    page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(timeout=60_000)
    assert not page.locator('[data-testid="stException"]').count(), f"{label}: a traceback is shown"


def drawn(page: Any) -> None:
    """Wait until the browser has painted what it was sent: every table's grid and every chart
    on its canvas, then two animation frames (a screenshot taken sooner shows empty boxes)."""
    for selector in ('[data-testid="stDataFrame"]', '[data-testid="stVegaLiteChart"]'):
        for i in range(page.locator(selector + ":visible").count()):
            page.locator(selector + ":visible").nth(i).locator("canvas, svg").first.wait_for(timeout=60_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


@dataclass
class Table:
    columns: list[str]
    rows: list[dict[str, Any]]
    placeholder: str


@dataclass
class Received:
    """What the page was sent since the last clear(): charts' specs (with their datasets' rows),
    tables, and each choice's options."""

    charts: list[dict[str, Any]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    selectboxes: dict[str, list[str]] = field(default_factory=dict)  # label -> its options

    def clear(self) -> None:
        self.charts.clear()
        self.tables.clear()
        self.selectboxes.clear()

    def on_frame(self, payload: bytes | str) -> None:
        if isinstance(payload, str):
            return
        msg = ForwardMsg()
        try:
            msg.ParseFromString(payload)
        except Exception:  # not every frame is a ForwardMsg (a ping)
            return
        if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
            return
        element = msg.delta.new_element
        kind = element.WhichOneof("type")
        if kind == "vega_lite_chart":
            chart = element.vega_lite_chart
            spec = json.loads(chart.spec)
            spec["_rows"] = [row for ds in chart.datasets for row in _rows(ds.data.data)]
            if chart.data.data:
                spec["_rows"] += _rows(chart.data.data)
            self.charts.append(spec)
        elif kind == "selectbox":
            self.selectboxes[element.selectbox.label] = list(element.selectbox.options)
        elif kind == "dataframe" and element.dataframe.arrow_data.data:
            table = pa.ipc.open_stream(io.BytesIO(element.dataframe.arrow_data.data)).read_all()
            self.tables.append(Table(table.column_names, table.to_pylist(), element.dataframe.placeholder))


def _rows(data: bytes) -> list[dict[str, Any]]:
    return pa.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist() if data else []


def listen(page: Any) -> Received:
    received = Received()
    page.on("websocket", lambda ws: ws.on("framereceived", received.on_frame))
    return received


def encodings(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (channel, definition) of a spec, through its layers and concatenations."""
    for channel, definition in (spec.get("encoding") or {}).items():
        for one in definition if isinstance(definition, list) else [definition]:
            if isinstance(one, dict):
                yield channel, one
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for part in spec.get(key) or []:
            yield from encodings(part)
