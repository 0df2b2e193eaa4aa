"""Faults injected into a collector process's simulated GPUs, found in the store through
the real aggregator — and XIDs arriving between sampling ticks."""

from __future__ import annotations

import time

import pytest
from conftest import Cluster, wait_until

from gpufleet.aggregator.store import EmbeddedStore

SCENARIO = """
[[fault]]
at_s = 1.5
gpu = 4
kind = "xid"
xid = 79

[[fault]]
at_s = 1.5
gpu = 2
kind = "ecc_uncorrected"

[[fault]]
at_s = 1.5
gpu = 1
kind = "thermal"

[[fault]]
at_s = 1.5
gpu = 7
kind = "lost"

[[fault]]
at_s = 1.5
gpu = 0
kind = "xid"
xid = 13
node = "some-other-node"
"""


def points(data_dir: object, measurement: str) -> list:
    store = EmbeddedStore(data_dir / "store.sqlite3", retention_s=86400)  # type: ignore[operator]
    try:
        return store.query_points(measurement, 0, time.time_ns() + 10**12)
    finally:
        store.close()


@pytest.mark.slow
def test_injected_faults_reach_the_store_and_xids_do_not_wait_for_the_tick(cluster: Cluster) -> None:
    path = cluster.tmp / "faults.toml"
    path.write_text(SCENARIO)
    agg = cluster.aggregator()
    collector = cluster.collector("faulty", agg.ingest, "--interval-s", "5", "--sim-scenario", str(path))
    wait_until(lambda: "scenario: xid on GPU 4" in collector.log(), 20, "the XID to be injected")
    injected = time.monotonic()
    (xid,) = wait_until(
        lambda: [p for p in points(agg.data_dir, "event") if p.tags["kind"] == "xid"],
        10,
        "the XID event in the store",
    )
    latency_s = time.monotonic() - injected
    # The collector samples every 5 s; the XID came through NVML's event set at once.
    assert latency_s < 2.0, f"XID took {latency_s:.2f}s to reach the store"
    assert xid.tags["gpu"] == "4" and xid.tags["source"] == "nvml" and xid.fields["xid"] == 79
    assert xid.tags["node"] == "faulty", "a fault for another node is not applied here"

    def faulted_sample() -> dict[str, object] | None:
        newest: dict[str, object] = {}
        for p in points(agg.data_dir, "gpu"):  # oldest first: the last one per GPU wins
            newest[p.tags["gpu"]] = p
        return newest if newest["2"].fields.get("ecc_dbe_volatile") == 1 else None

    gpus = wait_until(faulted_sample, 15, "a sample taken after the ECC fault")
    assert gpus["2"].fields["remap_pending"] == 1 and gpus["2"].fields["remap_uncorrectable"] == 1
    assert gpus["1"].fields["throttle_thermal"] == 1 and gpus["1"].fields["throttle_power"] == 0
    assert gpus["7"].fields["lost"] == 1 and "util_gpu_pct" not in gpus["7"].fields
    assert gpus["0"].fields["ecc_dbe_volatile"] == 0 and gpus["0"].fields["lost"] == 0
    lost = [p for p in points(agg.data_dir, "event") if p.tags["kind"] == "gpu_lost"]
    assert [p.tags["gpu"] for p in lost] == ["7"]


def test_a_bad_scenario_stops_the_collector_with_the_fault_named(cluster: Cluster) -> None:
    path = cluster.tmp / "bad.toml"
    path.write_text('[[fault]]\nat_s = 1\ngpu = 9\nkind = "lost"\n')
    proc = cluster.collector("n1", "127.0.0.1:1", "--sim-gpus", "8", "--sim-scenario", str(path))
    assert proc.popen.wait(timeout=60) == 2
    assert "names GPU 9; node n1 has 8" in proc.log()
