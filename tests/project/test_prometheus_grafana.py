"""The tools SREs already run: the Grafana dashboards (deploy/grafana/) and the Prometheus alert
rules (deploy/prometheus/).

Every panel, variable and annotation query of every dashboard is run against real servers
holding a simulated fleet's data: InfluxQL against a real influxd the aggregator writes to,
PromQL against a real Prometheus (Debian's prometheus) scraping real collectors. No Grafana
runs here, so the JSON is checked for what Grafana needs (a datasource on every panel and
target, variables that exist, a layout without overlaps); the check is shown to catch a panel
without a datasource and a broken variable. The alert rules pass `promtool check rules` and
their own `promtool test rules` cases.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.paths import REPO
from harness.processes import Cluster, free_port, stop_process
from harness.repair import repair_flags
from harness.waiting import wait_until

DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
RULES = REPO / "deploy" / "prometheus" / "gpufleet-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "gpufleet-alerts.test.yml"
# dcgm-exporter's published dashboard's queries and the rules fleets run on its names (tests/data:
# source and licence in the files).
DCGM_DASHBOARD = REPO / "tests" / "data" / "dcgm-exporter-dashboard-queries.json"
DCGM_RULES = REPO / "tests" / "data" / "dcgm-exporter-alert-rules.yml"
# Grafana's own variables, and InfluxQL aliases naming a tag ($tag_node).
BUILTIN = {"timeFilter", "__interval", "__rate_interval", "__range", "__interval_ms"}
FAULTY = "graf-1"  # runs vLLM; GPU 1 falls off the bus (XID 79) and the node is quarantined
FAULTS = f"""
[[fault]]
at_s = 1.0
gpu = 1
kind = "xid"
xid = 79
node = "{FAULTY}"

