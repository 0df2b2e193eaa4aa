"""A driver call that never returns, and one that returns after 45 s, on a real collector process
over the C stand-in NVML (collector/simnvml/clibrary.py: the collector's real foreign calls; a
stuck call is blocked in C, where Python cannot interrupt it) streaming to a real aggregator with
repair on: the other GPUs keep reporting every interval, the stuck GPUs are
reported driver_unresponsive within the deadline plus one interval and become a finding in
`gpufleet incidents`, the collector stays alive and its /ready names the stuck call, and when
the calls return the GPUs report again without a restart. And a driver stuck with its lock held
(every GPU's calls wait): every GPU is reported driver_unresponsive, the node is not silent, and
SIGTERM still ends the collector within 5 s. And a driver that does not answer nvmlInit: the
collector's start goes on, its node is reported with no GPUs from NVML beside the eight on its PCI
bus (gpu_missing_from_driver takes it out of service), and /ready says so."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpufleet.protos import fleet_pb2, vocabulary_pb2
from harness.dashboard import app
from harness.fleet_api import bearer
from harness.processes import AggregatorHandle, Cluster, Proc
from harness.repair import FAST_POLICY, gpufleet_cli, incidents, repair_aggregator
from harness.stored import read_points
from harness.waiting import wait_until

NODE = "hang-node-01"
INTERVAL_S = 1.0
DEADLINE_S = 2.0
FOREVER_GPU, TIMED_GPU, TIMED_S = 3, 5, 45.0
POLICY = FAST_POLICY + "\n[rules.driver_unresponsive]\nwindow_s = 3.0\n"


def _scenario(path: Path, release: Path) -> Path:
    path.write_text(
        f'[[fault]]\nat_s = 3\ngpu = {FOREVER_GPU}\nkind = "hang"\nsymbol = "nvmlDeviceGetPowerUsage"\n'
        f'release_file = "{release}"\n\n'
        f'[[fault]]\nat_s = 3\ngpu = {TIMED_GPU}\nkind = "hang"\nsymbol = "nvmlDeviceGetTemperature"\n'
        f"seconds = {TIMED_S}\n"
    )
    return path


def _collector(cluster: Cluster, agg: AggregatorHandle, node: str, standin: Path, *extra: str) -> Proc:
    """A simulated collector over the C stand-in NVML, at this module's interval and deadline."""
    return cluster.collector(
        node,
        agg.ingest,
        "--interval-s",
        str(INTERVAL_S),
        "--nvml-deadline-s",
        str(DEADLINE_S),
        "--sim-nvml-library",
        str(standin),
        *extra,
    )


def _probe(collector: Proc, path: str) -> tuple[int, dict[str, Any]]:
    port = int(re.findall(r"127\.0\.0\.1:(\d+)/metrics", collector.log())[0])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _summary(agg: AggregatorHandle, cluster: Cluster, node: str = NODE) -> Any:
    return (
        agg.fleet_stub()
        .GetNode(
            fleet_pb2.GetNodeRequest(node=node), metadata=bearer(cluster.secrets.tokens["viewer"]), timeout=10
        )
        .summary
    )


def _gpus(agg: AggregatorHandle, cluster: Cluster, node: str = NODE) -> dict[int, Any]:
    return {g.index: g for g in _summary(agg, cluster, node).gpus}


def _unresponsive(agg: AggregatorHandle, cluster: Cluster, node: str = NODE) -> set[int]:
    return {i for i, g in _gpus(agg, cluster, node).items() if g.driver_unresponsive}


