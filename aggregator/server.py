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
from prometheus_client import start_http_server

import gpufleet
from gpufleet.aggregator import rollups
from gpufleet.aggregator.auth import Authenticator
from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.fleet_service import FleetService
from gpufleet.aggregator.fleet_state import FleetState
from gpufleet.aggregator.ingest import IngestLimits, IngestService
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.repair_wiring import build_controller
from gpufleet.aggregator.spool import Spool
from gpufleet.aggregator.store import Store, StoreError, open_store
from gpufleet.aggregator.writer import GroupCommitWriter
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc

log = logging.getLogger("gpufleet.aggregator")

RETENTION_EVERY_S = 600.0
ROLLUP_EVERY_S = 60.0
SERVER_OPTIONS = [
    # Our own size check (max_report_bytes) answers with a precise Reject; this transport
    # limit only stops what is far beyond it.
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
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


def _add_port(server: grpc.aio.Server, address: str, config: AggregatorConfig) -> str:
    if config.tls_cert:
        creds = grpc.ssl_server_credentials(
            [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())]
        )
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}: is the port in use or the address wrong?")
    host, _ = _split(address)
    return f"{host or '0.0.0.0'}:{port}"


class Aggregator:
    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config
        config.data_path.mkdir(parents=True, exist_ok=True)
        self.metrics = AggregatorMetrics()
        self.auth = Authenticator.from_file(config.secrets_path)
        self.store: Store = open_store(
            config.store,
            config.data_path,
            config.retention_s,
            rollup_retention={"_1m": config.rollup_1m_retention_s, "_1h": config.rollup_1h_retention_s},
            **{k: getattr(config, k) for k in vars(config) if k.startswith("influx_")},
        )
        self.fleet = FleetState(config.stale_after_intervals, config.silent_after_intervals)
        self._restored = self._restore()
        self.spool = Spool(config.data_path / "spool", config.spool_max_bytes, config.spool_warn_ratio)
        self.metrics.watch_spool(self.spool, self.store)
        self.writer = GroupCommitWriter(self.store, self.metrics, self.spool)
        self.ingest = IngestService(
            self.auth,
            self.writer,
            self.fleet,
            self.metrics,
            IngestLimits(config.max_report_bytes, config.retention_s, config.max_clock_skew_s),
        )
        self.repair, self.alerts, self.repair_state = build_controller(
            config, self.fleet, self.ingest, self.metrics
        )
        self.fleet_service = FleetService(
            self.auth, self.fleet, self.store, self.metrics, self.status, self.repair
        )
        self._servers: list[grpc.aio.Server] = []
        self._http = None

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
            except StoreError as exc:  # the store is down: the next pass catches up
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

    def status(self) -> fleet_pb2.AggregatorStatus:
        spool = self.spool.status()
        return fleet_pb2.AggregatorStatus(
            version=gpufleet.__version__,
            store=self.config.store,
            store_ok=spool.batches == 0,
            store_error=self.writer.store_error if spool.batches else "",
            spool=fleet_pb2.SpoolStatus(
                bytes=spool.bytes,
                batches=spool.batches,
                points=spool.points,
                oldest_age_s=spool.oldest_age_s,
                drain_points_per_s=spool.drain_points_per_s,
                drained_points_total=spool.drained_points_total,
                max_bytes=spool.max_bytes,
                near_limit=spool.near_limit,
                refused_batches_total=spool.refused_total,
            ),
            store_points_dropped_total=getattr(self.store, "points_dropped_total", 0),
            nodes=len(self.fleet.nodes),
            streams_open=self.ingest.streams_open,
        )

    async def start(self) -> Bound:
        self.writer.start()
        self.alerts.start()
        ingest_server = grpc.aio.server(options=SERVER_OPTIONS)
        ingest_server.add_generic_rpc_handlers((self.ingest.handler(),))
        ingest_addr = _add_port(ingest_server, self.config.ingest_listen, self.config)
        fleet_server = grpc.aio.server(options=SERVER_OPTIONS)
        fleet_pb2_grpc.add_FleetServicer_to_server(self.fleet_service, fleet_server)
        fleet_addr = _add_port(fleet_server, self.config.fleet_listen, self.config)
        self._servers = [ingest_server, fleet_server]
        for server in self._servers:
            await server.start()
        metrics_addr = ""
        if self.config.metrics_listen:
            host, port = _split(self.config.metrics_listen)
            self._http, _thread = start_http_server(port, host, registry=self.metrics.registry)
            metrics_addr = f"{host}:{self._http.server_port}"
        bound = Bound(ingest_addr, fleet_addr, metrics_addr)
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

    async def stop(self, grace_s: float = 5.0) -> None:
        await asyncio.gather(*(s.stop(grace_s) for s in self._servers))
        await self.writer.close()
        await self.alerts.close()
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
    background = [
        asyncio.create_task(aggregator.retention_loop(stop)),
        asyncio.create_task(aggregator.restore_loop(stop)),
        asyncio.create_task(aggregator.rollup_loop(stop)),
        asyncio.create_task(aggregator.repair.run(stop, config.repair_interval_s)),
    ]
    await stop.wait()
    await asyncio.gather(*background)
    await aggregator.stop()
