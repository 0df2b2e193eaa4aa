"""The SRE's read commands: nodes, node, history, metrics. They talk only to the Fleet API.

Every command prints a readable table by default and takes --json (history also --csv)
for scripts. Absent values print as N/A, never 0.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tabulate import tabulate

from gpufleet.client.exits import Exit
from gpufleet.client.fleet import ClientError, FleetClient
from gpufleet.client.present import (
    AGGREGATES,
    NA,
    describe_projection,
    event_row,
    event_what,
    events_csv,
    every_replica,
    fmt,
    gib_of,
    gpu_health,
    health_said,
    history_csv,
    mean,
    message_fields,
    node_row,
    opt,
    out_of_service,
    out_of_service_said,
    percent,
    pool_row,
    projection_row,
    series_label,
    states_said,
    varying_tags,
)
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import iso, parse_duration_ns, parse_range_ns, parse_time_ns
from gpufleet.protos import fleet_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import aggregate_name


def print_nodes(resp: fleet_pb2.ListNodesResponse, as_json: bool, clusters: list[str] | None = None) -> None:
    rows = [node_row(n) for n in resp.nodes]
    if as_json:
        print(json.dumps({"server_time": iso(resp.server_time_unix_ns), "nodes": rows}, indent=2))
        return
    if not rows:
        print(
            f"no node is in cluster {', '.join(clusters)}; `gpufleet nodes` lists every node's cluster"
            if clusters
            else "no nodes have reported to this aggregator yet"
        )
        return
    table = [
        [
            r["node"],
            r["cluster"],
            r["state"],
            health_said(r["health"], r["health_detail"])
            + (f" LEMON ({r['recent_incidents']} incidents)" if r["lemon"] else ""),
            (f"{r['seconds_since_report']:.1f}s ago" if r["last_report"] else "never")
            + ("" if r["connected"] else " (disconnected)"),
            f"{r['gpu_count']}" + (f" ({r['gpus_lost']} LOST)" if r["gpus_lost"] else ""),
            fmt(r["util_gpu_mean_pct"]),
            gib_of(r["hbm_used_bytes"], r["hbm_total_bytes"]),
            fmt(r["temp_gpu_max_c"]),
            fmt(r["power_w"]),
        ]
        for r in rows
    ]
    print(
        tabulate(
            table,
            headers=[
                "NODE",
                "CLUSTER",
                "STATE",
                "WORKFLOW",
                "LAST REPORT",
                "GPUS",
                "UTIL %",
                "HBM GiB",
                "MAX TEMP °C",
                "POWER W",
            ],
        )
    )
    gpus = sum(r["gpu_count"] for r in rows)
    print(
        f"\n{len(rows)} nodes ({states_said(rows)}), "
        f"{out_of_service_said(rows)}; {gpus} GPUs, fleet mean utilization "
        f"{fmt(mean(r['util_gpu_mean_pct'] for r in rows))} %"
    )
    clipped = [r["node"] for r in rows if r["clipped_bytes"]]
    if clipped:
        names = ", ".join(clipped[:3]) + (f" and {len(clipped) - 3} more" if len(clipped) > 3 else "")
        print(
            f"cut to the per-node cap of an answer (engine details first; `gpufleet node NAME` shows "
            f"more): {names}"
        )


def gpu_row(g: telemetry_pb2.GpuSample, health: str) -> list[str]:
    power = fmt(opt(g, "power_w"))
    if g.HasField("power_limit_w"):
        power += f"/{g.power_limit_w:.0f}"
    return [
        str(g.index),
        g.model,
        g.uuid,
        g.pci_bus_id,
        health,
        fmt(opt(g, "util_gpu_pct")),
        fmt(opt(g, "util_mem_pct")),
        gib_of(opt(g, "hbm_used_bytes"), opt(g, "hbm_total_bytes")),
        fmt(opt(g, "temp_gpu_c")),
        power,
    ]


def print_node(detail: fleet_pb2.NodeDetail, stored: fleet_pb2.EventsResponse, as_json: bool) -> None:
    """stored: the node's events of the last day from history (they outlive an aggregator
    restart; detail.recent_events is the aggregator's memory since it started)."""
    s = detail.summary
    row = node_row(s)
    health = gpu_health(s)
    events = [
        dict(
            message_fields(e),
            kind=vocabulary_pb2.EventKind.Name(e.kind),
            source=vocabulary_pb2.EventSource.Name(e.source),
            time=iso(e.time_unix_ns),
        )
        for e in detail.recent_events
    ]
    if as_json:
        row.update(
            boot_id=s.boot_id,
            last_seq=s.last_seq,
            interval_s=s.interval_s,
            driver_version=s.driver_version,
            engines=[message_fields(e) for e in detail.engines],
            if_drained=[projection_row(d) for d in detail.if_drained],
            recent_events=events,
            events=[event_row(e) for e in stored.events],
            collector_stats=message_fields(detail.collector_stats),
            answer_clipped_bytes=detail.clipped_bytes,
        )
        print(json.dumps(row, indent=2))
        return
    print(
        f"node {s.node} (cluster {s.cluster}): {row['liveness']}, "
        f"{'connected' if s.connected else 'not connected'}, last report "
        f"{row['last_report'] or 'never'} ({s.seconds_since_report:.1f}s ago), seq {s.last_seq}"
    )
    if s.scheduler_node:
        print(f"in the scheduler: {s.scheduler_node} (scheduler_names)")
    print(
        f"collector boot {s.boot_id or NA}, interval {s.interval_s:g}s, driver "
        f"{s.driver_version or NA}{', simulated GPUs' if s.simulated else ''}\n"
    )
    print(
        tabulate(
            [gpu_row(g, health.get(g.index, NA)) for g in s.gpus],
            headers=[
                "GPU",
                "MODEL",
                "UUID",
                "PCI",
                "STATE",
                "UTIL %",
                "MEM %",
                "HBM GiB",
                "TEMP °C",
                "POWER W",
            ],
        )
    )
    if detail.engines:
        print()
        print(
            tabulate(
                [
                    [
                        e.engine,
                        e.model,
                        e.port,
                        ",".join(map(str, e.gpu_indices)),
                        percent(opt(e, "kv_cache_usage_ratio")),
                        fmt(opt(e, "requests_running")),
                        fmt(opt(e, "requests_waiting")),
                        "ok" if e.readable else f"unreadable: {e.unreadable_reason}",
                    ]
                    for e in detail.engines
                ],
                headers=["ENGINE", "MODEL", "PORT", "GPUS", "KV %", "RUNNING", "WAITING", "STATUS"],
            )
        )
        for d in detail.if_drained:
            print(f"if drained: {describe_projection(d)}")
    else:
        print("\nno inference engines reported on this node")
    st = detail.collector_stats
    print(
        f"\ncollector: {st.unacked_reports} unacked, {st.reports_dropped_total} dropped, "
        f"{st.reports_rejected_total} rejected, {st.reconnects_total} reconnects, "
        f"{st.sample_errors_total} NVML errors, last sample took {st.sample_duration_s * 1000:.1f} ms"
    )
    if detail.clipped_bytes:
        print(
            f"\n{detail.clipped_bytes:,} bytes of this node's answer were left out to keep it under the "
            f"per-node cap (the oldest recent events first): `gpufleet events --node {s.node}` reads "
            "its events from history"
        )
    if stored.events:
        shown = stored.events[-20:]
        earlier = len(stored.events) - len(shown)
        print(
            f"\nevents since {iso(stored.start_unix_ns)} (from history"
            + (
                f"; {earlier} earlier not shown, `gpufleet events --node {s.node}` lists them"
                if earlier
                else ""
            )
            + "):"
        )
        for e in shown:
            gpu = f"GPU {e.gpu_index}" if e.HasField("gpu_index") else "node"
            print(f"  {iso(e.time_unix_ns)}  {event_what(e)}  {gpu}  {e.summary[:100]}")


