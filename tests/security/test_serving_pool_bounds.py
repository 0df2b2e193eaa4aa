"""What nodes' engine readings can do to the serving pools' answers, written as the attack: nodes
each reporting many engines with distinct, maximal model and pool names (every name is a node's
words). Names no declared pool takes make no pool at all (counted as unverified replicas); pools
the operator declares are exported at most MAX_EXPORTED_POOLS at a time, and a ListPools answer
stays within its byte cap."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.aggregator.api.answers import ANSWER_BYTES
from gpufleet.aggregator.fleet.pools import (
    MAX_EXPORTED_POOLS,
    ServingReader,
    list_pools,
    register_pool_metrics,
)
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.protos import fleet_pb2, ingest_pb2, telemetry_pb2
from gpufleet.protos.limits import MAX_ENGINES_PER_REPORT, MAX_GPUS_PER_NODE
from gpufleet.repair.policy import Policy, load_policy_text


def model_name(node: int, engine: int, name_len: int) -> str:
    return f"{node:04d}-{engine:02d}-".ljust(name_len, "x")


def flooded_fleet(nodes: int, name_len: int) -> FleetState:
    """Each node declares MAX_GPUS_PER_NODE GPUs and reports MAX_ENGINES_PER_REPORT engines, one
    a GPU, each under a model name of its own ("NNNN-EE-xxx...")."""
    fleet = FleetState()
    now = time.time_ns()
    for n in range(nodes):
        node = f"evil-{n}"
        gpus = [telemetry_pb2.GpuIdentity(index=i) for i in range(MAX_GPUS_PER_NODE)]
        fleet.on_hello(ingest_pb2.Hello(node=node, cluster="c", gpus=gpus), now)
        report = telemetry_pb2.NodeReport(node=node, cluster="c", seq=1, time_unix_ns=now, interval_s=5)
        for e in range(MAX_ENGINES_PER_REPORT):
            model = model_name(n, e, name_len)
            report.engines.append(
                telemetry_pb2.EngineSample(
                    engine="vllm",
                    model=model,
                    port=8000 + e,
                    readable=True,
                    kv_cache_usage_ratio=1.0,
                    requests_running=1,
                    gpu_indices=[e],
                )
            )
        fleet.on_report(report, now)
    return fleet


def declaring_every_model(nodes: int) -> Policy:
    """The operator declares a pool for each model the flooded fleet serves (the worst case for
    /metrics: every name a real pool)."""
    tables = [
        f'[serving.pools."{model_name(n, e, 10)}"]\ncluster = "c"\nnodes = ["evil-{n}"]\n'
        for n in range(nodes)
        for e in range(MAX_ENGINES_PER_REPORT)
    ]
    return load_policy_text("".join(tables), "test")


def scrape(fleet: FleetState, policy: Policy) -> str:
    registry = CollectorRegistry()
    register_pool_metrics(registry, ServingReader(fleet, lambda: policy), lambda: policy.serving, dict)
    return generate_latest(registry).decode()


def test_names_no_declared_pool_takes_make_no_pool_series_and_are_counted() -> None:
    fleet = flooded_fleet(12, 64)  # 768 names, none declared
    text = scrape(fleet, load_policy_text('[serving.pools.real]\ncluster = "c"\nnodes = ["gpu-*"]\n', "t"))
    assert "gpufleet_pool_replicas{" not in text
    assert 'gpufleet_pool_unverified_replicas{reason="not_placed"} 768.0' in text


def test_metrics_export_at_most_max_pools_of_declared_ones_and_count_the_rest() -> None:
    fleet = flooded_fleet(12, 10)  # 12 x 64 = 768 declared pools, one replica each
    text = scrape(fleet, declaring_every_model(12))
    lines = [line for line in text.splitlines() if "gpufleet_pool_replicas{" in line]
    exported = {line.split('model="')[1].split('"')[0] for line in lines}
    assert len(exported) == MAX_EXPORTED_POOLS
    assert f"gpufleet_pools_not_exported {768 - MAX_EXPORTED_POOLS}.0" in text
    assert 'gpufleet_pool_unverified_replicas{reason="not_placed"} 0.0' in text


def test_a_list_pools_answer_stays_under_its_byte_cap_and_says_it_was_cut() -> None:
    fleet = flooded_fleet(16, 10)
    policy = declaring_every_model(16)  # 1,024 pools: the most a policy may declare
    answer = list_pools(
        ServingReader(fleet, lambda: policy)(), {}, policy, fleet_pb2.ListPoolsRequest(replicas=True)
    )
    assert answer.pools_declared == 1024 and answer.unverified_total == 0
    assert 0 < len(answer.pools) <= 1024
    assert answer.ByteSize() <= ANSWER_BYTES + 4096  # the pools, plus the answer's own fields
    assert answer.ByteSize() < 4 << 20, "a client's default limit"


def test_the_unverified_list_is_bounded_and_its_total_exact() -> None:
    fleet = flooded_fleet(200, 250)  # 12,800 replicas under long names nobody declared
    policy = load_policy_text("", "t")
    answer = list_pools(ServingReader(fleet, lambda: policy)(), {}, policy, fleet_pb2.ListPoolsRequest())
    assert answer.unverified_total == 12_800 and len(answer.unverified) == 200
    assert not answer.pools
    assert answer.ByteSize() < 4 << 20
