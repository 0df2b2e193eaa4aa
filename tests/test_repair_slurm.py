"""Repair end to end on a real Slurm: simulated collectors with injected faults, the real
aggregator, real slurmctld/slurmd, a real HTTP alert receiver."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from alert_receiver import AlertReceiver
from conftest import AggregatorHandle, Cluster, gpufleet_argv, wait_until

# Short windows so a test takes seconds; the shipped defaults are in repair/default_policy.toml.
FAST_POLICY = """
[workflow]
validate_s = 2.0
reboot_timeout_s = 60.0
reset_timeout_s = 20.0
"""


def xid_scenario(path: Path, xid: int, gpu: int = 3, lost: bool = False, at_s: float = 1.0) -> Path:
    text = f'[[fault]]\nat_s = {at_s}\ngpu = {gpu}\nkind = "xid"\nxid = {xid}\n'
    if lost:
        text += f'\n[[fault]]\nat_s = {at_s}\ngpu = {gpu}\nkind = "lost"\n'
    path.write_text(text)
    return path


def repair_aggregator(
    cluster: Cluster, *extra: str, policy: str = FAST_POLICY, **kwargs: Any
) -> AggregatorHandle:
    policy_file = cluster.tmp / "policy.toml"
    policy_file.write_text(policy)
    return cluster.aggregator(
        kwargs.get("name", "aggregator"),
        0,
        0,
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


def audit(agg: AggregatorHandle, cluster: Cluster, node: str = "") -> list[dict[str, Any]]:
    out = gpufleet_cli(agg, cluster, "viewer", "audit", "--json", *(["--node", node] if node else []))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def incidents(agg: AggregatorHandle, cluster: Cluster, *extra: str) -> list[dict[str, Any]]:
    out = gpufleet_cli(agg, cluster, "viewer", "incidents", "--json", *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def drained(slurm: Any, node: str) -> bool:
    return "DRAIN" in slurm.state(node)[0]


@pytest.mark.slow
def test_xid79_is_drained_reset_rebooted_validated_and_resumed(cluster: Cluster, slurm: Any) -> None:
    node = "gpu-node-01"
    receiver = AlertReceiver()
    agg = repair_aggregator(
        cluster, *slurm_args(slurm, cluster), "--alert-webhooks", receiver.url, "--alert-group-wait-s", "0.5"
    )
    resets = cluster.tmp / "resets.txt"
    reset = f"sh -c 'echo {{gpu_index}} >> {resets}'"
    scenario = xid_scenario(cluster.tmp / "xid79.toml", 79, gpu=3, lost=True)
    collector = cluster.collector(
        node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario), "--reset-command", reset
    )

    wait_until(lambda: drained(slurm, node), 30, "the node drained in Slurm")
    words, reason = slurm.state(node)
    assert reason.startswith("gpufleet: xid_79 on GPU 3"), reason
    assert not drained(slurm, "gpu-node-02"), "only the faulty node is drained"

    # The GPU reset runs on the node, through the collector; the GPU stays lost, so the
    # workflow goes on to the reboot hook.
    wait_until(lambda: lines(resets) == ["3"], 30, "the GPU reset on the node")
    wait_until(lambda: lines(cluster.tmp / "reboots.txt") == [node], 30, "the reboot hook")
    assert drained(slurm, node), "still out of service while it reboots"

    # The "reboot": the node goes down and comes back with a fresh collector and healthy GPUs.
    collector.stop(signal.SIGKILL)
    cluster.collector(node, agg.ingest, "--interval-s", "1", "--reset-command", reset)

    wait_until(lambda: not drained(slurm, node), 60, "the node resumed in Slurm after validation")
    (incident,) = incidents(agg, cluster, "--all")
    assert not incident["open"] and incident["outcome"] == "repaired by reboot"
    assert {f["code"] for f in incident["findings"]} >= {"xid_79", "gpu_lost"}
    steps = [(a["action"], a["outcome"]) for a in audit(agg, cluster, node)]
    assert ("cordon", "ok") in steps and ("uncordon", "ok") in steps
    order = [a for a, _ in steps]
    assert (
        order.index("cordon")
        < order.index("drain")
        < order.index("reset_gpu")
        < order.index("reboot")
        < order.index("uncordon")
    ), order
    assert ("validate", "failed") in steps, "the reset was checked and found not to help"
    assert lines(resets) == ["3"], "the reset was done once"

    # One alert identity for the incident: fired, updated through the states, resolved.
    wait_until(
        lambda: any(a["status"] == "resolved" for a in receiver.for_key(incident["id"])),
        30,
        "the resolved alert",
    )
    alerts = receiver.for_key(incident["id"])
    assert alerts[0]["status"] == "firing" and alerts[0]["node"] == node
    assert alerts[-1]["status"] == "resolved" and "repaired by reboot" in alerts[-1]["summary"]
    receiver.close()


@pytest.mark.slow
def test_application_xid_does_not_cordon(cluster: Cluster, slurm: Any) -> None:
    node = "gpu-node-02"
    agg = repair_aggregator(cluster, *slurm_args(slurm, cluster))
    scenario = xid_scenario(cluster.tmp / "xid13.toml", 13, gpu=0)
    cluster.collector(node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))

    def seen() -> dict[str, Any] | None:
        status = json.loads(gpufleet_cli(agg, cluster, "viewer", "breaker", "status", "--json").stdout)
        return next((n for n in status["nodes"] if n["node"] == node), None)

    finding = wait_until(seen, 30, "the XID 13 finding")["findings"][0]
    assert finding["code"] == "xid_13" and finding["action"] == "RESTART_APP" and not finding["cordon"]
    assert finding["severity"] == "info"
    # The finding is evaluated on every pass; several passes later the node is still in service.
    passes_then = agg.metric_value("gpufleet_repair_passes")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes") > passes_then + 5, 20, "more passes")
    assert not drained(slurm, node)
    assert incidents(agg, cluster, "--all") == []
    assert [a for a in audit(agg, cluster) if a["action"] == "cordon"] == []
