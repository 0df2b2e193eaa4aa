"""Every page of the hidden-failures and gpu-faults demos in Chromium, read as a person reads
it: the demo is the README's (`gpufleet demo --scenario examples/...`, its own dashboard), its
faults the examples' with their times scaled down so the test does not wait minutes for them.

What the browser was sent is read from its WebSocket (harness/browser.py), so the checks are on
what is drawn: no cell or text reads "None" (a missing value is N/A); every time axis is UTC and
24-hour, and every time in a tooltip too; a state has one colour on every page
(protos/presentation.py); the history page of 16 nodes draws few enough lines for its legend to
list them all, uncut; the faulty GPU's health cell is not "ok" and says what `gpufleet node
--json` says; an unknown node in the address stays "not found"; Streamlit's Deploy button is
not there. A second demo, in the same home, shows none of the first one's nodes.

Each page's screenshot is saved in $GPUFLEET_SCREENSHOTS (build/screenshots/ by default):
scripts/screenshots.sh runs this test with it set to docs/screenshots/, which is how the
pictures in the docs are made."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.browser import (
    CHROMIUM_FLAGS,
    SHOTS,
    Received,
    chromium_path,
    drawn,
    encodings,
    listen,
    open_page,
    settled,
)
from harness.demo import running_demo
from harness.paths import REPO
from harness.processes import free_port, gpufleet_argv
from harness.waiting import wait_until

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("streamlit")

from gpufleet.dashboard.views.history import MAX_LINES  # noqa: E402
from gpufleet.protos.presentation import GPU_HEALTH_COLOURS, NODE_STATE_COLOURS  # noqa: E402

SPEED_UP = 5  # the examples' fault times divided by this
PAGES = [
    "Fleet overview",
    "Inference",
    "Workloads",
    "Failures and repairs",
    "Node",
    "History explorer",
    "Policy what-if",
]
ONE_COLOUR = {**NODE_STATE_COLOURS, **GPU_HEALTH_COLOURS}
# "healthy" and "ok" share a colour on purpose (both: nothing wrong); no word has two colours.
TWELVE_HOUR = re.compile(r"%[Ilp]")


@dataclass
class Scenario:
    example: str
    nodes: int
    faulty_node: str
    faulty_gpu: int


HIDDEN_FAILURES = Scenario("hidden-failures", 16, "demo-node-01", 2)  # an NVML call that hangs
GPU_FAULTS = Scenario("gpu-faults", 4, "demo-node-03", 5)  # an uncorrectable ECC error, XID 48
SERVING = Scenario("serving", 4, "demo-node-01", 2)  # a row remap waiting for a reset, held for capacity


def scaled(example: str, into: Path) -> Path:
    """The example scenario with every fault SPEED_UP times sooner (its faults and order kept)."""
    text = (REPO / "examples" / f"{example}.toml").read_text()
    faster = re.sub(r"^at_s = ([0-9.]+)", lambda m: f"at_s = {float(m[1]) / SPEED_UP:g}", text, flags=re.M)
    path = into / f"{example}.toml"
    path.write_text(faster)
    return path


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpufleet_argv(*args), env=env, capture_output=True, text=True, timeout=60)


@contextmanager
def demo(home: Path, scenario: Scenario) -> Iterator[tuple[dict[str, str], str]]:
    port = free_port()
    args = (
        "--nodes", str(scenario.nodes), "--dashboard-port", str(port),
        "--scenario", str(scaled(scenario.example, home)),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running_demo(home, *args, name=scenario.example) as env:
        wait_until(
            lambda: urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200,
            60,
            "the demo's dashboard to serve",
        )
        yield env, url


def gpu_health_said(env: dict[str, str], node: str, gpu: int) -> str:
    """What `gpufleet node NODE --json` says of one GPU's health: its word and detail."""
    out = cli(env, "node", node, "--json")
    assert out.returncode == 0, out.stderr
    said = {g["index"]: g for g in json.loads(out.stdout)["gpus"]}[gpu]
    return said.get("health", "") + (f": {said['health_detail']}" if said.get("health_detail") else "")


