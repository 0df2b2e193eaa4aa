"""What the dashboard shows, as pandas frames built from Fleet API answers. Kept apart from
the Streamlit pages so it is plain, testable code."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from gpufleet.client.present import (
    EVENT_COLUMNS,
    GIB,
    describe_projection,
    event_row,
    every_replica,
    finite,
    gpu_health,
    health_said,
    incident_work_label,
    incident_workload_row,
    node_row,
    opt,
    series_label,
    usage_row,
    varying_tags,
    waste_row,
    workload_row,
)
from gpufleet.client.timeparse import iso
from gpufleet.protos import fleet_pb2, vocabulary_pb2
from gpufleet.protos.names import (
    CAPACITY_WAIT_PREFIX,
    OUT_OF_SERVICE_STATES,
    action_name,
    health_name,
    liveness_name,
    severity_name,
)
from gpufleet.protos.presentation import (
    NODE_STATE_COLOURS,
    NODE_STATE_MEANING,
    OUT_OF_SERVICE_MEANING,
    STEP_STATES,
    node_state,
)
from gpufleet.protos.signals import GPU_SIGNALS, Signal

# The heat map's choices: the catalog's heat signals by their chart's label, and HBM in use as a
# share of the GPU's (derived here, in gpus_frame).
_HEAT_SIGNALS = [s for s in GPU_SIGNALS.values() if s.heat]
HEAT_METRICS = {
    **{s.chart_label: s.field for s in _HEAT_SIGNALS[:1]},
    "HBM used %": "hbm_used_pct",
    **{s.chart_label: s.field for s in _HEAT_SIGNALS[1:]},
}

# The states every page colours nodes by (protos/presentation.py), as every surface says them.
STATES = list(NODE_STATE_COLOURS)


def display_state(n: fleet_pb2.NodeSummary) -> str:
    return node_state(health_name(n.health), silent=n.liveness == vocabulary_pb2.LIVENESS_SILENT)


# The overview table: what an SRE scans a fleet for, narrow enough to fit a 1,600-px window
# (HBM as a percentage; the GPU model is the model filter's and the heat map tooltip's, and the
# node page's); each column says what it holds on hover.
NODE_COLUMNS = {
    "node": "The node's name, as its collector reports it.",
    "cluster": "The cluster label its collector reports.",
    "state": "The node's state at a glance: " + NODE_STATE_MEANING + ".",
    "workflow": "The repair workflow's own state for the node (gpufleet repair status).",
    "detail": "What the workflow is doing or waiting for.",
    "GPUs": "GPUs on the node.",
    "GPUs lost": "GPUs that fell off the bus (NVML no longer sees them).",
    "util %": "Mean GPU utilization of the GPUs reporting it (time busy, not work done).",
    "HBM used %": "HBM in use across the node's GPUs, as a percentage of their total.",
    "max temp °C": "The hottest GPU's temperature.",
    "power W": "Board power of all its GPUs together.",
    "last report": "When the aggregator last heard from its collector (UTC).",
    "lemon": "A lemon node: its incidents recur (the repair policy's repeat_offender_incidents or more "
    "within repeat_offender_days). With lemon_quarantine on, its next incident quarantines it "
    "instead of trying the repair ladder again: a person decides.",
}


# The workflow's own state word (not shown: the table says it as "workflow"), for the figures.
WORKFLOW_STATE = "workflow state"


def nodes_frame(resp: fleet_pb2.ListNodesResponse) -> pd.DataFrame:
    rows = []
    for n in resp.nodes:
        r = node_row(n)
        used, total = r["hbm_used_bytes"], r["hbm_total_bytes"]
        rows.append(
            {
                "node": r["node"],
                "cluster": r["cluster"],
                "state": display_state(n),
                "workflow": health_said(r["health"], r["health_detail"]),
                "detail": r["health_detail"],
                "GPUs": r["gpu_count"],
                "GPUs lost": r["gpus_lost"],
                "util %": _rounded(r["util_gpu_mean_pct"], 1),
                "HBM used %": round(100 * used / total, 1) if used is not None and total else None,
                "max temp °C": _rounded(r["temp_gpu_max_c"], 0),
                "power W": _rounded(r["power_w"], 0),
                "last report": pd.Timestamp(r["last_report"]) if r["last_report"] else pd.NaT,
                # Flagged when its incidents recur (repair policy: repeat_offender_*).
                "lemon": f"yes: {r['recent_incidents']} recent incidents" if r["lemon"] else "",
                WORKFLOW_STATE: r["health"],
            }
        )
    return pd.DataFrame(rows, columns=[*NODE_COLUMNS, WORKFLOW_STATE])


def gpus_frame(resp: fleet_pb2.ListNodesResponse) -> pd.DataFrame:
    """One row per GPU: the heat map's cells. Absent values stay NaN (shown as gaps)."""
    rows = []
    for n in resp.nodes:
        state = display_state(n)
        for g in n.gpus:
            used, total = opt(g, "hbm_used_bytes"), opt(g, "hbm_total_bytes")
            rows.append(
                {
                    "node": n.node,
                    "cluster": n.cluster,
                    "state": state,
                    "workflow": health_name(n.health),
                    "liveness": liveness_name(n.liveness),
                    "gpu": g.index,
                    "model": g.model,
                    "uuid": g.uuid,
                    "lost": g.lost,
                    "hbm_used_pct": 100 * used / total if used is not None and total else None,
                    **{s.field: opt(g, s.field) for s in _HEAT_SIGNALS},
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "node",
            "cluster",
            "state",
            "workflow",
            "liveness",
            "gpu",
            "model",
            "uuid",
            "lost",
            *HEAT_METRICS.values(),
        ],
    )


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else round(100 * ratio, 1)


