"""What both front ends (the `gpufleet` CLI and the dashboard) make of Fleet API answers: rows
with the same names and units, the same series labels, the same CSV. It lives beside the Fleet
API client (client/fleet.py)."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from gpufleet.client.timeparse import iso
from gpufleet.protos import fleet_pb2, vocabulary_pb2
from gpufleet.protos.names import (
    AGGREGATES,
    CAPACITY_WAIT_PREFIX,
    OUT_OF_SERVICE_STATES,
    gpu_health_name,
    health_name,
    liveness_name,
)
from gpufleet.protos.presentation import NA, NODE_STATES, node_state

__all__ = ["AGGREGATES", "NA"]

GIB = 1024**3


def message_fields(msg: Any) -> dict[str, Any]:
    """A flat message as a dict: identity fields always (GPU index 0 is still index 0),
    optional measurements only when present (absent stays absent, never 0)."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        if f.type == f.TYPE_MESSAGE or (f.has_presence and not msg.HasField(f.name)):
            continue
        value = getattr(msg, f.name)
        out[f.name] = list(value) if f.is_repeated else value
    return out


def fmt(value: float | None, spec: str = ".0f") -> str:
    return NA if value is None else format(value, spec)


def opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def total(values: Iterable[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def node_row(n: fleet_pb2.NodeSummary) -> dict[str, Any]:
    gpus = list(n.gpus)
    health = gpu_health_fields(n)
    return {
        "node": n.node,
        "cluster": n.cluster,
        "state": node_state(health_name(n.health), silent=n.liveness == vocabulary_pb2.LIVENESS_SILENT),
        "liveness": liveness_name(n.liveness),
        "health": health_name(n.health),
        "health_detail": n.health_detail,
        "lemon": n.lemon,  # its incidents recur (the policy's repeat_offender_* settings)
        "recent_incidents": n.recent_incidents,
        "connected": n.connected,
        "last_report": iso(n.last_report_unix_ns) if n.last_report_unix_ns else None,
        "seconds_since_report": round(n.seconds_since_report, 3),
        "gpu_count": n.gpu_count,
        "gpus_lost": sum(1 for g in gpus if g.lost),
        "util_gpu_mean_pct": mean(opt(g, "util_gpu_pct") for g in gpus),
        "hbm_used_bytes": total(opt(g, "hbm_used_bytes") for g in gpus),
        "hbm_total_bytes": total(opt(g, "hbm_total_bytes") for g in gpus),
        "temp_gpu_max_c": max((g.temp_gpu_c for g in gpus if g.HasField("temp_gpu_c")), default=None),
        "power_w": total(opt(g, "power_w") for g in gpus),
        "simulated": n.simulated,
        # The scheduler's name for it, where scheduler_names maps it to another ("" when the same).
        "scheduler_node": n.scheduler_node,
        # Bytes of its entry left out to keep it under an answer's per-node cap (0: none).
        "clipped_bytes": n.clipped_bytes,
        "gpus": [dict(message_fields(g), **health.get(g.index, _NO_STATE)) for g in gpus],
    }


_NO_STATE = {"health": None, "health_detail": "", "findings": []}


def gpu_health_fields(summary: fleet_pb2.NodeSummary) -> dict[int, dict[str, Any]]:
    """Each GPU's state for --json: health (its word), health_detail, findings (codes)."""
    return {
        s.index: {
            "health": gpu_health_name(s.health),
            "health_detail": s.detail,
            "findings": list(s.findings),
        }
        for s in summary.gpu_states
        if s.health
    }


def gib(value: int | None) -> str:
    return NA if value is None else f"{value / GIB:.1f}"


def gib_of(used: int | None, total: int | None) -> str:
    """HBM as used/total GiB; one N/A when neither is known."""
    return NA if used is None and total is None else f"{gib(used)}/{gib(total)}"


def gpu_health(summary: fleet_pb2.NodeSummary) -> dict[int, str]:
    """Each GPU's health as the aggregator derived it (repair/gpu_health.py), as one line: its
    word, then what raised it ("faulty: driver_unresponsive"). A GPU the aggregator gave no
    state for is missing here: shown as N/A, never "ok"."""
    return {
        index: f["health"] + (f": {f['health_detail']}" if f["health_detail"] else "")
        for index, f in gpu_health_fields(summary).items()
    }


# Tags in the order a series label names them.
LABEL_ORDER = ("cluster", "model", "node", "engine", "gpu", "port")


def series_label(tags: dict[str, str], varying: Iterable[str] | None = None) -> str:
    """A series' name for a legend or a column: the tags that tell it apart (all it has when
    varying is None), GPU indices as gpuN; a grouped series by its group's values."""
    keys = [k for k in LABEL_ORDER if k in tags and (varying is None or k in varying)]
    return "/".join(f"gpu{tags[k]}" if k == "gpu" else tags[k] or f"(no {k})" for k in keys) or "all"


def varying_tags(series: list[dict[str, str]]) -> list[str]:
    """The tags whose values differ between series (what a label needs to say)."""
    names = {k for tags in series for k in tags}
    varying = [k for k in LABEL_ORDER if k in names and len({tags.get(k) for tags in series}) > 1]
    if varying:
        return varying
    return [k for k in ("node", "gpu") if k in names] or [k for k in LABEL_ORDER if k in names]


def history_csv(resp: fleet_pb2.HistoryResponse) -> str:
    """One row per series and step: time, the series' tags (a grouped query's group tags), the
    value. The same file from `gpufleet history --csv` and the history explorer's download."""
    tag_names = sorted({k for s in resp.series for k in s.tags})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["time", *tag_names, resp.metric])
    for s in resp.series:
        for t, v in zip(s.times_unix_ns, s.values, strict=True):
            writer.writerow([iso(t), *(s.tags.get(k, "") for k in tag_names), v])
    return out.getvalue()


def event_what(e: fleet_pb2.HistoryEvent) -> str:
    """An event in a few words: XID 79, XID 95 x1000, gpu_lost, health ecc_uncorrected, cordon ok."""
    if e.kind == "xid":
        what = f"XID {e.xid}"
        if e.count > 1:  # a folded storm (collector/xid_fold.py)
            what += f" x{e.count} since {iso(e.first_time_unix_ns)}"
        return what
    if e.kind == "health":
        return f"health {e.code} ({e.severity})"
    if e.kind == "repair":
        return f"{e.code} {e.outcome}".strip()
    return e.kind


def event_row(e: fleet_pb2.HistoryEvent) -> dict[str, Any]:
    """One stored event as the CLI's --json/--csv and the dashboard's table name it."""
    return {
        "time": iso(e.time_unix_ns),
        "node": e.node,
        "cluster": e.cluster,
        "gpu": e.gpu_index if e.HasField("gpu_index") else None,
        "kind": e.kind,
        "what": event_what(e),
        "xid": e.xid or None,
        "count": e.count or 1 if e.kind == "xid" else None,
        "source": e.source,
        "severity": e.severity,
        "outcome": e.outcome,
        "incident": e.incident_id,
        "summary": e.summary,
    }


EVENT_COLUMNS = list(event_row(fleet_pb2.HistoryEvent()))


def events_csv(events: Iterable[fleet_pb2.HistoryEvent]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, EVENT_COLUMNS)
    writer.writeheader()
    for e in events:
        writer.writerow({k: "" if v is None else v for k, v in event_row(e).items()})
    return out.getvalue()


def finite(value: float | None) -> float | None:
    """JSON has no infinity: a projection with no replica left is null (text: "none left")."""
    return value if value is None or math.isfinite(value) else None


def percent(ratio: float | None) -> str:
    """A 0..1 ratio as people read it: "85 %" style, N/A when absent, "none left" for ∞."""
    if ratio is None:
        return NA
    return "none left" if math.isinf(ratio) else f"{100 * ratio:.0f}"


def every_replica(resp: fleet_pb2.ListPoolsResponse) -> list[tuple[str, str, fleet_pb2.PoolReplica]]:
    """(cluster, pool, replica) of every engine replica in a ListPools answer, by node, engine and
    port: the pools' (under the pool's name) and those no declared pool places (under the model
    they report, state "unverified")."""
    rows = [(p.cluster, p.model, r) for p in resp.pools for r in p.replicas]
    rows += [(u.cluster, u.model, u.replica) for u in resp.unverified if u.HasField("replica")]
    return sorted(rows, key=lambda row: (row[2].node, row[2].engine, row[2].port))


def pool_row(p: fleet_pb2.ServingPool) -> dict[str, Any]:
    """One serving pool for --json and the dashboard: every figure the aggregator computed."""
    row = {k: finite(v) if isinstance(v, float) else v for k, v in message_fields(p).items()}
    row["replicas"] = [message_fields(r) for r in p.replicas]
    return row


def projection_row(d: fleet_pb2.DrainProjection) -> dict[str, Any]:
    return {k: finite(v) if isinstance(v, float) else v for k, v in message_fields(d).items()}


def out_of_service(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(nodes, GPUs) out of service among node_rows: their workflow state is one of
    OUT_OF_SERVICE_STATES (protos/presentation.py OUT_OF_SERVICE_MEANING), silent or not."""
    out = [r for r in rows if r["health"] in OUT_OF_SERVICE_STATES]
    return len(out), sum(r["gpu_count"] for r in out)


def states_said(rows: list[dict[str, Any]]) -> str:
    """How many nodes are in each state, in NODE_STATES' order: "15 healthy, 1 in repair"."""
    states = Counter(r["state"] for r in rows)
    return ", ".join(f"{states[w]} {w}" for w in NODE_STATES if states[w])


def out_of_service_said(rows: list[dict[str, Any]]) -> str:
    """How every surface says it: "1 node out of service (8 GPUs)"."""
    nodes, gpus = out_of_service(rows)
    return f"{nodes} node{'' if nodes == 1 else 's'} out of service ({gpus} GPU{'' if gpus == 1 else 's'})"


def health_said(health: str, detail: str) -> str:
    """A node's workflow word as every surface writes it: a drain held for serving capacity says
    so beside its state (`cordoned, waiting for capacity`), not a bare `cordoned`."""
    return f"{health}, waiting for capacity" if detail.startswith(CAPACITY_WAIT_PREFIX) else health


# A projection past the pool's floor: its KV-cache usage over the floor's, or too few replicas
# left. Said so, not "below the floor" (a usage above the floor's figure read as "below" it).
BREAKS_FLOOR = "(breaks the serving floor)"


def describe_projection(d: fleet_pb2.DrainProjection) -> str:
    """e.g. "demo/llama 3 → 2 replicas, KV 85 % → 128 % (breaks the serving floor)"."""
    text = f"{d.cluster}/{d.model} {d.replicas_now} → {d.replicas_after} replicas"
    if d.HasField("kv_cache_usage_now_ratio") and d.HasField("kv_cache_usage_after_ratio"):
        after = percent(d.kv_cache_usage_after_ratio)
        text += (
            f", KV {percent(d.kv_cache_usage_now_ratio)} % → {after}{'' if after == 'none left' else ' %'}"
        )
    return text + (f" {BREAKS_FLOOR}" if d.below_floor else "")


# --- workloads (docs/workloads.md) ---------------------------------------------------------
USER_HIDDEN = "(hidden)"  # a user name this caller's role may not see


def workload_name(w: fleet_pb2.WorkloadSummary) -> str:
    """How a workload is named on every surface: `slurm:1234`."""
    return f"{w.scheduler}:{w.id}"


def workload_row(w: fleet_pb2.WorkloadSummary) -> dict[str, Any]:
    """One workload's figures with their units in their names; absent figures are None (JSON
    null, N/A on screens), never 0."""
    return {
        "workload": workload_name(w),
        "user": USER_HIDDEN if w.user_hidden else w.user,
        "account": w.account,
        "partition": w.partition,
        "namespace": w.namespace,
        "team": w.team,
        "name": w.name,
        "nodes": list(w.nodes),
        "gpus": w.gpus,
        "model": w.model,
        "start": iso(int(w.start_unix_s * 1e9)),
        "end": iso(int(w.end_unix_s * 1e9)) if w.HasField("end_unix_s") else None,
        "gpu_hours_allocated": w.gpu_hours_allocated,
        "gpu_hours_effective": opt(w, "gpu_hours_effective"),
        "gpu_hours_idle": w.gpu_hours_idle,
        "efficiency_pct": opt(w, "efficiency_pct"),
        "util_mean_pct": opt(w, "util_mean_pct"),
        "util_max_pct": opt(w, "util_max_pct"),
        "sm_mean_pct": opt(w, "sm_mean_pct"),
        "hbm_peak_bytes": w.hbm_peak_bytes,
        "energy_j": w.energy_j,
        "cost_allocated": opt(w, "cost_allocated"),
        "cost_effective": opt(w, "cost_effective"),
    }


def usage_row(r: fleet_pb2.UsageRow) -> dict[str, Any]:
    return {
        "owner": r.owner,
        "workloads": r.workloads,
        "gpu_hours_allocated": r.gpu_hours_allocated,
        "gpu_hours_effective": r.gpu_hours_effective,
        "gpu_hours_idle": r.gpu_hours_idle,
        "efficiency_pct": opt(r, "efficiency_pct"),
        "cost_allocated": opt(r, "cost_allocated"),
        "cost_effective": opt(r, "cost_effective"),
    }


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """Rows of one shape as CSV (a list joined with spaces; absent: empty)."""
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: " ".join(v) if isinstance(v, list) else ("" if v is None else v) for k, v in row.items()}
        )
    return out.getvalue()