[[fault]]
at_s = 1.0
gpu = 1
kind = "lost"
node = "{FAULTY}"
"""


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / name).read_text())


def all_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


# --- the JSON's structure ----------------------------------------------------------------------
def _queries(obj: dict[str, Any]) -> list[str]:
    return [t.get("query") or t.get("expr") or "" for t in obj.get("targets", [])]


def structure_problems(d: dict[str, Any]) -> list[str]:
    """What would keep Grafana from showing this dashboard as meant; [] when nothing."""
    problems = []
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if not d.get(key):
            problems.append(f"no {key}")
    variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    datasources = {f"${{{n}}}": v["query"] for n, v in variables.items() if v["type"] == "datasource"}

    def check_ds(where: str, ds: Any) -> None:
        if not isinstance(ds, dict) or not ds.get("uid") or not ds.get("type"):
            problems.append(f"{where}: no datasource")
        elif ds["uid"] not in datasources or datasources[ds["uid"]] != ds["type"]:
            problems.append(f"{where}: datasource {ds} is no datasource variable of this dashboard")

    def check_vars(where: str, text: str) -> None:
        for name in re.findall(r"\$\{?(\w+)", text):
            if name not in variables and name not in BUILTIN and not name.startswith("tag_"):
                problems.append(f"{where}: ${name} is not a variable of this dashboard")

    for name, v in variables.items():
        if v["type"] == "query":
            check_ds(f"variable {name}", v.get("datasource"))
            if not v.get("query") or v.get("definition") != v.get("query"):
                problems.append(f"variable {name}: no query")
            check_vars(f"variable {name}", v.get("query", ""))
    ids, boxes = set(), []
    for p in d.get("panels", []):
        where = f"panel {p.get('id')} {p.get('title')!r}"
        if p.get("id") in ids:
            problems.append(f"{where}: duplicate id")
        ids.add(p.get("id"))
        check_ds(where, p.get("datasource"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] + g["w"] > 24:
            problems.append(f"{where}: bad gridPos {g}")
        else:
            for other, o in boxes:
                if (
                    g["x"] < o["x"] + o["w"]
                    and o["x"] < g["x"] + g["w"]
                    and g["y"] < o["y"] + o["h"]
                    and (o["y"] < g["y"] + g["h"])
                ):
                    problems.append(f"{where}: overlaps {other}")
            boxes.append((where, g))
        targets = p.get("targets", [])
        if not targets:
            problems.append(f"{where}: no query")
        if len({t.get("refId") for t in targets}) != len(targets):
            problems.append(f"{where}: refIds repeat")
        for t in targets:
            check_ds(f"{where} target {t.get('refId')}", t.get("datasource"))
            text = t.get("query") or t.get("expr") or ""
            if not text:
                problems.append(f"{where} target {t.get('refId')}: empty query")
            check_vars(where, text + t.get("alias", ""))
    for a in d.get("annotations", {}).get("list", []):
        if not a.get("builtIn"):
            check_ds(f"annotation {a.get('name')}", a.get("datasource"))
            check_vars(f"annotation {a.get('name')}", a.get("query", ""))
    return problems


def test_generated_dashboards_are_committed_and_sound() -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_grafana.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    dashboards = all_dashboards()
    assert set(dashboards) == {
        "gpufleet-fleet.json",
        "gpufleet-node.json",
        "gpufleet-kv-cache.json",
        "gpufleet-xids-repairs.json",
        "gpufleet-collector-prometheus.json",
        "gpufleet-workloads.json",
    }
    assert len({d["uid"] for d in dashboards.values()}) == len(dashboards)
    for name, d in dashboards.items():
        assert structure_problems(d) == [], name
        names = {v["name"] for v in d["templating"]["list"]}
        # Owners are fleet-wide (an account's GPUs in every cluster): the workloads dashboard has none.
        assert "cluster" in names or name == "gpufleet-workloads.json", f"{name}: a cluster variable"
    # The template variables SREs filter by: cluster, node and model.
    assert {"cluster", "node", "model"} <= {
        v["name"] for v in load("gpufleet-node.json")["templating"]["list"]
    }
    prom = {v["name"] for v in load("gpufleet-collector-prometheus.json")["templating"]["list"]}
    assert {"cluster", "node", "model"} <= prom


def test_gpu_health_reads_as_its_word_in_the_colour_of_every_other_screen() -> None:
    """Grafana's value mappings for gpufleet_gpu_health are the dashboard's words and colours
    (protos/presentation.py), for every health level the proto defines."""
    from gpufleet.protos import vocabulary_pb2
    from gpufleet.protos.presentation import GPU_HEALTH_COLOURS

    panels = [
        p for p in load("gpufleet-collector-prometheus.json")["panels"] if "gpufleet_gpu_health" in str(p)
    ]
    assert len(panels) == 2, [p["title"] for p in panels]
    for panel in panels:
        (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
        shown = {int(level): (o["text"], o["color"]) for level, o in mapping["options"].items()}
        levels = {v.number: v.name for v in vocabulary_pb2.GpuHealth.DESCRIPTOR.values if v.number}
        assert set(shown) == set(levels), (shown, levels)
        for level, (word, colour) in shown.items():
            assert levels[level] == f"GPU_HEALTH_{word.upper()}" and GPU_HEALTH_COLOURS[word] == colour


def test_the_structure_check_catches_a_missing_datasource_and_a_broken_variable() -> None:
    d = load("gpufleet-fleet.json")
    no_ds = copy.deepcopy(d)
    del no_ds["panels"][4]["datasource"]
    assert any("no datasource" in p for p in structure_problems(no_ds))
    wrong_ds = copy.deepcopy(d)
    wrong_ds["panels"][4]["targets"][0]["datasource"] = {"type": "influxdb", "uid": "${elsewhere}"}
    assert any("no datasource variable" in p for p in structure_problems(wrong_ds))
    broken_var = copy.deepcopy(d)
    broken_var["panels"][5]["targets"][0]["query"] += ' AND "gpu" =~ /^$gpu$/'
    assert any("$gpu is not a variable" in p for p in structure_problems(broken_var))
    gone_var = copy.deepcopy(d)
    gone_var["templating"]["list"] = [v for v in gone_var["templating"]["list"] if v["name"] != "model"]
    assert any("$model is not a variable" in p for p in structure_problems(gone_var))
    overlap = copy.deepcopy(d)
    overlap["panels"][1]["gridPos"] = dict(overlap["panels"][0]["gridPos"])
    assert any("overlaps" in p for p in structure_problems(overlap))


# --- alert rules ---------------------------------------------------------------------------------
def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed: scripts/install-test-deps.sh installs Debian's prometheus")
    return exe


def test_alert_rules_check_and_pass_their_promtool_tests() -> None:
    check = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a case where it fires and one where it stays quiet.
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert alerts >= {
        "GpuLost",
        "GpuUncorrectedEccError",
        "GpuRowRemapPending",
        "GpuRowRemapFailure",
        "GpuHardwareXid",
        "GpuThermalSlowdownSustained",
        "InferenceEngineKvCacheBound",
    }
    fires, quiet = set(), set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for t in case["alert_rule_test"]:
            (fires if t["exp_alerts"] else quiet).add(t["alertname"])
    assert fires == alerts and quiet == alerts


def test_serving_recording_rules_check_and_pass_their_promtool_tests() -> None:
    """The per-pool recording rules (the autoscaling signal) and their promtool cases, which
    read the gauges the aggregator exports (aggregator/fleet/pools.py)."""
    rules = REPO / "deploy" / "prometheus" / "gpufleet-serving.yml"
    check = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(
        [promtool(), "test", "rules", str(rules.with_name("gpufleet-serving.test.yml"))],
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    listed = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())["rule_files"]
    assert "gpufleet-serving.yml" in listed


def test_a_broken_rule_fails_its_promtool_test(tmp_path: Path) -> None:
    """The promtool cases can fail: a rule that no longer fires is caught."""
    broken = RULES.read_text().replace("expr: gpufleet_gpu_lost == 1", "expr: gpufleet_gpu_lost == 2")
    (tmp_path / "gpufleet-alerts.yml").write_text(broken)
    (tmp_path / "gpufleet-alerts.test.yml").write_text(RULE_TESTS.read_text())
    tested = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / "gpufleet-alerts.test.yml")],
        capture_output=True,
        text=True,
    )
    assert tested.returncode != 0 and "GpuLost" in tested.stdout + tested.stderr


def test_hardware_xid_alert_lists_what_the_shipped_policy_cordons_for() -> None:
    from gpufleet.repair.policy import load_policy
    from gpufleet.repair.xid_catalog import MNEMONICS

    policy = load_policy(None)
    cordoned = {x for x in MNEMONICS if policy.xid_entry(x)[0].cordon}
    rule = next(
        r
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if r["alert"] == "GpuHardwareXid"
    )
    listed = {int(x) for x in re.search(r'xid=~"([\d|]+)"', rule["expr"]).group(1).split("|")}
    assert listed == cordoned
    assert not listed & {13, 31, 43, 45, 94}, "application errors do not page"
    flagged = {int(x) for x in re.search(r'code=~"xid_\(([\d|]+)\)"', rule["expr"]).group(1).split("|")}
    assert flagged == cordoned, "held by the repair controller's flag for the same XIDs"


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_rule_links_a_runbook_section_that_exists() -> None:
    runbooks = REPO / "docs" / "runbooks.md"
    anchors = {_slug(line.lstrip("#")) for line in runbooks.read_text().splitlines() if line.startswith("#")}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"].get("runbook_url", "")
            path, _, anchor = url.partition("#")
            assert path == "docs/runbooks.md" and anchor in anchors, (rule["alert"], url)


# --- every query on real servers ------------------------------------------------------------------
class PrometheusServer:
    def __init__(self, home: Path, targets: list[str], aggregators: list[str]) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            pytest.fail(
                "prometheus is not installed: scripts/install-test-deps.sh installs Debian's prometheus"
            )
        shutil.copy(RULES, home / "gpufleet-alerts.yml")
        shutil.copy(DCGM_RULES, home / "dcgm-exporter-rules.yml")
        config = home / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": ["gpufleet-alerts.yml", "dcgm-exporter-rules.yml"],
                    "scrape_configs": [
                        {"job_name": "gpufleet-collector", "static_configs": [{"targets": targets}]},
                        {"job_name": "gpufleet-aggregator", "static_configs": [{"targets": aggregators}]},
                    ],
                }
            )
        )
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = home / "prometheus.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    exe,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={home / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str, **params: str) -> Any:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        stop_process(self.proc)


class Fleet:
    """A simulated fleet like the demo's on real servers: an aggregator writing to a real influxd
    with repair on, collectors in two clusters (vLLM and SGLang replicas, one node with a lost
    GPU), and a real Prometheus scraping the collectors."""

    def __init__(self, cluster: Cluster, influxd: str) -> None:
        self.influx, self.database = influxd, f"grafana_{uuid.uuid4().hex[:10]}"
        policy = cluster.tmp / "policy.toml"
        policy.write_text("[workflow]\nvalidate_s = 2.0\n")
        # Owners: the demo scheduler's records (the nodes' own jobs, as a site's scheduler), and a
        # job that ran and ended before the aggregator read them (its GPU-hours still counted).
        jobs = cluster.tmp / "jobs"
        jobs.mkdir()
        now = time.time()
        ended = {"id": "41", "user": "ana", "account": "vision", "team": "cv", "nodes": {"graf-3": [0, 1, 2]}}
        times = {"start_unix_s": now - 900, "end_unix_s": now - 60}
        (jobs / "41.json").write_text(json.dumps({**ended, **times}))
        agg = cluster.aggregator(
            "aggregator",
            0,
            0,
            None,
            "--store",
            "influxdb",
            "--influx-url",
            influxd,
            "--influx-database",
            self.database,
            *repair_flags(policy),
            "--workload-scheduler",
            "site",
            "--workload-site-jobs-dir",
            str(jobs),
            "--workload-poll-s",
            "1",
        )
        (cluster.tmp / "faults.toml").write_text(FAULTS)
        ports = []
        for node, cl, extra in (
            (FAULTY, "east", ["--sim-engine", "vllm"]),
            ("graf-2", "west", ["--sim-engine", "sglang", "--sim-model", "H200"]),
            ("graf-3", "west", ["--sim-model", "H200"]),
        ):
            port = free_port()
            ports.append(f"127.0.0.1:{port}")
            cluster.collector(
                node,
                agg.ingest,
                "--cluster",
                cl,
                "--interval-s",
                "0.5",
                "--sim-gpus",
                "4",
                "--sim-scenario",
                str(cluster.tmp / "faults.toml"),
                "--metrics-listen",
                f"127.0.0.1:{port}",
                "--sim-jobs-dir",
                str(jobs),
                # Both faces: gpufleet's names and dcgm-exporter's (collector/dcgm_face.py).
                "--metrics-names",
                "both",
                *extra,
            )
        self.collector_metrics, self.aggregator_metrics = ports, agg.metrics
        self.prometheus = PrometheusServer(cluster.tmp, ports, [agg.metrics])

    def influxql(self, query: str) -> list[dict[str, Any]]:
        url = f"{self.influx}/query?" + urllib.parse.urlencode(
            {"db": self.database, "q": query, "epoch": "ns"}
        )
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as exc:  # InfluxDB says what it could not parse
            raise AssertionError(f"{query}: HTTP {exc.code}: {exc.read().decode()}") from exc
        (result,) = body["results"]
        assert "error" not in result, f"{query}: {result['error']}"
        return result.get("series", [])

    def ready(self) -> None:
        def stored() -> bool:
            shown = self.influxql('SHOW TAG VALUES FROM "event" WITH KEY = "kind"')
            kinds = {row[1] for s in shown for row in s["values"]}
            repairs = self.influxql('SELECT count("outcome") FROM "repair" WHERE "action" = \'ticket\'')
            engines = self.influxql('SELECT count("kv_cache_usage_ratio") FROM "engine" GROUP BY "node"')
            owners = self.influxql('SELECT count("util_gpu_pct") FROM "owner_account" GROUP BY "account"')
            ended = self.influxql('SELECT count("gpu_hours_allocated") FROM "workload"')
            return (
                {"xid", "gpu_lost"} <= kinds
                and bool(repairs)
                and len(engines) == 2
                and bool(owners)
                and bool(ended)
            )

        wait_until(stored, 60, "XIDs, repairs, engines and workloads in InfluxDB")

        def scraped() -> bool:
            up = self.prometheus.api("query", query='up{job="gpufleet-collector"} == 1')["result"]
            # Enough scrapes for a rate over a minute's window to have two samples.
            lost = self.prometheus.api("query", query="count_over_time(gpufleet_gpu_lost[1m])")["result"]
            xids = self.prometheus.api("query", query="gpufleet_xid_errors_total")["result"]
            aggregator = self.prometheus.api("query", query='up{job="gpufleet-aggregator"} == 1')["result"]
            return (
                len(up) == 3
                and len(aggregator) == 1
                and bool(xids)
                and min(float(s["value"][1]) for s in lost) >= 3
            )

        wait_until(scraped, 60, "Prometheus scraping the three collectors and the aggregator")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, influxd: str) -> Iterator[Fleet]:
    cluster = Cluster(tmp_path_factory.mktemp("grafana"))
    f = None
    try:
        f = Fleet(cluster, influxd)
        f.ready()
        yield f
    finally:
        if f is not None:
            f.prometheus.stop()
        cluster.stop_all()


def influx_text(query: str, values: dict[str, str]) -> str:
    text = query.replace("$timeFilter", "time > now() - 15m").replace("$__interval", "2s")
    for name, value in values.items():
        text = text.replace(f"${name}", value)
    return text


def grafana_escape(value: str) -> str:
    """A variable's value as Grafana's InfluxDB datasource puts it into a regex: its special
    characters, the slash that ends an InfluxQL regex among them, escaped."""
    return re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m.group(0), value)


def influx_values(fleet: Fleet, d: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The dashboard's variables, each set as Grafana would: every value ('All': .*) and the
    first value its own query lists (a single-value variable: only that)."""
    all_values: dict[str, str] = {}
    first: dict[str, str] = {}
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        listed = sorted(row[1] for s in fleet.influxql(influx_text(v["query"], first)) for row in s["values"])
        assert listed, f"variable {v['name']} lists no values: {v['query']}"
        first[v["name"]] = grafana_escape(listed[0])
        all_values[v["name"]] = ".*" if v.get("includeAll") else grafana_escape(listed[0])
    return {"all": all_values, "first": first}


