"""Serving pools: the inference-engine replicas that serve one model in one cluster, and what
taking one node out would do to them (docs/repair.md "Serving-aware repair").

Computed once, here, from the engines' readings the collectors send (KV-cache usage, requests
running and waiting, preemptions) and the repair workflow's state of each node; the
aggregator's fleet view builds them (aggregator/fleet/pools.py) and the Fleet API, the CLI,
the dashboard, /metrics and the capacity guard (repair/capacity.py) all read them from there.

**The projection.** A pool has n replicas serving, with KV-cache usage u_1..u_m read from the
m ≤ n of them that report it. If k of them leave (their node is drained), their requests move
to the n - k that remain, which are assumed alike (same model, same cache size):

    projected = mean(u) x n / (n - k)   (∞ when n - k = 0 under load; none when m = 0)

A pool is below its floor when projected > floor.max_kv_cache_usage_ratio or n - k <
floor.min_serving_replicas. Headroom is the most replicas that can leave without going below
the floor: n - needed, needed = max(min_serving_replicas, ceil(mean(u) x n / max_kv)); negative:
that many replicas short of the floor already (the scaling signal).

Every figure of a pool comes from its own replicas' readings: a node's engines move only the
pools they serve. Which pool a replica is in is the control plane's word, not the node's
(repair/placement.py: the policy's `[serving.pools]`); a replica placed nowhere is *unverified*
(`ReplicaReading.unverified` says why) and in no pool's figures, and one that has served no
request for the floor's `idle_replica_window_s` is *idle*: listed, but not counted as serving
capacity, so replicas that take no traffic are no headroom. Readings built elsewhere (replay
traces, the tests' fleets) are the placement's output already. A replica whose engine has never
been read (its model unknown) and whose collector names no pool is in none."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.protos import telemetry_pb2
from gpufleet.protos.names import UNKNOWN_ENGINE_MODEL
from gpufleet.repair.health import Health

# The load classes (the Inference page's scatter and the pools' replica table).
KV_BOUND_USAGE = 0.90
KV_BOUND_USAGE_WITH_QUEUE = 0.75
COMPUTE_BOUND_UTIL_PCT = 70.0
LOAD_CLASS_RULE = (
    f"idle: no request running or waiting. KV-bound: KV-cache usage ≥ {KV_BOUND_USAGE:.0%}, "
    f"or ≥ {KV_BOUND_USAGE_WITH_QUEUE:.0%} with requests waiting or preemptions seen — the cache, "
    "not the GPU, limits the batch. compute-bound: busy with KV-cache room to spare and its GPUs' "
    f"mean utilization ≥ {COMPUTE_BOUND_UTIL_PCT:.0f} % — the GPUs are the limit. light: busy "
    f"with KV-cache room and its GPUs under {COMPUTE_BOUND_UTIL_PCT:.0f} % — neither is the limit; "
    "it could take more requests. unknown: the engine or its GPUs do not report enough to tell."
)
PROJECTION_RULE = (
    "projected KV-cache usage when k of n serving replicas leave = mean usage x n / (n - k); "
    "below the floor when that passes the floor's KV-cache usage or fewer than its minimum "
    "replicas remain"
)
_EPSILON = 1e-9  # float noise: 0.9 x 3 / 3 is not above a 0.9 floor


class ReplicaState(StrEnum):
    SERVING = "serving"  # takes requests: its engine answers and its node is in service
    IDLE = "idle"  # in service, but has served no request for the floor's idle window: no headroom
    DRAINING = "draining"  # its node is being drained
    OUT = "out"  # its node is in repair, or its engine or collector is not answering


# Node states whose engines no longer take requests (the node was drained).
_OUT_STATES = frozenset({Health.REPAIRING, Health.VALIDATING, Health.QUARANTINED})


@dataclass(frozen=True)
class ServingFloor:
    """The policy's [serving] table: how far a pool may be taken down by a repair that may wait."""

    guard: bool = True  # false: repairs never wait for capacity
    max_kv_cache_usage_ratio: float = 0.9
    min_serving_replicas: int = 1
    # A repair waits for capacity at most this long: then its drain goes on, with the "capacity
    # at risk" alert, unless hold_past_max_capacity_wait (then it alerts and keeps waiting).
    max_capacity_wait_s: float = 3600.0
    hold_past_max_capacity_wait: bool = False
    # A replica with no request running or waiting (and no preemption) for this long is idle:
    # not counted as serving capacity (a node cannot offer headroom that takes no traffic).
    idle_replica_window_s: float = 600.0
    # Graceful drain (repair/engine_drain.py): a node's engines leave rotation before its drain
    # evicts anything, and the eviction waits until they report no request running or waiting,
    # at most engine_drain_timeout_s.
    graceful_drain: bool = True
    engine_drain_timeout_s: float = 120.0


