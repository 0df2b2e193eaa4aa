"""The dashboard in a real browser: headless Chromium (Debian's chromium, driven by Playwright)
loads every page from `gpufleet dashboard` against a real aggregator and simulated collectors,
checks the page's key elements are there, and saves a PNG of each page in the folder the
docs/components.md names (build/screenshots/, or $GPUFLEET_SCREENSHOTS)."""

from __future__ import annotations

import csv
import io
import signal
from pathlib import Path

import pytest

from harness.alert_receiver import AlertReceiver
from harness.browser import CHROMIUM_FLAGS, SHOTS, chromium_path, open_page, serve_dashboard, settled
from harness.fleets import fleet_of_200_nodes, fleet_with_a_quarantined_node
from harness.processes import Cluster, free_port
from harness.repair import repair_aggregator, xid_scenario
from harness.waiting import wait_until

sync_api = pytest.importorskip("playwright.sync_api")

# page label → text that must be on it once rendered
PAGES = {
    "Fleet overview": ["GPUs in service", "GPUs out of service", "fleet mean utilization", "quarantined"],
    "Inference": ["KV-bound", "compute-bound", "replicas", "vllm"],
    # This fleet's aggregator reads no scheduler: the page says so, and how to set one.
    "Workloads": ["Workloads", "No scheduler is read"],
    "Failures and repairs": ["Repair breaker ok", "Repair queue", "Incidents", "Audit log", "xid_79"],
    "Node": ["workflow", "Inference engines", "Incidents", "need an operator token"],
    "History explorer": ["History explorer", "Download CSV"],
}


@pytest.mark.slow
def test_every_page_renders_in_chromium(cluster: Cluster) -> None:
    chromium = chromium_path()
    agg = fleet_with_a_quarantined_node(cluster)
    url = serve_dashboard(cluster, agg.fleet)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(url)
        for label, expected in PAGES.items():
            page.locator('[data-testid="stSidebar"]').get_by_text(label, exact=True).click()
            page.get_by_role(
                "heading", name=label if label != "Fleet overview" else "Fleet overview"
            ).first.wait_for(timeout=60_000)
            for text in expected:
                # Table cells are drawn on a canvas; their text is in hidden accessibility cells.
                page.get_by_text(text).first.wait_for(state="attached", timeout=60_000)
            if label not in ("History explorer", "Workloads"):
                page.locator('[data-testid="stVegaLiteChart"], [data-testid="stDataFrame"]').first.wait_for(
                    timeout=60_000
                )
            page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(
                timeout=60_000
            )
            assert not page.locator('[data-testid="stException"]').count(), f"{label}: a traceback is shown"
            path = SHOTS / f"{label.lower().replace(' ', '-')}.png"
            page.screenshot(path=str(path), full_page=True)
            assert path.stat().st_size > 20_000, f"{path} looks empty"
        # Policy what-if: a replay of this fleet's store under the current and the proposed policy.
        page.locator('[data-testid="stSidebar"]').get_by_text("Policy what-if", exact=True).click()
        page.get_by_role("heading", name="Policy what-if").first.wait_for(timeout=60_000)
        page.get_by_role("button", name="Replay").click()
        page.get_by_text("taken out only under the proposed policy").first.wait_for(timeout=120_000)
        page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=60_000)
        page.get_by_text("gpu_hours_out_of_service").first.wait_for(state="attached", timeout=60_000)
        assert not page.locator('[data-testid="stException"]').count(), "Policy what-if: a traceback is shown"
        page.screenshot(path=str(SHOTS / "policy-what-if.png"), full_page=True)
        browser.close()


