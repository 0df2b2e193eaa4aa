"""The SRE's repair commands: cordon, uncordon, proceed, incidents, audit, breaker (Fleet API), and
policy check / explain (local: they read the policy files, not the aggregator)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from tabulate import tabulate

from gpufleet.client.fleet import FleetClient
from gpufleet.client.present import incident_work_label, incident_workload_row
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import iso
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import action_name, health_name, outcome_status_name, severity_name


def add_arguments(
    sub: Any, client: argparse.ArgumentParser, watch: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The repair commands; watch adds --watch N to the listing ones."""
    for name, help_text in (
        ("cordon", "take a node out of service (a person's cordon always wins)"),
        ("uncordon", "return a node to service; cancels its repair workflow"),
        ("proceed", "let a drain that waits for serving capacity go on regardless (audited)"),
    ):
        p = sub.add_parser(name, parents=[client], help=help_text)
        p.add_argument("node")
        p.add_argument("--reason", required=True, help="why: recorded in the audit log and the scheduler")
        p.add_argument("--json", action="store_true")
    p = sub.add_parser("incidents", parents=[client], help="repair incidents, newest first")
    p.add_argument("--all", action="store_true", help="closed ones too (default: open only)")
    p.add_argument("--node", default="")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true")
    watch(p)
    p = sub.add_parser("audit", parents=[client], help="every repair action, automatic or manual")
    p.add_argument("--node", default="")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("breaker", parents=[client], help="the repair circuit breaker")
    b = p.add_subparsers(dest="action", required=True)
    q = b.add_parser("status", parents=[client], help="breaker, cap and every node not healthy")
    q.add_argument("--json", action="store_true")
    watch(q)
    q = b.add_parser("reset", parents=[client], help="resume automatic repair after a trip")
    q.add_argument("--reason", required=True)
    q.add_argument("--json", action="store_true")
    p = sub.add_parser("policy", help="the health policy")
    pol = p.add_subparsers(dest="action", required=True)
    q = pol.add_parser("check", help="validate a policy override file")
    q.add_argument("file")
    q = pol.add_parser("explain", help="what the policy does for an XID")
    q.add_argument("--xid", type=int, required=True)
    q.add_argument(
        "--with-xid", type=int, action="append", default=[], help="an XID seen with it (repeatable)"
    )
    q.add_argument("--policy", default="", help="override file to apply on top of the shipped defaults")
    q.add_argument("--json", action="store_true")


def run_policy(args: argparse.Namespace) -> int:
    from gpufleet.repair.policy import check_policy_file, load_policy

    if args.action == "check":
        policy = check_policy_file(args.file)  # PolicyError (a ValueError) → exit 2 with its message
        print(
            f"{args.file}: valid ({len(policy.xids)} XID override(s), "
            f"{len(policy.workflows)} multi-XID workflow(s), {len(policy.rules)} rules)"
        )
        return 0
    explained = load_policy(args.policy or None).explain_xid(args.xid, set(args.with_xid))
    if args.json:
        print(json.dumps(explained, indent=2))
        return 0
    with_text = f" with XID {', '.join(map(str, explained['with_xids']))}" if explained["with_xids"] else ""
    print(f"XID {args.xid}{with_text} ({explained['mnemonic'] or 'not in the catalog'})")
    print(f"  severity  {explained['severity']}")
    print(f"  action    {explained['action']}")
    print(f"  cordon    {'yes' if explained['cordon'] else 'no'}")
    if explained["ladder"]:
        print(f"  repair    {' → '.join(explained['ladder'])} → quarantine")
    print(f"  reason    {explained['reason']}")
    print(f"  from      {explained['decided_by']} ({explained['catalog']})")
    return 0


def _finding_json(f: fleet_pb2.Finding) -> dict[str, Any]:
    return {
        "gpu": f.gpu_index if f.HasField("gpu_index") else None,
        "code": f.code,
        "severity": severity_name(f.severity),
        "action": action_name(f.action),
        "cordon": f.cordon,
        "reason": f.reason,
        "evidence": f.evidence,
        # When gpufleet raised it, and when its evidence starts (a windowed rule's window).
        "detected": iso(f.detected_unix_ns or f.first_seen_unix_ns),
        "first_seen": iso(f.first_seen_unix_ns),
    }


def audit_json(e: fleet_pb2.AuditEntry) -> dict[str, Any]:
    return {
        "time": iso(e.time_unix_ns),
        "actor": e.actor,
        "node": e.node,
        "action": e.action,
        "reason": e.reason,
        "outcome": e.outcome,
        "status": outcome_status_name(e.status) if e.status else "",
        "incident": e.incident_id,
    }


