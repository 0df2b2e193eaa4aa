"""What the capacity guard costs a repair pass: 2,000 nodes x 8 GPUs, a quarter of them serving
(one vLLM replica each: four models of 125 replicas at 0.895 KV-cache usage, so one replica
less puts a pool at 0.902, past the 0.9 floor), ten serving nodes cordoned for a fault that may
wait, so every pass checks ten held drains.

    python bench/capacity_guard_bench.py              # 2,000 nodes, 40 full passes each way
    python bench/capacity_guard_bench.py --nodes 8000 --passes 20

In-process: the real live view (aggregator/fleet/state.py, its engines and GPU samples), the
real snapshot and engine-reading builders the aggregator hands the controller
(aggregator/repair_wiring.py `snapshots`, aggregator/fleet/pools.py `serving_readings`), the
real controller, policy and SQLite state, backend `none`. Baseline, same run: the same fleet
and faults with the guard off ([serving] guard = false), whose ten nodes drain and go on to
quarantine. Reported: the median full pass with the guard on and off, the difference, and the
guard's own check (the fleet's pools built and one node projected) timed alone. Target: the
guard adds at most 10 ms to a pass at 2,000 nodes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

from loadgen import machine

from gpufleet.aggregator.fleet.pools import serving_readings
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.repair_wiring import snapshots
from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.controller import Hooks, Rails, RepairController
from gpufleet.repair.policy import load_policy_text
from gpufleet.repair.state import open_state

DEFERRABLE = "[xid.79]\nmay_wait = true\n"


def fleet_of(nodes: int, serving_every: int = 4, faulty: int = 10) -> FleetState:
    fleet = FleetState()
    now = time.time_ns()
    for i in range(nodes):
        name = f"node-{i:05d}"
        serving = i % serving_every == 0
        report = telemetry_pb2.NodeReport(
            node=name,
            cluster="bench",
            seq=1,
            time_unix_ns=now,
            interval_s=5.0,
            gpus=[
                telemetry_pb2.GpuSample(index=g, uuid=f"GPU-{name}-{g}", util_gpu_pct=90.0, power_w=600.0)
                for g in range(8)
            ],
        )
        if serving:
            report.engines.append(
                telemetry_pb2.EngineSample(
                    engine="vllm",
                    model=f"model-{(i // serving_every) % 4}",
                    port=8000,
                    gpu_indices=list(range(8)),
                    readable=True,
                    kv_cache_usage_ratio=0.895,
                    requests_running=40,
                    requests_waiting=0,
                    preemptions_total=0,
                )
            )
        if serving and i // serving_every < faulty:
            report.events.append(
                telemetry_pb2.Event(
                    kind=vocabulary_pb2.EVENT_KIND_XID,
                    source=vocabulary_pb2.EVENT_SOURCE_NVML,
                    time_unix_ns=now,
                    gpu_index=0,
                    xid=79,
                )
            )
        fleet.on_report(report, now)
    return fleet


def controller(tmp: Path, fleet: FleetState, policy_text: str) -> RepairController:
    state = open_state("sqlite", str(tmp / "repair.sqlite3"))
    return RepairController(
        load_policy_text(policy_text, "bench"),
        state,
        NoBackend(),
        Rails(max_out_of_service=1000, max_out_of_service_fraction=1, breaker_nodes=1000),
        Hooks(),
        AlertDispatcher([], store=state.kept),
        lambda only: snapshots(fleet, only),
        lambda node, command: False,
        serving=lambda: serving_readings(fleet, gpu_util=False),  # as aggregator/repair_wiring.py
    )


async def full_passes(repair: RepairController, passes: int) -> list[float]:
    for _ in range(5):  # warm up: the faulty nodes cordoned, then held (on) or drained (off)
        await repair.pass_once()
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        await repair.pass_once()
        times.append(time.perf_counter() - started)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=40)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each held drain and step is logged: not the bench's output
    print(f"machine: {machine()}")
    fleet = fleet_of(args.nodes)
    serving = sum(1 for live in fleet.nodes.values() if live.engines)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, text in (
            ("guard off", DEFERRABLE + "[serving]\nguard = false\n"),
            ("guard on", DEFERRABLE),
        ):
            run = Path(tmp) / label.replace(" ", "-")
            run.mkdir()
            repair = controller(run, fleet, text)
            results[label] = await full_passes(repair, args.passes)
            held = sum(
                1 for w in repair.workflows.values() if w.held is not None and w.held.kind == "capacity"
            )
            print(f"{label}: {held} drains held for capacity after the warm-up")
            if label == "guard on":
                node = next(n for n, w in repair.workflows.items() if w.held is not None)
                checks = []
                for _ in range(args.passes):
                    repair.capacity.new_pass()
                    started = time.perf_counter()
                    repair.capacity.projections(node, repair.workflows)
                    checks.append(time.perf_counter() - started)
    on, off = statistics.median(results["guard on"]), statistics.median(results["guard off"])
    print(f"{args.nodes} nodes, {serving} serving, {args.passes} full passes each (medians):")
    print(f"  pass, guard off   {off * 1000:8.2f} ms")
    print(f"  pass, guard on    {on * 1000:8.2f} ms   ({on / off:.2f}x)")
    print(f"  guard adds        {(on - off) * 1000:8.2f} ms   (target <= 10 ms)")
    check_ms = statistics.median(checks) * 1000
    print(f"  one guard check   {check_ms:8.2f} ms   (the fleet's pools built, one node projected)")


if __name__ == "__main__":
    asyncio.run(main())