@pytest.mark.parametrize(
    "name",
    [
        "gpufleet-fleet.json",
        "gpufleet-node.json",
        "gpufleet-kv-cache.json",
        "gpufleet-xids-repairs.json",
        "gpufleet-workloads.json",
    ],
)
def test_every_influxql_query_returns_data(fleet: Fleet, name: str) -> None:
    d = load(name)
    values = influx_values(fleet, d)
    queries = [(p["title"], q) for p in d["panels"] for q in _queries(p)]
    queries += [(a["name"], a["query"]) for a in d["annotations"]["list"] if not a.get("builtIn")]
    assert queries
    for title, query in queries:
        series = fleet.influxql(influx_text(query, values["all"]))
        rows = [row for s in series for row in s["values"] if any(v is not None for v in row[1:])]
        assert rows, f"{name}: {title!r} returned no data: {influx_text(query, values['all'])}"
        # One value of each variable (one cluster, one model): the query still runs.
        fleet.influxql(influx_text(query, values["first"]))
    if name == "gpufleet-node.json":
        # The node variable's first value is the faulty node: its XID, findings and repairs show.
        assert values["first"]["node"] == grafana_escape(FAULTY)


def test_every_promql_query_and_variable_returns_data(fleet: Fleet) -> None:
    d = load("gpufleet-collector-prometheus.json")
    prom = fleet.prometheus

    def text(query: str) -> str:
        for name in ("cluster", "node", "model"):
            query = query.replace(f"${name}", ".*")
        return query.replace("$__rate_interval", "1m")

    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", text(v["query"]))
        assert m, v["query"]
        listed = prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
        assert listed, f"variable {v['name']} lists no values"
    assert set(prom.api("label/cluster/values", **{"match[]": "gpufleet_gpu_utilization_ratio"})) == {
        "east",
        "west",
    }
    for p in d["panels"]:
        for query in _queries(p):
            result = prom.api("query", query=text(query))["result"]
            assert result, f"{p['title']!r} returned no data: {text(query)}"
    lost = prom.api("query", query=text('sum(gpufleet_gpu_lost{cluster=~"$cluster"})'))["result"]
    assert float(lost[0]["value"][1]) == 1.0, "the lost GPU shows"


