"""Which pool a replica is in is the control plane's word (repair/placement.py), property-tested
over whole fleets of claims: a replica no declared pool places on its node is in no pool's
figures; a node never has more verified replicas than GPUs, nor one GPU in two; the pool's
cluster is the placement's whatever the node says; idle replicas are listed but are no
headroom; and adding any claims from a node no pool places changes no pool's figure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.repair.health import Health
from gpufleet.repair.placement import Placement, PoolPlacement, placement_from_table
from gpufleet.repair.serving import Pools, ReplicaReading, ReplicaState, ServingFloor

SERVERS = ["gpu-a-1", "gpu-a-2", "gpu-b-1"]
MODELS = ["llama", "qwen"]
PLACEMENT = Placement(
    (
        PoolPlacement("llama", "prod", ("gpu-a-*",)),
        PoolPlacement("qwen-batch", "batch", ("gpu-b-*",), ("qwen",)),
    )
)

claims_st = st.lists(
    st.builds(
        ReplicaReading,
        node=st.sampled_from([*SERVERS, "evil"]),
        cluster=st.sampled_from(["prod", "batch", "elsewhere", "x" * 200]),
        engine=st.sampled_from(["vllm", "sglang"]),
        model=st.sampled_from([*MODELS, "meta/llama 3", "<!channel>"]),
        port=st.integers(8000, 8020),
        gpu_indices=st.lists(st.integers(0, 9), max_size=3, unique=True).map(tuple),
        kv_cache_usage_ratio=st.none() | st.floats(0, 1.5, allow_nan=False),
        requests_running=st.none() | st.floats(0, 100, allow_nan=False),
        pool=st.sampled_from(["", "llama", "qwen-batch", "made-up", "a" * 64, "[x](https://e)"]),
        idle=st.booleans(),
    ),
    max_size=40,
)
gpus_st = st.fixed_dictionaries({n: st.integers(0, 8) for n in [*SERVERS, "evil"]})


def figures(pools: Pools) -> dict[tuple[str, str], tuple[object, ...]]:
    floor = ServingFloor()
    return {
        key: (
            pool.count(ReplicaState.SERVING),
            pool.kv_cache_usage_mean_ratio,
            pool.headroom_replicas(floor),
            tuple(pool.projection({n}, floor) for n in SERVERS),
        )
        for key, pool in pools.by_key.items()
    }


@settings(max_examples=300, deadline=None)
@given(claims_st, gpus_st)
def test_only_what_the_placement_places_counts_and_each_node_within_its_gpus(
    claims: list[ReplicaReading], gpus: dict[str, int]
) -> None:
    placed = PLACEMENT.place(claims, gpus)
    assert len(placed) == len(claims)
    by_node: dict[str, list[ReplicaReading]] = {}
    for r in placed:
        if r.unverified:
            assert r.unverified_kind and not Pools([r], {}).by_key, "an unverified replica makes no pool"
            continue
        by_node.setdefault(r.node, []).append(r)
        declared = PLACEMENT.pool_for(r.node, r.pool, r.model)
        assert declared is not None and (r.cluster, r.pool) == (declared.cluster, declared.name)
        assert r.node != "evil"
    for node, verified in by_node.items():
        assert len(verified) <= gpus[node], "no more replicas than the GPUs it declared"
        used = [g for r in verified for g in r.gpu_indices]
        assert len(used) == len(set(used)), "no GPU in two replicas"


@settings(max_examples=300, deadline=None)
@given(claims_st, claims_st, gpus_st)
def test_claims_from_a_node_no_pool_places_change_no_pools_figures(
    claims: list[ReplicaReading], evil: list[ReplicaReading], gpus: dict[str, int]
) -> None:
    honest = [r for r in claims if r.node != "evil"]
    attack = [replace(r, node="evil") for r in evil]
    before = Pools(PLACEMENT.place(honest, gpus), {})
    after = Pools(PLACEMENT.place(honest + attack, {**gpus, "evil": 64}), {})
    assert figures(after) == figures(before)
    assert len(after.unverified) == len(before.unverified) + len(attack)


@settings(max_examples=200, deadline=None)
@given(claims_st, gpus_st, st.sampled_from(list(Health)))
def test_idle_replicas_are_listed_but_no_serving_capacity(
    claims: list[ReplicaReading], gpus: dict[str, int], state: Health
) -> None:
    pools = Pools(PLACEMENT.place(claims, gpus), {n: state for n in SERVERS})
    for pool in pools.by_key.values():
        for r, s in zip(pool.replicas, pool.states, strict=True):
            if s is ReplicaState.SERVING:
                assert not r.idle
        busy_only = Pools([r for r in pool.replicas if not r.idle], {n: state for n in SERVERS})
        key = (pool.cluster, pool.model)
        if key in busy_only.by_key:
            assert busy_only.by_key[key].kv_readings() == pool.kv_readings()
            assert busy_only.by_key[key].count(ReplicaState.SERVING) == pool.count(ReplicaState.SERVING)


def test_the_pools_table_is_checked_with_the_table_key_and_what_to_give() -> None:
    good = placement_from_table(
        {"meta-llama/Llama-3.1-70B-Instruct": {"cluster": "prod", "nodes": ["gpu-*"]}}, "p.toml"
    )
    assert good.pools[0].takes("gpu-1", "", "meta-llama/Llama-3.1-70B-Instruct")
    assert not good.pools[0].takes("gpu-1", "other-pool", "meta-llama/Llama-3.1-70B-Instruct")
    assert not good.pools[0].takes("cpu-1", "", "meta-llama/Llama-3.1-70B-Instruct")
    for table, words in (
        ({"a<b": {"cluster": "c", "nodes": ["x"]}}, "neither a pool name nor a model name"),
        ({"p": {"cluster": "c", "nodes": []}}, "nodes = [] must be a list of 1 to 256"),
        ({"p": {"cluster": "-x", "nodes": ["n"]}}, "cluster = '-x' must be a cluster name"),
        ({"p": {"cluster": "c", "nodes": ["n"], "modles": []}}, "unknown key(s) modles"),
        ({"p": {"cluster": "c", "nodes": ["n"], "models": ["a b"]}}, "models: model name 'a b'"),
    ):
        with pytest.raises(ValueError, match=r"p\.toml: \[serving\.pools\.") as info:
            placement_from_table(table, "p.toml")
        assert words in str(info.value), info.value