def check_what_was_drawn(label: str, got: Received, colours_seen: dict[str, set[str]]) -> None:
    for table in got.tables:
        assert table.placeholder == "N/A", f"{label}: a table shows a missing value as {table.placeholder!r}"
        for row in table.rows:
            bad = {k: v for k, v in row.items() if isinstance(v, str) and v.strip() in ("None", "nan", "NaN")}
            assert not bad, f"{label}: cells read {bad} in {row}"
    for spec in got.charts:
        for channel, enc in encodings(spec):
            temporal = enc.get("type") == "temporal"
            if channel == "x" and temporal:
                assert (enc.get("scale") or {}).get("type") == "utc", (
                    f"{label}: a time axis not in UTC: {enc}"
                )
                axis = enc.get("axis") or {}
                assert "UTC" in (axis.get("title") or ""), f"{label}: a time axis not labelled UTC: {enc}"
                assert axis.get("format") and not TWELVE_HOUR.search(axis["format"]), f"{label}: {enc}"
            if channel == "tooltip" and temporal:
                assert str(enc.get("timeUnit", "")).startswith("utc"), (
                    f"{label}: a tooltip time not UTC: {enc}"
                )
                assert not TWELVE_HOUR.search(enc.get("format", "")), f"{label}: {enc}"
            scale = enc.get("scale") or {}
            if channel in ("color", "stroke") and scale.get("domain") and scale.get("range"):
                for word, colour in zip(scale["domain"], scale["range"], strict=False):
                    if word in ONE_COLOUR:
                        assert colour == ONE_COLOUR[word], f"{label}: {word!r} drawn {colour}"
                        colours_seen.setdefault(word, set()).add(label)


WINDOW = {"width": 1600, "height": 1100}  # issue 55: every table the page chose fits this window


def fits_the_window(page: Any, label: str, got: Received) -> None:
    """No table shown is cut at the right edge: each grid's scroller is no wider than its box
    (a table behind a closed expander, the page's detail, is not shown)."""
    widths = page.evaluate(
        """() => [...document.querySelectorAll('[data-testid="stDataFrame"] .dvn-scroller')]
            .filter(s => s.offsetParent !== null).map(s => [s.scrollWidth, s.clientWidth])"""
    )
    cut = [w for w in widths if w[0] > w[1] + 1]
    assert not cut, (
        f"{label}: at {WINDOW['width']} px a table is cut (its width, the window's): {cut}; "
        f"the tables' columns: {[t.columns for t in got.tables]}"
    )


def bracketed(label: str, fact: str, cli_read: Any, page_read: Any, near: Any = None) -> None:
    """What the page shows of fact agrees with what the CLI says just before and just after it
    (the demo moves on between them): equal to one of the two, or near one when given."""
    before = cli_read()
    shown = page_read()
    after = cli_read()
    ok = shown in (before, after) if near is None else near(shown, before) or near(shown, after)
    assert ok, f"{label}: the page shows {fact} {shown!r}; the CLI said {before!r}, then {after!r}"


def metric_shown(page: Any, name: str) -> str:
    """A headline figure as the page draws it (the tile whose label is name)."""
    tile = page.locator('[data-testid="stMetric"]').filter(
        has=page.locator('[data-testid="stMetricLabel"]', has_text=re.compile(rf"^{re.escape(name)}$"))
    )
    return tile.first.locator('[data-testid="stMetricValue"]').inner_text().strip()


