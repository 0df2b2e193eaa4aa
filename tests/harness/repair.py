"""The repair tests' shared steps: a fast policy, an XID scenario, an aggregator with repair on,
the CLI as a person runs it, the audit, incidents and breaker status as its --json says them,
and the audit log read straight from the repair state."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import grpc

from gpufleet.cli.repair_cmds import audit_json, incident_json, status_json
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.repair.outcome import Outcome
from harness.processes import AggregatorHandle, Cluster, gpufleet_argv

# Short windows so a test takes seconds; the shipped defaults are in repair/default_policy.toml.
FAST_POLICY = """
[workflow]
validate_s = 2.0
reboot_timeout_s = 60.0
reset_timeout_s = 20.0
"""


def declared_pool(name: str, nodes: list[str], cluster: str = "test", models: list[str] | None = None) -> str:
    """A policy's `[serving.pools.NAME]` table (repair/placement.py): which nodes serve the pool."""
    text = f"\n[serving.pools.{json.dumps(name)}]\ncluster = {json.dumps(cluster)}\n"
    text += f"nodes = {json.dumps(nodes)}\n"
    return text + (f"models = {json.dumps(models)}\n" if models is not None else "")


def xid_scenario(path: Path, xid: int, gpu: int = 3, lost: bool = False, at_s: float = 1.0) -> Path:
    text = f'[[fault]]\nat_s = {at_s}\ngpu = {gpu}\nkind = "xid"\nxid = {xid}\n'
    if lost:
        text += f'\n[[fault]]\nat_s = {at_s}\ngpu = {gpu}\nkind = "lost"\n'
    path.write_text(text)
    return path


def repair_flags(policy_file: Path) -> tuple[str, ...]:
    """A fast repair loop on the given policy, the cap as a fraction out of the way (tests with
    a handful of nodes would otherwise be held at one)."""
    return (
        "--repair-policy-file",
        str(policy_file),
        "--repair-interval-s",
        "0.2",
        "--repair-max-out-of-service-fraction",
        "1",
    )


def repair_aggregator(
    cluster: Cluster, *extra: str, policy: str = FAST_POLICY, **kwargs: Any
) -> AggregatorHandle:
    policy_file = cluster.tmp / "policy.toml"
    policy_file.write_text(policy)
    ingest_port, fleet_port = kwargs.get("ports", (0, 0))
    return cluster.aggregator(
        kwargs.get("name", "aggregator"),
        ingest_port,
        fleet_port,
        kwargs.get("data_dir"),
        "--repair-policy-file",
        str(policy_file),
        "--repair-interval-s",
        "0.2",
        *extra,
    )


def slurm_args(slurm: Any, cluster: Cluster) -> list[str]:
    return [
        "--repair-backend",
        "slurm",
        "--repair-slurm-conf",
        str(slurm.conf),
        "--repair-reboot-command",
        f"sh -c 'echo {{node}} >> {cluster.tmp}/reboots.txt'",
    ]


def gpufleet_cli(
    agg: AggregatorHandle, cluster: Cluster, token: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpufleet_argv(*args, "--fleet", agg.fleet, "--token", cluster.secrets.tokens[token]),
        capture_output=True,
        text=True,
        timeout=60,
    )


# The repair side's answers as `gpufleet audit|incidents|breaker status --json` print them, read
# through the Fleet API in this process with the CLI's own formatting (cli/repair_cmds.py): tests
# poll these many times a second, and a CLI process per look was ~0.1 s of CPU each. The CLI's
# own text and exit codes are tested as a person runs them (tests/fleet/test_demo_and_cli.py).
def _ask(agg: AggregatorHandle, cluster: Cluster, rpc: str, request: Any) -> Any:
    with grpc.insecure_channel(agg.fleet) as channel:
        call = getattr(fleet_pb2_grpc.FleetStub(channel), rpc)
        return call(request, metadata=cluster.secrets.metadata("viewer"), timeout=30)


def audit(agg: AggregatorHandle, cluster: Cluster, node: str = "") -> list[dict[str, Any]]:
    answer = _ask(agg, cluster, "ListAudit", fleet_pb2.ListAuditRequest(node=node, limit=200))
    return [audit_json(e) for e in answer.entries]


def incidents(agg: AggregatorHandle, cluster: Cluster, *extra: str) -> list[dict[str, Any]]:
    """extra: `incidents`' flags, --all and --node NODE."""
    node = extra[extra.index("--node") + 1] if "--node" in extra else ""
    request = fleet_pb2.ListIncidentsRequest(open_only="--all" not in extra, node=node, limit=100)
    return [incident_json(i) for i in _ask(agg, cluster, "ListIncidents", request).incidents]


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def drained(slurm: Any, node: str) -> bool:
    return "DRAIN" in slurm.state(node)[0]


def repair_status(agg: AggregatorHandle, cluster: Cluster) -> dict[str, Any]:
    return status_json(_ask(agg, cluster, "GetRepairStatus", fleet_pb2.RepairStatusRequest()))


def saved_state(data_dir: Path, node: str) -> str:
    """The node's workflow state as the repair state holds it on disk (read-only): what a
    restarted aggregator resumes from. The Fleet API shows a pass's state before the pass has
    written it."""
    db = sqlite3.connect(f"file:{data_dir / 'repair.sqlite3'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT body FROM workflow WHERE node = ?", (node,)).fetchone()
    finally:
        db.close()
    return str(json.loads(row[0])["state"]) if row else "healthy"


def audit_rows(data_dir: Path) -> list[dict[str, Any]]:
    """The audit log as the aggregator wrote it (read-only, straight from its repair state); each
    row's `status` is its outcome's, as the repair code reads it (repair/outcome.py)."""
    db = sqlite3.connect(f"file:{data_dir / 'repair.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT seq, actor, node, action, reason, outcome FROM audit ORDER BY seq"
        ).fetchall()
    finally:
        db.close()
    columns = ("seq", "actor", "node", "action", "reason", "outcome")
    return [{**dict(zip(columns, r, strict=True)), "status": str(Outcome.parse(r[5]).status)} for r in rows]