@dataclass(frozen=True)
class ReplicaReading:
    """One engine replica as its node's latest sampling report and the live view show it."""

    node: str
    cluster: str
    engine: str
    model: str
    port: int
    gpu_indices: tuple[int, ...] = ()
    readable: bool = True
    unreadable_reason: str = ""
    reporting: bool = True  # the node's collector reports (its liveness)
    kv_cache_usage_ratio: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    preemptions_total: float | None = None
    preemptions_per_s: float | None = None  # between the node's last two sampling reports
    gpu_util_pct: float | None = None  # the mean over its GPUs that report it
    heard_ns: int = 0  # when the aggregator received the report these readings came in (its clock)
    pool: str = ""  # the pool it is in (repair/placement.py: the declared pool's name once placed)
    unverified: str = ""  # why the control plane does not count it in a pool ("": it does)
    unverified_kind: str = ""  # that reason as a bounded word (repair/placement.py REFUSAL_KINDS)
    idle: bool = False  # no request served for the floor's idle window (the aggregator's clock)

    @property
    def busy(self) -> bool:
        """Requests in flight by its latest reading (an engine that cannot be read has none we
        could wait for)."""
        return self.readable and ((self.requests_running or 0) > 0 or (self.requests_waiting or 0) > 0)

    @property
    def pool_key(self) -> tuple[str, str]:
        """(cluster, the pool's name: the one its collector gives, else its model)."""
        return (self.cluster, self.pool or self.model)

    @property
    def load_class(self) -> str:
        return classify(
            self.readable,
            self.kv_cache_usage_ratio,
            self.requests_running,
            self.requests_waiting,
            self.preemptions_total,
            self.gpu_util_pct,
        )


def _opt(msg: telemetry_pb2.EngineSample | telemetry_pb2.GpuSample, name: str) -> float | None:
    return getattr(msg, name) if msg.HasField(name) else None


def readings_of(
    node: str,
    cluster: str,
    reporting: bool,
    engines: Iterable[telemetry_pb2.EngineSample],
    gpus: Mapping[int, telemetry_pb2.GpuSample],
    preemptions_per_s: Mapping[tuple[str, int], float] | None = None,
    heard_ns: int = 0,
) -> list[ReplicaReading]:
    """A node's replicas from its latest engine and GPU samples."""
    rates = preemptions_per_s or {}
    out = []
    for e in engines:
        utils = [u for i in e.gpu_indices if i in gpus and (u := _opt(gpus[i], "util_gpu_pct")) is not None]
        out.append(
            ReplicaReading(
                node=node,
                cluster=cluster,
                engine=e.engine,
                model=e.model,
                port=e.port,
                gpu_indices=tuple(e.gpu_indices),
                readable=e.readable,
                unreadable_reason=e.unreadable_reason,
                reporting=reporting,
                kv_cache_usage_ratio=_opt(e, "kv_cache_usage_ratio"),
                requests_running=_opt(e, "requests_running"),
                requests_waiting=_opt(e, "requests_waiting"),
                preemptions_total=_opt(e, "preemptions_total"),
                preemptions_per_s=rates.get((e.engine, e.port)),
                gpu_util_pct=sum(utils) / len(utils) if utils else None,
                heard_ns=heard_ns,
                pool=e.pool,
            )
        )
    return out


