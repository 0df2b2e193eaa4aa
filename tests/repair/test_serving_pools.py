"""The serving pools' math (repair/serving.py), property-tested over whole fleets of engine
readings: pools partition the replicas; the projection and the headroom agree with each other
and with the floor; readings missing, empty pools, one replica and a node in two pools; and one
node's readings move only the pools it serves."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.repair.health import Health
from gpufleet.repair.serving import (
    Pools,
    ReplicaReading,
    ReplicaState,
    ServingFloor,
    below_floor,
    classify,
    projected_usage,
)

NODES = [f"n{i}" for i in range(8)]
MODELS = ["llama-70b", "qwen-72b", "mistral-7b"]
CLUSTERS = ["a", "b"]
KV = st.none() | st.floats(0.0, 1.0, allow_nan=False)
COUNT = st.none() | st.floats(0.0, 1e5, allow_nan=False)
STATES = st.sampled_from(list(Health))

readings_st = st.builds(
    ReplicaReading,
    node=st.sampled_from(NODES),
    cluster=st.sampled_from(CLUSTERS),
    engine=st.sampled_from(["vllm", "sglang"]),
    model=st.sampled_from(MODELS),
    port=st.integers(8000, 8003),
    readable=st.booleans(),
    reporting=st.booleans(),
    kv_cache_usage_ratio=KV,
    requests_running=COUNT,
    requests_waiting=COUNT,
    preemptions_per_s=COUNT,
    pool=st.sampled_from(["", "", "llama-prod", "llama-batch"]),  # named by the collector, or not
)
fleet_st = st.lists(readings_st, max_size=40)
node_states_st = st.dictionaries(st.sampled_from(NODES), STATES)
floor_st = st.builds(
    ServingFloor,
    max_kv_cache_usage_ratio=st.floats(0.05, 2.0),
    min_serving_replicas=st.integers(0, 4),
)
PROPERTY = settings(max_examples=300, deadline=None)


def figures(pool: object, floor: ServingFloor) -> tuple[object, ...]:
    return (
        pool.count(ReplicaState.SERVING),
        pool.count(ReplicaState.DRAINING),
        pool.count(ReplicaState.OUT),
        pool.kv_cache_usage_mean_ratio,
        pool.kv_cache_usage_max_ratio,
        pool.requests_running,
        pool.requests_waiting,
        pool.preemptions_per_s,
        pool.headroom_replicas(floor),
        pool.projection_if_one_leaves(),
    )


@PROPERTY
@given(fleet_st, node_states_st)
def test_pools_partition_the_replicas_by_cluster_and_model_or_named_pool(
    readings: list[ReplicaReading], states: dict
) -> None:
    pools = Pools(readings, states)
    assert sum(len(p.replicas) for p in pools.by_key.values()) == len(readings)
    for (cluster, name), pool in pools.by_key.items():
        assert all(r.cluster == cluster and (r.pool or r.model) == name for r in pool.replicas)
        assert sum(pool.count(s) for s in ReplicaState) == len(pool.replicas)
        serving_kv = [
            r.kv_cache_usage_ratio
            for r, s in zip(pool.replicas, pool.states, strict=True)
            if s is ReplicaState.SERVING and r.kv_cache_usage_ratio is not None
        ]
        mean = pool.kv_cache_usage_mean_ratio
        assert (mean is None) == (not serving_kv)
        if serving_kv:
            assert (
                min(serving_kv) - 1e-12
                <= mean
                <= max(serving_kv) + 1e-12
                == pool.kv_cache_usage_max_ratio + 1e-12
            )
    for node in NODES:
        assert {id(p) for p in pools.of_node(node)} == {
            id(p) for p in pools.by_key.values() if any(r.node == node for r in p.replicas)
        }


@PROPERTY
@given(fleet_st, node_states_st)
def test_a_replica_serves_only_while_its_engine_answers_and_its_node_is_in_service(
    readings: list[ReplicaReading], states: dict
) -> None:
    for pool in Pools(readings, states).by_key.values():
        for r, s in zip(pool.replicas, pool.states, strict=True):
            node_state = states.get(r.node, Health.HEALTHY)
            if node_state in (Health.REPAIRING, Health.VALIDATING, Health.QUARANTINED):
                assert s is ReplicaState.OUT
            elif node_state == Health.DRAINING:
                assert s is ReplicaState.DRAINING
            else:
                assert s is (ReplicaState.SERVING if r.readable and r.reporting else ReplicaState.OUT)


@PROPERTY
@given(st.lists(st.floats(0.0, 1.0), max_size=12), st.integers(0, 12))
def test_the_projection_starts_at_the_mean_and_only_rises_as_replicas_leave(
    kv: list[float], extra: int
) -> None:
    serving = len(kv) + extra  # some serving replicas may not report their usage
    values = [projected_usage(kv, serving, k) for k in range(serving + 1)]
    if not kv:
        assert all(v is None for v in values)
        return
    assert math.isclose(values[0], sum(kv) / len(kv), abs_tol=1e-12)
    assert math.isinf(values[-1]) if sum(kv) > 0 else values[-1] == 0.0
    assert all(a <= b for a, b in itertools.pairwise(values))


@PROPERTY
@given(fleet_st, node_states_st, floor_st)
def test_headroom_is_exactly_how_many_may_leave_within_the_floor(
    readings: list[ReplicaReading], states: dict, floor: ServingFloor
) -> None:
    for pool in Pools(readings, states).by_key.values():
        serving = pool.count(ReplicaState.SERVING)
        kv = [
            r.kv_cache_usage_ratio
            for r, s in zip(pool.replicas, pool.states, strict=True)
            if s is ReplicaState.SERVING and r.kv_cache_usage_ratio is not None
        ]
        headroom = pool.headroom_replicas(floor)
        if 0 <= headroom <= serving:
            assert not below_floor(projected_usage(kv, serving, headroom), serving - headroom, floor)
        if 0 <= headroom + 1 <= serving:
            assert below_floor(projected_usage(kv, serving, headroom + 1), serving - headroom - 1, floor)
        if headroom < 0 and serving:
            assert below_floor(projected_usage(kv, serving, 0), serving, floor)


@PROPERTY
@given(fleet_st, node_states_st, floor_st, st.sampled_from(NODES), fleet_st)
def test_one_nodes_readings_move_only_the_pools_it_serves(
    readings: list[ReplicaReading], states: dict, floor: ServingFloor, node: str, other: list[ReplicaReading]
) -> None:
    """Whatever a node reports (any engines, models, figures), the pools it is in neither
    before nor after are exactly as they were."""
    others = [r for r in readings if r.node != node]
    forged = [ReplicaReading(**{**vars(r), "node": node}) for r in other]
    before = Pools(others + [r for r in readings if r.node == node], states)
    after = Pools(others + forged, states)
    touched = {r.pool_key for r in readings + forged if r.node == node}
    for key, pool in before.by_key.items():
        if key not in touched:
            assert figures(pool, floor) == figures(after.by_key[key], floor)


def reading(node: str, model: str = "m", kv: float | None = 0.5, **kw: object) -> ReplicaReading:
    return ReplicaReading(node, "c", "vllm", model, 8000, kv_cache_usage_ratio=kv, **kw)


def test_no_engines_no_pools() -> None:
    pools = Pools([], {})
    assert pools.sorted() == [] and pools.projections("n1", {}, ServingFloor()) == []


def test_one_replica_never_drains_for_a_fault_that_may_wait() -> None:
    (p,) = Pools([reading("n1", kv=0.01)], {}).projections("n1", {}, ServingFloor())
    assert (p.replicas_now, p.replicas_after, p.below_floor) == (1, 0, True)
    assert math.isinf(p.kv_after) and p.describe() == "m 1 → 0 replicas, projected KV 1 % → none left"
    (p,) = Pools([reading("n1", kv=0.01)], {}).projections("n1", {}, ServingFloor(min_serving_replicas=0))
    assert p.below_floor, "no replica left and load on it: above any KV floor"


def test_readings_missing_leave_only_the_replica_count() -> None:
    pools = Pools([reading("n1", kv=None), reading("n2", kv=None)], {})
    (p,) = pools.projections("n1", {}, ServingFloor())
    assert (p.kv_now, p.kv_after, p.below_floor) == (None, None, False)
    assert p.describe() == "m 2 → 1 replicas"
    assert pools.by_key[("c", "m")].headroom_replicas(ServingFloor()) == 1


def test_a_node_in_two_pools_is_projected_in_each() -> None:
    pools = Pools(
        [
            reading("n1", "a", 0.85),
            reading("n2", "a", 0.85),
            reading("n1", "b", 0.2),
            reading("n3", "b", 0.2),
        ],
        {},
    )
    by_model = {p.model: p for p in pools.projections("n1", {}, ServingFloor())}
    assert by_model["a"].below_floor and not by_model["b"].below_floor
    assert math.isclose(by_model["a"].kv_after, 1.7) and math.isclose(by_model["b"].kv_after, 0.4)


def test_two_replicas_of_one_model_on_a_node_both_leave() -> None:
    second = ReplicaReading("n1", "c", "vllm", "m", 8001, kv_cache_usage_ratio=0.3)
    pools = Pools([reading("n1", kv=0.3), second, reading("n2", kv=0.3)], {})
    (p,) = pools.projections("n1", {}, ServingFloor())
    assert (
        (p.replicas_now, p.replicas_after) == (3, 1) and math.isclose(p.kv_after, 0.9) and not p.below_floor
    )


def test_the_issue_example_three_replicas_at_85_percent() -> None:
    pools = Pools([reading(n, kv=0.85) for n in ("n1", "n2", "n3")], {})
    (p,) = pools.projections("n1", {}, ServingFloor())
    assert p.below_floor and math.isclose(p.kv_after, 1.275)
    assert pools.by_key[("c", "m")].headroom_replicas(ServingFloor()) == 0
    with_fourth = Pools([*(reading(n, kv=0.85) for n in ("n1", "n2", "n3")), reading("n4", kv=0.0)], {})
    (p,) = with_fourth.projections("n1", {}, ServingFloor())
    assert not p.below_floor and math.isclose(p.kv_after, 0.85)


def test_load_classes() -> None:
    def cls(util: float | None, **v: float) -> str:
        return classify(True, v.get("kv"), v.get("running"), v.get("waiting"), v.get("preemptions"), util)

    assert cls(0.0, running=0, waiting=0, kv=0.0) == "idle"
    assert cls(40.0, running=8, waiting=0, kv=0.95) == "KV-bound"
    assert cls(60.0, running=8, waiting=3, kv=0.8) == "KV-bound"
    assert cls(95.0, running=8, waiting=0, kv=0.4) == "compute-bound"
    assert cls(70.0, running=8, waiting=0, kv=0.4) == "compute-bound"  # the printed rule's line
    assert cls(44.0, running=8, waiting=0, kv=0.8) == "light", "44 % under a ≥ 70 % rule is not compute-bound"
    assert cls(None, running=8, waiting=0, kv=0.4) == "unknown", "no GPU figure: no guess"
    assert cls(90.0, running=8) == "unknown", "no KV-cache figure: no guess"
    assert classify(False, None, None, None, None, None) == "unreadable"


def test_two_deployments_of_one_model_named_apart_are_weighed_apart() -> None:
    """One model served by a production and a batch deployment in one cluster: named pools
    (the collectors' pool=) keep the busy production pool's floor from being met by the idle
    batch replicas, which one pool of the model would count."""
    model = "meta-llama/Llama-3.1-70B-Instruct"
    prod = [
        ReplicaReading(f"p{i}", "a", "vllm", model, 8000, kv_cache_usage_ratio=0.85, pool="llama-prod")
        for i in range(3)
    ]
    batch = [
        ReplicaReading(f"b{i}", "a", "vllm", model, 8000, kv_cache_usage_ratio=0.05, pool="llama-batch")
        for i in range(3)
    ]
    named = Pools(prod + batch, {})
    assert sorted(named.by_key) == [("a", "llama-batch"), ("a", "llama-prod")]
    (p,) = named.projections("p0", {}, ServingFloor())
    assert p.model == "llama-prod" and p.below_floor and p.describe().startswith("llama-prod 3 → 2 replicas")
    one = Pools([replace(r, pool="") for r in prod + batch], {})
    (together,) = one.projections("p0", {}, ServingFloor())
    assert not together.below_floor, "one pool of the model hides the production pool's pressure"


def test_a_replica_never_read_is_in_no_pool_unless_its_collector_names_one() -> None:
    never_read = ReplicaReading("n9", "a", "unknown", "unknown", 8000, readable=False)
    assert Pools([never_read], {}).by_key == {}
    named = Pools([replace(never_read, pool="llama-prod")], {})
    assert named.by_key[("a", "llama-prod")].count(ReplicaState.OUT) == 1
