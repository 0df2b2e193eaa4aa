"""What nodes' engine readings can do to the serving pools' answers, written as the attack: nodes
each reporting many engines with distinct, maximal model names (every name is a node's words)
cannot grow /metrics past MAX_EXPORTED_POOLS pools, nor a ListPools answer past its byte cap."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.aggregator.api.answers import ANSWER_BYTES
from gpufleet.aggregator.fleet.pools import (
    MAX_EXPORTED_POOLS,
    list_pools,
    register_pool_metrics,
    serving_readings,
)
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.protos import fleet_pb2, telemetry_pb2
from gpufleet.protos.limits import MAX_ENGINES_PER_REPORT
from gpufleet.repair.serving import ServingFloor


def flooded_fleet(nodes: int, name_len: int) -> FleetState:
    fleet = FleetState()
    now = time.time_ns()
    for n in range(nodes):
        report = telemetry_pb2.NodeReport(
            node=f"evil-{n}", cluster="c", seq=1, time_unix_ns=now, interval_s=5
        )
        for e in range(MAX_ENGINES_PER_REPORT):
            model = f"{n:04d}-{e:02d}-".ljust(name_len, "x")
            report.engines.append(
                telemetry_pb2.EngineSample(
                    engine="vllm", model=model, port=8000 + e, readable=True, kv_cache_usage_ratio=1.0
                )
            )
        fleet.on_report(report, now)
    return fleet


def test_metrics_export_at_most_max_pools_and_count_the_rest() -> None:
    fleet = flooded_fleet(12, 64)  # 12 x 64 = 768 distinct pools
    registry = CollectorRegistry()
    register_pool_metrics(registry, fleet, ServingFloor, dict)
    text = generate_latest(registry).decode()
    exported = {
        line.split('model="')[1].split('"')[0]
        for line in text.splitlines()
        if "gpufleet_pool_replicas{" in line
    }
    assert len(exported) == MAX_EXPORTED_POOLS
    assert f"gpufleet_pools_not_exported {768 - MAX_EXPORTED_POOLS}.0" in text


def test_a_list_pools_answer_stays_under_its_byte_cap_and_says_it_was_cut() -> None:
    fleet = flooded_fleet(200, 250)  # 12,800 pools with long names and their replicas: ~4 MiB
    answer = list_pools(
        serving_readings(fleet), {}, ServingFloor(), fleet_pb2.ListPoolsRequest(replicas=True)
    )
    assert answer.truncated and 0 < len(answer.pools) < 12_800
    assert answer.ByteSize() <= ANSWER_BYTES + 4096  # the pools, plus the answer's own fields
    assert answer.ByteSize() < 4 << 20, "a client's default limit"
