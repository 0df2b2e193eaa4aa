"""Write the Grafana dashboards in deploy/grafana/dashboards/ from the panel lists below.

    python scripts/gen_grafana.py            # rewrite deploy/grafana/dashboards/*.json
    python scripts/gen_grafana.py --check    # exit 1 if a committed dashboard is out of date

Four dashboards read the InfluxDB schema (aggregator/ingest/schema.py; InfluxQL through InfluxDB's v1
API, which 1.x, 2.x and 3.x serve) and one reads the collector's Prometheus /metrics
(collector/metrics_endpoint.py). Each query is written once here; tests/project/test_prometheus_grafana.py
runs every one of them against a real influxd and a real Prometheus and checks the JSON's
structure. The JSON is generated rather than hand-edited so a panel cannot lose its datasource
or name a variable that does not exist; Grafana's own export would add a page of defaults per
panel that nobody reviews.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.protos import vocabulary_pb2
from gpufleet.protos.presentation import GPU_HEALTH_COLOURS
from gpufleet.protos.signals import GPU_SIGNALS, charted

OUT = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "dashboards"
INFLUX = {"type": "influxdb", "uid": "${influxdb}"}
PROM = {"type": "prometheus", "uid": "${prometheus}"}
# InfluxQL filters a panel applies for the dashboard's variables.
CLUSTER = '"cluster" =~ /^$cluster$/'
MODEL = '"model" =~ /^$model$/'
NODE = '"node" =~ /^$node$/'
GPU_FILTER = f"$timeFilter AND {CLUSTER} AND {MODEL}"
PROM_SEL = 'cluster=~"$cluster", node=~"$node", model=~"$model"'
PROM_NODE_SEL = 'cluster=~"$cluster", node=~"$node"'
# The signal catalog's units as Grafana's unit ids (a unit not here: a plain number).
GRAFANA_UNITS = {"%": "percent", "bytes": "bytes", "°C": "celsius", "W": "watt", "MHz": "MHz", "s": "s"}


@dataclass
class Panel:
    title: str
    queries: list[str]
    kind: str = "timeseries"  # timeseries | stat | table
    unit: str = ""
    legend: str = ""  # InfluxQL alias ($tag_node) or a Prometheus legend ({{node}})
    description: str = ""
    width: int = 12
    height: int = 8
    table: bool = False  # InfluxQL result as a table (raw rows) rather than time series
    extra: dict[str, Any] = field(default_factory=dict)


def _datasource_var(name: str, plugin: str, label: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "datasource",
        "query": plugin,
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def _query_var(name: str, ds: dict[str, str], query: str, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": ds,
        "query": query,
        "definition": query,
        "refresh": 2,  # on time range change: a new node shows up without reloading
        "multi": multi,
        "includeAll": multi,
        # InfluxQL and PromQL both take the regex: every value, a missing tag ("") too.
        **({"allValue": ".*"} if multi else {}),
        "current": {},
        "sort": 1,
        "hide": 0,
        "regex": "",
        "options": [],
    }


def _panel(p: Panel, pid: int, x: int, y: int, ds: dict[str, str]) -> dict[str, Any]:
    targets = []
    for i, q in enumerate(p.queries):
        ref = chr(ord("A") + i)
        if ds is INFLUX:
            target: dict[str, Any] = {
                "refId": ref,
                "datasource": ds,
                "query": q,
                "rawQuery": True,
                "resultFormat": "table" if p.table else "time_series",
            }
            if p.legend:
                target["alias"] = p.legend
        else:
            target = {"refId": ref, "datasource": ds, "expr": q, "range": p.kind != "table"}
            if p.kind == "table":
                target.update(instant=True, format="table")
            if p.legend:
                target["legendFormat"] = p.legend
        targets.append(target)
    panel: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": ds,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": p.unit} if p.unit else {}, "overrides": []},
        "options": {},
    }
    if p.kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]}
        }
    panel.update(p.extra)
    return panel


def dashboard(
    uid: str,
    title: str,
    description: str,
    ds: dict[str, str],
    variables: list[dict[str, Any]],
    panels: list[Panel],
    annotations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    laid, x, y, row_h = [], 0, 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p.width > 24:
            x, y, row_h = 0, y + row_h, 0
        laid.append(_panel(p, i, x, y, ds))
        x, row_h = x + p.width, max(row_h, p.height)
    plugin, label = ("influxdb", "InfluxDB") if ds is INFLUX else ("prometheus", "Prometheus")
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpufleet"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "links": [{"title": "gpufleet", "type": "dashboards", "tags": ["gpufleet"], "asDropdown": True}],
        "templating": {"list": [_datasource_var(plugin, plugin, label), *variables]},
        "annotations": {"list": [builtin, *(annotations or [])]},
        "panels": laid,
    }


def _influx_vars(measurement: str = "gpu", node: str = "") -> list[dict[str, Any]]:
    out = [
        _query_var("cluster", INFLUX, f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "cluster"'),
        _query_var(
            "model", INFLUX, f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "model" WHERE {CLUSTER}'
        ),
    ]
    if node:
        out.append(
            _query_var(
                "node",
                INFLUX,
                f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "node" WHERE {CLUSTER}',
                False,
            )
        )
    return out


def _repair_annotation(where: str = "") -> dict[str, Any]:
    """Repair actions as annotations on every time series (the control plane's audit, exported)."""
    return {
        "name": "repair actions",
        "datasource": INFLUX,
        "enable": True,
        "iconColor": "#3778bf",
        "query": 'SELECT "reason" AS "text", "outcome" FROM "repair" WHERE $timeFilter' + where,
        "tagsColumn": "action",
        "textColumn": "text",
    }


def fleet_overview() -> dict[str, Any]:
    per_gpu = f'FROM "gpu" WHERE {GPU_FILTER} GROUP BY time($__interval), "cluster", "node", "gpu"'
    return dashboard(
        "gpufleet-fleet",
        "gpufleet / Fleet overview",
        "Every GPU of the fleet from gpufleet's InfluxDB history: utilization, HBM, temperature, power, "
        "lost GPUs and ECC, by cluster and model.",
        INFLUX,
        _influx_vars(),
        [
            Panel(
                "Nodes reporting (last 5 minutes)",
                [
                    'SELECT count("last") FROM (SELECT last("seq") FROM "collector" WHERE time > now() - 5m '
                    f'AND {CLUSTER} GROUP BY "node")'
                ],
                kind="stat",
                width=6,
                height=4,
            ),
            Panel(
                "GPUs reporting (last 5 minutes)",
                [
                    'SELECT count("last") FROM (SELECT last("hbm_total_bytes") FROM "gpu" '
                    "WHERE time > now() - 5m "
                    f'AND {CLUSTER} AND {MODEL} GROUP BY "node", "gpu")'
                ],
                kind="stat",
                width=6,
                height=4,
            ),
            Panel(
                "GPUs lost (last 5 minutes)",
                [
                    'SELECT count("last") FROM (SELECT last("lost") FROM "gpu" WHERE time > now() - 5m '
                    f'AND {CLUSTER} AND {MODEL} AND "lost" = true GROUP BY "node", "gpu")'
                ],
                kind="stat",
                description="GPUs whose newest sample says NVML answers GPU_IS_LOST. No value: none lost.",
                width=6,
                height=4,
            ),
            Panel(
                "Fleet mean GPU utilization",
                [f'SELECT mean("util_gpu_pct") FROM "gpu" WHERE {GPU_FILTER}'],
                kind="stat",
                unit="percent",
                width=6,
                height=4,
            ),
            Panel(
                "GPU utilization by cluster (mean)",
                [
                    f'SELECT mean("util_gpu_pct") FROM "gpu" WHERE {GPU_FILTER} '
                    'GROUP BY time($__interval), "cluster" fill(none)'
                ],
                unit="percent",
                legend="$tag_cluster",
            ),
            Panel(
                "GPU utilization by model (p95)",
                [
                    f'SELECT percentile("util_gpu_pct", 95) FROM "gpu" WHERE {GPU_FILTER} '
                    'GROUP BY time($__interval), "model" fill(none)'
                ],
                unit="percent",
                legend="$tag_model",
            ),
            Panel(
                "HBM in use by cluster",
                [
                    f'SELECT sum("used") FROM (SELECT mean("hbm_used_bytes") AS "used" {per_gpu}) '
                    'WHERE $timeFilter GROUP BY time($__interval), "cluster" fill(none)'
                ],
                unit="bytes",
                legend="$tag_cluster",
            ),
            Panel(
                "Board power by cluster",
                [
                    f'SELECT sum("power") FROM (SELECT mean("power_w") AS "power" {per_gpu}) '
                    'WHERE $timeFilter GROUP BY time($__interval), "cluster" fill(none)'
                ],
                unit="watt",
                legend="$tag_cluster",
            ),
            Panel(
                "Hottest GPU by cluster",
                [
                    f'SELECT max("temp_gpu_c") FROM "gpu" WHERE {GPU_FILTER} '
                    'GROUP BY time($__interval), "cluster" fill(none)'
                ],
                unit="celsius",
                legend="$tag_cluster",
            ),
            Panel(
                "GPU utilization by node (mean)",
                [
                    f'SELECT mean("util_gpu_pct") FROM "gpu" WHERE {GPU_FILTER} '
                    'GROUP BY time($__interval), "node" fill(none)'
                ],
                unit="percent",
                legend="$tag_node",
            ),
            Panel(
                "Uncorrected ECC errors (volatile) by node and GPU",
                [
                    f'SELECT max("ecc_dbe_volatile") FROM "gpu" WHERE {GPU_FILTER} '
                    'GROUP BY time($__interval), "node", "gpu" fill(none)'
                ],
                legend="$tag_node GPU $tag_gpu",
            ),
            Panel(
                "Remapped rows and retired pages by node and GPU (newest)",
                [
                    'SELECT last("remap_correctable") AS "remapped correctable", last("remap_uncorrectable") '
                    'AS "remapped uncorrectable", last("ecc_sbe_aggregate") AS "corrected ECC (lifetime)", '
                    'last("ecc_dbe_aggregate") AS "uncorrected ECC (lifetime)" '
                    f'FROM "gpu" WHERE {GPU_FILTER} GROUP BY "node", "gpu"'
                ],
                kind="table",
                table=True,
            ),
        ],
        [_repair_annotation(f" AND {CLUSTER}")],
    )


def node_drilldown() -> dict[str, Any]:
    def per_gpu(field_: str, agg: str = "mean") -> str:
        return (
            f'SELECT {agg}("{field_}") FROM "gpu" WHERE $timeFilter AND {NODE} '
            'GROUP BY time($__interval), "gpu" fill(none)'
        )

    on_node = f" AND {NODE}"
    return dashboard(
        "gpufleet-node",
        "gpufleet / Node",
        "One node: each GPU's utilization, HBM, temperature, power and clocks, its inference engines, "
        "and its XIDs, health findings and repair actions.",
        INFLUX,
        _influx_vars(node="node"),
        [
            # One panel per charted signal of the catalog (protos/signals.py), as the dashboard's
            # node page charts them; a temperature's panel shows the interval's highest.
            *(
                Panel(
                    s.title[:1].upper() + s.title[1:],
                    [per_gpu(s.field, "max" if s.unit == "°C" else "mean")],
                    unit=GRAFANA_UNITS.get(s.unit, "short"),
                    legend="GPU $tag_gpu",
                    description=s.help,
                )
                for s in charted(GPU_SIGNALS).values()
            ),
            Panel(
                "KV-cache usage of this node's engines",
                [
                    f'SELECT mean("kv_cache_usage_ratio") FROM "engine" WHERE $timeFilter AND {NODE} '
                    'GROUP BY time($__interval), "engine", "port" fill(none)'
                ],
                unit="percentunit",
                legend="$tag_engine:$tag_port",
            ),
            Panel(
                "XIDs and GPU events",
                [
                    'SELECT "gpu", "kind", "xid", "count", "source", "message" FROM "event" '
                    f"WHERE $timeFilter AND {NODE}"
                ],
                kind="table",
                table=True,
                width=24,
            ),
            Panel(
                "Health findings",
                [
                    'SELECT "gpu", "code", "severity", "action", "reason", "evidence", "incident_id" '
                    f'FROM "health" WHERE $timeFilter AND {NODE}'
                ],
                kind="table",
                table=True,
                width=24,
            ),
            Panel(
                "Repair actions",
                [
                    'SELECT "action", "by", "actor", "outcome", "reason", "incident_id" FROM "repair" '
                    f"WHERE $timeFilter AND {NODE}"
                ],
                kind="table",
                table=True,
                width=24,
            ),
        ],
        [_repair_annotation(on_node)],
    )


def kv_cache() -> dict[str, Any]:
    where = f"$timeFilter AND {CLUSTER} AND {MODEL}"
    by_replica = 'GROUP BY time($__interval), "node", "engine", "port" fill(none)'
    return dashboard(
        "gpufleet-kv-cache",
        "gpufleet / KV-cache pressure",
        "Inference engines (vLLM, SGLang, TGI, TensorRT-LLM): KV-cache usage, queues and preemptions "
        "per replica, next to the GPU utilization of the nodes they run on. A replica with a full KV "
        "cache and a queue is KV-bound; one with GPUs at 70 % or more and room in its cache is "
        "compute-bound; one busy under 70 % with room in its cache is light.",
        INFLUX,
        [
            *_influx_vars("engine"),
            {
                **_query_var(
                    "engine_node", INFLUX, f'SHOW TAG VALUES FROM "engine" WITH KEY = "node" WHERE {CLUSTER}'
                ),
                "hide": 2,  # the nodes running engines in the chosen clusters: not a control of its own
            },
        ],
        [
            Panel(
                "KV-cache usage by replica",
                [f'SELECT mean("kv_cache_usage_ratio") FROM "engine" WHERE {where} {by_replica}'],
                unit="percentunit",
                legend="$tag_node $tag_engine:$tag_port",
            ),
            Panel(
                "GPU utilization of nodes running engines",
                [
                    'SELECT mean("util_gpu_pct") FROM "gpu" WHERE $timeFilter AND "node" =~ /^$engine_node$/ '
                    'GROUP BY time($__interval), "node" fill(none)'
                ],
                unit="percent",
                legend="$tag_node",
            ),
            Panel(
                "Requests waiting by replica",
                [f'SELECT mean("requests_waiting") FROM "engine" WHERE {where} {by_replica}'],
                legend="$tag_node $tag_engine:$tag_port",
            ),
            Panel(
                "Requests running by replica",
                [f'SELECT mean("requests_running") FROM "engine" WHERE {where} {by_replica}'],
                legend="$tag_node $tag_engine:$tag_port",
            ),
            Panel(
                "Preemptions per minute by replica",
                [
                    'SELECT non_negative_derivative(max("preemptions_total"), 1m) FROM "engine" '
                    f"WHERE {where} {by_replica}"
                ],
                legend="$tag_node $tag_engine:$tag_port",
            ),
            Panel(
                "Prefix-cache hit ratio by replica",
                [f'SELECT mean("prefix_cache_hit_ratio") FROM "engine" WHERE {where} {by_replica}'],
                unit="percentunit",
                legend="$tag_node $tag_engine:$tag_port",
            ),
            Panel(
                "Replicas now: KV-cache usage and queue (last 5 minutes)",
                [
                    'SELECT last("kv_cache_usage_ratio") AS "KV-cache usage", last("requests_waiting") AS '
                    '"waiting", last("requests_running") AS "running" FROM "engine" WHERE time > now() - 5m '
                    f'AND {CLUSTER} AND {MODEL} GROUP BY "node", "engine", "model", "port"'
                ],
                kind="table",
                table=True,
                width=24,
            ),
        ],
    )


# Counts per interval: the legend's table shows each series' total over the range.
SUM_LEGEND = {"options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["sum"]}}}


def xids_and_repairs() -> dict[str, Any]:
    where = f"$timeFilter AND {CLUSTER}"
    return dashboard(
        "gpufleet-xids-repairs",
        "gpufleet / XIDs and repairs",
        "What went wrong and what was done: XIDs (storms folded into counts), lost GPUs, health "
        "findings and every repair action, automatic or by hand, from gpufleet's history.",
        INFLUX,
        _influx_vars("event")[:1],
        [
            Panel(
                "XIDs per interval by node (storms counted in full)",
                [
                    f'SELECT sum("count") FROM "event" WHERE {where} AND "kind" = \'xid\' '
                    'GROUP BY time($__interval), "node" fill(none)'
                ],
                legend="$tag_node",
                extra=SUM_LEGEND,
            ),
            Panel(
                "Repair actions per interval by action",
                [
                    f'SELECT count("outcome") FROM "repair" WHERE {where} '
                    'GROUP BY time($__interval), "action" fill(none)'
                ],
                legend="$tag_action",
                extra=SUM_LEGEND,
            ),
            Panel(
                "XIDs",
                [
                    'SELECT "node", "gpu", "xid", "count", "source", "message" FROM "event" '
                    f"WHERE {where} AND \"kind\" = 'xid'"
                ],
                kind="table",
                table=True,
                width=24,
            ),
            Panel(
                "GPUs lost and recovered, engines unreadable",
                [
                    'SELECT "node", "gpu", "kind", "message" FROM "event" '
                    f'WHERE {where} AND "kind" =~ /^(gpu_lost|gpu_recovered|engine_unreadable)$/'
                ],
                kind="table",
                table=True,
                width=24,
            ),
            Panel(
                "Health findings",
                [
                    'SELECT "node", "gpu", "code", "severity", "action", "reason", "evidence", "incident_id" '
                    f'FROM "health" WHERE {where}'
                ],
                kind="table",
                table=True,
                width=24,
            ),
            Panel(
                "Repair actions (automatic and by hand)",
                [
                    'SELECT "node", "action", "by", "actor", "result", "outcome", "reason", "incident_id" '
                    f'FROM "repair" WHERE {where}'
                ],
                kind="table",
                table=True,
                width=24,
            ),
        ],
        [_repair_annotation(f" AND {CLUSTER}")],
    )


def gpu_health_mappings() -> dict[str, Any]:
    """gpufleet_gpu_health's level as its word, in the colour every screen gives it
    (protos/presentation.py): Grafana's value mappings, so a panel reads "faulty" in vermillion as
    the dashboard and `gpufleet node` do, not 4."""
    options = {
        str(vocabulary_pb2.GpuHealth.Value(f"GPU_HEALTH_{word.upper()}")): {
            "text": word,
            "color": colour,
            "index": i,
        }
        for i, (word, colour) in enumerate(GPU_HEALTH_COLOURS.items())
    }
    return {
        "fieldConfig": {
            "defaults": {
                "mappings": [{"type": "value", "options": options}],
                "color": {"mode": "fixed", "fixedColor": "text"},
                "custom": {"cellOptions": {"type": "color-text"}},
            },
            "overrides": [],
        }
    }


def collector_prometheus() -> dict[str, Any]:
    metric = "gpufleet_gpu_utilization_ratio"
    variables = [
        _query_var("cluster", PROM, f"label_values({metric}, cluster)"),
        _query_var("node", PROM, f'label_values({metric}{{cluster=~"$cluster"}}, node)'),
        _query_var("model", PROM, f'label_values({metric}{{cluster=~"$cluster"}}, model)'),
    ]
    return dashboard(
        "gpufleet-collector",
        "gpufleet / Collectors (Prometheus)",
        "The gpufleet collector's /metrics as Prometheus scrapes it (job gpufleet-collector): GPUs, "
        "XIDs, inference engines and the collectors' own health; and each GPU's health as the "
        "aggregator words it (job gpufleet-aggregator, gpufleet_gpu_health).",
        PROM,
        variables,
        [
            Panel(
                "GPUs not ok (the aggregator's GPU health)",
                [f"max by (cluster, node, gpu, health) (gpufleet_gpu_health{{{PROM_NODE_SEL}}})"],
                kind="table",
                description="Every GPU whose health is not ok, in the word and colour `gpufleet node` and "
                "the dashboard's node page use (watch, suspect, faulty, lost); from the repair leader's "
                "/metrics. A GPU that reads ok is not listed.",
                width=12,
                extra=gpu_health_mappings(),
            ),
            Panel(
                "GPU health over time",
                [f"max by (node, gpu) (gpufleet_gpu_health{{{PROM_NODE_SEL}}})"],
                kind="state-timeline",
                legend="{{node}} GPU {{gpu}}",
                description="When each GPU left ok, and what it was; gaps are ok.",
                width=12,
                extra=gpu_health_mappings(),
            ),
            Panel(
                "GPU utilization by node",
                [f"avg by (node) ({metric}{{{PROM_SEL}}})"],
                unit="percentunit",
                legend="{{node}}",
            ),
            Panel(
                "HBM in use by node",
                [
                    f"sum by (node) (gpufleet_gpu_hbm_used_bytes{{{PROM_SEL}}}) / "
                    f"sum by (node) (gpufleet_gpu_hbm_total_bytes{{{PROM_SEL}}})"
                ],
                unit="percentunit",
                legend="{{node}}",
            ),
            Panel(
                "Hottest GPU by node",
                [f"max by (node) (gpufleet_gpu_temperature_celsius{{{PROM_SEL}}})"],
                unit="celsius",
                legend="{{node}}",
            ),
            Panel(
                "Board power by node",
                [f"sum by (node) (gpufleet_gpu_power_watts{{{PROM_SEL}}})"],
                unit="watt",
                legend="{{node}}",
            ),
            Panel(
                "GPUs lost",
                [f"sum(gpufleet_gpu_lost{{{PROM_SEL}}})"],
                kind="stat",
                width=6,
                height=4,
            ),
            Panel(
                "GPUs in thermal slowdown",
                [f"sum(gpufleet_gpu_thermal_slowdown{{{PROM_SEL}}})"],
                kind="stat",
                width=6,
                height=4,
            ),
            Panel(
                "GPUs waiting for a reset (row remap or page retirement pending)",
                [f"sum(gpufleet_gpu_remapped_rows_pending{{{PROM_SEL}}})"],
                kind="stat",
                width=6,
                height=4,
            ),
            Panel(
                "Collectors up",
                ['sum(up{job="gpufleet-collector"})'],
                kind="stat",
                width=6,
                height=4,
            ),
            Panel(
                "XIDs by node and XID",
                [
                    "sum by (node, xid) "
                    f"(increase(gpufleet_xid_errors_total{{{PROM_NODE_SEL}}}[$__rate_interval]))"
                ],
                legend="{{node}} XID {{xid}}",
            ),
            Panel(
                "Uncorrected ECC errors (volatile) by node and GPU",
                [f"max by (node, gpu) (gpufleet_gpu_ecc_uncorrected_volatile_total{{{PROM_SEL}}})"],
                legend="{{node}} GPU {{gpu}}",
            ),
            Panel(
                "KV-cache usage by replica",
                [f"max by (node, engine, port) (gpufleet_engine_kv_cache_usage_ratio{{{PROM_NODE_SEL}}})"],
                unit="percentunit",
                legend="{{node}} {{engine}}:{{port}}",
            ),
            Panel(
                "Requests waiting by replica",
                [f"sum by (node, engine, port) (gpufleet_engine_requests_waiting{{{PROM_NODE_SEL}}})"],
                legend="{{node}} {{engine}}:{{port}}",
            ),
            Panel(
                "Collector: reports waiting for the aggregator's acknowledgement",
                [f"max by (node) (gpufleet_collector_unacked_reports{{{PROM_NODE_SEL}}})"],
                legend="{{node}}",
            ),
            Panel(
                "Collector: time to sample all GPUs",
                [f"max by (node) (gpufleet_collector_sample_duration_seconds{{{PROM_NODE_SEL}}})"],
                unit="s",
                legend="{{node}}",
            ),
            Panel(
                "Collector: reconnects and NVML errors per second",
                [
                    "sum by (node) "
                    f"(rate(gpufleet_collector_reconnects_total{{{PROM_NODE_SEL}}}[$__rate_interval]))",
                    "sum by (node) "
                    f"(rate(gpufleet_collector_nvml_errors_total{{{PROM_NODE_SEL}}}[$__rate_interval]))",
                ],
                legend="{{node}}",
                width=24,
            ),
        ],
    )


def workloads() -> dict[str, Any]:
    """Owners of the GPUs (docs/workloads.md): the owner series the aggregator writes at each
    scheduler read (owner_account, owner_team: bounded, never a user or a job) and the summary of
    each workload that ended (the `workload` measurement)."""

    def by(dimension: str, field_: str, agg: str = "mean") -> str:
        return (
            f'SELECT {agg}("{field_}") FROM "owner_{dimension}" WHERE $timeFilter '
            f'GROUP BY time($__interval), "{dimension}" fill(none)'
        )

    return dashboard(
        "gpufleet-workloads",
        "gpufleet / Workloads",
        "Whose work is on the GPUs: GPUs allocated and their utilization by account and by team (the "
        "scheduler's owners, read by the aggregator), and GPU-hours and efficiency of the workloads that "
        "ended in the range. User names are in the ended workloads' table: Grafana's own permissions "
        "decide who may open this dashboard.",
        INFLUX,
        [],
        [
            Panel("GPUs allocated by account", [by("account", "gpus_allocated")], legend="$tag_account"),
            Panel(
                "GPU utilization by account",
                [by("account", "util_gpu_pct")],
                unit="percent",
                legend="$tag_account",
            ),
            Panel("GPUs allocated by team", [by("team", "gpus_allocated")], legend="$tag_team"),
            Panel(
                "GPU utilization by team", [by("team", "util_gpu_pct")], unit="percent", legend="$tag_team"
            ),
            Panel(
                "GPU-hours by account (workloads that ended in the range)",
                [
                    'SELECT sum("gpu_hours_allocated") AS "GPU-h allocated", sum("gpu_hours_effective") AS '
                    '"GPU-h effective", sum("gpu_hours_idle") AS "GPU-h idle" FROM "workload" '
                    'WHERE $timeFilter GROUP BY "account"'
                ],
                kind="table",
                table=True,
                width=24,
            ),
            Panel(
                "Workloads that ended in the range",
                [
                    'SELECT "id", "user", "name", "nodes", "gpus", "gpu_hours_allocated", "util_mean_pct", '
                    '"hbm_peak_bytes" FROM "workload" WHERE $timeFilter GROUP BY "account", "team"'
                ],
                kind="table",
                table=True,
                width=24,
            ),
        ],
    )


DASHBOARDS = {
    "gpufleet-fleet.json": fleet_overview,
    "gpufleet-node.json": node_drilldown,
    "gpufleet-kv-cache.json": kv_cache,
    "gpufleet-xids-repairs.json": xids_and_repairs,
    "gpufleet-collector-prometheus.json": collector_prometheus,
    "gpufleet-workloads.json": workloads,
}


def render() -> dict[str, str]:
    return {
        name: json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for name, build in DASHBOARDS.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard is out of date")
    args = parser.parse_args()
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/gen_grafana.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