def classify(
    readable: bool,
    kv: float | None,
    running: float | None,
    waiting: float | None,
    preemptions: float | None,
    gpu_util_pct: float | None,
) -> str:
    """One replica's load class (LOAD_CLASS_RULE)."""
    if not readable:
        return "unreadable"
    if running is not None and waiting is not None and running == 0 and waiting == 0:
        return "idle"
    if kv is None:
        return "unknown"
    queued = (waiting or 0) > 0 or (preemptions or 0) > 0
    if kv >= KV_BOUND_USAGE or (kv >= KV_BOUND_USAGE_WITH_QUEUE and queued):
        return "KV-bound"
    if gpu_util_pct is None:
        return "unknown"  # the rule's line is its GPUs' utilization: no figure, no guess
    return "compute-bound" if gpu_util_pct >= COMPUTE_BOUND_UTIL_PCT else "light"


def replica_state(reading: ReplicaReading, node_state: Health) -> ReplicaState:
    if node_state in _OUT_STATES:
        return ReplicaState.OUT
    if node_state == Health.DRAINING:
        return ReplicaState.DRAINING
    if not reading.reporting or not reading.readable:
        return ReplicaState.OUT
    return ReplicaState.IDLE if reading.idle else ReplicaState.SERVING


def projected_usage(kv_readings: list[float], serving: int, leaving: int) -> float | None:
    """The KV-cache usage of the replicas left when `leaving` of `serving` go (the module's
    formula); None without a reading, ∞ when none would be left to carry a load (0 with none)."""
    if not kv_readings:
        return None
    load = sum(kv_readings) / len(kv_readings) * serving
    if serving - leaving <= 0:
        return math.inf if load > 0 else 0.0
    return load / (serving - leaving)


def below_floor(projected: float | None, remaining: int, floor: ServingFloor) -> bool:
    if remaining < floor.min_serving_replicas:
        return True
    return projected is not None and projected > floor.max_kv_cache_usage_ratio + _EPSILON


def needed_replicas(kv_readings: list[float], serving: int, floor: ServingFloor) -> int:
    """The fewest replicas that keep the pool's present load within the floor."""
    needed = floor.min_serving_replicas
    if kv_readings and floor.max_kv_cache_usage_ratio > 0:
        load = sum(kv_readings) / len(kv_readings) * serving  # in replicas' worth of KV-cache
        # Any load at all needs one replica to carry it (projected_usage: ∞ with none left).
        needed = max(needed, math.ceil(load / floor.max_kv_cache_usage_ratio - _EPSILON), int(load > 0))
    return needed