def _shown(g: object, signal: Signal) -> float | None:
    """A signal as its node-table column shows it: in the column's unit, rounded; absent: empty."""
    value = opt(g, signal.field)
    return None if value is None else round(value * signal.label_scale, signal.decimals)


# The signal catalog's columns (protos/signals.py: label, unit, rounding), in its order.
_SIGNAL_COLUMNS = [s for s in GPU_SIGNALS.values() if s.label]


def node_gpus_table(summary: fleet_pb2.NodeSummary, owners: dict[int, str] | None = None) -> pd.DataFrame:
    """The node page's GPU table: people's column names, units in them, sensible rounding;
    absent values stay empty (never 0). owners: each GPU's workload (`slurm:1234 (account)`),
    a column after health when a scheduler is read (a GPU no workload holds: empty)."""
    rows = []
    health = gpu_health(summary)
    for g in summary.gpus:
        used, total = opt(g, "hbm_used_bytes"), opt(g, "hbm_total_bytes")
        rows.append(
            {
                "GPU": g.index,
                "model": g.model,
                "UUID": g.uuid,
                "PCI bus": g.pci_bus_id,
                "health": health.get(g.index),
                **{s.label: _shown(g, s) for s in _SIGNAL_COLUMNS},
                "HBM used %": round(100 * used / total, 1) if used is not None and total else None,
                "workload": (owners or {}).get(g.index),
            }
        )
    columns = (
        NODE_GPU_COLUMNS if owners is None else [*NODE_GPU_COLUMNS[:2], "workload", *NODE_GPU_COLUMNS[2:]]
    )
    return pd.DataFrame(rows, columns=columns)


