"""Run the aggregator: store, live fleet view, ingest and Fleet API servers, own metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path

import grpc

from gpufleet.aggregator.api.service import FleetService
from gpufleet.aggregator.auth.tokens import Authenticator, CollectorAuth, Revocations
from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.fleet.pools import register_pool_metrics
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.http_endpoints import serve as serve_http
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.service import IngestLimits, IngestService
from gpufleet.aggregator.ingest.spool import Spool, adopt_orphans
from gpufleet.aggregator.ingest.worker_pool import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.listen import Bound, add_port, reachable, server_options, split_address
from gpufleet.aggregator.loops import BackgroundLoops
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.repair_wiring import RepairWiring
from gpufleet.aggregator.replication.control_plane import ControlPlane, register_metrics
from gpufleet.aggregator.status import Lifecycle, StatusReports
from gpufleet.aggregator.store import Store
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.aggregator.workloads.wiring import Workloads
from gpufleet.common.bounded_http import BoundedHTTPServer
from gpufleet.common.memory import fix_mmap_threshold, tune_gc
from gpufleet.protos import fleet_pb2_grpc
from gpufleet.repair.state import RepairState, StateError, open_state

log = logging.getLogger("gpufleet.aggregator")
START_RETRY_S = 30.0  # how long a start waits for a control plane that does not answer yet
WORKER_START_S = 30.0  # how long a start waits for the ingest workers' first word


class Aggregator:
    """The aggregator's parts, built here and given what each uses; started and stopped here.
    What it says of itself is its StatusReports' (status.py), its periodic work its
    BackgroundLoops' (loops.py)."""

    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config
        config.data_path.mkdir(parents=True, exist_ok=True)
        self.metrics = AggregatorMetrics()
        self.supervisor = Supervisor(self.metrics.registry)
        self.revocations = Revocations()
        self.auth = Authenticator.from_file(config.secrets_path, self.revocations)
        self.store: Store = config.open_store()
        self.fleet = FleetState(config.stale_after_intervals, config.silent_after_intervals)
        self.spool = Spool(config.data_path / "spool", config.spool_max_bytes, config.spool_warn_ratio)
        # Batches spooled by ingest workers that this configuration no longer runs drain from here.
        adopt_orphans(config.data_path, config.ingest_workers, self.spool)
        self.writer = GroupCommitWriter(self.store, self.metrics, self.spool)
        self.pool = (
            WorkerPool(config, self.metrics, logging.getLevelName(logging.getLogger().getEffectiveLevel()))
            if config.ingest_workers
            else None
        )
        self.fanout = Fanout(self.metrics)
        self.fanout.on_report("fleet_view", self.fleet.on_report)
        self.ingest = IngestService(
            self._collector_auth(config),
            self.writer,
            self.fleet,
            self.metrics,
            IngestLimits(
                max_report_bytes=config.max_report_bytes,
                retention_s=config.retention_s,
                max_clock_skew_s=config.max_clock_skew_s,
                hello_timeout_s=config.hello_timeout_s,
                max_hello_bytes=config.max_hello_bytes,
                max_hellos_per_node=config.max_hellos_per_node,
                max_streams=config.max_streams,
                max_streams_per_peer=config.max_streams_per_peer,
                budget=config.budget_limits(),
            ),
            self.fanout,
            self.pool,
        )
        self.repair = RepairWiring(config, self.fleet, self.ingest, self.metrics, self.writer.write)
        self.workloads = Workloads(
            config,
            self.fleet,
            self.store,
            self.fanout,
            self.writer.write,
            self.metrics.registry,
            lambda: self.repair.policy,
        )
        # Whose work is on each node, in its repair snapshot (the waste rules, and the workloads
        # an incident names).
        self.repair.waste_view = self.workloads.ledger.waste_view
        self.repair.usage = self.workloads.usage

        open_control_plane = self._open_control_plane

        # One box: the repair state in SQLite, one repair term from start to stop. Replicas: the
        # shared PostgreSQL, and a term only while this replica holds the lease.
        self.control_plane = (
            ControlPlane(config, self._open_at_start, self.fleet, self.ingest, self.repair, self.supervisor)
            if config.replicated
            else None
        )
        self.repair_state = self.control_plane.state if self.control_plane else self._open_at_start()
        if self.control_plane is None:
            # One box: the running workloads' figures are kept in the control-plane state and
            # survive a restart (with replicas each replica keeps its own streams' in memory).
            self.workloads.keep_in(self.repair_state.kept)
        if self.control_plane is not None:
            register_metrics(self.control_plane, self.metrics.registry)
        self.loops = BackgroundLoops(
            config, self.store, self.fleet, self.revocations, self.ingest, open_control_plane
        )
        self.lifecycle = Lifecycle()
        self.reports = StatusReports(
            config,
            self.fleet,
            self.store,
            self.spool,
            self.writer,
            self.pool,
            self.fanout,
            self.ingest,
            self.supervisor,
            self.control_plane,
            self.lifecycle,
        )
        self.metrics.watch_spool(self.reports.spool_status, self.store)
        self.reports.register_status_gauges(self.metrics.registry)
        self.fleet_service = FleetService(
            self.auth,
            self.fleet,
            self.store,
            self.metrics,
            self.reports.status,
            self.repair,
            self.control_plane,
            self.workloads,
            config.show_user_names,
        )
        register_pool_metrics(
            self.metrics.registry,
            self.repair.serving,
            lambda: self.repair.policy.serving,
            self.fleet_service.workflows,
        )
        self._servers: list[grpc.aio.Server] = []
        self._http: BoundedHTTPServer | None = None
        self._tasks = self.lifecycle.tasks  # watched by the status's watchdog
        self._loops: list[asyncio.Task[None]] = []

    def _open_at_start(self, purpose: str = "repair") -> RepairState:
        """The control plane at start: a server that does not answer yet (starting, or slow under
        load: a fresh-clone run saw PostgreSQL miss a 0.75 s call during the migration check) is
        tried again for START_RETRY_S, each failure logged; then the start fails with its error."""
        deadline, wait_s = time.monotonic() + START_RETRY_S, 0.5
        while True:
            try:
                return self._open_control_plane(purpose)
            except StateError as exc:
                if time.monotonic() + wait_s > deadline:
                    raise
                log.warning("control plane not ready at start (%s); trying again in %.1f s", exc, wait_s)
                time.sleep(wait_s)  # the start's own back-off, before anything serves
                wait_s = min(wait_s * 2, 5.0)

    def _open_control_plane(self, purpose: str = "repair") -> RepairState:
        # A connect attempt is bounded well inside the lease, and no call waits for an answer
        # longer than a quarter of it: a replica that cannot reach PostgreSQL, or whose
        # PostgreSQL hangs, learns it before its lease runs out, and its event loop is never
        # held longer than one call timeout (docs/architecture.md "When the control plane hangs").
        config = self.config
        return open_state(
            config.control_plane,
            str(config.data_path / "repair.sqlite3"),
            connect_timeout_s=min(5.0, config.leader_lease_s / 2),
            call_timeout_s=config.control_plane_call_timeout_s,
            # PostgreSQL keeps 63 bytes of it: "gpufleet agg-a lease" says whose session it is.
            application_name=f"gpufleet {config.replica_name} {purpose}"[:63],
        )

    def _collector_auth(self, config: AggregatorConfig) -> CollectorAuth:
        modes = config.collector_auth_modes
        kubernetes = None
        if "kubernetes" in modes:
            from gpufleet.aggregator.auth.kubernetes import KubernetesCollectorAuth

            kubernetes = KubernetesCollectorAuth(
                config.collector_k8s_audience,
                config.collector_k8s_service_account,
                config.collector_k8s_kubeconfig,
            ).identify
        return CollectorAuth(self.auth, modes, kubernetes)

    async def start(self) -> Bound:
        # The ports first: an address refused (plaintext off loopback, in use) stops the start
        # before any worker process or task exists.
        options = server_options(self.config.max_report_bytes)
        ingest_server = grpc.aio.server(options=options)
        ingest_server.add_generic_rpc_handlers((self.ingest.handler(),))
        ingest_addr = add_port(
            ingest_server, self.config.ingest_listen, self.config, "mtls" in self.config.collector_auth_modes
        )
        fleet_server = grpc.aio.server(options=options)
        fleet_pb2_grpc.add_FleetServicer_to_server(self.fleet_service, fleet_server)
        fleet_addr = add_port(fleet_server, self.config.fleet_listen, self.config)
        self._servers = [ingest_server, fleet_server]
        self.writer.start(self.supervisor)  # with workers too: it drains this process's spool
        if self.pool is not None:
            for task in self.pool.start(self.supervisor):
                self._tasks[task.get_name()] = task
        self._tasks["fanout"] = self.supervisor.start("fanout", self.fanout.run)
        self.lifecycle.started = True
        for server in self._servers:
            await server.start()
        if self.pool is not None:
            # Ready means the workers run and their spools are counted (a restart with spooled
            # batches says so in its first status, not a second later).
            late = await self.pool.wait_started(WORKER_START_S)
            if late:
                log.warning(
                    "ingest worker(s) %s not running %g s after start; their nodes' reports wait "
                    "(the status and /ready say so until they are)",
                    ", ".join(map(str, late)),
                    WORKER_START_S,
                )
        metrics_addr = ""
        if self.config.metrics_listen:
            host, port = split_address(self.config.metrics_listen)
            self._http = serve_http(
                host,
                port,
                self.metrics.registry,
                self.reports.unhealthy,
                self.config.metrics_snapshot_s,
                self.config.metrics_max_scrapes_per_s,
            )
            metrics_addr = f"{host or '0.0.0.0'}:{self._http.server_port}"
        bound = Bound(ingest_addr, fleet_addr, metrics_addr)
        if self.control_plane is not None:
            self.control_plane.addresses = {
                "fleet": self.config.replica_advertise or reachable(bound.fleet),
                "ingest": reachable(bound.ingest),
            }
        log.info(
            "aggregator serving: ingest %s, fleet API %s, metrics %s, store %s in %s (%d known nodes)",
            bound.ingest,
            bound.fleet,
            bound.metrics or "off",
            self.config.store,
            self.config.data_dir,
            len(self.fleet.nodes),
        )
        if self.config.ready_file:
            tmp = Path(self.config.ready_file + ".tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "ingest": bound.ingest,
                        "fleet": bound.fleet,
                        "metrics": bound.metrics,
                    }
                )
            )
            tmp.replace(self.config.ready_file)  # atomic: readers never see half a file
        return bound

    def run_background(self, stop: asyncio.Event) -> None:
        """The aggregator's periodic loops, each supervised (a crash is logged, counted and the
        loop restarted; a loop that ends early shows in the watchdog)."""
        loops = {
            "retention": lambda: self.loops.retention_loop(stop),
            "restore": lambda: self.loops.restore_loop(stop),
            "rollups": lambda: self.loops.rollup_loop(stop),
            "settle": lambda: self.loops.settle_loop(stop),
            "revocations": lambda: self.loops.revocation_loop(stop),
            "workloads": lambda: self.workloads.poll_loop(stop),
        }
        if self.control_plane is not None:
            loops["control-plane-lease"] = lambda: self.control_plane.leadership.lease_loop(stop)  # type: ignore[union-attr]
            loops["control-plane-sync"] = lambda: self.control_plane.sync_loop(stop)  # type: ignore[union-attr]
        for name, body in loops.items():
            task = self.supervisor.start(name, body)
            self._loops.append(task)
            if name != "restore":  # restore ends once the live view is seeded
                self._tasks[name] = task
        if self.control_plane is None:
            term = self.repair.start_term(self.repair_state, self.supervisor)
            assert term.done is not None
            self._tasks["repair"] = term.done
            stop_task = asyncio.ensure_future(self._end_term_on(stop))
            self._loops.append(stop_task)

    async def _end_term_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.repair.end_term()

    async def wait_loops(self, timeout_s: float = 60.0) -> None:
        """After stop is set: let each loop finish its pass (a repair step is not cut short)."""
        self.lifecycle.stopping = True
        if self._loops:
            await asyncio.wait(self._loops, timeout=timeout_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        self.lifecycle.stopping = True
        await asyncio.gather(*(s.stop(grace_s) for s in self._servers))
        if self.pool is not None:
            await self.pool.close()
        await self.writer.close()
        await self.repair.end_term()
        await self.supervisor.stop()
        if self.control_plane is not None:
            self.control_plane.close()
        else:
            self.repair_state.close()
        if self._http is not None:
            self._http.shutdown()
        self.store.close()
        log.info("aggregator stopped")


async def run_aggregator(config: AggregatorConfig) -> None:
    fix_mmap_threshold()  # a flood of large messages leaves no RSS behind (common/memory.py)
    aggregator = Aggregator(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await aggregator.start()
    except BaseException:
        await aggregator.stop()  # whatever did start (worker processes, tasks) stops with it
        raise
    aggregator.run_background(stop)
    tune_gc()  # fewer, larger garbage collections under load (common/memory.py)
    await stop.wait()
    await aggregator.wait_loops()
    await aggregator.stop()
