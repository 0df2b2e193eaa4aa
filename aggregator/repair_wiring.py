"""Wires the repair library to the aggregator: node snapshots from the live view, commands
down the ingest streams, the backend, alert sinks and metrics from the configuration."""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.declared_metrics import counter, gauge, gauges, totals
from gpufleet.aggregator.declared_metrics import family as declared_family
from gpufleet.aggregator.fleet.export import EventExporter, WritePoints
from gpufleet.aggregator.fleet.pools import ServingReader
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.service import IngestService
from gpufleet.aggregator.loop_thread import LoopClosed, call_on
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.repair_term import RepairTerm, Spawn, TermParts
from gpufleet.aggregator.store import Point
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.aggregator.workloads.digest import WasteDigest
from gpufleet.aggregator.workloads.summary import UsageRow
from gpufleet.protos import columns, ingest_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import HEALTH_STATES, gpu_health_name
from gpufleet.repair.alerts import open_sinks
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends import open_backend
from gpufleet.repair.controller import Hooks, Rails, RepairController
from gpufleet.repair.gpu_health import gpu_states, raised
from gpufleet.repair.health import Health
from gpufleet.repair.model import NodeSnapshot, ProcessClaim, WorkloadOnNode
from gpufleet.repair.policy import Policy, load_policy
from gpufleet.repair.replay.engine import ReplayConfig
from gpufleet.repair.rules import WATCH_FIELDS
from gpufleet.repair.state import RepairState

T = TypeVar("T")
log = logging.getLogger("gpufleet.aggregator.repair")


WasteView = Callable[[str], tuple[tuple[WorkloadOnNode, ...], tuple[ProcessClaim, ...]]]


def snapshots(
    fleet: FleetState, only: set[str] | None = None, waste_view: WasteView | None = None
) -> list[NodeSnapshot]:
    now = time.time_ns()
    out = []
    lives = fleet.nodes.values() if only is None else [fleet.nodes[n] for n in only if n in fleet.nodes]
    for live in lives:
        workloads, claims = waste_view(live.node) if waste_view is not None else ((), ())
        out.append(
            NodeSnapshot(
                node=live.node,
                cluster=live.cluster,
                liveness=fleet.liveness(live, now),
                seconds_since_report=(now - live.last_heard_ns) / 1e9 if live.last_heard_ns else 0.0,
                boot_id=live.boot_id,
                connected=live.connected,
                gpu_count=live.gpu_count,
                gpus=dict(live.gpus),
                events=list(live.events),
                sample_time_ns=live.last_sample_ns,
                gpus_on_pci_bus=live.gpus_on_pci_bus,
                workloads=workloads,
                claims=claims,
            )
        )
    return out


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class HealthWatch:
    """Pokes the controller for one node when a report carries events or a GPU's health
    signals changed, so a sampled fault is acted on at its report, not at the next full pass.
    The check reads a handful of fields per GPU: cheap enough for every report."""

    FIELDS = WATCH_FIELDS  # declared by the rules themselves (repair/rules/__init__.py)

    def __init__(self, poke: Callable[[str], None]) -> None:
        self._poke = poke
        self._last: dict[str, tuple[object, ...]] = {}
        # One C call per GPU for every watched field (an absent field reads as its default: a
        # field going absent is seen at the next full pass, not at its report).
        self._fingerprint = operator.attrgetter("index", "lost", *self.FIELDS)
        # Columns: the watched fields' slots of each layout (an absent slot holds 0, the default).
        self._column_getters: dict[tuple, Callable[[tuple], tuple]] = {}

    def on_report(self, report: telemetry_pb2.NodeReport) -> None:
        if report.HasField("gpu_columns"):
            self._changed(report.node, self._column_fingerprint(report.gpu_columns), bool(report.events))
        else:
            self.on_gpus(report.node, report.gpus, bool(report.events))

    def _column_fingerprint(self, cols: telemetry_pb2.GpuColumns) -> tuple[object, ...]:
        key = (tuple(cols.double_fields), tuple(cols.integer_fields), tuple(cols.bool_fields), cols.count)
        get = self._column_getters.get(key)
        if get is None:
            order = key[0] + key[1] + key[2]
            watched = {columns.number_of(f) for f in self.FIELDS}
            at = [
                k * cols.count + i
                for k, number in enumerate(order)
                if number in watched
                for i in range(cols.count)
            ]
            if len(self._column_getters) > 4096:
                self._column_getters.clear()
            get = self._column_getters[key] = columns.getter(at)
        return (tuple(cols.index), cols.lost, get(columns.values(cols))) if cols.count else ()

    def on_gpus(self, node: str, gpus: Iterable[telemetry_pb2.GpuSample], events: bool) -> None:
        self._changed(node, tuple(map(self._fingerprint, gpus)), events)

    def _changed(self, node: str, fingerprint: tuple[object, ...], events: bool) -> None:
        changed = bool(fingerprint) and self._last.get(node) != fingerprint
        if fingerprint:
            self._last[node] = fingerprint
        if changed or events:
            self._poke(node)