def cli_json(env: dict[str, str], *args: str) -> Any:
    out = cli(env, *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def the_cli_and_the_page_agree(page: Any, got: Received, label: str, env: dict[str, str]) -> None:
    """The same fact read from the CLI and from the page: each node's state word (overview),
    the nodes out of service (overview, Failures and repairs, `gpufleet status`), each replica's
    KV-cache as a percent (Inference, `gpufleet engines`)."""
    if label in ("Fleet overview", "Failures and repairs"):
        bracketed(
            label,
            "nodes out of service",
            lambda: str(cli_json(env, "status")["fleet"]["nodes_out_of_service"]),
            lambda: metric_shown(page, "nodes out of service"),
        )
    if label == "Fleet overview":

        def states_shown() -> dict[str, str]:
            got.clear()  # the next refresh's table: drawn after the CLI's first answer
            table = wait_until(
                lambda: page.evaluate("1") and next((t for t in got.tables if "state" in t.columns), None),
                30,
                "the overview's node table to refresh",
            )
            return {row["node"]: row["state"] for row in table.rows}

        bracketed(
            label,
            "the nodes' states",
            lambda: {n["node"]: n["state"] for n in cli_json(env, "nodes")["nodes"]},
            states_shown,
        )
    if label == "Inference":

        def kv_shown() -> dict[tuple[str, int], float]:
            got.clear()
            table = wait_until(
                lambda: page.evaluate("1") and next((t for t in got.tables if "KV %" in t.columns), None),
                30,
                "the Inference page's replica table to refresh",
            )
            return {(r["node"], r["port"]): r["KV %"] for r in table.rows if r["KV %"] is not None}

        def kv_said() -> dict[tuple[str, int], float]:
            engines = cli_json(env, "engines")["engines"]
            return {
                (e["node"], e["port"]): 100 * e["kv_cache_usage_ratio"]
                for e in engines
                if e.get("kv_cache_usage_ratio") is not None
            }

        # The simulated engines' KV-cache moves by a few percent a report: the same figure in the
        # same unit (a percent, not a ratio: 64, never 0.64) within 10 points of the CLI's.
        bracketed(
            label,
            "each replica's KV %",
            kv_said,
            kv_shown,
            near=lambda shown, said: (
                shown.keys() == said.keys() and all(abs(shown[k] - said[k]) <= 10 for k in shown)
            ),
        )


def read_every_page(page: Any, got: Received, url: str, scenario: Scenario, env: dict[str, str]) -> None:
    colours_seen: dict[str, set[str]] = {}
    got.clear()
    page.goto(url)  # opens on the first page: what it draws is what was sent since the clear
    for label in PAGES:
        if label != PAGES[0]:
            got.clear()
            open_page(page, label)
        else:
            page.get_by_role("heading", name=label).first.wait_for(timeout=60_000)
        if label == "Policy what-if":
            page.get_by_role("button", name="Replay").click()
            page.get_by_text("taken out only under the proposed policy").first.wait_for(timeout=180_000)
        settled(page, label)
        if label == "History explorer":
            page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=60_000)
        # Playwright hands over the frames it received while the test is in one of its calls: a
        # round trip to the page each poll.
        wait_until(
            lambda: page.evaluate("1") and (got.charts or got.tables),
            30,
            f"{label}: its charts and tables sent",
        )
        assert page.get_by_role("button", name="Deploy").count() == 0, "Streamlit's Deploy button is shown"
        text = page.evaluate("document.body.innerText")
        assert not re.search(r"\bNone\b|\bnan\b", text), f"{label}: the page reads {text!r}"
        check_what_was_drawn(label, got, colours_seen)
        drawn(page)
        fits_the_window(page, label, got)
        the_cli_and_the_page_agree(page, got, label, env)
        if label == "Fleet overview":
            # Every node listed is this demo's: a second demo inherits none of the first's.
            listed = {row["node"] for t in got.tables if "node" in t.columns for row in t.rows}
            assert listed == {f"demo-node-{i:02d}" for i in range(1, scenario.nodes + 1)}, listed
        if label == "History explorer":
            check_the_legend(got, scenario)
        drawn(page)
        page.screenshot(path=str(SHOTS / f"{scenario.example}-{slug(label)}.png"), full_page=True)
    # A state drawn on more than one page is drawn in one colour (checked above) on each.
    assert len(colours_seen.get("healthy", set())) >= 2, colours_seen