GPU_TABLE_HELP = {
    **{s.label: s.help[0].upper() + s.help[1:] + "." for s in _SIGNAL_COLUMNS},
    "health": "The GPU's health as the aggregator derives it (repair/gpu_health.py) from the findings "
    "it holds, the node's open incident and the GPU's last sample: ok, watch (a signal raised), "
    "suspect, faulty (a critical finding open), lost (off the bus); then what raised it. The same "
    "word as `gpufleet node` and Grafana. N/A: the aggregator gave no state, never read as ok.",
    "GPU util %": "Time the GPU was busy over the sample period (NVML utilization), not work done.",
    "HBM used %": "HBM in use as a percentage of the GPU's total.",
    "workload": "The job or pod the scheduler allocated this GPU to, with its account or namespace "
    "(docs/workloads.md); empty: no workload holds it.",
    "SMs active %": "Share of the SMs busy over the sample period (GPM, Hopper and later): work, "
    "where GPU util % is only time. Empty on GPUs without GPM.",
    "tensor active %": "Share of the sample period the SMs ran tensor-core work (GPM). Empty on "
    "GPUs without GPM.",
}
# What an SRE reads first first: which GPU, its health, its load; its identity last.
_HBM_TOTAL = GPU_SIGNALS["hbm_total_bytes"].label
NODE_GPU_COLUMNS = ["GPU", "health", "model"]
for _signal in _SIGNAL_COLUMNS:
    NODE_GPU_COLUMNS.append(_signal.label)
    if _signal.label == _HBM_TOTAL:
        NODE_GPU_COLUMNS.append("HBM used %")
NODE_GPU_COLUMNS += ["UUID", "PCI bus"]
# The node page's GPU table at a glance: which GPU, its health and owner, its load, heat and power,
# narrow enough for a 1,600-px window; every other column is in the full table behind it.
NODE_GPU_GLANCE = [
    "GPU",
    "health",
    "workload",
    *(GPU_SIGNALS[f].label for f in ("util_gpu_pct", "sm_active_pct", "temp_gpu_c", "power_w")),
    "HBM used %",
    "model",
]


HEADLINE_HELP = {
    "nodes out of service": OUT_OF_SERVICE_MEANING,
    "GPUs out of service": "The GPUs on the nodes out of service. " + OUT_OF_SERVICE_MEANING,
    "GPUs in repair": "Of the GPUs out of service, those on nodes draining, in repair or validating.",
    "GPUs silent": "GPUs on nodes whose collector is not heard from (and not out of service).",
}


def headline(nodes: pd.DataFrame, gpus: pd.DataFrame) -> dict[str, object]:
    """The overview's figures. "Out of service" has one meaning on every surface: a node whose
    workflow state is one of OUT_OF_SERVICE_STATES (cordoned by the automation or a person,
    draining, in repair, validating, quarantined) — the repair cap's count, which the Repairs
    page and `gpufleet breaker status` show in nodes; here also the GPUs on those nodes (of
    them, those in repair). A silent node's GPUs are neither in service nor out: nothing is heard
    from them. The fleet's mean utilization is of the GPUs that report it (absent is not 0)."""
    out_nodes = int(nodes[WORKFLOW_STATE].isin(OUT_OF_SERVICE_STATES).sum())
    if gpus.empty:
        out = in_repair = silent = 0
    else:
        out_of_service = gpus["workflow"].isin(OUT_OF_SERVICE_STATES)
        out = int(out_of_service.sum())
        in_repair = int((gpus["state"] == "in repair").sum())
        silent = int(((gpus["state"] == "silent") & ~out_of_service).sum())
    util = gpus["util_gpu_pct"].mean() if not gpus.empty else float("nan")
    return {
        "nodes": len(nodes),
        "nodes out of service": out_nodes,
        "GPUs in service": int(len(gpus) - out - silent),
        "GPUs out of service": out,
        "GPUs in repair": in_repair,
        "GPUs silent": silent,
        "fleet mean utilization": None if pd.isna(util) else float(util),
    }


# --- inference ----------------------------------------------------------------------
# The pools, each replica's load class and the rule for it are the aggregator's
# (aggregator/fleet/pools.py, repair/serving.py): the page shows them as given.
REPLICA_COLUMNS = [
    "node",
    "engine",
    "model",
    "cluster",
    "port",
    "GPUs",
    "state",
    "GPU util %",
    "KV %",
    "running",
    "waiting",
    "preemptions",
    "class",
    "status",
]
POOL_COLUMNS = [
    "cluster",
    "model",
    "serving",
    "draining",
    "out",
    "KV mean %",
    "KV max %",
    "running",
    "waiting",
    "preemptions/s",
    "KV if one leaves %",
    "headroom replicas",
    "repairs waiting",
]


