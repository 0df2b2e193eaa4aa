"""The serving pools in a replay (a history with engine readings; docs/repair.md "Policy
replay"): what the capacity guard reads, and what the report measures.

Each pool's demand is the sum of what the trace says its replicas carry with the pool whole;
it is spread over the replicas whose nodes serve now, as a router would spread it, so a replica
leaving raises the others' KV-cache usage (at most 1: a full cache). A pool is below its floor
while its serving replicas carry more than the floor's KV-cache usage or are fewer than its
minimum; the time each pool spends so, and the time each drain waits for capacity, are the two
sides of the trade-off a [serving] floor chooses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpufleet.repair.capacity import LiveStates
from gpufleet.repair.health import Health, HoldKind
from gpufleet.repair.replay.history import ENGINE_SIGNALS, KV_CACHE
from gpufleet.repair.serving import (
    Pools,
    ReplicaReading,
    ReplicaState,
    ServingFloor,
    below_floor,
    projected_usage,
    replica_state,
)
from gpufleet.repair.state import Workflow

CLUSTER = "replay"


class _ServingNode(Protocol):
    reporting: bool
    engines: dict[str, dict[str, float]]  # served model -> traced readings


@dataclass
class ServingFigures:
    """What the serving pools went through in a replay."""

    pools: set[str] = field(default_factory=set)  # every model a replica served
    seconds_below_floor: dict[str, float] = field(default_factory=dict)  # model -> seconds
    capacity_waits_s: list[tuple[str, float]] = field(default_factory=list)  # (node, seconds held)


class ReplayServing:
    def __init__(
        self,
        floor: ServingFloor,
        nodes: Mapping[str, _ServingNode],
        workflows: Mapping[str, Workflow],
        clock: Callable[[], int],
    ) -> None:
        """nodes: the replay's simulated nodes (each with `reporting` and `engines`), read live;
        workflows: the controller's, read live; clock: the replay's virtual time (ns)."""
        self._floor, self._nodes, self._workflows, self._clock = floor, nodes, workflows, clock
        self.figures = ServingFigures()
        self._below: list[str] = []  # the pools below their floor since _since_ns
        self._since_ns = clock()
        self._waiting_since: dict[str, int] = {}  # node -> when its drain began to wait

    def replicas(self) -> list[ReplicaReading]:
        """Every engine replica as a router would load it now."""
        states = LiveStates(self._workflows)
        traced: dict[str, list[tuple[ReplicaReading, dict[str, float]]]] = {}
        for name, node in self._nodes.items():
            for model, values in node.engines.items():
                r = ReplicaReading(name, CLUSTER, "replay", model, 0, reporting=node.reporting)
                traced.setdefault(model, []).append((r, values))
        out = []
        for replicas in traced.values():
            serving = {
                r.node
                for r, _ in replicas
                if replica_state(r, states.get(r.node, Health.HEALTHY)) is ReplicaState.SERVING
            }
            shares = spread([values for _, values in replicas], len(serving))
            for r, _ in replicas:
                figures = shares if r.node in serving else dict.fromkeys(shares, 0.0)
                out.append(
                    replace(
                        r,
                        kv_cache_usage_ratio=figures.get(KV_CACHE),
                        requests_running=figures.get("requests_running"),
                        requests_waiting=figures.get("requests_waiting"),
                        heard_ns=self._clock(),
                    )
                )
        return out

    def look(self) -> None:
        """After the passes at one instant: which pools are below their floor from now on."""
        pools = Pools(self.replicas(), LiveStates(self._workflows))
        self._below = []
        for pool in pools.sorted():
            self.figures.pools.add(pool.model)
            serving = pool.count(ReplicaState.SERVING)
            if below_floor(projected_usage(pool.kv_readings(), serving, 0), serving, self._floor):
                self._below.append(pool.model)

    def until(self, now_ns: int) -> None:
        """The pools below their floor at the last look stayed so until now_ns."""
        seconds = self.figures.seconds_below_floor
        for model in self._below:
            seconds[model] = seconds.get(model, 0.0) + (now_ns - self._since_ns) / 1e9
        self._since_ns = now_ns

    def track_wait(self, node: str) -> None:
        """After a pass of the node: when its drain began and ended waiting for capacity."""
        wf = self._workflows.get(node)
        now = self._clock()
        if wf is not None and wf.held is not None and wf.held.kind is HoldKind.CAPACITY:
            self._waiting_since.setdefault(node, now)
        elif node in self._waiting_since:
            self.figures.capacity_waits_s.append((node, (now - self._waiting_since.pop(node)) / 1e9))

    def end(self) -> None:
        """The history's end: a drain still waiting has waited until now."""
        now = self._clock()
        for node, since in sorted(self._waiting_since.items()):
            self.figures.capacity_waits_s.append((node, (now - since) / 1e9))
        self._waiting_since.clear()


def spread(traced: list[dict[str, float]], serving: int) -> dict[str, float]:
    """What each of `serving` replicas carries of a pool's demand (the sum of what the trace says
    each replica carries with the pool whole): KV-cache usage at most 1, a full cache."""
    out = {}
    for name in ENGINE_SIGNALS:
        values = [v[name] for v in traced if name in v]
        if values:
            share = sum(values) / serving if serving else 0.0
            out[name] = min(1.0, share) if name == KV_CACHE else share
    return out