# Metrics the rules read that a one-box aggregator with nothing gone wrong does not expose: the
# replicas' control-plane gauges, and a labelled counter before its first count.
NOT_ON_ONE_BOX = {
    "gpufleet_control_plane_lease_errors_total": "aggregator/replication/control_plane.py",
    "gpufleet_control_plane_sync_age_seconds": "aggregator/replication/control_plane.py",
    "gpufleet_alerts_total": "aggregator/repair_wiring.py",
}


def test_alert_rules_load_in_prometheus_and_name_metrics_the_components_expose(fleet: Fleet) -> None:
    groups = fleet.prometheus.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    shipped = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    rules = [r for r in rules if not r["name"].startswith("GPU")]  # dcgm-exporter's rules: below
    assert len(rules) == len(shipped) and all(r["health"] == "ok" for r in rules), rules
    exposed = set(fleet.prometheus.api("label/__name__/values"))
    named = set(re.findall(r"\b(gpufleet_\w+)", RULES.read_text()))
    missing = named - exposed
    assert named and missing <= set(NOT_ON_ONE_BOX), missing - set(NOT_ON_ONE_BOX)
    for name in missing:  # each still spelled as its code defines it
        assert name.removesuffix("_total") in (REPO / NOT_ON_ONE_BOX[name]).read_text(), name
    # The aggregator's own gauges, live: it is ready, it leads repair, and it flags the lost GPU.
    query = fleet.prometheus.api
    assert float(query("query", query="gpufleet_aggregator_ready")["result"][0]["value"][1]) == 1.0
    assert float(query("query", query="sum(gpufleet_repair_leader)")["result"][0]["value"][1]) == 1.0
    wait_until(
        lambda: query("query", query=f'gpufleet_gpu_flagged{{node="{FAULTY}",code="gpu_lost"}}')["result"],
        30,
        "the lost GPU flagged on the aggregator's /metrics",
    )