def if_drained_lines(detail: fleet_pb2.NodeDetail) -> list[str]:
    """What draining this node would do to each serving pool it is in, one line each."""
    return [f"If drained: {describe_projection(d)}" for d in detail.if_drained]


def waiting_frame(status: fleet_pb2.RepairStatus) -> pd.DataFrame:
    """The nodes whose drain waits for serving capacity, and what for (the rail's own words)."""
    rows = [
        {
            "node": n.node,
            "incident": n.incident_id,
            "waiting for": n.detail.removeprefix(CAPACITY_WAIT_PREFIX),
        }
        for n in status.nodes
        if n.detail.startswith(CAPACITY_WAIT_PREFIX)
    ]
    return pd.DataFrame(rows, columns=["node", "incident", "waiting for"])


def pools_frame(resp: fleet_pb2.ListPoolsResponse) -> pd.DataFrame:
    """One row per serving pool (one model in one cluster), every figure the aggregator's."""
    rows = [
        {
            "cluster": p.cluster,
            "model": p.model,
            "serving": p.replicas_serving,
            "idle": p.replicas_idle,
            "draining": p.replicas_draining,
            "out": p.replicas_out,
            "KV mean %": _percent(opt(p, "kv_cache_usage_mean_ratio")),
            "KV max %": _percent(opt(p, "kv_cache_usage_max_ratio")),
            "running": opt(p, "requests_running"),
            "waiting": opt(p, "requests_waiting"),
            "preemptions/s": _rounded(opt(p, "preemptions_per_s"), 2),
            "KV if one leaves %": _percent(finite(opt(p, "kv_cache_usage_if_one_leaves_ratio"))),
            "headroom replicas": p.headroom_replicas,
            "repairs waiting": ", ".join(p.nodes_waiting),
        }
        for p in resp.pools
    ]
    return pd.DataFrame(rows, columns=POOL_COLUMNS)


def replicas_frame(resp: fleet_pb2.ListPoolsResponse) -> pd.DataFrame:
    """One row per engine replica in the fleet (those no declared pool places too, their state
    "unverified"), with its GPUs' mean utilization and the load class the aggregator gave it."""
    rows = [
        {
            "node": r.node,
            "engine": r.engine,
            "model": model,
            "cluster": cluster,
            "port": r.port,
            "GPUs": ",".join(str(i) for i in r.gpu_indices),
            "state": r.state,
            "GPU util %": _rounded(opt(r, "gpu_util_pct"), 1),
            "KV %": _percent(opt(r, "kv_cache_usage_ratio")),
            "running": opt(r, "requests_running"),
            "waiting": opt(r, "requests_waiting"),
            "preemptions": opt(r, "preemptions_total"),
            "class": r.load_class,
            "status": f"unreadable: {r.unreadable_reason}" if r.load_class == "unreadable" else "ok",
        }
        for cluster, model, r in every_replica(resp)
    ]
    return pd.DataFrame(rows, columns=REPLICA_COLUMNS)


def engines_frame(engines: list) -> pd.DataFrame:
    """One node's replicas; unreadable ones show why, and absent values stay empty."""
    return pd.DataFrame(
        [
            {
                "engine": e.engine,
                "model": e.model,
                "port": e.port,
                "GPUs": ",".join(str(i) for i in e.gpu_indices),
                "KV %": _percent(opt(e, "kv_cache_usage_ratio")),
                "running": opt(e, "requests_running"),
                "waiting": opt(e, "requests_waiting"),
                "preemptions": opt(e, "preemptions_total"),
                "prefix-cache hit %": _percent(opt(e, "prefix_cache_hit_ratio")),
                "status": "ok" if e.readable else f"unreadable: {e.unreadable_reason}",
            }
            for e in engines
        ]
    )