@pytest.mark.slow
def test_grouped_history_and_stored_events_in_chromium(cluster: Cluster) -> None:
    """At 200 nodes the history explorer draws one line per cluster; after an aggregator restart
    the node page still marks and lists the node's XID, findings and repair actions."""
    chromium = chromium_path()
    big = fleet_of_200_nodes(cluster)
    restarted = fleet_with_a_quarantined_node(cluster)
    for proc in [restarted.proc, *(p for p in cluster.procs if p.name in ("dash-1", "dash-2"))]:
        proc.stop(signal.SIGTERM, timeout_s=15)
    again = cluster.aggregator("aggregator-again", 0, 0, restarted.data_dir)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})

        page.goto(serve_dashboard(cluster, big.fleet, "dashboard-200"))
        open_page(page, "History explorer")
        page.get_by_text("4 groups, mean across each cluster").first.wait_for(timeout=60_000)
        page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=60_000)
        settled(page, "History explorer")
        # The CSV a person downloads holds the grouped series: one per cluster, no per-GPU columns.
        with page.expect_download() as download:
            page.get_by_role("button", name="Download CSV").click()
        rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
        assert set(rows[0]) == {"time", "cluster", "util_gpu_pct"}
        assert {r["cluster"] for r in rows} == {"east", "west", "north", "south"}
        page.screenshot(path=str(SHOTS / "history-grouped-200-nodes.png"), full_page=True)

        page.goto(serve_dashboard(cluster, again.fleet, "dashboard-restarted"))
        open_page(page, "Node")
        # The page's script run ends before its node list is clicked: a run that ends after the
        # click redraws the list closed (a six-worker run waited 30 s for an option never shown).
        settled(page, "Node")
        page.locator('[data-testid="stSelectbox"]').first.click()
        page.get_by_role("option", name="dash-2").click(timeout=60_000)
        page.get_by_text("quarantined").first.wait_for(timeout=60_000)
        for text in ("XID 79", "cordon ok", "gpu_lost", "Dashed lines"):
            page.get_by_text(text).first.wait_for(state="attached", timeout=60_000)
        settled(page, "Node")
        page.screenshot(path=str(SHOTS / "node-events-after-restart.png"), full_page=True)
        browser.close()


@pytest.mark.slow
def test_an_alerts_links_open_its_incident_and_its_node_in_chromium(cluster: Cluster) -> None:
    """An alert carries its incident's and its node's dashboard pages (dashboard_url): followed in
    Chromium, each opens on what the alert is about, and the address still names it."""
    chromium = chromium_path()
    port = free_port()
    dashboard = f"http://127.0.0.1:{port}"
    receiver = AlertReceiver()
    try:
        agg = repair_aggregator(
            cluster,
            "--alert-webhooks",
            f"{receiver.url}/hook",
            "--alert-group-wait-s",
            "0.2",
            "--dashboard-url",
            dashboard,
        )
        scenario = xid_scenario(cluster.tmp / "xid.toml", 79, gpu=2, lost=True)
        cluster.collector("linked-node", agg.ingest, "--interval-s", "0.5", "--sim-scenario", str(scenario))
        cluster.collector("aaa-node", agg.ingest, "--interval-s", "0.5")  # first in the list: not the default
        alert = wait_until(lambda: receiver.received, 60, "the incident's alert")[0]
        assert alert["links"]["incident"] == f"{dashboard}/?page=repairs&incident={alert['key']}"
        serve_dashboard(cluster, agg.fleet, port=port)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(alert["links"]["incident"])
            page.get_by_role("heading", name="Failures and repairs").first.wait_for(timeout=60_000)
            page.get_by_text(f"{alert['key']} on linked-node").first.wait_for(timeout=60_000)
            settled(page, "Failures and repairs")
            assert f"incident={alert['key']}" in page.url
            page.screenshot(path=str(SHOTS / "alert-link-incident.png"), full_page=True)

            page.goto(alert["links"]["node"])
            page.get_by_role("heading", name="Node").first.wait_for(timeout=60_000)
            # Only linked-node lost a GPU: its events on the page say the link chose it, not the
            # first node of the list (aaa-node, healthy).
            page.get_by_text("gpu_lost").first.wait_for(state="attached", timeout=60_000)
            settled(page, "Node")
            assert "node=linked-node" in page.url
            browser.close()
    finally:
        receiver.close()