def history_request(args: Any) -> fleet_pb2.HistoryRequest:
    start, end = parse_range_ns(args.since, args.until)
    return fleet_pb2.HistoryRequest(
        metric=args.metric,
        nodes=args.node or [],
        gpus=args.gpu or [],
        clusters=args.cluster or [],
        engines=args.engine or [],
        models=args.model or [],
        start_unix_ns=start,
        end_unix_ns=end,
        step_ns=parse_duration_ns(args.step) if args.step else 0,
        aggregate=AGGREGATES[args.agg],
        group_by=[t for t in (args.group_by or "").split(",") if t],
    )


def print_history(resp: fleet_pb2.HistoryResponse, fmt_: str) -> None:
    agg = aggregate_name(resp.aggregate)
    series = [(dict(s.tags), list(zip(s.times_unix_ns, s.values, strict=True))) for s in resp.series]
    if fmt_ == "json":
        print(
            json.dumps(
                {
                    "metric": resp.metric,
                    "source": resp.measurement,  # raw measurement, or the roll-up tier answering
                    "unit": resp.unit,
                    "help": resp.help,
                    "aggregate": agg,
                    "step_s": resp.step_ns / 1e9,
                    "start": iso(resp.start_unix_ns),
                    "end": iso(resp.end_unix_ns),
                    "series": [
                        {
                            "tags": tags,
                            "points": [{"time": iso(t), "time_unix_ns": t, "value": v} for t, v in pts],
                        }
                        for tags, pts in series
                    ],
                },
                indent=2,
            )
        )
        return
    if fmt_ == "csv":
        sys.stdout.write(history_csv(resp))
        return
    if not series:
        print(
            f"no {resp.metric} data in {iso(resp.start_unix_ns)} .. {iso(resp.end_unix_ns)} for these filters"
        )
        return
    varying = varying_tags([tags for tags, _ in series])
    what = f"{resp.unit}: {resp.help}" if resp.help else resp.unit  # an older aggregator sends no help
    header = (
        f"{resp.metric} ({what}), {agg} per {resp.step_ns / 1e9:g}s, "
        f"{iso(resp.start_unix_ns)} .. {iso(resp.end_unix_ns)}, {len(series)} series"
    )
    print(header)
    if len(series) <= 8:
        times = sorted({t for _, pts in series for t, _ in pts})
        columns = [dict(pts) for _, pts in series]
        rows = [[iso(t), *(fmt(col.get(t), ".2f") for col in columns)] for t in times]
        print(tabulate(rows, headers=["TIME", *(series_label(tags, varying) for tags, _ in series)]))
    else:
        rows = [[series_label(tags, varying), iso(t), f"{v:.2f}"] for tags, pts in series for t, v in pts]
        print(tabulate(rows, headers=["SERIES", "TIME", resp.metric]))