# --- history --------------------------------------------------------------------------
def history_frame(resp: fleet_pb2.HistoryResponse) -> pd.DataFrame:
    """Long format: time, series label, value, plus every tag as a column (for CSV). A grouped
    answer's series are named by their group (`east`, `east/H100`)."""
    varying = varying_tags([dict(s.tags) for s in resp.series])
    rows = []
    for s in resp.series:
        tags = dict(s.tags)
        label = series_label(tags, varying)
        for t, v in zip(s.times_unix_ns, s.values, strict=True):
            # Three decimals: enough for a ratio, plenty for a percentage (the CSV keeps all).
            rows.append({"time": pd.Timestamp(iso(t)), "series": label, resp.metric: round(v, 3), **tags})
    return pd.DataFrame(rows)


def top_series(
    frame: pd.DataFrame, metric: str, count: int, lowest: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The count series of a history frame with the highest (or lowest) mean over the range,
    and the rest folded into one band: their smallest and largest value per step. Returns the
    drawn series' rows, the band (time, min, max; empty when nothing is left over) and the
    drawn series' names, first the most extreme."""
    means = frame.groupby("series")[metric].mean().sort_values(ascending=lowest, kind="stable")
    drawn = list(means.index[:count])
    chosen = frame["series"].isin(drawn)
    rest = frame[~chosen]
    if rest.empty:
        return frame[chosen], pd.DataFrame(columns=["time", "min", "max"]), drawn
    band = rest.groupby("time")[metric].agg(["min", "max"]).reset_index()
    return frame[chosen], band, drawn


def band_frame(low: fleet_pb2.HistoryResponse, high: fleet_pb2.HistoryResponse) -> pd.DataFrame:
    """Each group's min and max per step, side by side: the band drawn around its line."""
    lows, highs = history_frame(low), history_frame(high)
    if lows.empty or highs.empty:
        return pd.DataFrame(columns=["time", "series", "min", "max"])
    lows = lows[["time", "series", low.metric]].rename(columns={low.metric: "min"})
    highs = highs[["time", "series", high.metric]].rename(columns={high.metric: "max"})
    return lows.merge(highs, on=["time", "series"])


def events_frame(events: list[fleet_pb2.HistoryEvent]) -> pd.DataFrame:
    """Stored events (QueryEvents) as the node page lists and marks them, oldest first."""
    rows = []
    for e in events:
        row = event_row(e)
        row["time"] = pd.Timestamp(row["time"])
        rows.append(row)
    return pd.DataFrame(rows, columns=EVENT_COLUMNS)


# --- repairs --------------------------------------------------------------------------
def incidents_frame(incidents: list[fleet_pb2.Incident]) -> pd.DataFrame:
    rows = []
    for i in incidents:
        worst = max(i.findings, key=lambda f: f.severity, default=None)
        rows.append(
            {
                "incident": i.id,
                "node": i.node,
                "workflow": health_name(i.state) if i.open else "closed",
                "opened": pd.Timestamp(iso(i.opened_unix_ns)),
                "closed": pd.Timestamp(iso(i.closed_unix_ns)) if i.closed_unix_ns else pd.NaT,
                "severity": severity_name(worst.severity) if worst else "",
                "findings": ", ".join(
                    f.code + ("" if not f.HasField("gpu_index") else f" (GPU {f.gpu_index})")
                    for f in i.findings
                ),
                "action": action_name(worst.action) if worst else "",
                "outcome": i.outcome,
                "steps": len(i.actions),
                # Whose work the fault hit, as `gpufleet incidents` says it (WORK HIT).
                "work hit": incident_work_label([incident_workload_row(w) for w in i.workloads]),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "incident",
            "node",
            "workflow",
            "opened",
            "closed",
            "severity",
            "findings",
            "action",
            "outcome",
            "steps",
            "work hit",
        ],
    )


# Audited steps that changed the node: begun (started, ok, observed), not held, refused or dry.
_STEP_TOOK = {
    vocabulary_pb2.OUTCOME_STATUS_STARTED,
    vocabulary_pb2.OUTCOME_STATUS_OK,
    vocabulary_pb2.OUTCOME_STATUS_OBSERVED,
    vocabulary_pb2.OUTCOME_STATUS_UNKNOWN,
}


def incident_segments(incidents: list[fleet_pb2.Incident], now: pd.Timestamp) -> pd.DataFrame:
    """The incident timeline: each incident as the node states it went through, from its audited
    steps (protos/presentation.py STEP_STATES): suspect until its first step, cordoned from its
    cordon (a wait for serving capacity stays cordoned), in repair from its drain, and so on, to
    its close (or now, while open). An open incident's last segment is its state now."""
    rows = []
    for i in incidents:
        start = pd.Timestamp(iso(i.opened_unix_ns))
        end = pd.Timestamp(iso(i.closed_unix_ns)) if i.closed_unix_ns else now
        changes: list[tuple[pd.Timestamp, str]] = [(start, "suspect")]
        for e in sorted(i.actions, key=lambda e: e.time_unix_ns):
            word = STEP_STATES.get(e.action)
            if word and e.status in _STEP_TOOK and word != changes[-1][1]:
                changes.append((max(start, pd.Timestamp(iso(e.time_unix_ns))), word))
        if i.open and (now_word := node_state(health_name(i.state))) != changes[-1][1]:
            # A change no step audited (a person's, a validation): from the incident's last entry.
            last = max((e.time_unix_ns for e in i.actions), default=i.opened_unix_ns)
            changes.append((max(changes[-1][0], pd.Timestamp(iso(last))), now_word))
        for (at, word), (until, _) in zip(changes, [*changes[1:], (end, "")], strict=True):
            if until <= at and word != changes[-1][1]:
                continue  # a state left within the second it began: nothing to draw
            rows.append(
                {
                    "incident": i.id,
                    "node": i.node,
                    "node state": word,
                    "from": at,
                    "until": max(at, until),
                    "open": "open" if i.open else "closed",
                }
            )
    return pd.DataFrame(rows, columns=["incident", "node", "node state", "from", "until", "open"])


def audit_frame(entries: list[fleet_pb2.AuditEntry]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "time": pd.Timestamp(iso(e.time_unix_ns)),
                "who": e.actor,
                "node": e.node,
                "action": e.action,
                "outcome": e.outcome,
                "why": e.reason,
                "incident": e.incident_id,
            }
            for e in entries
        ],
        columns=["time", "who", "node", "action", "outcome", "why", "incident"],
    )