def owner_of_gpu(resp: fleet_pb2.ListWorkloadsResponse) -> dict[tuple[str, int], fleet_pb2.WorkloadSummary]:
    """(node, GPU index) -> the running workload holding it, from one ListWorkloads answer."""
    by_key = {(w.scheduler, w.id): w for w in resp.running}
    out = {}
    for p in resp.placements:
        w = by_key.get((p.scheduler, p.id))
        if w is not None:
            out[(p.node, p.gpu)] = w
    return out


def owner_label(w: fleet_pb2.WorkloadSummary) -> str:
    """A workload as one short label: `slurm:1234 (llm-train)`, its account, namespace or team."""
    owner = w.account or w.namespace or w.team
    return f"{workload_name(w)} ({owner})" if owner else workload_name(w)


def incident_workload_row(w: fleet_pb2.IncidentWorkload) -> dict[str, Any]:
    """A workload an incident names, as every surface shows it (the hidden user as for jobs)."""
    return {
        "workload": w.workload,
        "name": w.name,
        "user": USER_HIDDEN if w.user_hidden else w.user,
        "account": w.account,
        "namespace": w.namespace,
        "team": w.team,
        "gpus": list(w.gpus),
        "hit": w.hit,
    }


def incident_work_label(rows: list[dict[str, Any]]) -> str:
    """The work an incident hit, in one cell: `slurm:42 (llm-train)`; NA when none was named."""
    hit = [r for r in rows if r["hit"]]
    return (
        ", ".join(
            f"{r['workload']} ({o})" if (o := r["account"] or r["namespace"] or r["team"]) else r["workload"]
            for r in hit
        )
        or NA
    )


def waste_row(w: fleet_pb2.WasteNow) -> dict[str, Any]:
    """A waste finding firing now (docs/workloads.md "Waste findings"), as every surface shows
    it: the finding's code is its one word; the user hidden as for jobs."""
    return {
        "finding": w.finding,
        "workload": w.workload or None,
        "user": USER_HIDDEN if w.user_hidden else w.user,
        "account": w.account,
        "namespace": w.namespace,
        "team": w.team,
        "nodes": list(w.nodes),
        "gpus": list(w.gpus),
        "hbm_used_bytes": w.hbm_used_bytes,
        "since": iso(w.since_unix_ns),
        "evidence": w.evidence,
    }


def waste_by_gpu(resp: fleet_pb2.ListWorkloadsResponse) -> dict[tuple[str, int], str]:
    """(node, GPU) -> the waste finding on it now (its first node's GPUs), for a heat map's mark."""
    return {(w.nodes[0], g): w.finding for w in resp.waste if w.nodes for g in w.gpus}
