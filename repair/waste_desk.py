"""The waste findings' alerts (repair/rules/waste.py, docs/workloads.md "Waste findings"): one alert
per workload and episode, its owner in the labels so Alertmanager routes it to the team, firing
once the finding has persisted for its window and resolved when it clears on every node (or its
job ends). They are not node incidents: a job holding GPUs idle is its owner's matter, not the
node's fault, and it never takes the node out unless the policy says cordon = true."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.repair.alerts.base import Alert
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.evaluator import Evaluator
from gpufleet.repair.model import WASTE_RULES, Finding, NodeSnapshot, Owner, WorkloadOnNode
from gpufleet.repair.orphan_cleanup import OrphanCleanup

log = logging.getLogger("gpufleet.repair.waste")
KEY_PREFIX = "waste/"
ALERT_NAME = "GpufleetWaste"


def alert_key(f: Finding) -> str:
    """One identity per workload (and finding): a job idle on four nodes is one alert; a process
    of no known job, one per GPU."""
    subject = f.workload or f"{f.node}:{'-' if f.gpu is None else f.gpu}"
    return f"{KEY_PREFIX}{f.code}/{subject}"


def owner_labels(owner: Owner) -> dict[str, str]:
    """The owner as alert labels (the ones known): what Alertmanager's routes match on."""
    pairs = (("user", owner.user), ("account", owner.account), ("namespace", owner.namespace))
    return {k: v for k, v in (*pairs, ("team", owner.team)) if v}


@dataclass
class Episode:
    first: Finding
    owner: Owner
    by_node: dict[str, Finding] = field(default_factory=dict)
    opened_ns: int = 0
    hbm_used_bytes: int = 0  # what the idle GPUs or the processes held when it was found
    gpus: tuple[int, ...] = ()  # its GPUs on its first node


