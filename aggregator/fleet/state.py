"""The live view of the fleet: for each node, when it was last heard, its liveness and the
latest sample of every GPU and engine. Updated only with reports that are already durable,
so the view never shows what the store does not hold.

Every node is untrusted (docs/security.md), so what one node's reports can do here is bounded
and its own: a node's engines are the ones its latest sampling report carries (an engine it
stopped reporting is dropped, so renaming engines cannot grow the view); its events are the
last 100, each listed once; and the live values follow the node's *current* stream: a report
of a stream that a newer one superseded never overwrites the newer stream's values, and each
stream starts its sequence anew, so one report with a huge seq (or a time far ahead) cannot
freeze the view the repair controller reads."""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.aggregator.store import Point
from gpufleet.protos import columns, fleet_pb2, ingest_pb2, telemetry_pb2, vocabulary_pb2

RECENT_EVENTS = 100


class RecentEvents(deque[telemetry_pb2.Event]):
    """A node's newest events (at most RECENT_EVENTS), each listed once: an event sent again (a
    replayed report; a kernel-log XID resent after a collector crash, collector/kmsg_cursor.py)
    is the same event (same kind, source, time, GPU, XID, count, kernel record) and is not added
    twice. Membership is a set lookup, so a report of a thousand events costs a thousand."""

    def __init__(self, events: Iterable[telemetry_pb2.Event] = ()) -> None:
        super().__init__(maxlen=RECENT_EVENTS)
        self._keys: dict[bytes, int] = {}
        for event in events:
            self.add(event)

    def add(self, event: telemetry_pb2.Event) -> None:
        key = event.SerializeToString(deterministic=True)
        if key in self._keys:
            return
        if len(self) == RECENT_EVENTS:
            old = self[0].SerializeToString(deterministic=True)
            if self._keys[old] == 1:
                del self._keys[old]
            else:
                self._keys[old] -= 1
        self.append(event)
        self._keys[key] = self._keys.get(key, 0) + 1


@dataclass
class NodeLive:
    node: str
    cluster: str = ""
    boot_id: str = ""
    last_seq: int = 0
    last_report_ns: int = 0  # the report's own timestamp (node clock)
    last_heard_ns: int = 0  # when the aggregator received it (aggregator clock)
    last_sample_ns: int = 0  # the newest report that carried GPU samples (node clock)
    interval_s: float = 0.0
    simulated: bool = False
    driver_version: str = ""
    gpu_count: int = 0
    gpus_on_pci_bus: int | None = None  # NVIDIA GPUs its PCI bus shows (None: not counted)
    connected: bool = False
    # The GPUs' newest samples, by index (read through `gpus`). A report that came as columns is
    # kept as it came and read out into per-GPU samples only when something reads `gpus` (the
    # repair controller, the Fleet API): most reports are superseded before anyone looks.
    _gpu_samples: dict[int, telemetry_pb2.GpuSample] = field(default_factory=dict)
    _gpu_columns: telemetry_pb2.GpuColumns | None = None
    engines: dict[tuple[str, int], telemetry_pb2.EngineSample] = field(default_factory=dict)
    # Each engine's preemptions per second between the node's last two sampling reports that
    # carried it (absent: not seen twice yet, or its counter went back: a restart).
    preemptions_per_s: dict[tuple[str, int], float] = field(default_factory=dict)
    engines_time_ns: int = 0  # the report time of `engines`
    engines_heard_ns: int = 0  # when `engines` came (the aggregator's clock)
    # When each engine last had work (a request running or waiting, or a preemption since the
    # report before), or was first seen: the aggregator's clock (repair/serving.py "idle").
    engines_active_ns: dict[tuple[str, int], int] = field(default_factory=dict)
    events: RecentEvents = field(default_factory=RecentEvents)
    stats: telemetry_pb2.CollectorStats = field(default_factory=telemetry_pb2.CollectorStats)
    replica: str = ""  # another aggregator replica holding the node's stream; "": this one
    # Whose values the view shows: the newest stream (ingest's stream number), and the seq and
    # report time it has shown; a new stream starts its seq at 0 and its time at or before now.
    stream: int = 0
    order_time_ns: int = 0

    @property
    def gpus(self) -> dict[int, telemetry_pb2.GpuSample]:
        if self._gpu_columns is not None:
            cols, self._gpu_columns = self._gpu_columns, None
            for sample in columns.to_samples(cols):
                self._gpu_samples[sample.index] = sample
        return self._gpu_samples

    @gpus.setter
    def gpus(self, samples: dict[int, telemetry_pb2.GpuSample]) -> None:
        self._gpu_samples, self._gpu_columns = samples, None

    def take_columns(self, cols: telemetry_pb2.GpuColumns) -> None:
        """The newest GPU samples, as columns: they replace the samples of the GPUs they hold."""
        pending = self._gpu_columns
        if pending is not None and pending.index != cols.index:
            _ = self.gpus  # another set of GPUs: the pending ones are read out first
        self._gpu_columns = cols


