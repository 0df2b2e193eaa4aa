"""`gpufleet waste`: GPUs held and not used (docs/workloads.md "Waste findings"). What is found
now (idle allocations, orphaned processes, GPUs used outside their allocation: each with its
owner, GPUs and HBM held) and, over --since, each owner's idle GPU-hours: the digest a team
lead reads (`--by user|account|team|namespace|partition`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tabulate import tabulate

from gpufleet.client.exits import ClientError, Exit
from gpufleet.client.fleet import FleetClient
from gpufleet.client.present import NA, gib, rows_csv, usage_row, waste_row
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import iso, parse_time_ns
from gpufleet.protos import fleet_pb2

USAGE_BY = ("account", "team", "namespace", "partition", "user")
COMMANDS = ("waste",)


def add_parser(sub: Any, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "waste",
        parents=[client],
        help="GPUs held and not used: idle allocations, orphaned processes, GPUs outside their allocation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--since", default="1d", help="the digest's start: 10m, 2h, 7d ago, or ISO time (default 1d)"
    )
    p.add_argument("--by", default="account", choices=USAGE_BY, help="the digest's owner (default account)")
    p.add_argument("--node", default="", help="only what is found on this node now")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true", help="what is found now, one row each")


def run(client: FleetClient, args: argparse.Namespace) -> None:
    now = [
        waste_row(w)
        for w in client.call(FleetRpc.ListWorkloads, fleet_pb2.ListWorkloadsRequest(node=args.node)).waste
    ]
    if args.csv:
        print(rows_csv(now), end="")
        return
    start = parse_time_ns(args.since)
    try:
        usage = client.call(FleetRpc.QueryUsage, fleet_pb2.UsageRequest(start_unix_ns=start, by=args.by))
    except ClientError as exc:
        if exc.exit_code != Exit.CREDENTIAL:
            raise
        usage = None  # by user needs the operator role: what is found now is still shown
    digest = sorted(
        (_digest_row(usage_row(r)) for r in usage.rows) if usage is not None else [],
        key=lambda r: -r["gpu_hours_idle"],
    )
    if args.json:
        print(json.dumps({"now": now, "since": iso(start), "by": args.by, "digest": digest}, indent=2))
        return
    _print_now(now)
    print()
    if usage is None:
        print(f"idle GPU-hours by {args.by}: needs the operator role (or show_user_names on the aggregator)")
    elif not digest:
        print(f"no workload held a GPU since {iso(start)}")
    else:
        print(f"idle GPU-hours by {args.by} since {iso(start)}:")
        print(
            tabulate(
                [[r["owner"], r["workloads"], f"{r['gpu_hours_idle']:.2f}", f"{r['gpu_hours_allocated']:.2f}",
                  NA if r["idle_pct"] is None else f"{r['idle_pct']:.0f}"] for r in digest],
                headers=[args.by.upper(), "WORKLOADS", "GPU-H IDLE", "GPU-H ALLOC", "IDLE %"],
            )
        )  # fmt: skip


def _digest_row(r: dict[str, Any]) -> dict[str, Any]:
    allocated = r["gpu_hours_allocated"]
    return {
        "owner": r["owner"],
        "workloads": r["workloads"],
        "gpu_hours_idle": r["gpu_hours_idle"],
        "gpu_hours_allocated": allocated,
        "idle_pct": 100.0 * r["gpu_hours_idle"] / allocated if allocated else None,
    }


def _print_now(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("nothing held and not used is found now")
        return
    print(f"found now ({len(rows)}):")
    print(
        tabulate(
            [
                [
                    r["finding"],
                    r["workload"] or NA,
                    r["user"] or NA,
                    r["account"] or r["namespace"] or NA,
                    r["team"] or NA,
                    ",".join(r["nodes"]),
                    ",".join(map(str, r["gpus"])),
                    gib(r["hbm_used_bytes"]),
                    r["since"],
                ]
                for r in rows
            ],
            headers=["FINDING", "WORKLOAD", "USER", "ACCOUNT", "TEAM", "NODES", "GPUS", "HBM GiB", "FOUND"],
        )
    )
