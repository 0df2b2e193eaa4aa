"""`gpufleet jobs`, `gpufleet job ID` and `gpufleet usage`: whose work is on the GPUs, one
workload's report (per node and GPU, as Slurm users know from jobstats), and GPU-hours by
owner (docs/workloads.md). Every figure is the aggregator's; the rows are client/present.py's,
the dashboard's Workloads page shows the same."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tabulate import tabulate

from gpufleet.client.exits import Exit
from gpufleet.client.fleet import ClientError, FleetClient
from gpufleet.client.present import NA, fmt, gib, rows_csv, usage_row, workload_name, workload_row
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import iso, parse_time_ns
from gpufleet.protos import fleet_pb2

USAGE_BY = ("account", "user", "namespace", "team", "partition")


def add_parsers(sub: Any, client: argparse.ArgumentParser, add_watch: Any) -> None:
    p = sub.add_parser("jobs", parents=[client], help="running workloads (jobs, pods) with their efficiency")
    p.add_argument("--node", default="", help="only those on this node")
    p.add_argument("--ended", action="store_true", help="also those that ended in the last --since")
    p.add_argument("--since", default="24h", help="with --ended: how far back (default 24h)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--csv", action="store_true")
    add_watch(p)
    p = sub.add_parser("job", parents=[client], help="one workload's report: per node and GPU")
    p.add_argument("id", help="the job id (Slurm) or workload id; SCHEDULER:ID for another scheduler")
    p.add_argument("--json", action="store_true")
    p.add_argument("--csv", action="store_true", help="one row per node and GPU")
    p = sub.add_parser("usage", parents=[client], help="GPU-hours, efficiency and cost by owner")
    p.add_argument("--by", default="account", choices=USAGE_BY)
    p.add_argument("--since", default="7d", help="start: 10m, 2h, 7d ago, or ISO time (default 7d)")
    p.add_argument("--until", default="now", help="end (default now)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--csv", action="store_true")


COMMANDS = ("jobs", "job", "usage")


def run(client: FleetClient, args: Any) -> None:
    if args.command == "jobs":
        request = fleet_pb2.ListWorkloadsRequest(
            node=args.node,
            ended=args.ended,
            ended_since_unix_ns=parse_time_ns(args.since) if args.ended else 0,
        )
        print_jobs(client.call(FleetRpc.ListWorkloads, request), _output(args))
    elif args.command == "job":
        scheduler, sep, wid = args.id.partition(":")
        if not sep:
            scheduler, wid = "", args.id
        detail = client.call(FleetRpc.GetWorkload, fleet_pb2.GetWorkloadRequest(scheduler=scheduler, id=wid))
        print_job(detail, _output(args))
    elif args.command == "usage":
        request = fleet_pb2.UsageRequest(
            start_unix_ns=parse_time_ns(args.since), end_unix_ns=parse_time_ns(args.until), by=args.by
        )
        print_usage(client.call(FleetRpc.QueryUsage, request), _output(args))


def _output(args: Any) -> str:
    if args.json and args.csv:
        raise ClientError("give --json or --csv, not both", Exit.USAGE)
    return "json" if args.json else "csv" if args.csv else "table"


def _hours(value: float | None) -> str:
    return fmt(value, ".2f")


def print_jobs(resp: fleet_pb2.ListWorkloadsResponse, output: str) -> None:
    running = [workload_row(w) for w in resp.running]
    ended = [workload_row(w) for w in resp.ended]
    if output == "json":
        age = resp.scheduler_read_age_s if resp.HasField("scheduler_read_age_s") else None
        doc = {"scheduler": resp.scheduler, "scheduler_read_age_s": age, "running": running, "ended": ended}
        print(json.dumps(doc, indent=2))
        return
    if output == "csv":
        print(
            rows_csv([{**r, "state": "running"} for r in running] + [{**r, "state": "ended"} for r in ended]),
            end="",
        )
        return
    if resp.scheduler == "none":
        print(
            "no scheduler is read (workload_scheduler = none): no workload is attributed (docs/workloads.md)"
        )
        return
    if not running and not ended:
        print(f"no workload holds a GPU now ({resp.scheduler} scheduler)")
        return
    for title, rows in (("running", running), ("ended", ended)):
        if not rows:
            continue
        print(f"{title} ({len(rows)}):")
        print(
            tabulate(
                [
                    [
                        r["workload"],
                        r["user"] or NA,
                        r["account"] or r["namespace"] or NA,
                        r["name"] or NA,
                        ",".join(r["nodes"]),
                        r["gpus"],
                        r["start"],
                        _hours(r["gpu_hours_allocated"]),
                        _hours(r["gpu_hours_effective"]),
                        fmt(r["efficiency_pct"]),
                        fmt(r["util_mean_pct"]),
                        gib(r["hbm_peak_bytes"]),
                    ]
                    for r in rows
                ],
                headers=[
                    "WORKLOAD",
                    "USER",
                    "ACCOUNT",
                    "NAME",
                    "NODES",
                    "GPUS",
                    "START",
                    "GPU-H ALLOC",
                    "GPU-H EFFECTIVE",
                    "EFFICIENCY %",
                    "UTIL MEAN %",
                    "HBM PEAK GiB",
                ],
            )
        )


def print_job(detail: fleet_pb2.WorkloadDetail, output: str) -> None:
    w = detail.summary
    row = workload_row(w)
    gpus = [
        {
            "node": g.node,
            "gpu": g.gpu,
            "seconds": g.seconds,
            "util_mean_pct": g.util_mean_pct if g.HasField("util_mean_pct") else None,
            "util_max_pct": g.util_max_pct,
            "idle_seconds": g.idle_seconds,
            "sm_mean_pct": g.sm_mean_pct if g.HasField("sm_mean_pct") else None,
            "hbm_peak_bytes": g.hbm_peak_bytes,
            "energy_j": g.energy_j,
        }
        for g in detail.gpus
    ]
    claims = [
        {"node": c.node, "gpus": list(c.gpu_indices), "pids": list(c.pids), "processes": c.process_count}
        for c in detail.claims
    ]
    if output == "json":
        print(json.dumps({**row, "per_gpu": gpus, "processes": claims}, indent=2))
        return
    if output == "csv":
        print(rows_csv([{"workload": row["workload"], **g} for g in gpus]), end="")
        return
    state = f"ended {row['end']}" if row["end"] else "running"
    print(f"workload {workload_name(w)}: {row['name'] or NA}, {state}")
    print(
        f"  user {row['user'] or NA}, account {row['account'] or NA}, partition {row['partition'] or NA}"
        + (f", namespace {row['namespace']}" if row["namespace"] else "")
        + (f", team {row['team']}" if row["team"] else "")
    )
    print(f"  {row['gpus']} GPU(s) on {', '.join(row['nodes'])}, started {row['start']}")
    print(
        f"  GPU-hours: {_hours(row['gpu_hours_allocated'])} allocated, {_hours(row['gpu_hours_effective'])} "
        f"effective, {_hours(row['gpu_hours_idle'])} idle; efficiency {fmt(row['efficiency_pct'])} %"
    )
    if row["cost_allocated"] is not None:
        print(
            f"  cost: {fmt(row['cost_allocated'], '.2f')} allocated, "
            f"{fmt(row['cost_effective'], '.2f')} effective"
        )
    print(
        tabulate(
            [
                [
                    g["node"],
                    g["gpu"],
                    fmt(g["util_mean_pct"]),
                    fmt(g["util_max_pct"]),
                    fmt(g["sm_mean_pct"]),
                    gib(g["hbm_peak_bytes"]),
                    fmt(g["energy_j"] / 3.6e6, ".3f"),
                    fmt(g["idle_seconds"] / 60, ".1f"),
                ]
                for g in gpus
            ],
            headers=[
                "NODE",
                "GPU",
                "UTIL MEAN %",
                "UTIL MAX %",
                "SM MEAN %",
                "HBM PEAK GiB",
                "ENERGY kWh",
                "IDLE min",
            ],
        )
        if gpus
        else "  no GPU readings yet"
    )
    for c in claims:
        print(
            f"  processes on {c['node']}: {c['processes']} (pids {', '.join(map(str, c['pids']))}) "
            f"on GPU(s) {c['gpus']}"
        )


def print_usage(resp: fleet_pb2.UsageResponse, output: str) -> None:
    rows = [usage_row(r) for r in resp.rows]
    if output == "json":
        doc = {"by": resp.by, "start": iso(resp.start_unix_ns), "end": iso(resp.end_unix_ns), "rows": rows}
        print(json.dumps(doc, indent=2))
        return
    if output == "csv":
        print(rows_csv(rows), end="")
        return
    print(f"GPU usage by {resp.by}, {iso(resp.start_unix_ns)} to {iso(resp.end_unix_ns)}")
    if not rows:
        print("no workload held a GPU in this range")
        return
    priced = any(r["cost_allocated"] is not None for r in rows)
    print(
        tabulate(
            [
                [
                    r["owner"],
                    r["workloads"],
                    _hours(r["gpu_hours_allocated"]),
                    _hours(r["gpu_hours_effective"]),
                    _hours(r["gpu_hours_idle"]),
                    fmt(r["efficiency_pct"]),
                    *([fmt(r["cost_allocated"], ".2f"), fmt(r["cost_effective"], ".2f")] if priced else []),
                ]
                for r in rows
            ],
            headers=[
                resp.by.upper(),
                "WORKLOADS",
                "GPU-H ALLOC",
                "GPU-H EFFECTIVE",
                "GPU-H IDLE",
                "EFFICIENCY %",
                *(["COST ALLOC", "COST EFFECTIVE"] if priced else []),
            ],
        )
    )
