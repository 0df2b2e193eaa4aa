"""The fleet's serving pools, built from the live view (repair/serving.py holds the pool math):
what the Fleet API's ListPools and GetNode answer, the capacity guard reads and /metrics
exports. Computed on demand from each node's latest engine samples, so a pool is never older
than its replicas' last reports."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from gpufleet.aggregator.api.answers import ANSWER_BYTES, AnswerBytes
from gpufleet.aggregator.declared_metrics import family
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.protos import fleet_pb2, vocabulary_pb2
from gpufleet.repair.capacity import node_states, waiting_nodes
from gpufleet.repair.placement import REFUSAL_KINDS
from gpufleet.repair.policy import Policy
from gpufleet.repair.serving import (
    LOAD_CLASS_RULE,
    PROJECTION_RULE,
    Pool,
    Pools,
    Projection,
    ReplicaReading,
    ReplicaState,
    ServingFloor,
    readings_of,
)
from gpufleet.repair.state import Workflow

MAX_EXPORTED_POOLS = 500  # /metrics: pools exported, the largest first (model names are a node's words)

log = logging.getLogger("gpufleet.aggregator")


UNVERIFIED_LOG_EVERY_S = 60.0  # each node's unverified replicas are logged at most this often
MAX_NODES_LOGGED = 10  # nodes whose unverified replicas one read logs (the rest counted)
_FLEET = ""  # the log-throttle key of the fleet-wide "no pool declared" line (no node is named "")
MAX_UNVERIFIED_LISTED = 200  # in a ListPools answer (the total is always given)


class ServingReader:
    """Every engine replica in the live view, placed in the pools the policy declares
    (repair/placement.py: a node's pool and cluster are its words, the placement is the control
    plane's) and marked idle after the floor's idle window. Replicas no pool takes are kept
    aside (`unverified`), counted on /metrics and logged at most once a minute per node."""

    def __init__(self, fleet: FleetState, policy: Callable[[], Policy]) -> None:
        self._fleet = fleet
        self._policy = policy
        self._logged_s: dict[str, float] = {}  # node -> when its unverified replicas were last logged
        # Read on the event loop (the repair pass) and on the HTTP server's threads (/metrics).
        self._lock = threading.Lock()

    def __call__(self, gpu_util: bool = True, now_ns: int | None = None) -> list[ReplicaReading]:
        """gpu_util: read each replica's GPUs' utilization too (this reads the GPU samples out of
        their columns: on the event loop only)."""
        now = now_ns or time.time_ns()
        policy = self._policy()
        idle_after_ns = policy.serving.idle_replica_window_s * 1e9
        claimed: list[ReplicaReading] = []
        gpus_declared: dict[str, int] = {}
        for live in list(self._fleet.nodes.values()):
            engines = list(live.engines.values())
            if not engines:
                continue
            # The GPUs it declared (its Hello), or those its PCI bus shows where NVML listed
            # fewer (a driver stuck at its start still serves: collector/sources/nvml_start.py).
            gpus_declared[live.node] = max(live.gpu_count, live.gpus_on_pci_bus or 0)
            reporting = self._fleet.liveness(live, now) == vocabulary_pb2.LIVENESS_REPORTING
            active = live.engines_active_ns
            for r in readings_of(
                live.node,
                live.cluster,
                reporting,
                engines,
                live.gpus if gpu_util else {},
                live.preemptions_per_s,
                live.engines_heard_ns,
            ):
                idle = now - active.get((r.engine, r.port), now) >= idle_after_ns
                claimed.append(dataclasses.replace(r, idle=True) if idle else r)
        placed = policy.placement.place(claimed, gpus_declared)
        self._log_unverified(placed)
        return placed

    def _log_unverified(self, placed: list[ReplicaReading]) -> None:
        """Log the unverified replicas: with no pool declared, one line for the fleet; else each
        node's at most once a minute, at most MAX_NODES_LOGGED nodes a read (the rest counted in
        that read's last line)."""
        by_node: dict[str, list[ReplicaReading]] = {}
        for r in placed:
            if r.unverified:
                by_node.setdefault(r.node, []).append(r)
        mono = time.monotonic()
        undeclared = {n for n, rs in by_node.items() if all(r.unverified_kind == "not_declared" for r in rs)}
        with self._lock:
            for node in [n for n in self._logged_s if n not in by_node and n != _FLEET]:
                del self._logged_s[node]  # bounded by the nodes with unverified replicas now
            due = [
                n
                for n in [*([_FLEET] if undeclared else []), *sorted(set(by_node) - undeclared)]
                if mono - self._logged_s.get(n, -UNVERIFIED_LOG_EVERY_S) >= UNVERIFIED_LOG_EVERY_S
            ]
            for node in due:  # each once a minute, named or counted
                self._logged_s[node] = mono
        logged = due[:MAX_NODES_LOGGED]
        for node in logged:
            if node == _FLEET:
                log.warning(
                    "%d engine replica(s) on %d node(s) are in no serving pool: no pool is declared (the "
                    "repair policy's [serving.pools], docs/repair.md), so no drain waits for serving "
                    "capacity; logged once a minute",
                    sum(len(by_node[n]) for n in undeclared),
                    len(undeclared),
                )
                continue
            first = by_node[node][0]
            log.warning(
                "%d engine replica(s) of node %s are in no serving pool's figures: %s:%d claims %r: %s",
                len(by_node[node]),
                node,
                first.engine,
                first.port,
                first.pool or first.model,
                first.unverified,
                extra={"node": node},
            )
        if len(due) > len(logged):
            log.warning(
                "... and %d more node(s) with engine replicas no declared pool places (gpufleet pools)",
                len(due) - len(logged),
            )


def _set(
    msg: fleet_pb2.ServingPool | fleet_pb2.PoolReplica | fleet_pb2.DrainProjection, **values: float | None
) -> None:
    for name, value in values.items():
        if value is not None:
            setattr(msg, name, value)


def pool_pb(pool: Pool, floor: ServingFloor, waiting: set[str], replicas: bool) -> fleet_pb2.ServingPool:
    msg = fleet_pb2.ServingPool(
        cluster=pool.cluster,
        model=pool.model,
        replicas_serving=pool.count(ReplicaState.SERVING),
        replicas_draining=pool.count(ReplicaState.DRAINING),
        replicas_out=pool.count(ReplicaState.OUT),
        replicas_idle=pool.count(ReplicaState.IDLE),
        headroom_replicas=pool.headroom_replicas(floor),
        nodes_waiting=sorted({r.node for r in pool.replicas} & waiting),
    )
    if_one_leaves = pool.projection_if_one_leaves()
    _set(
        msg,
        kv_cache_usage_mean_ratio=pool.kv_cache_usage_mean_ratio,
        kv_cache_usage_max_ratio=pool.kv_cache_usage_max_ratio,
        requests_running=pool.requests_running,
        requests_waiting=pool.requests_waiting,
        preemptions_per_s=pool.preemptions_per_s,
        kv_cache_usage_if_one_leaves_ratio=if_one_leaves,
    )
    if replicas:
        for r, state in zip(pool.replicas, pool.states, strict=True):
            msg.replicas.append(replica_pb(r, state.value))
    return msg


UNVERIFIED_STATE = "unverified"  # a replica's state word where no declared pool counts it


def replica_pb(r: ReplicaReading, state: str) -> fleet_pb2.PoolReplica:
    """One replica's readings as the Fleet API answers them."""
    rep = fleet_pb2.PoolReplica(
        node=r.node,
        engine=r.engine,
        port=r.port,
        gpu_indices=r.gpu_indices,
        state=state,
        load_class=r.load_class,
        unreadable_reason=r.unreadable_reason,
    )
    _set(
        rep,
        kv_cache_usage_ratio=r.kv_cache_usage_ratio,
        requests_running=r.requests_running,
        requests_waiting=r.requests_waiting,
        preemptions_total=r.preemptions_total,
        preemptions_per_s=r.preemptions_per_s,
        gpu_util_pct=r.gpu_util_pct,
    )
    return rep


def list_pools(
    readings: Iterable[ReplicaReading],
    workflows: Mapping[str, Workflow],
    policy: Policy,
    request: fleet_pb2.ListPoolsRequest,
) -> fleet_pb2.ListPoolsResponse:
    """ListPools' answer: pools by cluster and name, at most ANSWER_BYTES of them, and the
    replicas nodes claim that no declared pool takes."""
    floor = policy.serving
    clusters = set(request.clusters)
    chosen = [
        r
        for r in readings
        if (not clusters or r.cluster in clusters)
        and (not request.model or request.model in (r.model, r.pool))
    ]
    pools = Pools(chosen, node_states(workflows))
    waiting = waiting_nodes(workflows)
    resp = fleet_pb2.ListPoolsResponse(
        floor_kv_cache_usage_ratio=floor.max_kv_cache_usage_ratio,
        floor_min_serving_replicas=floor.min_serving_replicas,
        guard=floor.guard,
        formula=PROJECTION_RULE,
        load_class_rule=LOAD_CLASS_RULE,
        server_time_unix_ns=time.time_ns(),
        unverified_total=len(pools.unverified),
        pools_declared=len(policy.placement.pools),
    )
    for r in pools.unverified[:MAX_UNVERIFIED_LISTED]:
        entry = resp.unverified.add(
            node=r.node,
            engine=r.engine,
            port=r.port,
            claimed=r.pool or r.model,
            reason=r.unverified,
            kind=r.unverified_kind,
            cluster=r.cluster,
            model=r.model,
        )
        if request.replicas:
            entry.replica.CopyFrom(replica_pb(r, UNVERIFIED_STATE))
    answer = AnswerBytes(ANSWER_BYTES - resp.ByteSize())  # the unverified list's bytes count too
    for pool in pools.sorted():
        msg = pool_pb(pool, floor, waiting, request.replicas)
        if not answer.fits(msg):
            resp.truncated = True
            break
        resp.pools.append(msg)
    return resp


def projection_pb(p: Projection) -> fleet_pb2.DrainProjection:
    msg = fleet_pb2.DrainProjection(
        cluster=p.cluster,
        model=p.model,
        replicas_now=p.replicas_now,
        replicas_after=p.replicas_after,
        below_floor=p.below_floor,
    )
    _set(msg, kv_cache_usage_now_ratio=p.kv_now, kv_cache_usage_after_ratio=p.kv_after)
    return msg


def if_drained(
    node: str, readings: Iterable[ReplicaReading], workflows: Mapping[str, Workflow], floor: ServingFloor
) -> list[fleet_pb2.DrainProjection]:
    """What draining `node` would do to each pool it serves (GetNode)."""
    states = node_states(workflows)
    return [projection_pb(p) for p in Pools(readings, states).projections(node, states, floor)]


class PoolGauges:
    """Per-pool gauges on the aggregator's /metrics, the scaling signal for an autoscaler
    (deploy/kubernetes/keda-scaledobject.yaml): gpufleet_pool_kv_cache_usage_ratio{stat=mean|max},
    gpufleet_pool_requests_waiting, gpufleet_pool_replicas{state}, gpufleet_pool_headroom_replicas
    and gpufleet_pool_repairs_waiting_for_capacity, labelled cluster and model. Model names are
    what nodes report: at most MAX_EXPORTED_POOLS pools (the most replicas first), the rest
    counted in gpufleet_pools_not_exported."""

    def __init__(
        self,
        readings: ServingReader,
        floor: Callable[[], ServingFloor],
        workflows: Callable[[], Mapping[str, Workflow]],
    ) -> None:
        self._readings, self._floor, self._workflows = readings, floor, workflows

    def collect(self) -> Iterable[GaugeMetricFamily]:
        kv = family("gpufleet_pool_kv_cache_usage_ratio")
        waiting_requests = family("gpufleet_pool_requests_waiting")
        replicas = family("gpufleet_pool_replicas")
        headroom = family("gpufleet_pool_headroom_replicas")
        repairs = family("gpufleet_pool_repairs_waiting_for_capacity")
        left_out = family("gpufleet_pools_not_exported")
        unverified = family("gpufleet_pool_unverified_replicas")
        workflows = self._workflows()
        floor = self._floor()
        fleet_pools = Pools(self._readings(gpu_util=False), node_states(workflows))
        for kind in REFUSAL_KINDS:
            count = sum(1 for r in fleet_pools.unverified if r.unverified_kind == kind)
            unverified.add_metric([kind], float(count))
        pools = fleet_pools.sorted()
        waiting = waiting_nodes(workflows)
        pools.sort(key=lambda p: -len(p.replicas))
        for pool in pools[:MAX_EXPORTED_POOLS]:
            key = [pool.cluster, pool.model]
            for stat, value in (
                ("mean", pool.kv_cache_usage_mean_ratio),
                ("max", pool.kv_cache_usage_max_ratio),
            ):
                if value is not None:
                    kv.add_metric([*key, stat], value)
            if pool.requests_waiting is not None:
                waiting_requests.add_metric(key, pool.requests_waiting)
            for state in ReplicaState:
                replicas.add_metric([*key, state.value], float(pool.count(state)))
            headroom.add_metric(key, float(pool.headroom_replicas(floor)))
            repairs.add_metric(key, float(len({r.node for r in pool.replicas} & waiting)))
        left_out.add_metric([], float(max(0, len(pools) - MAX_EXPORTED_POOLS)))
        yield from (kv, waiting_requests, replicas, headroom, repairs, left_out, unverified)


def register_pool_metrics(
    registry: CollectorRegistry,
    readings: ServingReader,
    floor: Callable[[], ServingFloor],
    workflows: Callable[[], Mapping[str, Workflow]],
) -> None:
    registry.register(PoolGauges(readings, floor, workflows))
