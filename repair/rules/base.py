"""The one interface every health rule has: look at one node now, return findings."""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Callable

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy


class Rule(abc.ABC):
    name = ""
    # GpuSample fields whose change in a report means "evaluate this node now" (the health
    # watch pokes the controller). Every field a rule reads must be here: between full passes
    # (repair_observe_interval_s apart) a node is evaluated only when one of them changed, its
    # liveness changed, or it needs attention (repair/controller.py `run`).
    watch_fields: tuple[str, ...] = ()
    # Fields it reads beside the watched ones that change rarely (a link's maximum, the GPU count
    # on the PCI bus): a replay of the store's history reads their changes too, and traces a
    # finding back to them.
    context_fields: tuple[str, ...] = ()
    # Fields it compares across a node's GPUs at every full pass, too busy to watch or to replay
    # from the store (clocks, power): a trace or generated history may still give them.
    peer_fields: tuple[str, ...] = ()
    # Whether its findings change with time alone, the samples staying the same (a rate falls
    # as a counter stands still): a replay looks at such a finding again as time passes.
    changes_with_time = False
    # Whether a finding's seen time is its window's start: a later one (the signal stopped and
    # began again between two evaluations) restarts the window (the evaluator keeps the first
    # seen time of a finding that stays active otherwise).
    window_from_seen = False
    # A threshold that is a fraction must stay under this (a policy with more is refused).
    threshold_max: float | None = None

    @abc.abstractmethod
    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        """The findings this rule makes of one node now."""

    def look_again_at_ns(self, node: str, entry: Entry) -> int | None:
        """When a window this rule is filling for the node will be whole (None: none is): a
        replay, which looks at a node only when something happens to it, looks again then."""
        return None


class GpuCheck(Rule):
    """A rule that looks at each GPU's latest sample on its own; `check` returns the evidence
    when the GPU is in trouble, None when it is fine (or the field is absent)."""

    @abc.abstractmethod
    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        """The evidence when this GPU is in trouble; None when it is fine or the field is absent."""

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        found = []
        for index in sorted(snap.gpus):
            gpu = snap.gpus[index]
            if gpu.lost and self.name != "gpu_lost":
                continue  # a lost GPU's other fields are stale; gpu_lost covers it
            evidence = self.check(gpu, entry)
            if evidence is not None:
                found.append(
                    entry.finding(snap.node, index, self.name, evidence, snap.sample_time_ns or now_ns)
                )
        return found


class RateCheck(Rule):
    """Errors per hour of a monotonically growing counter, over the rule's window: active once
    the counter's growth over a whole window reaches the threshold, as evidence since the
    window's start (so the evaluator's persistence window is the rate's own window, not a
    second one after it; docs/repair.md "Rates over windows")."""

    changes_with_time = True

    def __init__(self, counter: Callable[[telemetry_pb2.GpuSample], int | None]) -> None:
        self._counter = counter
        # node -> GPU -> (time, count), oldest first, the last whole window and one before it
        self._history: dict[str, dict[int, deque[tuple[int, int]]]] = {}

    def look_again_at_ns(self, node: str, entry: Entry) -> int | None:
        span_ns = _span_ns(entry)
        growing = [
            h[0][0] + span_ns
            for h in self._history.get(node, {}).values()
            if len(h) > 1 and h[-1][1] > h[0][1] and h[-1][0] - h[0][0] < span_ns
        ]
        return min(growing) if growing else None

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        span_ns = _span_ns(entry)
        found = []
        for index, gpu in sorted(snap.gpus.items()):
            total = self._counter(gpu)
            if total is None or gpu.lost:
                continue
            history = self._history.setdefault(snap.node, {}).setdefault(index, deque())
            t = snap.sample_time_ns or now_ns
            if history and (total < history[-1][1] or t < history[-1][0]):
                history.clear()  # counter reset (driver reload) or clock step
            if not history or history[-1][0] != t:
                history.append((t, total))
            while len(history) > 2 and t - history[1][0] >= span_ns:
                history.popleft()
            (t0, c0), (t1, c1) = history[0], history[-1]
            if t1 - t0 < span_ns:
                continue  # not a whole window of history yet
            per_hour = (c1 - c0) / ((t1 - t0) / 3.6e12)
            if per_hour >= entry.threshold > 0:
                found.append(
                    entry.finding(
                        snap.node,
                        index,
                        self.name,
                        f"{per_hour:.0f}/h over {(t1 - t0) / 1e9:.0f} s (threshold {entry.threshold:g}/h)",
                        t1 - span_ns,
                    )
                )
        return found


def _span_ns(entry: Entry) -> int:
    """A rate's window: the policy's, never under a minute (a shorter one is a count, not a rate)."""
    return int(max(entry.window_s, 60.0) * 1e9)