@pytest.mark.slow
def test_a_hung_driver_call_stops_only_its_gpu_and_recovers_without_a_restart(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, nvml_standin_so: Path
) -> None:
    agg = repair_aggregator(cluster, policy=POLICY)
    release = cluster.tmp / "release-gpu3"
    scenario = _scenario(cluster.tmp / "hang.toml", release)
    collector = _collector(cluster, agg, NODE, nvml_standin_so, "--sim-scenario", str(scenario))
    pid = collector.popen.pid

    wait_until(lambda: _unresponsive(agg, cluster) == {FOREVER_GPU, TIMED_GPU}, 30, "both GPUs stuck")
    hung_from_ns = time.time_ns()
    gpu = _gpus(agg, cluster)[FOREVER_GPU]
    assert gpu.driver_unresponsive_call == "nvmlDeviceGetPowerUsage"
    assert not gpu.HasField("power_w"), "a stuck GPU's values are absent, not stale or zero"

    # The finding, through the Fleet API as a person reads it.
    def findings() -> set[tuple[int, str]]:
        return {(f["gpu"], f["code"]) for i in incidents(agg, cluster, "--node", NODE) for f in i["findings"]}

    wait_until(
        lambda: {(FOREVER_GPU, "driver_unresponsive"), (TIMED_GPU, "driver_unresponsive")} <= findings(),
        30,
        "the driver_unresponsive findings in `gpufleet incidents`",
    )

    # What a person reads: `gpufleet node` says the stuck GPUs are faulty with their finding
    # (never "ok"), as its --json and the dashboard's node page do; the others read ok.
    out = gpufleet_cli(agg, cluster, "viewer", "node", NODE, "--json")
    assert out.returncode == 0, out.stderr
    by_gpu = {g["index"]: g for g in json.loads(out.stdout)["gpus"]}
    for stuck_gpu in (FOREVER_GPU, TIMED_GPU):
        assert by_gpu[stuck_gpu]["health"] == "faulty", by_gpu[stuck_gpu]
        assert by_gpu[stuck_gpu]["findings"] == ["driver_unresponsive"]
    assert {g["health"] for i, g in by_gpu.items() if i not in (FOREVER_GPU, TIMED_GPU)} == {"ok"}
    table = gpufleet_cli(agg, cluster, "viewer", "node", NODE).stdout
    said = {int(line.split()[0]): line for line in table.splitlines() if re.match(r" *\d+ +NVIDIA", line)}
    assert "faulty: driver_unresponsive " in said[FOREVER_GPU], table
    assert " ok " in said[0] and " ok " not in said[FOREVER_GPU]
    at = app(monkeypatch, agg.fleet, cluster.secrets.tokens["viewer"]).run()
    at.sidebar.radio[0].set_value("Node").run()
    shown = dict(zip(at.dataframe[0].value["GPU"], at.dataframe[0].value["health"], strict=True))
    assert shown[FOREVER_GPU].startswith("faulty: driver_unresponsive") and shown[0] == "ok", shown

    # Alive, live and ready, and /ready says which call is stuck where.
    assert collector.alive()
    status, live = _probe(collector, "/healthz")
    assert status == 200, live
    status, ready = _probe(collector, "/ready")
    assert status == 200 and ready["connected"], ready
    stuck = {h["gpu"]: h["nvml_call"] for h in ready["driver_unresponsive"]}
    assert stuck == {FOREVER_GPU: "nvmlDeviceGetPowerUsage", TIMED_GPU: "nvmlDeviceGetTemperature"}
    assert f"GPU {FOREVER_GPU} driver unresponsive" in ready["note"]

    # The 45 s call returns by itself: GPU 5 reports again, GPU 3 is still stuck.
    wait_until(lambda: _unresponsive(agg, cluster) == {FOREVER_GPU}, TIMED_S + 20, "GPU 5's call to return")
    assert _gpus(agg, cluster)[TIMED_GPU].HasField("temp_gpu_c")
    # The call "blocked forever" returns once released: GPU 3 reports again, same process.
    release.touch()
    wait_until(lambda: not _unresponsive(agg, cluster), 20, "GPU 3's call to return")
    recovered_ns = time.time_ns()
    wait_until(lambda: _gpus(agg, cluster)[FOREVER_GPU].HasField("power_w"), 10, "GPU 3's power again")
    assert collector.alive() and collector.popen.pid == pid, "recovered without a restart"
    status, ready = _probe(collector, "/ready")
    assert status == 200 and ready["driver_unresponsive"] == [], ready

    # What was stored while they were stuck: each of the 6 other GPUs every interval; each stuck
    # GPU flagged from its first report on, within the deadline plus one interval of its call.
    points = read_points(agg.data_dir, "gpu", hung_from_ns, recovered_ns)
    span_s = (recovered_ns - hung_from_ns) / 1e9
    per_gpu: dict[int, list[Any]] = {}
    for p in points:
        if p.tags["node"] == NODE:
            per_gpu.setdefault(int(p.tags["gpu"]), []).append(p)
    for index in set(range(8)) - {FOREVER_GPU, TIMED_GPU}:
        reported = len(per_gpu.get(index, []))
        assert reported >= span_s / INTERVAL_S - 3, (index, reported, span_s)
    every = read_points(agg.data_dir, "gpu")
    for index in (FOREVER_GPU, TIMED_GPU):
        flagged = [p for p in every if p.tags["gpu"] == str(index) and p.fields.get("driver_unresponsive")]
        first = flagged[0].fields["driver_unresponsive_s"]
        assert DEADLINE_S <= first <= DEADLINE_S + INTERVAL_S + 0.5, (index, first)
    hung_total = [p.fields["nvml_calls_hung_total"] for p in read_points(agg.data_dir, "collector")]
    assert max(hung_total) == 2, "each stuck call counted once"