def events_request(args: Any) -> fleet_pb2.EventsRequest:
    start, end = parse_range_ns(args.since, args.until)
    return fleet_pb2.EventsRequest(
        start_unix_ns=start,
        end_unix_ns=end,
        nodes=args.node or [],
        gpus=args.gpu or [],
        xids=args.xid or [],
        kinds=args.kind or [],
        clusters=args.cluster or [],
        limit=args.limit,
    )


def _filters_said(request: fleet_pb2.EventsRequest) -> str:
    """The filters of an events request as a person typed them: `node a, b; kind xid`."""
    parts = [
        f"{name} {', '.join(map(str, values))}"
        for name, values in (
            ("node", request.nodes),
            ("GPU", request.gpus),
            ("XID", request.xids),
            ("kind", request.kinds),
            ("cluster", request.clusters),
        )
        if values
    ]
    return "; ".join(parts) or "no filter"


def print_events(resp: fleet_pb2.EventsResponse, fmt_: str, request: fleet_pb2.EventsRequest) -> None:
    if fmt_ == "json":
        print(
            json.dumps(
                {
                    "start": iso(resp.start_unix_ns),
                    "end": iso(resp.end_unix_ns),
                    "truncated": resp.truncated,
                    "events": [event_row(e) for e in resp.events],
                },
                indent=2,
            )
        )
        return
    if fmt_ == "csv":
        sys.stdout.write(events_csv(resp.events))
        return
    if not resp.events:
        print(f"no events in {iso(resp.start_unix_ns)} .. {iso(resp.end_unix_ns)} ({_filters_said(request)})")
        return
    rows = [
        [
            iso(e.time_unix_ns),
            e.node or "(fleet)",
            e.gpu_index if e.HasField("gpu_index") else "node",
            e.kind,
            event_what(e),
            e.source,
            e.summary[:80],
        ]
        for e in resp.events
    ]
    print(tabulate(rows, headers=["TIME", "NODE", "GPU", "KIND", "WHAT", "SOURCE / ACTOR", "DETAIL"]))
    if resp.truncated:
        print(
            f"\nonly the newest {len(resp.events)} are shown (at most --limit, and what fits one "
            "answer): narrow the range or filter by --node, --kind or --xid"
        )


