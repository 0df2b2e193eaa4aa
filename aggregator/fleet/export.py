"""Health findings and repair actions into the history store, beside the collectors' events.

The control plane (repair/state.py) is where the repair controller keeps its audit log and
incidents; history (QueryEvents, `gpufleet events`, the node page, Grafana on InfluxDB) reads
the store. This task copies one into the other, on the repair leader (one box: always):

- every audit row (automatic or a person's action, the breaker) becomes a `repair` point:
  tags node, cluster, action, by (automation | person | scheduler); fields actor, reason,
  outcome, result (the outcome's status: ok, failed, refused, started, ...), incident_id;
- every finding of an incident becomes a `health` point: tags node, cluster, gpu, code,
  severity; fields action, cordon, reason, evidence, incident_id; at the time it was seen.

Delivery is at least once: the audit cursor (the last audit seq copied, kept in the control
plane) moves only after the points are durable (in the store or its spool, through the
group-commit writer), and a point's identity is measurement + tags + time, so a copy made
twice (a restart between the write and the cursor) overwrites itself. Findings are copied
from the open incidents and those opened since the last pass; a finding copied once in this
process is not written again while its incident is still read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from gpufleet.aggregator.store import Point, StoreError
from gpufleet.repair.incidents import AUTOMATION
from gpufleet.repair.state import AuditRecord, Incident, RepairState, StateError

log = logging.getLogger("gpufleet.aggregator.fleet.export")

CURSOR_KEY = "history_export_audit_seq"
BATCH_ROWS = 2000
# Incidents opened this long before the last pass are read again (a clock step, a slow commit).
_INCIDENT_MARGIN_NS = 300 * 1_000_000_000

WritePoints = Callable[[list[Point]], Awaitable[None]]


def actor_kind(actor: str) -> str:
    """Bounded for a tag: who acted, by kind (the actor's own name is a field)."""
    if actor in (AUTOMATION, "scheduler"):
        return actor
    return "person"


def _tags(**values: str) -> dict[str, str]:
    # An empty tag is no tag (line protocol cannot carry one; the breaker's rows have no node).
    return {k: v for k, v in values.items() if v}


def repair_point(record: AuditRecord, cluster: str, seq: int = 0) -> Point:
    """seq: the audit row's place in the log. The steps of one repair pass share its time to the
    nanosecond; readers order them by it (aggregator/fleet/events.py), as they happened."""
    return Point(
        "repair",
        _tags(node=record.node, cluster=cluster, action=record.action, by=actor_kind(record.actor)),
        {
            "actor": record.actor,
            "reason": record.reason,
            "outcome": str(record.outcome),
            "result": record.outcome.status.value,
            "incident_id": record.incident_id,
            "seq": seq,
        },
        record.time_ns,
    )


def health_points(incident: Incident, cluster: str) -> list[Point]:
    return [
        Point(
            "health",
            _tags(
                node=incident.node,
                cluster=cluster,
                gpu="" if f.gpu is None else str(f.gpu),
                code=f.code,
                severity=f.severity,
            ),
            {
                "action": f.action,
                "cordon": f.cordon,
                "reason": f.reason,
                "evidence": f.evidence,
                "incident_id": incident.id,
                "window_start_unix_ns": f.seen_ns,
            },
            # When it was detected, not when its evidence (a window) starts: a storm's finding
            # is drawn at or after the first sample over the threshold, never before it.
            f.detected_ns or f.seen_ns or incident.opened_ns,
        )
        for f in incident.findings
    ]


def _one_per_identity(points: list[Point]) -> list[Point]:
    """Two points with the same measurement, tags and nanosecond would be one: the later is
    kept 1 ns after (as the collector's events are: aggregator/ingest/schema.py)."""
    taken: set[tuple[str, tuple[tuple[str, str], ...], int]] = set()
    out = []
    for p in points:
        key, ts = (p.measurement, tuple(sorted(p.tags.items()))), p.time_unix_ns
        while (*key, ts) in taken:
            ts += 1
        taken.add((*key, ts))
        out.append(p if ts == p.time_unix_ns else p._replace(time_unix_ns=ts))
    return out


class EventExporter:
    def __init__(
        self,
        state: RepairState,
        write: WritePoints,
        cluster_of: Callable[[str], str],
        interval_s: float = 2.0,
    ) -> None:
        self._state = state
        self._write = write
        self._cluster_of = cluster_of
        self.interval_s = interval_s
        self._findings_done: set[tuple[str, str, int]] = set()
        self._incidents_since_ns = 0
        self.exported_total = 0  # points made durable (gpufleet_history_export_points_total)
        self.failures_total = 0  # passes that failed and will be tried again

    async def run(self, stop: asyncio.Event) -> None:
        """Export until stop is set; a failed pass is logged and tried again next interval (the
        cursor has not moved), so nothing is skipped."""
        while not stop.is_set():
            try:
                await self.export_once()
            except Exception as exc:  # the store or the control plane is down: next interval
                self.failures_total += 1
                log.warning(
                    "history export of repair and health events failed (%d so far): %s; retrying in %g s",
                    self.failures_total,
                    exc,
                    self.interval_s,
                    # Not an outage but a bug: its traceback, so it is not read as a store down.
                    exc_info=not isinstance(exc, (StoreError, StateError, OSError)),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def export_once(self) -> int:
        """Copy what is new; return how many points were made durable."""
        cursor = int(await asyncio.to_thread(self._state.kept.get, CURSOR_KEY) or 0)
        rows = await asyncio.to_thread(self._state.audit_after, cursor, BATCH_ROWS)
        points = [repair_point(r, self._cluster_of(r.node), seq) for seq, r in rows]
        incidents = await asyncio.to_thread(
            self._state.incidents_open_or_opened_since, self._incidents_since_ns, BATCH_ROWS
        )
        fresh: list[tuple[str, str, int]] = []
        for incident in incidents:
            for p in health_points(incident, self._cluster_of(incident.node)):
                key = (incident.id, p.tags.get("code", ""), p.time_unix_ns)
                if key not in self._findings_done:
                    fresh.append(key)
                    points.append(p)
        if not points:
            return 0
        await self._write(_one_per_identity(points))
        if rows:
            await asyncio.to_thread(self._state.kept.put, CURSOR_KEY, str(rows[-1][0]))
        # What was written is remembered only while its incident is still read (open, or opened
        # since the last pass): the set stays the size of what is current.
        current = {i.id for i in incidents}
        self._findings_done = {k for k in self._findings_done | set(fresh) if k[0] in current}
        if incidents:
            newest = max(i.opened_ns for i in incidents)
            self._incidents_since_ns = max(self._incidents_since_ns, newest - _INCIDENT_MARGIN_NS)
        self.exported_total += len(points)
        log.debug("history export: %d repair and health points", len(points))
        return len(points)