def preemption_rates(
    before: dict[tuple[str, int], telemetry_pb2.EngineSample],
    after: dict[tuple[str, int], telemetry_pb2.EngineSample],
    elapsed_s: float,
) -> dict[tuple[str, int], float]:
    """Preemptions per second of each engine seen in both samples, elapsed_s apart."""
    if not before or elapsed_s <= 0:
        return {}
    rates = {}
    for key, new in after.items():
        old = before.get(key)
        if old is None or not (old.HasField("preemptions_total") and new.HasField("preemptions_total")):
            continue
        delta = new.preemptions_total - old.preemptions_total
        if delta >= 0:
            rates[key] = delta / elapsed_s
    return rates


def engine_activity(
    before: dict[tuple[str, int], int],
    engines: dict[tuple[str, int], telemetry_pb2.EngineSample],
    preemptions_per_s: dict[tuple[str, int], float],
    heard_ns: int,
) -> dict[tuple[str, int], int]:
    """When each engine now reported last had work, or was first seen (engines gone are dropped)."""
    out = {}
    for key, e in engines.items():
        busy = e.requests_running > 0 or e.requests_waiting > 0 or preemptions_per_s.get(key, 0.0) > 0
        out[key] = heard_ns if busy or key not in before else before[key]
    return out


class FleetState:
    def __init__(
        self,
        stale_after_intervals: float = 3.0,
        silent_after_intervals: float = 10.0,
        default_interval_s: float = 5.0,
    ) -> None:
        self.stale_after_intervals = stale_after_intervals
        self.silent_after_intervals = silent_after_intervals
        self.default_interval_s = default_interval_s
        self.nodes: dict[str, NodeLive] = {}
        # Every node's liveness as last worked out, kept up to date at each liveness_by_node by
        # recomputing only the nodes whose liveness may have changed: those heard while not
        # reporting (or whose interval changed), and those whose next threshold (stale, then
        # silent) has come, from a heap of (when, node) with one live entry a node. Was: every
        # node each second, on the loop that acknowledges reports (55 ms a second at 20,000).
        self._liveness_now: dict[str, int] = {}
        self._liveness_dirty: set[str] = set()
        self._liveness_due: list[tuple[int, str]] = []
        self._liveness_due_at: dict[str, int] = {}
        # Nodes whose live state this process changed since take_changed() (what a replica
        # writes to the shared live view).
        self._changed: set[str] = set()

    def _node(self, name: str) -> NodeLive:
        live = self.nodes.get(name)
        if live is None:
            live = self.nodes[name] = NodeLive(name)
            self._liveness_dirty.add(name)
        return live

    # --- updates -------------------------------------------------------------------
    def take_changed(self) -> set[str]:
        changed, self._changed = self._changed, set()
        return changed

    def mark_changed(self, nodes: Iterable[str]) -> None:
        """Nodes taken by take_changed() whose state could not be passed on: again next time."""
        self._changed.update(nodes)

    def on_hello(self, hello: ingest_pb2.Hello, heard_ns: int | None = None, stream: int = 0) -> None:
        live = self._node(hello.node)
        self._changed.add(hello.node)
        live.replica = ""  # its stream is here now
        # A hello is hearing from the node: a collector that just connected is not silent.
        now_ns = heard_ns or time.time_ns()
        live.last_heard_ns = max(live.last_heard_ns, now_ns)
        if stream:
            # The values follow this stream from now on: its seqs count from 1 again, and a
            # report time ahead of the aggregator's clock (a stream it superseded may have sent
            # one) no longer holds them back.
            live.stream = max(live.stream, stream)
            live.last_seq = 0
            live.order_time_ns = min(live.order_time_ns, now_ns)
        live.cluster = hello.cluster
        live.interval_s = hello.interval_s
        self._liveness_dirty.add(hello.node)
        live.simulated = hello.simulated
        live.driver_version = hello.driver_version
        live.gpu_count = len(hello.gpus)
        live.connected = True
        if hello.boot_id != live.boot_id:
            live.boot_id = hello.boot_id
            live.last_seq = 0
            # GPUs may have changed across a collector restart; keep only those still there.
            live.gpus = {i: s for i, s in live.gpus.items() if i < live.gpu_count}

    def on_disconnect(self, node: str) -> None:
        if node in self.nodes:
            self.nodes[node].connected = False
            self._changed.add(node)

    def _heard(self, live: NodeLive, heard_ns: int, interval_s: float) -> None:
        """A report heard: its liveness is worked out again at the next read where it may have
        changed (the node was not reporting, or says another interval)."""
        live.last_heard_ns = max(live.last_heard_ns, heard_ns)
        reporting = self._liveness_now.get(live.node) == vocabulary_pb2.LIVENESS_REPORTING
        if not reporting or (interval_s and interval_s != live.interval_s):
            self._liveness_dirty.add(live.node)

    def on_report(self, report: telemetry_pb2.NodeReport, heard_ns: int, stream: int = 0) -> None:
        live = self._node(report.node)
        self._heard(live, heard_ns, report.interval_s)
        self._changed.add(report.node)
        for event in report.events[-RECENT_EVENTS:]:
            live.events.add(event)
        if stream < live.stream:
            return  # a stream a newer one superseded: the newer one's values stand
        if stream > live.stream:  # its hello was not seen here (the view was restored meanwhile)
            live.stream, live.last_seq = stream, 0
        if report.seq <= live.last_seq or report.time_unix_ns < live.order_time_ns:
            return  # a replay of a report already applied, or older than what the view shows
        live.order_time_ns = report.time_unix_ns
        live.last_report_ns = report.time_unix_ns
        live.last_seq = report.seq
        live.cluster = report.cluster
        live.interval_s = report.interval_s or live.interval_s
        live.stats = report.stats
        sampled = bool(report.gpus) or report.HasField("gpu_columns")
        if sampled:
            live.last_sample_ns = report.time_unix_ns
        # The bus count comes with every sampling tick, GPUs or not (a node whose NVML lists none,
        # its start stuck: collector/sources/nvml_start.py); an events-only report carries none.
        if report.HasField("gpus_on_pci_bus"):
            live.gpus_on_pci_bus = report.gpus_on_pci_bus
        elif sampled:
            live.gpus_on_pci_bus = None
        if sampled or report.engines:
            # A sampling report: it carries every engine found at this tick (a report that only
            # pushes events carries neither), so the engines it does not carry are gone.
            engines = {(eng.engine, eng.port): eng for eng in report.engines}
            live.preemptions_per_s = preemption_rates(
                live.engines, engines, (report.time_unix_ns - live.engines_time_ns) / 1e9
            )
            live.engines_active_ns = engine_activity(
                live.engines_active_ns, engines, live.preemptions_per_s, heard_ns
            )
            live.engines, live.engines_time_ns, live.engines_heard_ns = engines, report.time_unix_ns, heard_ns
        if report.HasField("gpu_columns"):
            live.take_columns(report.gpu_columns)
        for gpu in report.gpus:
            live.gpus[gpu.index] = gpu

    def restore(self, collector_points: list[Point], gpu_points: list[Point]) -> None:
        """Seed the view from the store after a restart: every node known, as last seen. A node
        already heard from since the start (the restore can come late, when the store was down
        at start-up) keeps its live values."""
        restored: set[str] = set()
        for p in collector_points:
            if p.tags["node"] in self.nodes and self.nodes[p.tags["node"]].last_heard_ns:
                continue
            restored.add(p.tags["node"])
            live = self._node(p.tags["node"])
            live.cluster = p.tags.get("cluster", "")
            live.last_report_ns = live.last_heard_ns = live.order_time_ns = p.time_unix_ns
            live.last_seq = int(p.fields.get("seq", 0))
            live.boot_id = str(p.fields.get("boot_id", ""))
            live.gpu_count = int(p.fields.get("gpu_count", 0))
            on_bus = p.fields.get("gpus_on_pci_bus")
            live.gpus_on_pci_bus = None if on_bus is None else int(on_bus)
            live.interval_s = float(p.fields.get("interval_s", 0.0))
            self._liveness_dirty.add(live.node)
        numeric = {f.name for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields} - {
            "index",
            "uuid",
            "model",
            "pci_bus_id",
        }
        for p in gpu_points:
            node = p.tags["node"]
            if node not in restored:
                continue
            sample = telemetry_pb2.GpuSample(
                index=int(p.tags["gpu"]), uuid=p.tags.get("uuid", ""), model=p.tags.get("model", "")
            )
            for name, value in p.fields.items():
                if name in numeric:
                    setattr(sample, name, bool(value) if name == "lost" else value)
            self.nodes[node].gpus[sample.index] = sample

    def apply_remote(
        self, replica: str, heard_ns: int, connected: bool, detail: fleet_pb2.NodeDetail
    ) -> bool | None:
        """A node's live state as the replica holding its stream wrote it to the shared view.
        None: not taken (this process holds the node's stream, or heard it more recently);
        else whether it carries events this view had not seen."""
        s = detail.summary
        live = self.nodes.get(s.node)
        if live is not None and not live.replica and (live.connected or live.last_heard_ns > heard_ns):
            return None
        live = self._node(s.node)
        newest = live.events[-1].time_unix_ns if live.events else 0
        live.replica = replica
        live.cluster, live.boot_id, live.last_seq = s.cluster, s.boot_id, s.last_seq
        live.last_report_ns, live.last_heard_ns = s.last_report_unix_ns, heard_ns
        live.last_sample_ns, live.interval_s = s.last_sample_unix_ns, s.interval_s
        self._liveness_dirty.add(live.node)
        live.simulated, live.driver_version, live.gpu_count = s.simulated, s.driver_version, s.gpu_count
        live.connected = connected
        live.gpus_on_pci_bus = s.gpus_on_pci_bus if s.HasField("gpus_on_pci_bus") else None
        live.gpus = {g.index: g for g in s.gpus}
        live.engines = {(e.engine, e.port): e for e in detail.engines}
        live.preemptions_per_s, live.engines_heard_ns = {}, heard_ns
        live.engines_active_ns = engine_activity(live.engines_active_ns, live.engines, {}, heard_ns)
        live.events = RecentEvents(detail.recent_events)
        live.stats = detail.collector_stats
        return any(e.time_unix_ns > newest for e in detail.recent_events)

    # --- reading -------------------------------------------------------------------
    def liveness(self, live: NodeLive, now_ns: int) -> int:
        if not live.last_heard_ns:
            return vocabulary_pb2.LIVENESS_SILENT
        interval = live.interval_s or self.default_interval_s
        age_s = (now_ns - live.last_heard_ns) / 1e9
        if age_s >= self.silent_after_intervals * interval:
            return vocabulary_pb2.LIVENESS_SILENT
        if age_s >= self.stale_after_intervals * interval:
            return vocabulary_pb2.LIVENESS_STALE
        return vocabulary_pb2.LIVENESS_REPORTING

    def cluster_of(self, node: str) -> str:
        """The cluster a node reported last ("" for a node not known here)."""
        live = self.nodes.get(node)
        return live.cluster if live is not None else ""

    def liveness_by_node(self, now_ns: int | None = None) -> dict[str, int]:
        """Every known node's liveness now (what the repair controller compares tick to tick),
        recomputing only the nodes whose liveness may have changed since the last call."""
        now_ns = now_ns or time.time_ns()
        redo, self._liveness_dirty = self._liveness_dirty, set()
        due = self._liveness_due
        while due and due[0][0] <= now_ns:
            when, node = heapq.heappop(due)
            if self._liveness_due_at.get(node) == when:  # else superseded by an earlier entry
                del self._liveness_due_at[node]
                redo.add(node)
        for node in redo:
            live = self.nodes.get(node)
            if live is None:
                self._liveness_now.pop(node, None)
                continue
            self._liveness_now[node] = self.liveness(live, now_ns)
            when = self._next_liveness_change_ns(live, now_ns)
            if when is not None and when < self._liveness_due_at.get(node, when + 1):
                self._liveness_due_at[node] = when
                heapq.heappush(due, (when, node))
        return dict(self._liveness_now)

    def _next_liveness_change_ns(self, live: NodeLive, now_ns: int) -> int | None:
        """When the node's liveness next changes if it is not heard from meanwhile: its stale,
        then its silent threshold (1 ms after, so the recomputation is past it); None: silent."""
        if not live.last_heard_ns:
            return None
        interval = live.interval_s or self.default_interval_s
        for intervals in (self.stale_after_intervals, self.silent_after_intervals):
            when = live.last_heard_ns + int(intervals * interval * 1e9) + 1_000_000
            if when > now_ns:
                return when
        return None

    def summary(self, live: NodeLive, now_ns: int | None = None) -> fleet_pb2.NodeSummary:
        now_ns = now_ns or time.time_ns()
        return fleet_pb2.NodeSummary(
            node=live.node,
            cluster=live.cluster,
            liveness=self.liveness(live, now_ns),
            last_report_unix_ns=live.last_report_ns,
            seconds_since_report=(now_ns - live.last_heard_ns) / 1e9 if live.last_heard_ns else 0.0,
            boot_id=live.boot_id,
            last_seq=live.last_seq,
            interval_s=live.interval_s,
            simulated=live.simulated,
            driver_version=live.driver_version,
            gpu_count=live.gpu_count or len(live.gpus),
            gpus=[live.gpus[i] for i in sorted(live.gpus)],
            connected=live.connected,
            engines=[live.engines[k] for k in sorted(live.engines)],
            last_sample_unix_ns=live.last_sample_ns,
            replica=live.replica,
            gpus_on_pci_bus=live.gpus_on_pci_bus,
        )

    def detail(self, live: NodeLive) -> fleet_pb2.NodeDetail:
        return fleet_pb2.NodeDetail(
            summary=self.summary(live),
            engines=[live.engines[k] for k in sorted(live.engines)],
            recent_events=list(live.events),
            collector_stats=live.stats,
        )