def print_metrics(resp: fleet_pb2.ListMetricsResponse, as_json: bool) -> None:
    rows = [message_fields(m) for m in resp.metrics]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print(
        tabulate(
            [[m.name, m.measurement, m.unit, m.help, m.source] for m in resp.metrics],
            headers=["METRIC", "MEASUREMENT", "UNIT", "MEANING", "READ FROM"],
        )
    )


def print_status(st: fleet_pb2.AggregatorStatus, nodes: list[dict[str, Any]], as_json: bool) -> None:
    """nodes: node_rows of every node, for the fleet's line (what is out of service)."""
    out_nodes, out_gpus = out_of_service(nodes)
    if as_json:
        out = message_fields(st)
        out["fleet"] = {
            "nodes": len(nodes),
            "nodes_out_of_service": out_nodes,
            "gpus_out_of_service": out_gpus,
        }
        out["spool"] = message_fields(st.spool)
        out["unhealthy_reasons"] = list(st.unhealthy_reasons)
        out["tasks"] = [message_fields(t) for t in st.tasks]
        out["replicas"] = [message_fields(r) for r in st.replicas]
        print(json.dumps(out, indent=2))
        return
    sp = st.spool
    health = "healthy" if st.healthy else "UNHEALTHY"
    print(
        f"aggregator {st.version}: {health}; {st.nodes} nodes known, {st.streams_open} collector streams "
        f"open; oldest report waiting for its ack {st.oldest_unacked_s:.1f}s"
    )
    for reason in st.unhealthy_reasons:
        print(f"  unhealthy: {reason}")
    print(f"fleet: {len(nodes)} nodes ({states_said(nodes)}), {out_of_service_said(nodes)}")
    if not st.acknowledging:
        print(f"NOT ACKNOWLEDGING: {st.not_acknowledging_reason} (collectors keep their reports)")
    state = "ok" if st.store_ok else f"NOT TAKING WRITES: {st.store_error or 'unknown error'}"
    print(
        f"store {st.store}: {state}; {st.store_refused_reports_total} reports refused by the store, "
        f"{st.store_points_dropped_total} points dropped by it"
    )
    size = f"{sp.bytes / 2**20:.1f} of {sp.max_bytes / 2**20:.0f} MiB"
    print(
        f"spool: {sp.batches} batches, {sp.points} points, {size}"
        f"{' (NEAR ITS LIMIT)' if sp.near_limit else ''}, oldest {sp.oldest_age_s:.0f}s, draining "
        f"{sp.drain_points_per_s:.0f} points/s, {sp.refused_batches_total} batches refused when full"
    )
    if sp.quarantined_batches:
        print(
            f"spool quarantine: {sp.quarantined_batches} batches, {sp.quarantined_points} points the store "
            f"refused again and again, kept in {sp.quarantine_dir}"
        )
    print(
        f"listeners: {st.listener_errors_total} errors, {st.listener_reports_dropped_total} reports not "
        "handed to the fleet view (queue full)"
    )
    if st.replica_id:
        leader = (
            f"repair leader {st.leader} (epoch {st.leader_epoch}, lease {st.leader_lease_left_s:.1f}s left)"
            if st.leader
            else "NO REPAIR LEADER (the lease is free or expired: a replica takes it within leader_lease_s)"
        )
        me = "this replica leads" if st.repair_leader else "this replica follows"
        print(f"control plane {st.control_plane}: replica {st.replica_id}; {leader}; {me}")
        for r in st.replicas:
            print(
                f"  replica {r.replica_id}{' (leader)' if r.leader else ''}: fleet API {r.fleet_address}, "
                f"ingest {r.ingest_address}, {r.streams_open} streams, heartbeat {r.heartbeat_age_s:.1f}s ago"
            )
    else:
        print(f"control plane {st.control_plane or 'sqlite'}: one box (this aggregator runs repair)")
    restarted = [t for t in st.tasks if t.restarts_total]
    for t in restarted:
        print(f"task {t.name}: restarted {t.restarts_total} times; last error {t.last_error}")