@dataclass(eq=False)
class Pool:
    """One model in one cluster (or one named pool): its replicas, each in the state its node is
    in (`refresh`)."""

    cluster: str
    model: str  # the pool's name: its model, or the name its collectors give it
    replicas: list[ReplicaReading] = field(default_factory=list)
    states: list[ReplicaState] = field(default_factory=list)

    def refresh(self, node_state: Mapping[str, Health]) -> None:
        """Each replica's state from its node's workflow state now."""
        self.states = [replica_state(r, node_state.get(r.node, Health.HEALTHY)) for r in self.replicas]

    def _serving(self) -> list[ReplicaReading]:
        return [r for r, s in zip(self.replicas, self.states, strict=True) if s is ReplicaState.SERVING]

    def count(self, state: ReplicaState) -> int:
        return sum(1 for s in self.states if s is state)

    def kv_readings(self) -> list[float]:
        """The KV-cache usage its serving replicas report."""
        return [r.kv_cache_usage_ratio for r in self._serving() if r.kv_cache_usage_ratio is not None]

    @property
    def kv_cache_usage_mean_ratio(self) -> float | None:
        kv = self.kv_readings()
        return sum(kv) / len(kv) if kv else None

    @property
    def kv_cache_usage_max_ratio(self) -> float | None:
        return max(self.kv_readings(), default=None)

    def _total(self, name: str) -> float | None:
        values = [v for r in self._serving() if (v := getattr(r, name)) is not None]
        return sum(values) if values else None

    @property
    def requests_running(self) -> float | None:
        return self._total("requests_running")

    @property
    def requests_waiting(self) -> float | None:
        return self._total("requests_waiting")

    @property
    def preemptions_per_s(self) -> float | None:
        return self._total("preemptions_per_s")

    def projection(self, nodes: set[str], floor: ServingFloor) -> Projection:
        """What taking `nodes` out would do to this pool."""
        serving = self._serving()
        kv = self.kv_readings()
        leaving = sum(1 for r in serving if r.node in nodes)
        after = projected_usage(kv, len(serving), leaving)
        return Projection(
            self.cluster,
            self.model,
            len(serving),
            len(serving) - leaving,
            projected_usage(kv, len(serving), 0),
            after,
            leaving > 0 and below_floor(after, len(serving) - leaving, floor),
        )

    def projection_if_one_leaves(self) -> float | None:
        serving = len(self._serving())
        return projected_usage(self.kv_readings(), serving, 1) if serving else None

    def headroom_replicas(self, floor: ServingFloor) -> int:
        """Replicas that may leave within the floor; negative: replicas short of it."""
        serving = len(self._serving())
        return serving - needed_replicas(self.kv_readings(), serving, floor)


@dataclass(frozen=True)
class Projection:
    cluster: str
    model: str
    replicas_now: int
    replicas_after: int
    kv_now: float | None
    kv_after: float | None
    below_floor: bool

    def describe(self) -> str:
        """e.g. "llama-70b 3 → 2 replicas, projected KV 88 % → 132 %": KV-cache usage as a percent,
        as every surface says it (docs/components.md)."""
        text = f"{self.model} {self.replicas_now} → {self.replicas_after} replicas"
        if self.kv_now is not None and self.kv_after is not None:
            after = "none left" if math.isinf(self.kv_after) else f"{100 * self.kv_after:.0f} %"
            text += f", projected KV {100 * self.kv_now:.0f} % → {after}"
        return text


class Pools:
    """Every pool of the fleet, indexed by the nodes in it; each replica's state follows its
    node's workflow state as given (`Pools(readings, states)`, or `refresh_node` later)."""

    def __init__(self, readings: Iterable[ReplicaReading], node_state: Mapping[str, Health]) -> None:
        self.by_key: dict[tuple[str, str], Pool] = {}
        self._by_node: dict[str, list[Pool]] = {}
        self.unverified: list[ReplicaReading] = []  # claimed by nodes, placed nowhere: no figures
        for r in readings:
            if r.unverified:
                self.unverified.append(r)
                continue
            if r.model == UNKNOWN_ENGINE_MODEL and not r.readable and not r.pool:
                continue  # never read: which pool it would serve is not known
            pool = self.by_key.get(r.pool_key)
            if pool is None:
                pool = self.by_key[r.pool_key] = Pool(*r.pool_key)
            pool.replicas.append(r)
            of_node = self._by_node.setdefault(r.node, [])
            if all(p is not pool for p in of_node):  # a node with two replicas of one model
                of_node.append(pool)
        for pool in self.by_key.values():
            pool.refresh(node_state)

    def of_node(self, node: str) -> list[Pool]:
        return self._by_node.get(node, [])

    def sorted(self) -> list[Pool]:
        return [self.by_key[k] for k in sorted(self.by_key)]

    def projections(
        self, node: str, node_state: Mapping[str, Health], floor: ServingFloor
    ) -> list[Projection]:
        """What draining `node` would do to each pool it serves, with its nodes' states now."""
        out = []
        for pool in self.of_node(node):
            pool.refresh(node_state)
            out.append(pool.projection({node}, floor))
        return out
