"""Events read back from the history store (the Fleet API's QueryEvents).

Three measurements hold them: `event` (what collectors report: XIDs, a GPU lost or recovered,
an engine unreadable; aggregator/ingest/schema.py), `health` and `repair` (findings and actions the
repair controller recorded, copied by aggregator/fleet/export.py). Reading them from the store,
not the aggregator's memory, is what keeps the picture whole across a restart.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.store import Point, Store
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import HISTORY_EVENT_KINDS as EVENT_KINDS

DEFAULT_EVENTS = 1000
MAX_EVENTS = 20_000
_COLLECTOR_KINDS = tuple(k for k in EVENT_KINDS if k not in ("health", "repair"))


@dataclass(frozen=True)
class EventQuery:
    start_unix_ns: int
    end_unix_ns: int
    nodes: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    xids: tuple[int, ...] = ()  # only XIDs with these numbers
    kinds: tuple[str, ...] = ()  # EVENT_KINDS; empty: all
    clusters: tuple[str, ...] = ()


def _kinds(query: EventQuery) -> set[str]:
    """The kinds the query asks for: an XID number filter asks for XIDs alone."""
    kinds = set(query.kinds or EVENT_KINDS)
    return kinds & {"xid"} if query.xids else kinds


def _measurements(kinds: set[str]) -> list[str]:
    out = []
    if kinds & set(_COLLECTOR_KINDS):
        out.append("event")
    out.extend(m for m in ("health", "repair") if m in kinds)
    return out


def _gpu(p: Point) -> int | None:
    gpu = p.tags.get("gpu", "")
    return int(gpu) if gpu.isdigit() else None


def to_event(p: Point) -> fleet_pb2.HistoryEvent:
    f, tags = p.fields, p.tags
    ev = fleet_pb2.HistoryEvent(time_unix_ns=p.time_unix_ns, node=tags.get("node", ""))
    ev.cluster = tags.get("cluster", "")
    gpu = _gpu(p)
    if gpu is not None:
        ev.gpu_index = gpu
    if p.measurement == "event":
        ev.kind = tags.get("kind", "")
        ev.source = tags.get("source", "")
        ev.xid = int(f.get("xid", 0) or 0)
        ev.count = int(f.get("count", 1) or 1)
        ev.first_time_unix_ns = int(f.get("first_time_unix_ns", 0) or 0)
        ev.summary = str(f.get("message", ""))
    elif p.measurement == "health":
        ev.kind = "health"
        ev.code = ev.source = tags.get("code", "")
        ev.severity = tags.get("severity", "")
        ev.summary = f"{f.get('reason', '')} ({f.get('evidence', '')})"
        ev.incident_id = str(f.get("incident_id", ""))
    else:
        ev.kind = "repair"
        ev.code = tags.get("action", "")
        ev.source = str(f.get("actor", ""))
        ev.outcome = str(f.get("outcome", ""))
        ev.summary = str(f.get("reason", ""))
        ev.incident_id = str(f.get("incident_id", ""))
    return ev


def read_events(store: Store, query: EventQuery) -> list[fleet_pb2.HistoryEvent]:
    """Every stored event in the range that matches, oldest first."""
    filters: dict[str, list[str]] = {}
    if query.nodes:
        filters["node"] = list(query.nodes)
    if query.clusters:
        filters["cluster"] = list(query.clusters)
    if query.gpus:
        filters["gpu"] = [str(g) for g in query.gpus]
    kinds, xids = _kinds(query), set(query.xids)
    points: list[Point] = []
    for measurement in _measurements(kinds):
        for p in store.query_points(measurement, query.start_unix_ns, query.end_unix_ns, filters):
            if measurement == "event":
                if p.tags.get("kind") not in kinds:
                    continue
                if xids and int(p.fields.get("xid", 0) or 0) not in xids:
                    continue
            points.append(p)
    points.sort(key=lambda p: (p.time_unix_ns, p.measurement))
    # The steps of one repair pass share its nanosecond, and the export moves a step whose tags
    # equal another's 1 ns on (one point per identity): time alone can put "drain ok" after the
    # next step. Their audit log's order (seq) is the order they happened in; the repair points
    # keep their places among the others, in seq order (points written before seq keep time's).
    slots = [i for i, p in enumerate(points) if p.measurement == "repair" and p.fields.get("seq")]
    in_order = sorted((points[i] for i in slots), key=lambda p: int(p.fields["seq"]))
    for i, p in zip(slots, in_order, strict=True):
        points[i] = p
    return [to_event(p) for p in points]