# --- coming from dcgm-exporter (issue 56) ----------------------------------------------------------
def test_dcgm_exporters_dashboard_and_alert_rules_find_data(fleet: Fleet) -> None:
    """NVIDIA's dcgm-exporter dashboard (grafana.com 12239): every variable lists values and every
    panel's query returns data from collectors serving the DCGM face; the rules fleets run on
    dcgm-exporter's names load, every metric they read has series, and the XID rule finds the
    faulty GPU's XID 79 (DCGM_FI_DEV_XID_ERRORS is the last XID's number, as dcgm-exporter's)."""
    prom = fleet.prometheus
    dashboard = json.loads(DCGM_DASHBOARD.read_text())
    chosen = {"Hostname": ".*", "gpu": ".*"}

    def text(query: str) -> str:
        for name, value in chosen.items():
            query = query.replace(f"${name}", value)
        return query

    for v in dashboard["variables"]:
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", text(v["query"]))
        assert m, v["query"]
        listed = prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
        assert listed, f"variable {v['name']} lists no values: {v['query']}"
    assert set(prom.api("label/Hostname/values", **{"match[]": "DCGM_FI_DEV_FB_FREE"})) == {
        FAULTY,
        "graf-2",
        "graf-3",
    }
    for panel in dashboard["panels"]:
        result = prom.api("query", query=text(panel["expr"]))["result"]
        assert result, f"{panel['title']!r} returned no data: {panel['expr']}"
    # One host's GPUs, as the dashboard's variables would pick them.
    chosen = {"Hostname": "graf-3", "gpu": "0"}
    (temp,) = prom.api("query", query=text(dashboard["panels"][0]["expr"]))["result"]
    assert temp["metric"]["Hostname"] == "graf-3" and 0 < float(temp["value"][1]) < 150, temp

    loaded = [
        r
        for g in prom.api("rules")["groups"]
        for r in g["rules"]
        if g["file"].endswith("dcgm-exporter-rules.yml")
    ]
    written = [r for g in yaml.safe_load(DCGM_RULES.read_text())["groups"] for r in g["rules"]]
    assert len(loaded) == len(written) and all(r["health"] == "ok" for r in loaded), loaded
    for rule in written:
        for name in set(re.findall(r"\bDCGM_FI_\w+", rule["expr"])):
            assert prom.api("query", query=name)["result"], f"{rule['alert']}: no {name} served"
    xid = prom.api("query", query="DCGM_FI_DEV_XID_ERRORS > 0")["result"]
    assert [(s["metric"]["Hostname"], s["metric"]["gpu"], s["value"][1]) for s in xid] == [
        (FAULTY, "1", "79")
    ]
    # The DCGM face's units: framebuffer in MiB, PROF fields 0-1, as dcgm-exporter's.
    used = prom.api("query", query='DCGM_FI_DEV_FB_TOTAL{Hostname="graf-3"}')["result"]
    assert all(100_000 < float(s["value"][1]) < 200_000 for s in used), used  # an H200's 141 GiB in MiB
    active = prom.api("query", query="DCGM_FI_PROF_GR_ENGINE_ACTIVE")["result"]
    assert active and all(0 <= float(s["value"][1]) <= 1 for s in active), active