def print_pools(resp: fleet_pb2.ListPoolsResponse, as_json: bool) -> None:
    """`gpufleet pools`: each model's replicas per cluster, their pressure, and what one
    replica leaving would do (the aggregator computes every figure: aggregator/fleet/pools.py)."""
    floor = (
        f"floor: KV-cache {100 * resp.floor_kv_cache_usage_ratio:.0f} %, at least "
        f"{resp.floor_min_serving_replicas} replica(s); guard {'on' if resp.guard else 'off'}"
    )
    if as_json:
        print(
            json.dumps(
                {
                    "server_time": iso(resp.server_time_unix_ns),
                    "floor_kv_cache_usage_ratio": resp.floor_kv_cache_usage_ratio,
                    "floor_min_serving_replicas": resp.floor_min_serving_replicas,
                    "guard": resp.guard,
                    "formula": resp.formula,
                    "truncated": resp.truncated,
                    "pools_declared": resp.pools_declared,
                    "pools": [pool_row(p) for p in resp.pools],
                    "unverified_total": resp.unverified_total,
                    "unverified": [message_fields(u) for u in resp.unverified],
                },
                indent=2,
            )
        )
        return
    if not resp.pools:
        if resp.unverified_total:
            print(f"no serving pool has a replica the control plane places ({resp.pools_declared} declared)")
        else:
            print("no inference engines reported in the fleet (vLLM, SGLang, TGI, TensorRT-LLM)")
        print_unverified(resp)
        return
    print(
        tabulate(
            [
                [
                    p.cluster,
                    p.model,
                    f"{p.replicas_serving}/{p.replicas_idle}/{p.replicas_draining}/{p.replicas_out}",
                    percent(opt(p, "kv_cache_usage_mean_ratio")),
                    percent(opt(p, "kv_cache_usage_max_ratio")),
                    fmt(opt(p, "requests_running")),
                    fmt(opt(p, "requests_waiting")),
                    fmt(opt(p, "preemptions_per_s"), ".1f"),
                    percent(opt(p, "kv_cache_usage_if_one_leaves_ratio")),
                    f"{p.headroom_replicas:+d}",
                    ", ".join(p.nodes_waiting) or NA,
                ]
                for p in resp.pools
            ],
            headers=[
                "CLUSTER",
                "MODEL",
                "SERVING/IDLE/DRAINING/OUT",
                "KV MEAN %",
                "KV MAX %",
                "RUNNING",
                "WAITING",
                "PREEMPT/s",
                "KV IF ONE LEAVES %",
                "HEADROOM",
                "REPAIRS WAITING",
            ],
        )
    )
    print(
        f"\n{len(resp.pools)} pools; {floor}"
        + ("; more pools than one answer holds" if resp.truncated else "")
    )
    print(f"HEADROOM: replicas that may leave within the floor (negative: replicas short); {resp.formula}")
    print_unverified(resp)


def print_unverified(resp: fleet_pb2.ListPoolsResponse) -> None:
    """The replicas nodes report that no declared pool places on them: in no pool's figures."""
    if not resp.unverified_total:
        return
    print(
        f"\n{resp.unverified_total} unverified replicas: reported by their nodes, placed in no pool by the "
        "policy's [serving.pools] (docs/repair.md), so in no pool's figures"
    )
    print(
        tabulate(
            [[u.node, f"{u.engine}:{u.port}", u.claimed, u.kind, u.reason] for u in resp.unverified],
            headers=["NODE", "ENGINE", "CLAIMS", "WHY", "DETAIL"],
        )
    )
    if resp.unverified_total > len(resp.unverified):
        print(f"... and {resp.unverified_total - len(resp.unverified)} more")


