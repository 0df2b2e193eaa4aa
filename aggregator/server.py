"""Run the aggregator: store, live fleet view, ingest and Fleet API servers, own metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufleet.aggregator.api.service import FleetService
from gpufleet.aggregator.auth.tokens import Authenticator, CollectorAuth, Revocations
from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.fleet import rollups
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.http_endpoints import serve as serve_http
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.service import IngestLimits, IngestService
from gpufleet.aggregator.ingest.spool import Spool, adopt_orphans
from gpufleet.aggregator.ingest.workers import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.repair_wiring import RepairWiring
from gpufleet.aggregator.replication.control_plane import ControlPlane
from gpufleet.aggregator.store import Store, StoreError
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.common.bounded_http import BoundedHTTPServer
from gpufleet.common.net import is_loopback
from gpufleet.common.redact import redact
from gpufleet.common.version import __version__
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.repair.state import RepairState, StateError, open_state

log = logging.getLogger("gpufleet.aggregator")

RETENTION_EVERY_S = 600.0
ROLLUP_EVERY_S = 60.0
REVOCATIONS_EVERY_S = 5.0


def server_options(max_report_bytes: int) -> list[tuple[str, int]]:
    """Our own size check (max_report_bytes) answers with a precise Reject; the transport limit
    only stops what is far beyond it (twice that, at least 4 MiB), before it is decoded."""
    return [
        ("grpc.max_receive_message_length", max(4 << 20, 2 * max_report_bytes)),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


@dataclass
class Bound:
    ingest: str
    fleet: str
    metrics: str


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _add_port(server: grpc.aio.Server, address: str, config: AggregatorConfig, clients: bool = False) -> str:
    """Listen on address: with TLS when tls_cert is set (clients: also require a collector's
    client certificate signed by tls_client_ca, collector_auth = mtls); in plaintext only on
    loopback unless allow_plaintext (docs/security.md "In transit")."""
    host, _ = _split(address)
    if config.tls_cert:
        creds = grpc.ssl_server_credentials(
            [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
            root_certificates=Path(config.tls_client_ca).read_bytes() if clients else None,
            require_client_auth=clients,
        )
        port = server.add_secure_port(address, creds)
    elif not is_loopback(host) and not config.allow_plaintext:
        raise ValueError(
            f"refusing to listen on {address} without TLS: collector tokens, Fleet API tokens and "
            "GPU-reset commands would cross the network in clear. Set tls_cert and tls_key (see "
            "docs/security.md), listen on 127.0.0.1, or set allow_plaintext = true on a network you trust"
        )
    else:
        if not is_loopback(host):
            log.warning(
                "listening on %s in plaintext (allow_plaintext = true): tokens cross the network in clear",
                address,
            )
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}: is the port in use or the address wrong?")
    host, _ = _split(address)
    return f"{host or '0.0.0.0'}:{port}"


def _reachable(address: str) -> str:
    """A bound address as another host can dial it (0.0.0.0 and [::] name no host)."""
    host, port = _split(address)
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.gethostname()
    return f"{host}:{port}"


class Aggregator:
    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config
        config.data_path.mkdir(parents=True, exist_ok=True)
        self.metrics = AggregatorMetrics()
        self.supervisor = Supervisor(self.metrics.registry)
        self.revocations = Revocations()
        self.auth = Authenticator.from_file(config.secrets_path, self.revocations)
        self.store: Store = config.open_store()
        self.fleet = FleetState(config.stale_after_intervals, config.silent_after_intervals)
        self._restored = self._restore()
        self.spool = Spool(config.data_path / "spool", config.spool_max_bytes, config.spool_warn_ratio)
        # Batches spooled by ingest workers that this configuration no longer runs drain from here.
        adopt_orphans(config.data_path, config.ingest_workers, self.spool)
        self.metrics.watch_spool(self.spool, self.store)
        self.writer = GroupCommitWriter(self.store, self.metrics, self.spool)
        self.pool = (
            WorkerPool(config, self.metrics, logging.getLevelName(logging.getLogger().getEffectiveLevel()))
            if config.ingest_workers
            else None
        )
        # Who makes reports durable: the worker processes, or this process's writer. The
        # watchdog and the status read it the same way.
        self.sink: GroupCommitWriter | WorkerPool = self.pool or self.writer
        self.fanout = Fanout(self.metrics)
        self.fanout.on_report("fleet_view", self.fleet.on_report)
        self.ingest = IngestService(
            self._collector_auth(config),
            self.writer,
            self.fleet,
            self.metrics,
            IngestLimits(
                config.max_report_bytes,
                config.retention_s,
                config.max_clock_skew_s,
                config.hello_timeout_s,
                config.max_streams,
                config.max_streams_per_peer,
                config.budget_limits(),
            ),
            self.fanout,
            self.pool,
        )
        self.repair = RepairWiring(config, self.fleet, self.ingest, self.metrics, self.writer.write)

        open_control_plane = self._open_control_plane

        # One box: the repair state in SQLite, one repair term from start to stop. Replicas: the
        # shared PostgreSQL, and a term only while this replica holds the lease.
        self.control_plane = (
            ControlPlane(config, open_control_plane, self.fleet, self.ingest, self.repair, self.supervisor)
            if config.replicated
            else None
        )
        self.repair_state = self.control_plane.state if self.control_plane else open_control_plane()
        if self.control_plane is not None:
            self.control_plane.register_metrics(self.metrics.registry)
        self.fleet_service = FleetService(
            self.auth, self.fleet, self.store, self.metrics, self.status, self.repair, self.control_plane
        )
        self._servers: list[grpc.aio.Server] = []
        self._http: BoundedHTTPServer | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}  # watched: one that ends is unhealthy
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = False
        self._started = False

    def _open_control_plane(self) -> RepairState:
        # A connect attempt is bounded well inside the lease: a replica that cannot reach
        # PostgreSQL learns it before its lease runs out.
        config = self.config
        return open_state(
            config.control_plane,
            str(config.data_path / "repair.sqlite3"),
            connect_timeout_s=min(5.0, config.leader_lease_s / 2),
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

    def _restore(self) -> bool:
        """Seed the live view from the store; False (logged) if the store is unreachable now."""
        try:
            self.fleet.restore(self.store.latest("collector"), self.store.latest("gpu"))
        except StoreError as exc:
            log.warning(
                "cannot read the last known state of the fleet from the store (%s); starting "
                "with an empty live view, nodes appear as they report; retrying in the background",
                exc,
            )
            return False
        return True

    async def rollup_loop(self, stop: asyncio.Event) -> None:
        """Recompute the roll-ups' trailing windows every minute (see rollups.py)."""
        while not stop.is_set():
            try:
                written = await asyncio.to_thread(rollups.run_once, self.store)
                log.debug("roll-ups: %d points written", written)
            except Exception as exc:  # the store is down, or refused a value: the next pass catches up
                log.warning("roll-up pass failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ROLLUP_EVERY_S)

    async def restore_loop(self, stop: asyncio.Event) -> None:
        """Retry the start-up restore until the store answers (the spool covers writes)."""
        delay_s = 2.0
        while not self._restored and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_s)  # a retry delay, stoppable
            self._restored = await asyncio.to_thread(self._restore)
            delay_s = min(60.0, delay_s * 2)

    def unhealthy(self) -> list[str]:
        """The watchdog: why this aggregator should not be sent collectors now (empty: healthy).
        Read by /ready, GetStatus, `gpufleet status` and the dashboard."""
        reasons = []
        if self.sink.not_acking:
            reasons.append(f"not acknowledging reports: {self.sink.not_acking}")
        waited = self.sink.oldest_waiting_s()
        if waited > self.config.ack_watchdog_s:
            reasons.append(
                f"an accepted report has waited {waited:.0f} s for its ack "
                f"(bound {self.config.ack_watchdog_s:g} s)"
            )
        lag = self.fanout.lag_s()
        if lag > self.config.ack_watchdog_s:
            reasons.append(f"the fleet view and repair listeners are {lag:.0f} s behind the acks")
        if self.pool is not None and self._started:
            reasons += self.pool.not_running()
        reasons += self.supervisor.looping()
        if self.control_plane is not None:
            reasons += self.control_plane.unhealthy()
        for name, task in self._tasks.items():
            if task.done() and not self._stopping:
                reasons.append(f"background task {name} has ended")
        return reasons

    def status(self) -> fleet_pb2.AggregatorStatus:
        spool = self.spool.status()
        batches, size, points = spool.batches, spool.bytes, spool.points
        if self.pool is not None:  # the workers' spools too
            more = self.pool.spool_totals()
            batches, size, points = batches + more[0], size + more[1], points + more[2]
        reasons = self.unhealthy()
        not_acking = self.sink.not_acking
        store_error = self.sink.store_error or self.writer.store_error
        return fleet_pb2.AggregatorStatus(
            version=__version__,
            store=self.config.store,
            store_ok=batches == 0 and not not_acking,
            store_error=redact(not_acking or (store_error if batches else "")),
            spool=fleet_pb2.SpoolStatus(
                bytes=size,
                batches=batches,
                points=points,
                oldest_age_s=spool.oldest_age_s,
                drain_points_per_s=spool.drain_points_per_s,
                drained_points_total=spool.drained_points_total,
                max_bytes=spool.max_bytes,
                near_limit=spool.near_limit,
                refused_batches_total=spool.refused_total,
                quarantined_batches=spool.quarantined_batches,
                quarantined_points=spool.quarantined_points,
                quarantine_dir=spool.quarantine_dir,
            ),
            store_points_dropped_total=self.store.points_dropped_total
            + (self.pool.points_dropped_total if self.pool else 0),
            nodes=len(self.fleet.nodes),
            streams_open=self.ingest.streams_open,
            healthy=not reasons,
            unhealthy_reasons=[redact(r) for r in reasons],
            acknowledging=not not_acking,
            not_acknowledging_reason=redact(not_acking),
            oldest_unacked_s=self.sink.oldest_waiting_s(),
            tasks=[
                fleet_pb2.TaskStatus(
                    name=r.name, restarts_total=r.restarts_total, last_error=redact(r.last_error)
                )
                for r in self.supervisor.records.values()
            ],
            store_refused_reports_total=self.sink.refused_reports_total,
            listener_errors_total=self.fanout.errors_total,
            listener_reports_dropped_total=self.fanout.dropped_total,
            **self._control_plane_status(),
        )

    def _control_plane_status(self) -> dict[str, object]:
        cp = self.control_plane
        if cp is None:
            return {"control_plane": "sqlite", "repair_leader": True}
        lease = cp.lease_info
        live = lease is not None and lease.live
        return {
            "control_plane": cp.url,
            "replica_id": cp.replica,
            "repair_leader": cp.leader,
            "leader": lease.holder if lease and live else "",
            "leader_epoch": lease.epoch if lease else 0,
            "leader_lease_left_s": (lease.expires_ns - lease.now_ns) / 1e9 if lease and live else 0.0,
            "replicas": [
                fleet_pb2.ReplicaStatus(
                    replica_id=r.replica,
                    fleet_address=str(r.info.get("fleet", "")),
                    ingest_address=str(r.info.get("ingest", "")),
                    streams_open=int(r.info.get("streams", 0)),
                    heartbeat_age_s=r.age_s,
                    leader=live and lease is not None and r.replica == lease.holder,
                )
                for r in cp.replicas
            ],
        }

    async def start(self) -> Bound:
        self.writer.start(self.supervisor)  # with workers too: it drains this process's spool
        if self.pool is not None:
            for task in self.pool.start(self.supervisor):
                self._tasks[task.get_name()] = task
        self._tasks["fanout"] = self.supervisor.start("fanout", self.fanout.run)
        self._started = True
        options = server_options(self.config.max_report_bytes)
        ingest_server = grpc.aio.server(options=options)
        ingest_server.add_generic_rpc_handlers((self.ingest.handler(),))
        ingest_addr = _add_port(
            ingest_server, self.config.ingest_listen, self.config, "mtls" in self.config.collector_auth_modes
        )
        fleet_server = grpc.aio.server(options=options)
        fleet_pb2_grpc.add_FleetServicer_to_server(self.fleet_service, fleet_server)
        fleet_addr = _add_port(fleet_server, self.config.fleet_listen, self.config)
        self._servers = [ingest_server, fleet_server]
        for server in self._servers:
            await server.start()
        metrics_addr = ""
        if self.config.metrics_listen:
            host, port = _split(self.config.metrics_listen)
            self._http = serve_http(host, port, self.metrics.registry, self.unhealthy)
            metrics_addr = f"{host or '0.0.0.0'}:{self._http.server_port}"
        bound = Bound(ingest_addr, fleet_addr, metrics_addr)
        if self.control_plane is not None:
            self.control_plane.addresses = {
                "fleet": self.config.replica_advertise or _reachable(bound.fleet),
                "ingest": _reachable(bound.ingest),
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

    async def retention_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.store.apply_retention, time.time_ns())
            except Exception:  # keep serving; the next pass tries again
                log.exception("retention pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETENTION_EVERY_S)

    async def revocation_loop(self, stop: asyncio.Event) -> None:
        """Keep the collector token revocation list as the control plane has it (every
        REVOCATIONS_EVERY_S, on a connection of its own); a token revoked meanwhile ends its
        stream at once. While the control plane cannot be read, the last list stands."""
        state: RepairState | None = None
        try:
            while not stop.is_set():
                try:
                    if state is None:
                        state = await asyncio.to_thread(self._open_control_plane)
                    revoked = await asyncio.to_thread(state.revoked_collector_tokens)
                    if revoked != self.revocations.ids:
                        self.revocations.update(revoked)
                        ended = self.ingest.end_invalid_streams()
                        log.info(
                            "collector token revocation list: %d token(s); %d open stream(s) ended",
                            len(revoked),
                            ended,
                        )
                except StateError as exc:
                    log.warning("cannot read the collector token revocation list: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), REVOCATIONS_EVERY_S)
        finally:
            if state is not None:
                state.close()

    def run_background(self, stop: asyncio.Event) -> None:
        """The aggregator's periodic loops, each supervised (a crash is logged, counted and the
        loop restarted; a loop that ends early shows in the watchdog)."""
        loops = {
            "retention": lambda: self.retention_loop(stop),
            "restore": lambda: self.restore_loop(stop),
            "rollups": lambda: self.rollup_loop(stop),
            "revocations": lambda: self.revocation_loop(stop),
        }
        if self.control_plane is not None:
            loops["control-plane-lease"] = lambda: self.control_plane.lease_loop(stop)  # type: ignore[union-attr]
            loops["control-plane-sync"] = lambda: self.control_plane.sync_loop(stop)  # type: ignore[union-attr]
        for name, body in loops.items():
            task = self.supervisor.start(name, body)
            self._loops.append(task)
            if name != "restore":  # restore ends once the live view is seeded
                self._tasks[name] = task
        if self.control_plane is None:
            self.repair.start_term(self.repair_state, self.supervisor.start)
            self._tasks["repair"] = self.repair.term_tasks[0]
            stop_task = asyncio.ensure_future(self._end_term_on(stop))
            self._loops.append(stop_task)

    async def _end_term_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.repair.end_term()

    async def wait_loops(self, timeout_s: float = 60.0) -> None:
        """After stop is set: let each loop finish its pass (a repair step is not cut short)."""
        self._stopping = True
        if self._loops:
            await asyncio.wait(self._loops, timeout=timeout_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        self._stopping = True
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
    aggregator = Aggregator(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await aggregator.start()
    aggregator.run_background(stop)
    await stop.wait()
    await aggregator.wait_loops()
    await aggregator.stop()
