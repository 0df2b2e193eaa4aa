"""Each failure the driver hides behind "healthy", end to end on the stand-in NVML: a fault in a
real simulated collector, the new signal on the wire, the aggregator's rule, the finding in
`gpufleet incidents` with the policy's action, and the repair that follows where the policy
cordons. One aggregator, a node per fault, and a healthy node that must stay clean."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import action_name
from harness.processes import Cluster
from harness.repair import FAST_POLICY, audit, gpufleet_cli, incidents, lines, repair_aggregator
from harness.waiting import wait_until

# Short windows, so findings come in seconds (the shipped ones are minutes: repair/default_policy.toml).
POLICY = FAST_POLICY + "".join(
    f"\n[rules.{rule}]\nwindow_s = 2.0\n"
    for rule in (
        "pcie_downtrained",
        "fabric_down",
        "gpu_missing_from_driver",
        "ecc_corrected_storm",
        "gpu_slow",
    )
)

# node -> (scenario faults, the finding expected: (GPU or None, code, action))
FAULTS: dict[str, tuple[str, tuple[int | None, str, str]]] = {
    "recovery-node": (
        'kind = "recovery_action"\ngpu = 1\naction = 2\n',
        (1, "recovery_action", "RESTART_BM"),
    ),
    "pcie-node": (
        'kind = "pcie_downtrain"\ngpu = 2\ngen = 3\nwidth = 8\n',
        (2, "pcie_downtrained", "ALERT_ONLY"),
    ),
    "fabric-node": (
        'kind = "fabric_down"\ngpu = 0\nstate = 3\nstatus = 999\n',
        (0, "fabric_down", "RESTART_BM"),
    ),
    "missing-node": (
        'kind = "gpu_missing"\ngpu = 0\ncount = 1\n',
        (None, "gpu_missing_from_driver", "RESTART_BM"),
    ),
    "storm-node": ('kind = "ecc_storm"\ngpu = 4\nrate = 5000\n', (4, "ecc_corrected_storm", "RESET_GPU")),
    "slow-node": ('kind = "slow"\ngpu = 6\nfactor = 0.7\n', (6, "gpu_slow", "ALERT_ONLY")),
}
BUSY = 'kind = "busy"\ngpu = 0\nutil = 97\n'  # every node under steady load from the start


def _scenario(path: Path, fault: str) -> Path:
    path.write_text(f"[[fault]]\nat_s = 0\n{BUSY}\n[[fault]]\nat_s = 2\n{fault}")
    return path


@pytest.mark.slow
def test_each_hidden_failure_becomes_its_finding_and_only_that(cluster: Cluster) -> None:
    started = time.time()
    reboots = cluster.tmp / "reboots.txt"
    agg = repair_aggregator(
        cluster,
        "--repair-max-out-of-service-fraction",
        "1",
        "--repair-reboot-command",
        f"sh -c 'echo {{node}} >> {reboots}'",
        policy=POLICY,
    )
    for node, (fault, _) in FAULTS.items():
        scenario = _scenario(cluster.tmp / f"{node}.toml", fault)
        cluster.collector(node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))
    healthy = _scenario(cluster.tmp / "healthy.toml", 'kind = "heal"\ngpu = 0\n')
    cluster.collector("healthy-node", agg.ingest, "--interval-s", "1", "--sim-scenario", str(healthy))

    def found() -> dict[str, set[tuple[Any, str, str]]]:
        """What `gpufleet incidents --all` says (the person's view, read once it is all there)."""
        out: dict[str, set[tuple[Any, str, str]]] = {}
        for incident in incidents(agg, cluster, "--all"):
            for f in incident["findings"]:
                out.setdefault(incident["node"], set()).add((f["gpu"], f["code"], f["action"]))
        return out

    stub, meta = agg.fleet_stub(), cluster.secrets.metadata("viewer")

    def found_so_far() -> set[tuple[str, Any, str, str]]:
        # Polled through the Fleet API (a CLI process per look was a third of this test's CPU).
        answer = stub.ListIncidents(fleet_pb2.ListIncidentsRequest(limit=100), metadata=meta, timeout=30)
        return {
            (i.node, f.gpu_index if f.HasField("gpu_index") else None, f.code, action_name(f.action))
            for i in answer.incidents
            for f in i.findings
        }

    expected = {node: want for node, (_, want) in FAULTS.items()}
    wait_until(
        lambda: {(node, *want) for node, want in expected.items()} <= found_so_far(),
        60,
        "every hidden failure's finding",
    )
    seen = found()
    for node, (gpu, code, _) in expected.items():
        # Only the faulty GPU: the fabric, storm and slowness rules judge each GPU on its own.
        assert {(g, c) for g, c, _ in seen[node]} == {(gpu, code)}, (node, seen[node])
    assert "healthy-node" not in seen, seen.get("healthy-node")

    # NVML asked for a node reboot: the repair starts at the reboot, not with a GPU reset first.
    wait_until(lambda: "recovery-node" in lines(reboots), 30, "the reboot NVML asked for")
    steps = [a["action"] for a in audit(agg, cluster, "recovery-node")]
    assert "reset_gpu" not in steps and "reboot" in steps, steps
    # Alert-only rules touch nothing.
    for node in ("pcie-node", "slow-node"):
        assert "cordon" not in [a["action"] for a in audit(agg, cluster, node)], node

    # Replaying the store's own history takes out the nodes the live controller did: the new
    # signals (and the node's GPU counts) are in the history the replay reads.
    cordoned = {a["node"] for a in audit(agg, cluster) if a["action"] == "cordon" and a["outcome"] == "ok"}
    assert cordoned == {"recovery-node", "fabric-node", "missing-node", "storm-node"}, cordoned
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started - 5))
    out = gpufleet_cli(agg, cluster, "viewer", "replay", "--since", since, "--json")
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)["nodes_taken_out_in_order"]) == cordoned