def queue_frame(status: fleet_pb2.RepairStatus) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "node": n.node,
                "workflow": health_name(n.state),
                "incident": n.incident_id,
                "detail": n.detail,
                "findings": ", ".join(f.code for f in n.findings),
            }
            for n in status.nodes
            if health_name(n.state) != "healthy"
        ],
        columns=["node", "workflow", "incident", "detail", "findings"],
    )


# --- workloads (docs/workloads.md) ---------------------------------------------------------
WORKLOAD_COLUMNS = {
    "workload": "workload",
    "user": "user",
    "account": "account",
    "name": "name",
    "nodes": "nodes",
    "gpus": "GPUs",
    "start": "start",
    "end": "end",
    "gpu_hours_allocated": "GPU-h allocated",
    "gpu_hours_effective": "GPU-h effective",
    "efficiency_pct": "efficiency %",
    "util_mean_pct": "util mean %",
    "hbm_peak_bytes": "HBM peak GiB",
    "cost_allocated": "cost allocated",
}


# Left out of the running and ended tables so they fit a 1,600-px window: efficiency % says the
# effective GPU-hours' share, and a workload's report below them has each (HBM peak per GPU).
WORKLOAD_DETAIL_ONLY = [
    WORKLOAD_COLUMNS[c] for c in ("gpu_hours_effective", "util_mean_pct", "hbm_peak_bytes")
]


