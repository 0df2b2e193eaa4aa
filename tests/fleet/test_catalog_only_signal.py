"""A signal is described in one place: a change made to the signal catalog (protos/signals.py)
and nowhere else is what every surface a person reads shows.

Every gpufleet process of this test (the collector, the aggregator, the dashboard, the CLI) starts
with a `sitecustomize` that gives the GpuSample field `clock_mem_mhz` a catalog entry of its own
(a help text, a Prometheus name, a node-table column and a chart no part of gpufleet names) before
any other gpufleet module is imported: the field travels as it always does, and only the catalog
says what it is. The test then reads the collector's /metrics, `gpufleet metrics`, `gpufleet
history` and the dashboard's Node page in Chromium, and finds the new entry's words on each.
(A signal that is new to the wire also needs its proto field and its reader: docs/architecture.md
"The signal catalog".)"""

from __future__ import annotations

import os
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.browser import CHROMIUM_FLAGS, chromium_path, listen, open_page, serve_dashboard, settled
from harness.processes import Cluster, free_port, gpufleet_argv
from harness.waiting import wait_until

sync_api = pytest.importorskip("playwright.sync_api")

HELP = "widget clock: a signal only the catalog describes"
PROMETHEUS = "catalog_widget_clock_hertz"
LABEL = "widget clock MHz"  # the node table's column
TITLE = "widget clock"  # its chart, read in MHz
SITECUSTOMIZE = f"""
import dataclasses

from gpufleet.protos import signals

signals.GPU_SIGNALS["clock_mem_mhz"] = dataclasses.replace(
    signals.GPU_SIGNALS["clock_mem_mhz"], help={HELP!r}, prometheus={PROMETHEUS!r}, label={LABEL!r},
    title={TITLE!r},
)
"""


def _cli(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(gpufleet_argv(*args), env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_a_signal_described_only_in_the_catalog_is_on_metrics_in_the_store_history_and_dashboard(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = cluster.tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    agg = cluster.aggregator()
    port = free_port()
    cluster.collector(
        "catalog-node",
        agg.ingest,
        "--interval-s",
        "0.5",
        "--sim-gpus",
        "2",
        "--metrics-listen",
        f"127.0.0.1:{port}",
    )

    # The collector's /metrics: the entry's name and help, in the base unit (hertz).
    def scrape() -> str:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return text if f"gpufleet_gpu_{PROMETHEUS}" in text else ""

    families = {
        f.name: f for f in text_string_to_metric_families(wait_until(scrape, 30, "the collector's /metrics"))
    }
    family = families[f"gpufleet_gpu_{PROMETHEUS}"]
    assert family.documentation.startswith(HELP) and family.type == "gauge"
    assert {s.labels["gpu"] for s in family.samples} == {"0", "1"} and all(
        s.value > 1e8 for s in family.samples
    )
    assert "gpufleet_gpu_memory_clock_hertz" not in families  # the name the shipped entry gives it

    # The store: `gpufleet metrics` lists it with the entry's help, and `gpufleet history` reads
    # its stored values back under it.
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],
        "GPUFLEET_CLIENT_CONFIG": str(cluster.tmp / "no-client.toml"),
    }
    listed = [line for line in _cli(env, "metrics").splitlines() if "clock_mem_mhz" in line]
    assert len(listed) == 1 and "MHz" in listed[0] and HELP in listed[0], listed

    def history() -> str:
        text = _cli(
            env, "history", "clock_mem_mhz", "--node", "catalog-node", "--since", "5m", "--step", "1s"
        )
        return text if text.startswith("clock_mem_mhz") else ""

    text = wait_until(history, 30, "the stored clock_mem_mhz to be read back")
    assert text.splitlines()[0].startswith(f"clock_mem_mhz (MHz: {HELP}), mean per 1s"), text
    assert "2 series" in text.splitlines()[0]

    # The dashboard's Node page: the node table's column, with values, and the GPU chart's series
    # among the choices the page offers (as the browser was sent them).
    url = serve_dashboard(cluster, agg.fleet)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        got = listen(page)
        page.goto(url)
        open_page(page, "Node")
        settled(page, "Node")
        gpus = next(t for t in got.tables if LABEL in t.columns)
        assert [r["GPU"] for r in gpus.rows] == [0, 1] and all(r[LABEL] > 100 for r in gpus.rows)
        series = got.selectboxes["GPU series"]
        assert f"{TITLE} MHz" in series, series  # the shipped entry has no chart: only the catalog adds it
        browser.close()