class WasteDesk:
    def __init__(
        self, alerts: AlertDispatcher, clock: Callable[[], int], cleanup: OrphanCleanup | None = None
    ) -> None:
        """cleanup: the opt-in action on orphaned processes (None: alerts only, the default)."""
        self.alerts = alerts
        self.cleanup = cleanup
        self._clock = clock
        self.episodes: dict[str, Episode] = {}
        self._by_node: dict[str, set[str]] = {}
        self._workloads_seen: dict[str, tuple[WorkloadOnNode, ...]] = {}
        self._firing: tuple[tuple[str, Episode, tuple[str, ...]], ...] = ()
        # Alerts a previous process left firing: resolved after the first full pass unless found.
        self._carried = {k for k in alerts.outstanding() if k.startswith(KEY_PREFIX)}

    def now(self) -> tuple[tuple[str, Episode, tuple[str, ...]], ...]:
        """The findings whose alerts fire now: (alert key, episode, its nodes). For the Fleet
        API's threads: a tuple the term's thread replaces whole after each change (`_publish`),
        never a dict it is changing."""
        return self._firing

    def workloads_on(self, node: str) -> tuple[WorkloadOnNode, ...]:
        """The node's allocations as its last look had them (an incident names whom it hit)."""
        return self._workloads_seen.get(node, ())

    def route(
        self,
        node: str,
        findings: list[Finding],
        snap: NodeSnapshot | None,
        evaluator: Evaluator,
        now: int,
    ) -> list[Finding]:
        """One node's look: its waste findings go to their owners (those that persisted for
        their window), and the rest, for the node's workflow, are returned (a waste finding the
        policy makes cordon stays with them)."""
        if snap is not None and (snap.workloads or node in self._workloads_seen):
            self._workloads_seen[node] = snap.workloads
        waste = [f for f in findings if f.code in WASTE_RULES and not f.cordon]
        if not waste and node not in self._by_node:
            return findings
        self.update(node, [f for f in waste if evaluator.persisted(f, now)], snap, now)
        return [f for f in findings if f.code not in WASTE_RULES or f.cordon]

    def update(self, node: str, persisted: list[Finding], snap: NodeSnapshot | None, now: int) -> None:
        """The node's waste findings that have persisted for their window, at this look."""
        keys = {alert_key(f): f for f in persisted}
        if self.cleanup is not None:
            for f in persisted:
                if f.code == WASTE_RULES[1]:  # orphaned_process
                    self.cleanup.found(f, snap)
        for key in self._by_node.get(node, set()) - keys.keys():
            self._leave(key, node, now)
        for key, f in keys.items():
            episode = self.episodes.get(key)
            if episode is None:
                gpus, hbm = _held(f, snap)
                episode = self.episodes[key] = Episode(f, _owner(f, snap), {}, now, hbm, gpus)
                episode.by_node[node] = f
                self._carried.discard(key)
                self._by_node.setdefault(node, set()).add(key)
                log.warning(
                    "%s: %s (alert %s to its owner: %s)",
                    f.code,
                    f.evidence,
                    key,
                    episode.owner.label(),
                    extra={"node": node, "gpu": f.gpu, "workload": f.workload},
                )
                self._alert(key, episode, "firing", now)
            else:
                episode.by_node[node] = f
                self._by_node.setdefault(node, set()).add(key)
            if f.gpu is not None and node == episode.first.node and f.gpu not in episode.gpus:
                episode.gpus = tuple(sorted({*episode.gpus, f.gpu}))  # an orphan on two GPUs
        if not self._by_node.get(node):
            self._by_node.pop(node, None)
        self._publish()

    async def passed(self, nodes: set[str] | None, now: int, halted: bool = False) -> None:
        """After a pass: the opt-in cleanup of the orphans it found (none while halted: the breaker
        is tripped). After a pass over every node (`nodes`; None: a pass over some): episodes of
        nodes gone from the fleet view end, and so do alerts the last process left firing that
        nothing found again."""
        if self.cleanup is not None:
            await self.cleanup.act(halted)
        if nodes is None:
            return
        for gone in [n for n in self._workloads_seen if n not in nodes]:
            del self._workloads_seen[gone]
        for node in [n for n in self._by_node if n not in nodes]:
            for key in list(self._by_node.get(node, ())):
                self._leave(key, node, now)
        for key in sorted(self._carried):
            self.alerts.notify(
                Alert(key, "resolved", "", "waste", "warning", "no longer found", now, {"kind": "waste"})
            )
        self._carried.clear()
        self._publish()

    def _publish(self) -> None:
        """What now() answers, as one tuple replaced whole (readers on other threads)."""
        self._firing = tuple((k, e, tuple(sorted(e.by_node))) for k, e in self.episodes.items())

    def _leave(self, key: str, node: str, now: int) -> None:
        keys = self._by_node.get(node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_node[node]
        episode = self.episodes.get(key)
        if episode is None:
            return
        episode.by_node.pop(node, None)
        if not episode.by_node:
            del self.episodes[key]
            log.warning(
                "%s resolved: no longer found", key, extra={"node": node, "workload": episode.first.workload}
            )
            self._alert(key, episode, "resolved", now)

    def _alert(self, key: str, episode: Episode, status: str, now: int) -> None:
        f = episode.first
        nodes = sorted(episode.by_node) or [f.node]
        where = f"{nodes[0]}" + (f" and {len(nodes) - 1} more node(s)" if len(nodes) > 1 else "")
        summary = (
            f"{f.code} on {where}: {f.evidence}"
            if status == "firing"
            else f"{f.code} on {where}: no longer found"
        )
        labels = {"alertname": ALERT_NAME, "finding": f.code, **owner_labels(episode.owner)}
        if f.workload:
            labels["workload"] = f.workload
        self.alerts.notify(
            Alert(
                key,
                status,
                nodes[0],
                "waste",
                f.severity,
                summary,
                now,
                {
                    "kind": "waste",
                    "finding": f.code,
                    "workload": f.workload,
                    "owner": owner_labels(episode.owner),
                    "nodes": nodes,
                    "evidence": [g.evidence for g in episode.by_node.values()] or [f.evidence],
                    "reason": f.reason,
                    "opened_unix_ns": episode.opened_ns,
                },
                labels=labels,
            )
        )


def _held(f: Finding, snap: NodeSnapshot | None) -> tuple[tuple[int, ...], int]:
    """The GPUs a finding is about on its node and the HBM held there: an idle allocation's GPUs,
    or the GPU the processes hold and what they hold on it."""
    if snap is None:
        return ((f.gpu,) if f.gpu is not None else ()), 0
    for w in snap.workloads:
        if f.code == WASTE_RULES[0] and w.key == f.workload:
            return w.gpus, w.hbm_used_bytes
    claims = [c for c in snap.claims if f.gpu in c.gpus and (c.workload == f.workload or not f.workload)]
    gpus = (f.gpu,) if f.gpu is not None else ()
    return gpus, sum(c.hbm_used_bytes for c in claims)


def _owner(f: Finding, snap: NodeSnapshot | None) -> Owner:
    """The finding's workload's owner, as the scheduler said (the node's allocations and its judged
    claims, which name an ended job's owner)."""
    if snap is None or not f.workload:
        return Owner()
    for w in snap.workloads:
        if w.key == f.workload:
            return w.owner
    for c in snap.claims:
        if c.workload == f.workload and c.owner != Owner():
            return c.owner
    return Owner()
