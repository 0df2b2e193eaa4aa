"""Faults injected into a collector process's simulated GPUs, found in the store through
the real aggregator — and XIDs arriving between sampling ticks."""

from __future__ import annotations

import time

import pytest

from harness.fleet_api import bearer
from harness.processes import Cluster
from harness.stored import read_points
from harness.waiting import wait_until

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

[[fault]]
at_s = 1.5
gpu = 3
kind = "power"

[[fault]]
at_s = 1.5
gpu = 5
kind = "nvlink_down"
link = 2

[[fault]]
at_s = 1.5
gpu = 6
kind = "pcie_replays"
count = 9

[[fault]]
at_s = 1.5
gpu = 2
kind = "remap_failure"
"""


@pytest.mark.slow
def test_injected_faults_reach_the_store_and_xids_do_not_wait_for_the_tick(cluster: Cluster) -> None:
    path = cluster.tmp / "faults.toml"
    path.write_text(SCENARIO)
    agg = cluster.aggregator()
    collector = cluster.collector("faulty", agg.ingest, "--interval-s", "5", "--sim-scenario", str(path))
    wait_until(lambda: "scenario: xid on GPU 4" in collector.log(), 20, "the XID to be injected")
    injected = time.monotonic()
    (xid,) = wait_until(
        lambda: [p for p in read_points(agg.data_dir, "event") if p.tags["kind"] == "xid"],
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
        for p in read_points(agg.data_dir, "gpu"):  # oldest first: the last one per GPU wins
            newest[p.tags["gpu"]] = p
        return newest if newest["2"].fields.get("ecc_dbe_volatile") == 1 else None

    gpus = wait_until(faulted_sample, 15, "a sample taken after the ECC fault")
    assert gpus["2"].fields["remap_pending"] == 1 and gpus["2"].fields["remap_uncorrectable"] == 1
    assert gpus["1"].fields["throttle_thermal"] == 1 and gpus["1"].fields["throttle_power"] == 0
    assert gpus["3"].fields["throttle_power"] == 1 and gpus["3"].fields["throttle_thermal"] == 0
    assert (gpus["5"].fields["nvlink_links_active"], gpus["5"].fields["nvlink_links_inactive"]) == (17, 1)
    assert gpus["6"].fields["pcie_replay_total"] == 9 and gpus["2"].fields["remap_failure"] == 1
    assert gpus["7"].fields["lost"] == 1 and "util_gpu_pct" not in gpus["7"].fields
    assert gpus["0"].fields["ecc_dbe_volatile"] == 0 and gpus["0"].fields["lost"] == 0
    lost = [p for p in read_points(agg.data_dir, "event") if p.tags["kind"] == "gpu_lost"]
    assert [p.tags["gpu"] for p in lost] == ["7"]


def test_a_bad_scenario_stops_the_collector_with_the_fault_named(cluster: Cluster) -> None:
    path = cluster.tmp / "bad.toml"
    path.write_text('[[fault]]\nat_s = 1\ngpu = 9\nkind = "lost"\n')
    proc = cluster.collector("n1", "127.0.0.1:1", "--sim-gpus", "8", "--sim-scenario", str(path))
    assert proc.popen.wait(timeout=60) == 2
    assert "names GPU 9; node n1 has 8" in proc.log()


@pytest.mark.slow
def test_kernel_log_xids_are_mapped_deduplicated_and_odd_lines_counted(cluster: Cluster) -> None:
    import os

    from gpufleet.protos import fleet_pb2

    fifo = cluster.tmp / "kmsg"
    os.mkfifo(fifo)
    scenario = cluster.tmp / "xid.toml"
    scenario.write_text('[[fault]]\nat_s = 1\ngpu = 4\nkind = "xid"\nxid = 79\n')
    agg = cluster.aggregator()
    collector = cluster.collector(
        "kmsg-node",
        agg.ingest,
        "--interval-s",
        "0.5",
        "--kmsg-path",
        str(fifo),
        "--sim-scenario",
        str(scenario),
    )
    wait_until(
        lambda: [p for p in read_points(agg.data_dir, "event") if p.fields.get("xid") == 79],
        20,
        "the NVML XID 79 in the store",
    )
    # Simulated GPU 4 sits on bus 5c, GPU 2 on 3a (as on an HGX board).
    with open(fifo, "w") as kmsg:
        kmsg.write(
            "6,1001,123456789,-;NVRM: Xid (PCI:0000:5c:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        )
        kmsg.write(
            "[ 4909.9] NVRM: Xid (PCI:0000:3a:00): 13, pid=4242, name=python3, Graphics SM Warp Exception\n"
        )
        kmsg.write("NVRM: Xid (PCI:0000:e1:00): 48, An uncorrectable double bit error\n")
        kmsg.write("NVRM: Xid (PCI:garbage\n")
        kmsg.write("\x00\xff not a kernel line at all\n")

    def events() -> list:
        got = [p for p in read_points(agg.data_dir, "event") if p.tags["kind"] == "xid"]
        return got if len(got) >= 3 else []

    xids = wait_until(events, 20, "the kernel-log XIDs in the store")
    by_xid = {p.fields["xid"]: p for p in xids}
    assert sorted(by_xid) == [13, 48, 79] and len(xids) == 3, "XID 79 seen by NVML and kmsg is stored once"
    assert by_xid[13].tags["source"] == "kmsg" and by_xid[13].tags["gpu"] == "2"
    assert by_xid[13].fields["pid"] == 4242 and by_xid[13].fields["process_name"] == "python3"
    assert "gpu" not in by_xid[48].tags and by_xid[48].fields["pci_bus_id"] == "0000:e1:00"

    viewer = cluster.secrets.tokens["viewer"]

    def stats() -> object:
        detail = agg.fleet_stub().GetNode(fleet_pb2.GetNodeRequest(node="kmsg-node"), metadata=bearer(viewer))
        s = detail.collector_stats
        return (
            s if s.kmsg_lines_unparsed_total and s.xid_unknown_gpu_total and s.xid_duplicates_total else None
        )

    s = wait_until(stats, 10, "the collector's own health to count the odd input")
    assert (s.kmsg_lines_unparsed_total, s.xid_unknown_gpu_total, s.xid_duplicates_total) == (1, 1, 1)
    assert collector.alive()


def test_prometheus_endpoint_lints_clean_and_shows_absent_as_absent(cluster: Cluster) -> None:
    import shutil
    import subprocess
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from harness.processes import free_port

    scenario = cluster.tmp / "m.toml"
    scenario.write_text(
        '[[fault]]\nat_s = 0\ngpu = 1\nkind = "not_supported"\nsymbol = "nvmlDeviceGetPowerUsage"\n'
        '[[fault]]\nat_s = 0\ngpu = 0\nkind = "ecc_uncorrected"\ncount = 2\n'
    )
    port = free_port()
    cluster.collector(
        "prom-node",
        "127.0.0.1:1",
        "--interval-s",
        "0.2",
        "--sim-gpus",
        "2",
        "--sim-scenario",
        str(scenario),
        "--metrics-listen",
        f"127.0.0.1:{port}",
    )

    def scrape() -> str:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return text if "gpufleet_gpu_ecc_uncorrected_volatile_total" in text and 'gpu="1"' in text else ""

    text = wait_until(scrape, 30, "the collector's /metrics to show a sample taken after the faults")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    util = {s.labels["gpu"]: s.value for s in families["gpufleet_gpu_utilization_ratio"].samples}
    assert set(util) == {"0", "1"} and all(0 <= v <= 1 for v in util.values())
    power = {s.labels["gpu"] for s in families["gpufleet_gpu_power_watts"].samples}
    assert power == {"0"}, "GPU 1 does not report power: no sample, not 0"
    ecc = families["gpufleet_gpu_ecc_uncorrected_volatile"]
    assert ecc.type == "counter"
    assert {s.labels["gpu"]: s.value for s in ecc.samples if s.name.endswith("_total")} == {
        "0": 2.0,
        "1": 0.0,
    }
    sample = families["gpufleet_gpu_sm_clock_hertz"].samples[0]
    assert (
        sample.labels["node"] == "prom-node"
        and sample.labels["uuid"].startswith("GPU-")
        and sample.value > 1e8
    )

    def reconnects() -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        (family,) = [
            f for f in text_string_to_metric_families(text) if f.name == "gpufleet_collector_reconnects"
        ]
        return family.samples[0].value

    wait_until(lambda: reconnects() >= 1, 20, "the failed connections (no aggregator) to be counted")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: scripts/test.sh installs Debian's prometheus package")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