def hooks_of(config: AggregatorConfig) -> Hooks:
    """The commands the repair controller runs (reboot, ticket, an orphan's cleanup)."""
    return Hooks(
        config.repair_reboot_command,
        config.repair_ticket_command,
        config.repair_hook_timeout_s,
        config.repair_orphan_command,
    )


def waste_digest(
    config: AggregatorConfig,
    usage: Callable[[float, float, str], list[UsageRow]] | None,
    dispatcher: AlertDispatcher,
) -> WasteDigest | None:
    """The waste digest through the term's alert sinks (None: off, or no workloads to read)."""
    if usage is None or config.waste_digest_every_s <= 0:
        return None
    return WasteDigest(
        usage,
        dispatcher,
        config.waste_digest_every_s,
        config.waste_digest_at_utc,
        config.waste_digest_by,
        config.waste_digest_min_idle_gpu_hours,
    )


class RepairWiring:
    """The repair controller of this aggregator, term by term. With the one-box control plane
    there is one term, from start to stop. With replicas, a term is this replica's time as
    repair leader (aggregator/replication/control_plane.py): `start_term` builds a controller, its alert
    dispatcher and backend on the leader's fenced view of the store, reloading every workflow,
    incident, ledger entry and the breaker from it, on the term's own thread
    (aggregator/repair_term.py); `end_term` stops them. Listeners and gauges are registered
    once and read the term that is running (none: 0, nothing done)."""

    def __init__(
        self,
        config: AggregatorConfig,
        fleet: FleetState,
        ingest: IngestService,
        metrics: AggregatorMetrics,
        write_points: WritePoints | None = None,
    ) -> None:
        self._config, self._fleet, self._ingest, self._metrics = config, fleet, ingest, metrics
        # Where the term's audit rows and findings go into history (None: nowhere).
        self._write_points = write_points
        self._policy = load_policy(config.repair_policy_file or None)
        # Every engine replica, placed in the pools the policy declares (the guard, ListPools,
        # GetNode and /metrics all read it).
        self.serving = ServingReader(fleet, lambda: self._policy)
        self.scheduler_names = config.scheduler_names()
        r = metrics.registry
        self._alert_count = counter(r, "gpufleet_alerts")
        self._actions = counter(r, "gpufleet_repair_actions")
        self.term: RepairTerm | None = None  # the running term (one at a time)
        # Each node's workloads and process claims (aggregator/workloads: the server sets it).
        self.waste_view: WasteView | None = None
        # GPU-hours by owner over a range (aggregator/workloads: the server sets it), which the
        # waste digest reads.
        self.usage: Callable[[float, float, str], list[UsageRow]] | None = None
        self._main: asyncio.AbstractEventLoop | None = None  # the loop the fleet's state lives on
        # How commands reach a node whose stream another replica holds (None: one box).
        self.remote_command: Callable[[RepairState, str, ingest_pb2.Command], bool] | None = None
        ingest.fanout.on_command_result("repair", self.on_command_result)
        self._health_watch = HealthWatch(self.poke)
        ingest.fanout.on_report(
            "health_watch", lambda report, _received_ns, _stream: self._health_watch.on_report(report)
        )
        self._gauges(r)

    @property
    def config_backend(self) -> str:
        """The repair backend's name (none: gpufleet's own records, no scheduler)."""
        return self._config.repair_backend

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def replay_max_days(self) -> float:
        return self._config.replay_max_days

    def replay_config(self) -> ReplayConfig:
        """A replay of this aggregator's own history as its controller would run it: its rails,
        its reboot and ticket commands (an unset one is skipped, as live; a set one simulated,
        never run), its pass interval (repair/replay/engine.py)."""
        c = self._config
        return ReplayConfig(
            rails=self._rails(),
            simulate_hooks=False,
            hooks=hooks_of(c),
            from_store=True,
            tick_s=c.repair_interval_s,
        )

    def _rails(self) -> Rails:
        c = self._config
        return Rails(
            dry_run=c.repair_dry_run,
            max_out_of_service=c.repair_max_out_of_service,
            max_out_of_service_fraction=c.repair_max_out_of_service_fraction,
            breaker_nodes=c.repair_breaker_nodes,
            breaker_window_s=c.repair_breaker_window_s,
        )

    def poke(self, node: str | None = None) -> None:
        """Called on the event loop; the controller is poked on its term's thread."""
        term, controller = self.term, self.controller
        if term is not None and controller is not None:
            term.call_soon(controller.poke, node)

    def on_command_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        term, controller = self.term, self.controller
        if term is not None and controller is not None:
            term.call_soon(controller.on_command_result, node, result)

    def watch_remote(self, node: str, gpus: Iterable[telemetry_pb2.GpuSample], events: bool) -> None:
        """A node another replica holds changed in the shared live view."""
        self._health_watch.on_gpus(node, gpus, events)

    def _send_command(
        self, main: asyncio.AbstractEventLoop, state: RepairState, node: str, command: ingest_pb2.Command
    ) -> bool:
        """On the term's thread: down the node's stream if this replica holds it (on the event
        loop that owns the streams), else queued in the control plane for the replica that does."""
        if call_on(main, self._ingest.send_command, node, command):
            return True
        return self.remote_command is not None and self.remote_command(state, node, command)

    def start_term(self, state: RepairState, supervisor: Supervisor) -> RepairTerm:
        """Start a term on a thread of its own (aggregator/repair_term.py); it loads its state
        there. Called on the aggregator's event loop."""
        main = asyncio.get_running_loop()
        name = "one-box" if state.epoch is None else f"epoch-{state.epoch}"
        self.term = RepairTerm(name, state, lambda spawn: self._build(main, state, spawn), supervisor)
        self.term.start()
        return self.term

    def _gpu_health_rows(self) -> list[tuple[str, str, int, str, int]]:
        """(cluster, node, GPU, health word, level) of every GPU not ok, as the Fleet API derives
        it (repair/gpu_health.py), from the snapshots and findings of the controller's last pass
        (read on the scraping thread, never on the event loop that acknowledges reports: a scrape
        costs ingest nothing); none while this aggregator runs no repair term (a replica that
        does not lead: read the leader's)."""
        controller = self.controller
        if controller is None:
            return []
        rows = []
        for node, snap in list(controller.last_snapshots.items()):
            findings = controller.findings.get(node, [])
            wf = controller.workflows.get(node)
            gpus = snap.gpus.values()
            if not findings and (wf is None or wf.state is Health.HEALTHY):
                # Most of a fleet: nothing open on the node, so a GPU is ok unless its own sample
                # raises something (the whole state is built only for those).
                gpus = [g for g in gpus if g.lost or raised(g)]
            for s in gpu_states(gpus, findings, wf):
                if s.health > vocabulary_pb2.GPU_HEALTH_OK:
                    rows.append((snap.cluster, node, s.index, gpu_health_name(s.health), s.health))
        return rows

    def _build(self, main: asyncio.AbstractEventLoop, state: RepairState, spawn: Spawn) -> TermParts:
        """The term's controller, alert dispatcher and history export, on the term's thread."""
        self._main = main
        config = self._config
        fleet = self._fleet
        backend = open_backend(config.repair_backend, config, self.scheduler_names)
        dispatcher = AlertDispatcher(
            open_sinks(config),
            group_wait_s=config.alert_group_wait_s,
            max_age_s=config.alert_max_age_s,
            count=lambda sink, outcome: self._alert_count.labels(sink=sink, outcome=outcome).inc(),
            store=state.kept,
            dashboard_url=config.dashboard_url,
        )
        controller = RepairController(
            self._policy,
            state,
            backend,
            self._rails(),
            hooks_of(config),
            dispatcher,
            lambda only: call_on(main, snapshots, fleet, only, self.waste_view),
            lambda node, command: self._send_command(main, state, node, command),
            on_action=lambda node, action, outcome: self._actions.labels(
                action=action, outcome=outcome.status.value
            ).inc(),
            observe_interval_s=config.repair_observe_interval_s,
            liveness=lambda: call_on(main, fleet.liveness_by_node),
            serving=lambda: call_on(main, self.serving, False),  # the guard needs no GPU figures
        )
        dispatcher.start(spawn)
        controller.desk.resolve_closed(controller.workflows)  # a close the last process did not page
        exporter = None
        write = self._write_points
        if write is not None:
            # The history store's writer belongs to the event loop: each batch is written there.
            def write_on_main(points: list[Point]) -> Awaitable[None]:
                return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_awaited(write(points)), main))

            exporter = EventExporter(state, write_on_main, fleet.cluster_of)
        digest = waste_digest(config, self.usage, dispatcher)
        return TermParts(controller, dispatcher, exporter, config.repair_interval_s, digest)

    @property
    def controller(self) -> RepairController | None:
        """The running term's controller (None: no term, or its state is still loading)."""
        return self.term.controller if self.term is not None else None

    @property
    def dispatcher(self) -> AlertDispatcher | None:
        parts = self.term.parts if self.term is not None else None
        return parts.dispatcher if parts is not None else None

    @property
    def exporter(self) -> EventExporter | None:
        parts = self.term.parts if self.term is not None else None
        return parts.exporter if parts is not None else None

    async def wait_controller(self, timeout_s: float = 10.0) -> RepairController | None:
        """The running term's controller, waiting up to timeout_s for its state to load."""
        term = self.term
        return await term.wait_built(timeout_s) if term is not None else None

    async def on_term(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run coro on the running term's thread (a person's action through the Fleet API)."""
        term = self.term
        if term is None:
            coro.close()
            raise LoopClosed("no repair term is running here (no longer the leader)")
        return await term.run(coro)

    async def end_term(self, timeout_s: float = 60.0) -> None:
        """Stop the running term: its pass finishes (a step is not cut short), alerts stop."""
        term, self.term = self.term, None
        if term is not None:
            await term.end(timeout_s)

    def _gauges(self, r: CollectorRegistry) -> None:
        def of(read: Callable[[RepairController], float]) -> Callable[[], float]:
            return lambda: read(self.controller) if self.controller is not None else 0.0

        nodes_in_state = gauge(r, "gpufleet_repair_nodes")
        for name in HEALTH_STATES:
            nodes_in_state.labels(state=name).set_function(
                of(lambda c, name=name: float(sum(1 for w in list(c.workflows.values()) if w.state == name)))
            )
        r.register(_FlaggedGpus(lambda: self.controller))
        r.register(_GpuHealthGauge(self._gpu_health_rows))
        gauges(
            r,
            {
                "gpufleet_repair_leader": lambda: float(self.controller is not None),
                "gpufleet_repair_breaker_tripped": of(lambda c: float(c.breaker_tripped)),
                "gpufleet_alerts_held": lambda: float(self.dispatcher.held) if self.dispatcher else 0.0,
                "gpufleet_repair_last_pass_seconds": of(lambda c: c.last_pass_s),
            },
        )
        # Running totals of this leader term (a new term starts them at 0: a counter reset).
        totals(
            r,
            {
                "gpufleet_alert_store_errors": lambda: (
                    float(self.dispatcher.store_errors_total) if self.dispatcher is not None else 0.0
                ),
                "gpufleet_repair_term_load_failures": lambda: (
                    float(self.term.build_failures_total) if self.term is not None else 0.0
                ),
                "gpufleet_repair_unrecorded_outcomes": of(lambda c: float(c.steps.unrecorded_total)),
                "gpufleet_repair_passes": of(lambda c: float(c.passes)),
                "gpufleet_repair_pass_errors": of(lambda c: float(c.pass_errors)),
                "gpufleet_repair_scheduler_reads": of(lambda c: float(c.scheduler_reads)),
                "gpufleet_history_export_points": lambda: (
                    float(self.exporter.exported_total) if self.exporter else 0.0
                ),
                "gpufleet_history_export_failures": lambda: (
                    float(self.exporter.failures_total) if self.exporter else 0.0
                ),
            },
        )


class _GpuHealthGauge:
    """`gpufleet_gpu_health{cluster, node, gpu, health}` for every GPU that is not ok: its level
    (vocabulary.proto GpuHealth: 2 watch, 3 suspect, 4 faulty, 5 lost) and its word, the same
    the Fleet API, `gpufleet node` and the dashboard show; Grafana maps the level to the word and
    its colour (protos/presentation.py). A GPU that reads ok has no series: the fleet's size does not
    set the series count, its trouble does. A scrape that cannot read the state in time is
    logged and answers without the family's samples, never fails the whole scrape."""

    def __init__(self, rows: Callable[[], list[tuple[str, str, int, str, int]]]) -> None:
        self._rows = rows
        self.failures_total = 0

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = declared_family("gpufleet_gpu_health")
        try:
            rows = self._rows()
        except (TimeoutError, LoopClosed) as exc:
            self.failures_total += 1
            log.warning("gpufleet_gpu_health left out of this scrape: %s", exc)
            rows = []
        for cluster, node, gpu, word, level in rows:
            family.add_metric([cluster, node, str(gpu), word], float(level))
        yield family


class _FlaggedGpus:
    """`gpufleet_gpu_flagged{node, gpu, code, severity}` = 1 for every finding the repair
    controller holds now (its last pass): a GPU stays flagged for as long as its signal lasts
    (a volatile ECC count until a reset, an XID for the policy's look-back), which is what lets
    a Prometheus rule keep firing after the raw counter stopped moving
    (deploy/prometheus/gpufleet-alerts.yml). Only the repair leader has findings; a node-level
    finding has gpu="". Bounded by the findings the rules can make of the fleet."""

    def __init__(self, controller: Callable[[], RepairController | None]) -> None:
        self._controller = controller

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = declared_family("gpufleet_gpu_flagged")
        controller = self._controller()
        if controller is not None:
            for node, findings in list(controller.findings.items()):
                for f in findings:
                    family.add_metric([node, "" if f.gpu is None else str(f.gpu), f.code, f.severity], 1.0)
        yield family