@pytest.mark.slow
def test_a_driver_stuck_with_its_lock_held_is_reported_for_every_gpu_and_sigterm_still_ends_it(
    cluster: Cluster, nvml_standin_so: Path
) -> None:
    agg = cluster.aggregator("aggregator", 0, 0, None)
    node = "locked-node-01"
    scenario = cluster.tmp / "locked.toml"
    scenario.write_text(
        '[[fault]]\nat_s = 2\ngpu = 2\nkind = "hang"\nsymbol = "nvmlDeviceGetPowerUsage"\n'
        f'release_file = "{cluster.tmp / "never"}"\nlock = true\n'
    )
    collector = _collector(cluster, agg, node, nvml_standin_so, "--sim-scenario", str(scenario))
    # Every GPU waits on the driver's lock: each is reported stuck, in reports that keep coming.
    wait_until(
        lambda: _unresponsive(agg, cluster, node) == set(range(8)), 30, "all eight GPUs driver_unresponsive"
    )
    assert _gpus(agg, cluster, node)[2].driver_unresponsive_call == "nvmlDeviceGetPowerUsage"
    summary = _summary(agg, cluster, node)
    assert summary.liveness == vocabulary_pb2.LIVENESS_REPORTING, summary
    seen = summary.last_report_unix_ns
    wait_until(lambda: _summary(agg, cluster, node).last_report_unix_ns > seen, 10, "a report after that one")
    # Eight threads blocked in C (one in the hang, seven on its lock): SIGTERM still ends it.
    started = time.monotonic()
    collector.popen.terminate()
    collector.popen.wait(timeout=30)
    took_s = time.monotonic() - started
    assert took_s < 5.0, f"SIGTERM took {took_s:.1f} s to end the collector: {collector.log()[-2000:]}"
    assert collector.popen.returncode == 0, collector.log()[-2000:]


@pytest.mark.slow
def test_a_serving_node_whose_driver_hangs_at_start_in_c_is_reported_flagged_and_stops_on_sigterm(
    cluster: Cluster, nvml_standin_so: Path, stuck_nvml_load_dir: Path
) -> None:
    """Two serving nodes whose NVML never starts, each with an inference engine (the case that went
    silent: its engine named GPUs the node could not declare): one whose nvmlInit blocks in C
    in the C stand-in, one whose libnvidia-ml.so.1 never finishes loading (blocked in C inside
    the dlopen pynvml makes holding its own libLoadLock, glibc holding its loader lock). Each is
    reported (no GPUs from NVML beside the eight on its PCI bus, its engine's KV-cache kept),
    flagged gpu_missing_from_driver within the rule's window plus an interval, its /ready and
    its node page say NVML is stuck, and SIGTERM ends its collector within 5 s."""
    from harness.engine_endpoint import EngineEndpoint

    policy = FAST_POLICY + "\n[rules.gpu_missing_from_driver]\nwindow_s = 2.0\n"
    # Full passes every second: the rule reads the node's counts, not a watched GPU field.
    agg = repair_aggregator(cluster, "--repair-observe-interval-s", "1", policy=policy)
    engines = {n: EngineEndpoint(0.5, model="m") for n in ("init-hang-01", "load-hang-01")}
    try:
        serving = ("--engines", f"{engines['init-hang-01'].url} gpus=0,1")
        collectors = {
            "init-hang-01": _collector(
                cluster, agg, "init-hang-01", nvml_standin_so, "--sim-nvml-init-hang-s", "600", *serving
            ),
            "load-hang-01": cluster.collector(
                "load-hang-01",
                agg.ingest,
                "--interval-s",
                str(INTERVAL_S),
                "--nvml-deadline-s",
                str(DEADLINE_S),
                "--sim-nvml-real-load",
                "--engines",
                f"{engines['load-hang-01'].url} gpus=0,1",
                env={"LD_LIBRARY_PATH": str(stuck_nvml_load_dir)},
            ),
        }
        for node, collector in collectors.items():

            def codes(node: str = node) -> set[str]:
                return {f["code"] for i in incidents(agg, cluster, "--node", node) for f in i["findings"]}

            wait_until(lambda codes=codes: "gpu_missing_from_driver" in codes(), 30, f"{node} flagged")
            summary = _summary(agg, cluster, node)
            assert summary.liveness == vocabulary_pb2.LIVENESS_REPORTING and not summary.gpus, summary
            assert summary.gpus_on_pci_bus == 8
            detail = agg.fleet_stub().GetNode(
                fleet_pb2.GetNodeRequest(node=node), metadata=bearer(cluster.secrets.tokens["viewer"])
            )
            (engine,) = detail.engines
            assert engine.kv_cache_usage_ratio == 0.5 and not engine.gpu_indices, engine
            assert "NVML has not answered its start" in collector.log()
            evidence = [f["evidence"] for i in incidents(agg, cluster, "--node", node) for f in i["findings"]]
            assert any("NVML lists none: the driver has not answered NVML's start" in e for e in evidence), (
                evidence
            )
            status, ready = _probe(collector, "/ready")
            assert status == 200 and "NVML has not answered its start" in ready["note"], ready
            nodes = json.loads(gpufleet_cli(agg, cluster, "viewer", "nodes", "--json").stdout)["nodes"]
            shown = next(n for n in nodes if n["node"] == node)
            assert shown["liveness"] == "reporting" and shown["health"] != "healthy", shown
        for collector in collectors.values():
            started = time.monotonic()
            collector.popen.terminate()
            collector.popen.wait(timeout=30)
            took_s = time.monotonic() - started
            assert took_s < 5.0 and collector.popen.returncode == 0, (took_s, collector.log()[-2000:])
    finally:
        for endpoint in engines.values():
            endpoint.close()
