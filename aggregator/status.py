"""What the aggregator says of itself: the watchdog's reasons to be unready (read by /ready,
GetStatus, `gpufleet status` and the dashboard) and the status the Fleet API serves."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from gpufleet.aggregator.declared_metrics import gauge, gauges
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.spool import Spool, SpoolStatus
from gpufleet.aggregator.ingest.worker_pool import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.store import Store
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.common.redact import redact
from gpufleet.common.version import __version__
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import LIVENESS_NAMES
from gpufleet.repair.state import LeaseInfo

if TYPE_CHECKING:
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.aggregator.ingest.service import IngestService
    from gpufleet.aggregator.replication.control_plane import ControlPlane


@dataclass
class Lifecycle:
    """How far the aggregator's start and stop have come, and its watched tasks (one that ends
    while not stopping makes it unhealthy; the repair term is a future of its own thread)."""

    started: bool = False
    stopping: bool = False
    tasks: dict[str, asyncio.Task[None] | concurrent.futures.Future[None]] = field(default_factory=dict)


@dataclass
class StatusReports:
    """Reads the aggregator's parts; changes none of them."""

    config: AggregatorConfig
    fleet: FleetState
    store: Store
    spool: Spool
    writer: GroupCommitWriter
    pool: WorkerPool | None
    fanout: Fanout
    ingest: IngestService
    supervisor: Supervisor
    control_plane: ControlPlane | None
    lifecycle: Lifecycle

    @property
    def sink(self) -> GroupCommitWriter | WorkerPool:
        """Who makes reports durable: the worker processes, or this process's writer."""
        return self.pool or self.writer

    def register_status_gauges(self, registry: CollectorRegistry) -> None:
        """Gauges read at scrape time for the aggregator's own alert rules
        (deploy/prometheus/gpufleet-alerts.yml): ready or not, and the nodes it knows by
        liveness (what Prometheus should find collectors for)."""
        gauges(
            registry,
            {
                "gpufleet_aggregator_ready": lambda: float(not self.unhealthy()),
                "gpufleet_ingest_oldest_unacked_seconds": lambda: self.sink.oldest_waiting_s(),
                "gpufleet_ingest_backlog_reports": lambda: float(self.sink.backlog()[0]),
                "gpufleet_ingest_backlog_bytes": lambda: float(self.sink.backlog()[1]),
            },
        )
        nodes = gauge(registry, "gpufleet_fleet_nodes")
        for value, name in LIVENESS_NAMES.items():
            nodes.labels(liveness=name).set_function(
                lambda value=value: float(self._nodes_by_liveness(value))
            )

    def _nodes_by_liveness(self, liveness: int) -> int:
        now = time.time_ns()
        return sum(1 for live in self.fleet.nodes.values() if self.fleet.liveness(live, now) == liveness)

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
        if self.pool is not None and self.lifecycle.started:
            reasons += self.pool.not_running()
        reasons += self.supervisor.looping()
        if self.control_plane is not None:
            reasons += self.control_plane.unhealthy()
        for name, task in self.lifecycle.tasks.items():
            if task.done() and not self.lifecycle.stopping:
                reasons.append(f"background task {name} has ended")
        return reasons

    def spool_status(self) -> SpoolStatus:
        """This process's spool and its ingest workers' (with workers, theirs hold most)."""
        spool = self.spool.status()
        return spool if self.pool is None else self.pool.spool_status(spool)

    def status(self) -> fleet_pb2.AggregatorStatus:
        spool = self.spool_status()
        batches, size, points = spool.batches, spool.bytes, spool.points
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
        lead = leadership_fields(cp.replica, cp.epoch, cp.lease_info)
        return {
            "control_plane": cp.url,
            "replica_id": cp.replica,
            **lead,
            "replicas": [
                fleet_pb2.ReplicaStatus(
                    replica_id=r.replica,
                    fleet_address=str(r.info.get("fleet", "")),
                    ingest_address=str(r.info.get("ingest", "")),
                    streams_open=int(r.info.get("streams", 0)),
                    heartbeat_age_s=r.age_s,
                    leader=r.replica == lead["leader"],
                )
                for r in cp.replicas
            ],
        }


def leadership_fields(replica: str, epoch: int | None, lease: LeaseInfo | None) -> dict[str, Any]:
    """Who leads, in which epoch, as one status says it, self-consistent: a replica that leads
    (epoch: its own term's) names itself and its own epoch, whatever lease it last read. The
    lease read lags an election by a round trip (aggregator/replication/leadership.py reads it
    after `_elected`); reading it alone, a new leader answered "I lead" with its predecessor's
    epoch, and a test saw the epoch move later with no election (one fresh-clone run of three,
    two cores busy with four workers)."""
    if epoch is not None:
        left_s = (lease.expires_ns - lease.now_ns) / 1e9 if lease and lease.holder == replica else 0.0
        return {
            "repair_leader": True,
            "leader": replica,
            "leader_epoch": epoch,
            "leader_lease_left_s": left_s,
        }
    live = lease is not None and lease.live
    return {
        "repair_leader": False,
        "leader": lease.holder if lease and live else "",
        "leader_epoch": lease.epoch if lease else 0,
        "leader_lease_left_s": (lease.expires_ns - lease.now_ns) / 1e9 if lease and live else 0.0,
    }