def incident_json(i: fleet_pb2.Incident) -> dict[str, Any]:
    return {
        "id": i.id,
        "node": i.node,
        "open": i.open,
        "state": health_name(i.state),
        "opened": iso(i.opened_unix_ns),
        "closed": iso(i.closed_unix_ns) if i.closed_unix_ns else None,
        "outcome": i.outcome,
        "attempts": i.attempts,
        "findings": [_finding_json(f) for f in i.findings],
        "actions": [audit_json(a) for a in i.actions],
        "workloads": [incident_workload_row(w) for w in i.workloads],
    }


def status_json(st: fleet_pb2.RepairStatus) -> dict[str, Any]:
    return {
        "backend": st.backend,
        "dry_run": st.dry_run,
        "breaker_tripped": st.breaker_tripped,
        "breaker_reason": st.breaker_reason,
        "breaker_tripped_at": iso(st.breaker_tripped_unix_ns) if st.breaker_tripped_unix_ns else None,
        "out_of_service": st.out_of_service,
        "out_of_service_cap": st.out_of_service_cap,
        "nodes": [
            {
                "node": n.node,
                "state": health_name(n.state),
                "incident": n.incident_id,
                "detail": n.detail,
                "findings": [_finding_json(f) for f in n.findings],
            }
            for n in st.nodes
        ],
    }


def _print_status(st: fleet_pb2.RepairStatus) -> None:
    breaker = (
        f"TRIPPED since {iso(st.breaker_tripped_unix_ns)}: {st.breaker_reason}"
        if st.breaker_tripped
        else "ok"
    )
    print(f"backend {st.backend}{' (dry-run)' if st.dry_run else ''}; breaker {breaker}")
    print(f"nodes out of service: {st.out_of_service} of a cap of {st.out_of_service_cap}")
    if st.nodes:
        print(
            tabulate(
                [[n.node, health_name(n.state), n.incident_id, n.detail] for n in st.nodes],
                headers=["NODE", "WORKFLOW", "INCIDENT", "DETAIL"],
            )
        )


def run(client: FleetClient, args: argparse.Namespace) -> None:
    if args.command in ("cordon", "uncordon", "proceed"):
        rpc = {"cordon": FleetRpc.Cordon, "uncordon": FleetRpc.Uncordon, "proceed": FleetRpc.Proceed}
        resp = client.call(rpc[args.command], fleet_pb2.CordonRequest(node=args.node, reason=args.reason))
        if args.json:
            print(json.dumps({"node": args.node, "state": health_name(resp.state), "detail": resp.detail}))
        else:
            print(f"{args.node}: {health_name(resp.state)}" + (f" ({resp.detail})" if resp.detail else ""))
    elif args.command == "incidents":
        resp = client.call(
            FleetRpc.ListIncidents,
            fleet_pb2.ListIncidentsRequest(open_only=not args.all, node=args.node, limit=args.limit),
        )
        rows = [incident_json(i) for i in resp.incidents]
        if args.json:  # an object, as every command's --json: when it was answered, and the rows
            print(json.dumps({"server_time": iso(resp.server_time_unix_ns), "incidents": rows}, indent=2))
        elif not rows:
            print("no open incidents" if not args.all else "no incidents")
        else:
            print(
                tabulate(
                    [
                        [
                            r["id"],
                            r["node"],
                            r["state"] if r["open"] else "closed",
                            r["opened"],
                            ", ".join(
                                f["code"] + ("" if f["gpu"] is None else f"@gpu{f['gpu']}")
                                for f in r["findings"]
                            ),
                            incident_work_label(r["workloads"]),
                            r["outcome"],
                        ]
                        for r in rows
                    ],
                    headers=["INCIDENT", "NODE", "WORKFLOW", "OPENED", "FINDINGS", "WORK HIT", "OUTCOME"],
                )
            )
    elif args.command == "audit":
        resp = client.call(FleetRpc.ListAudit, fleet_pb2.ListAuditRequest(node=args.node, limit=args.limit))
        rows = [audit_json(e) for e in resp.entries]
        if args.json:
            print(json.dumps({"server_time": iso(resp.server_time_unix_ns), "entries": rows}, indent=2))
        elif not rows:
            print("the audit log is empty")
        else:
            print(
                tabulate(
                    [
                        [r["time"], r["actor"], r["node"], r["action"], r["outcome"], r["reason"][:80]]
                        for r in rows
                    ],
                    headers=["TIME", "WHO", "NODE", "ACTION", "OUTCOME", "WHY"],
                )
            )
    elif args.command == "breaker":
        if args.action == "reset":
            st = client.call(FleetRpc.ResetBreaker, fleet_pb2.ResetBreakerRequest(reason=args.reason))
        else:
            st = client.call(FleetRpc.GetRepairStatus, fleet_pb2.RepairStatusRequest())
        if args.json:
            print(json.dumps(status_json(st), indent=2))
        else:
            _print_status(st)