# promtool's lints that are dcgm-exporter's own names, kept so its queries match: its camelCase
# labels (modelName) and a gauge named ..._COUNTER (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).
DCGM_NAMES_LINTS = (
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
)


def promtool_says(text: str) -> list[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: scripts/install-test-deps.sh installs Debian's prometheus")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    said = [line for line in (lint.stdout + lint.stderr).splitlines() if line.strip()]
    assert lint.returncode == 0 or said, lint
    return said


def scrape(address: str) -> str:
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()


def test_promtool_check_metrics_on_every_metrics_endpoint(fleet: Fleet) -> None:
    """The aggregator's /metrics and the collectors' gpufleet names pass `promtool check metrics`
    with nothing said; the DCGM face draws only the lints of dcgm-exporter's own names."""
    assert promtool_says(scrape(fleet.aggregator_metrics)) == []
    for address in fleet.collector_metrics:
        said = promtool_says(scrape(address))
        gpufleet = [line for line in said if not line.startswith("DCGM_")]
        assert gpufleet == [], gpufleet
        dcgm = {line.split(" ", 1)[1] for line in said if line.startswith("DCGM_")}
        assert dcgm <= set(DCGM_NAMES_LINTS), dcgm


def test_the_aggregator_serves_what_it_declares(fleet: Fleet) -> None:
    """aggregator/declared_metrics.py is the list of what the aggregator exports: every family a
    scrape serves is declared there with the type it is served as, and every declared one is
    served (but a replica's control-plane metrics, which a one-box aggregator has none of)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.aggregator.declared_metrics import DECLARED

    families = text_string_to_metric_families(scrape(fleet.aggregator_metrics))
    served = {f.name: f.type for f in families if f.name.startswith("gpufleet_")}
    # prometheus_client writes each counter's and histogram's creation time beside it, as a
    # gauge NAME_created: part of the declared metric, not a metric of its own.
    served = {n: k for n, k in served.items() if n.removesuffix("_created") not in DECLARED or n in DECLARED}
    undeclared = {name: kind for name, kind in served.items() if name not in DECLARED}
    assert not undeclared, f"served but not declared in aggregator/declared_metrics.py: {undeclared}"
    mistyped = {n: (k, DECLARED[n].kind) for n, k in served.items() if DECLARED[n].kind != k}
    assert not mistyped, mistyped
    replicas_only = {n for n in DECLARED if n.startswith("gpufleet_control_plane_")} | {
        "gpufleet_repair_leader_terms"
    }
    control_plane = (REPO / "aggregator" / "replication" / "control_plane.py").read_text()
    assert all(f'"{n}"' in control_plane for n in replicas_only), "each made by the control plane"
    assert set(DECLARED) - set(served) == replicas_only, set(DECLARED) - set(served)