def check_the_legend(got: Received, scenario: Scenario) -> None:
    """The history chart draws at most MAX_LINES series and the grey band of the rest, and its
    legend lists each by its whole name: for 16 nodes of 8 GPUs, node and GPU."""
    chart = next(c for c in got.charts if any(ch == "color" for ch, _ in encodings(c)))
    colour = next(enc for ch, enc in encodings(chart) if ch == "color")
    domain = colour["scale"]["domain"]
    assert len(domain) <= MAX_LINES + 1, domain
    assert colour["legend"]["labelLimit"] == 0 and colour["legend"]["symbolLimit"] == 0, colour["legend"]
    drawn = {row["series"] for row in chart["_rows"] if "series" in row}
    assert drawn <= set(domain), (drawn, domain)
    if scenario.nodes * 8 > MAX_LINES:
        assert domain[-1] == "the rest (min-max)" and all(
            re.search(r"demo-node-\d+/gpu\d", s) for s in domain[:-1]
        )


def slug(label: str) -> str:
    return label.lower().replace(" ", "-")


def the_faulty_gpu_reads_as_the_cli_says(
    page: Any, got: Received, url: str, scenario: Scenario, env: dict
) -> None:
    node, gpu = scenario.faulty_node, scenario.faulty_gpu
    before = gpu_health_said(env, node, gpu)
    got.clear()
    page.goto(f"{url}/?page=node&node={node}")
    page.get_by_role("heading", name="Node").first.wait_for(timeout=60_000)
    settled(page, "Node")
    table = wait_until(
        lambda: next((t for t in got.tables if {"GPU", "health"} <= set(t.columns)), None),
        30,
        "the GPU table",
    )
    after = gpu_health_said(env, node, gpu)
    shown = {row["GPU"]: row["health"] for row in table.rows}[gpu]
    assert shown is not None and not shown.startswith("ok"), f"{node} GPU {gpu} reads {shown!r}"
    assert shown in (before, after), (
        f"the page says {shown!r}, gpufleet node --json {before!r} then {after!r}"
    )
    drawn(page)
    page.screenshot(path=str(SHOTS / f"{scenario.example}-faulty-gpu.png"), full_page=True)

    page.goto(f"{url}/?page=node&node=demo-node-99")
    page.get_by_text("Node 'demo-node-99' not found").first.wait_for(timeout=60_000)
    settled(page, "Node")
    assert "node=demo-node-99" in page.url, page.url


def engines_left_gracefully(env: dict[str, str], node: str) -> None:
    """Issue 55: the hidden-failures demo's drain takes the node's engine out of rotation and its
    requests finish (the demo's engine gets no new one once out of rotation), so the drain goes
    on without evicting work in flight — not "drain_engines failed: timeout ...; evicting"."""

    def drain_engines() -> list[dict[str, str]]:
        out = cli(env, "audit", "--node", node, "--json")
        assert out.returncode == 0, out.stderr
        return [e for e in json.loads(out.stdout)["entries"] if e["action"] == "drain_engines"]

    done = wait_until(
        lambda: [e for e in drain_engines() if e["status"] != "started"] or None,
        90,
        f"{node}'s engines to leave rotation in its drain",
        context=lambda: repr(drain_engines()),
    )
    assert [e["status"] for e in done] == ["ok"], done


@pytest.mark.slow
def test_every_page_of_both_fault_demos_reads_true(tmp_path: Path) -> None:
    chromium = chromium_path()
    SHOTS.mkdir(parents=True, exist_ok=True)
    home = tmp_path / "home"
    home.mkdir()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        for scenario in (HIDDEN_FAILURES, GPU_FAULTS, SERVING):
            with demo(home, scenario) as (env, url):
                node, gpu = scenario.faulty_node, scenario.faulty_gpu
                wait_until(
                    lambda: gpu_health_said(env, node, gpu).split(":")[0] not in ("", "ok"),  # noqa: B023
                    120,
                    f"{node} GPU {gpu} to be flagged by the {scenario.example} faults",
                )
                page = browser.new_page(viewport=WINDOW)
                got = listen(page)
                the_faulty_gpu_reads_as_the_cli_says(page, got, url, scenario, env)
                read_every_page(page, got, url, scenario, env)
                page.close()
                if scenario is HIDDEN_FAILURES:  # its recovery action: cordoned and drained at once
                    engines_left_gracefully(env, "demo-node-02")
        browser.close()