def workloads_frame(workloads: Iterable[fleet_pb2.WorkloadSummary]) -> pd.DataFrame:
    """Workloads as the CLI lists them (client/present.workload_row), named for a table."""
    rows = []
    for w in workloads:
        row = workload_row(w)
        rows.append(
            {
                WORKLOAD_COLUMNS["workload"]: row["workload"],
                WORKLOAD_COLUMNS["user"]: row["user"] or None,
                WORKLOAD_COLUMNS["account"]: row["account"] or row["namespace"] or None,
                WORKLOAD_COLUMNS["name"]: row["name"] or None,
                WORKLOAD_COLUMNS["nodes"]: ", ".join(row["nodes"]),
                WORKLOAD_COLUMNS["gpus"]: row["gpus"],
                WORKLOAD_COLUMNS["start"]: pd.Timestamp(w.start_unix_s, unit="s", tz="UTC"),
                WORKLOAD_COLUMNS["end"]: (
                    pd.Timestamp(w.end_unix_s, unit="s", tz="UTC") if w.HasField("end_unix_s") else None
                ),
                WORKLOAD_COLUMNS["gpu_hours_allocated"]: _rounded(row["gpu_hours_allocated"], 2),
                WORKLOAD_COLUMNS["gpu_hours_effective"]: _rounded(row["gpu_hours_effective"], 2),
                WORKLOAD_COLUMNS["efficiency_pct"]: _rounded(row["efficiency_pct"], 0),
                WORKLOAD_COLUMNS["util_mean_pct"]: _rounded(row["util_mean_pct"], 0),
                WORKLOAD_COLUMNS["hbm_peak_bytes"]: _rounded(row["hbm_peak_bytes"] / GIB, 1),
                WORKLOAD_COLUMNS["cost_allocated"]: _rounded(row["cost_allocated"], 2),
            }
        )
    return pd.DataFrame(rows, columns=list(WORKLOAD_COLUMNS.values()))


def usage_frame(resp: fleet_pb2.UsageResponse) -> pd.DataFrame:
    rows = [
        {
            resp.by: r["owner"],
            "workloads": r["workloads"],
            "GPU-h allocated": _rounded(r["gpu_hours_allocated"], 2),
            "GPU-h effective": _rounded(r["gpu_hours_effective"], 2),
            "GPU-h idle": _rounded(r["gpu_hours_idle"], 2),
            "efficiency %": _rounded(r["efficiency_pct"], 0),
            "cost allocated": _rounded(r["cost_allocated"], 2),
            "cost effective": _rounded(r["cost_effective"], 2),
        }
        for r in map(usage_row, resp.rows)
    ]
    return pd.DataFrame(
        rows,
        columns=[resp.by, "workloads", "GPU-h allocated", "GPU-h effective", "GPU-h idle", "efficiency %",
                 "cost allocated", "cost effective"],
    )  # fmt: skip


def waste_frame(waste: Iterable[fleet_pb2.WasteNow]) -> pd.DataFrame:
    """GPUs held and not used now, as `gpufleet waste` lists them (client/present.waste_row)."""
    rows = []
    for w in waste:
        row = waste_row(w)
        rows.append(
            {
                "finding": row["finding"],
                "workload": row["workload"],
                "user": row["user"] or None,
                "account": row["account"] or row["namespace"] or None,
                "team": row["team"] or None,
                "nodes": ", ".join(row["nodes"]),
                "GPUs": ", ".join(map(str, row["gpus"])),
                "HBM held GiB": _rounded(row["hbm_used_bytes"] / GIB, 1),
                "found": pd.Timestamp(row["since"]),
            }
        )
    columns = ["finding", "workload", "user", "account", "team", "nodes", "GPUs", "HBM held GiB", "found"]
    return pd.DataFrame(rows, columns=columns)