def print_engines(resp: fleet_pb2.ListPoolsResponse, as_json: bool) -> None:
    """`gpufleet engines`: every engine replica the aggregator knows, by node, with its pressure
    and the load class the aggregator gave it (the pools' replicas, one row each)."""
    replicas = every_replica(resp)
    if as_json:
        rows = [{"cluster": cluster, "model": model, **message_fields(r)} for cluster, model, r in replicas]
        print(json.dumps({"engines": rows, "truncated": resp.truncated}, indent=2))
        return
    if not replicas:
        print("no inference engines reported in the fleet (vLLM, SGLang, TGI, TensorRT-LLM)")
        return
    print(
        tabulate(
            [
                [
                    r.node,
                    r.engine,
                    model,
                    r.port,
                    r.state,
                    percent(opt(r, "kv_cache_usage_ratio")),
                    fmt(opt(r, "requests_running")),
                    fmt(opt(r, "requests_waiting")),
                    r.load_class + (f" ({r.unreadable_reason})" if r.load_class == "unreadable" else ""),
                ]
                for _, model, r in replicas
            ],
            headers=["NODE", "ENGINE", "MODEL", "PORT", "STATE", "KV %", "RUNNING", "WAITING", "CLASS"],
        )
    )
    unverified = sum(1 for _, _, r in replicas if r.state == "unverified")
    print(
        f"\n{len(replicas)} replicas, {len(replicas) - unverified} in {len(resp.pools)} declared pools "
        f"(`gpufleet pools` sums them per pool); {unverified} unverified: in no pool's figures"
    )


def _known_nodes(client: FleetClient, nodes: list[str]) -> None:
    """An empty answer for nodes the aggregator has never heard of is a typo, not "no data":
    exit 5 (not found), naming them."""
    known = {n.node for n in client.list_nodes(fleet_pb2.ListNodesRequest()).nodes}
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise ClientError(
            f"no node named {', '.join(unknown)} is known to this aggregator; `gpufleet nodes` lists them",
            Exit.NOT_FOUND,
        )


def _output(args: Any) -> str:
    return "json" if args.json else "csv" if args.csv else "table"


def run(client: FleetClient, args: Any) -> None:
    if args.command == "nodes":
        print_nodes(
            client.list_nodes(fleet_pb2.ListNodesRequest(clusters=args.cluster or [])),
            args.json,
            args.cluster,
        )
    elif args.command == "node":
        detail = client.call(FleetRpc.GetNode, fleet_pb2.GetNodeRequest(node=args.name))
        stored = client.call(
            FleetRpc.QueryEvents,
            fleet_pb2.EventsRequest(nodes=[args.name], start_unix_ns=parse_time_ns("24h")),
        )
        print_node(detail, stored, args.json)
    elif args.command == "history":
        resp = client.call(FleetRpc.QueryHistory, history_request(args))
        if not resp.series and args.node:
            _known_nodes(client, args.node)
        print_history(resp, _output(args))
    elif args.command == "events":
        request = events_request(args)
        resp = client.call(FleetRpc.QueryEvents, request)
        if not resp.events and args.node:
            _known_nodes(client, args.node)
        print_events(resp, _output(args), request)
    elif args.command == "status":
        status = client.call(FleetRpc.GetStatus, fleet_pb2.StatusRequest())
        print_status(status, [node_row(n) for n in client.list_nodes().nodes], args.json)
    elif args.command == "pools":
        request = fleet_pb2.ListPoolsRequest(
            clusters=args.cluster or [], model=args.model, replicas=args.json
        )
        print_pools(client.call(FleetRpc.ListPools, request), args.json)
    elif args.command == "engines":
        print_engines(client.call(FleetRpc.ListPools, fleet_pb2.ListPoolsRequest(replicas=True)), args.json)
    elif args.command == "metrics":
        print_metrics(client.call(FleetRpc.ListMetrics, fleet_pb2.ListMetricsRequest()), args.json)
