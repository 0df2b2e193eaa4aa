"""Repair on the demo's simulated fleet with no scheduler (backend none): an uncorrectable ECC
error is cordoned in gpufleet's records, the GPU reset on the node (the simulated GPU itself),
validated clean and returned; a GPU that fell off the bus cannot be reset and, with no reboot
or ticket command configured, ends quarantined for a person."""

from __future__ import annotations

import json

import pytest

from harness.processes import Cluster
from harness.repair import gpufleet_cli, incidents, repair_aggregator, repair_status
from harness.waiting import wait_until

FAULTS = """
[[fault]]
at_s = 1.0
gpu = 5
kind = "ecc_uncorrected"
node = "ecc-node"

[[fault]]
at_s = 1.0
gpu = 2
kind = "xid"
xid = 79
node = "bus-node"

[[fault]]
at_s = 1.0
gpu = 2
kind = "lost"
node = "bus-node"
"""


@pytest.mark.slow
def test_simulated_fleet_repairs_what_a_reset_fixes_and_quarantines_what_it_cannot(cluster: Cluster) -> None:
    agg = repair_aggregator(cluster, "--repair-max-out-of-service-fraction", "1")
    (cluster.tmp / "faults.toml").write_text(FAULTS)
    for node in ("ecc-node", "bus-node", "fine-node"):
        cluster.collector(
            node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(cluster.tmp / "faults.toml")
        )

    def closed(node: str) -> dict | None:
        return next(
            (i for i in incidents(agg, cluster, "--all") if i["node"] == node and not i["open"]), None
        )

    repaired = wait_until(lambda: closed("ecc-node"), 60, "the ECC incident repaired")
    assert repaired["outcome"] == "repaired by reset_gpu"
    assert {f["code"] for f in repaired["findings"]} >= {"ecc_uncorrected", "remap_pending"}
    steps = [(a["action"], a["outcome"]) for a in repaired["actions"]]
    assert ("reset_gpu", "ok") in steps and ("uncordon", "ok") in steps

    wait_until(
        lambda: any(
            n["node"] == "bus-node" and n["state"] == "quarantined"
            for n in repair_status(agg, cluster)["nodes"]
        ),
        60,
        "the lost GPU's node quarantined",
    )
    (open_incident,) = incidents(agg, cluster)
    actions = [(a["action"], a["outcome"].split(":")[0]) for a in open_incident["actions"]]
    assert ("reset_gpu", "failed") in actions, "the simulated reset of a lost GPU fails, as a real one does"
    assert ("reboot", "skipped") in actions and ("ticket", "skipped") in actions
    listed = json.loads(gpufleet_cli(agg, cluster, "viewer", "nodes", "--json").stdout)["nodes"]
    nodes = {n["node"]: n for n in listed}
    assert nodes["fine-node"]["health"] == "healthy" and nodes["ecc-node"]["health"] == "healthy"
    assert nodes["bus-node"]["health"] == "quarantined"
