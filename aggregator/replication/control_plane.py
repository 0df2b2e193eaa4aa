"""This replica's part in a control plane shared by several aggregators (docs/architecture.md
"Control plane and replicas"); used when control_plane is a PostgreSQL URL.

Two supervised loops, each with its own connection to the store:

- **lease**: every leader_lease_s / 3, take the repair lease if it is free or expired, or
  renew it if this replica holds it. Elected: a repair term starts (aggregator/repair_wiring.py)
  on the leader's fenced view of the store, so every write it makes carries the epoch and is
  refused once another replica has taken over. Deposed (the renewal failed, or could not be
  made before the lease ran out by this process's own clock, or a write was fenced): the term
  stops at once. A clean stop hands the lease back, so the next leader need not wait it out.
- **sync**: every live_sync_s, write the live state of the nodes whose streams this replica
  holds (one row per node, a serialized NodeDetail), read what the other replicas wrote since
  the last read (the whole view every FULL_SYNC_EVERY reads, which also covers a row whose
  write committed after a later one), heartbeat, pass on commands the leader queued for this
  replica's streams, and — on the leader — read the results other replicas wrote back.

A command for a node whose stream another replica holds goes through the store's command
table; the collector's answer comes back through command_result."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.service import IngestService
from gpufleet.aggregator.repair_wiring import RepairWiring
from gpufleet.aggregator.replication.records import ReplicaRecords
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.common.redact import redact
from gpufleet.protos import fleet_pb2, ingest_pb2, vocabulary_pb2
from gpufleet.repair.outcome import OK
from gpufleet.repair.state import (
    AuditRecord,
    LeaseInfo,
    LiveRow,
    QueuedCommand,
    RepairState,
    ReplicaInfo,
    StateError,
    Workflow,
)

log = logging.getLogger("gpufleet.aggregator.replication.control_plane")

FULL_SYNC_EVERY = 30  # reads of the shared view between two reads of all of it
LEASE_TRUST = 0.8  # a leader acts for this fraction of its lease after a renewal began
COMMAND_MAX_AGE_S = 120.0  # a queued command older than this is never sent (its step timed out)


@dataclass
class _SyncResult:
    remote: list[LiveRow] = field(default_factory=list)
    commands: list[QueuedCommand] = field(default_factory=list)
    results: list[tuple[int, str, bytes]] = field(default_factory=list)
    replicas: list[ReplicaInfo] = field(default_factory=list)
    workflows: dict[str, Workflow] | None = None
    lease: LeaseInfo | None = None


class ControlPlane:
    def __init__(
        self,
        config: AggregatorConfig,
        open_state: Callable[[], RepairState],
        fleet: FleetState,
        ingest: IngestService,
        repair: RepairWiring,
        supervisor: Supervisor,
    ) -> None:
        self.replica = config.replica_name
        self.url = redact(config.control_plane)
        self.tls_cert = config.tls_cert
        self.tls_server_name = config.tls_server_name
        self.allow_plaintext = config.allow_plaintext
        self._lease_s = config.leader_lease_s
        self._sync_s = config.live_sync_s
        self._fleet, self._ingest, self._repair, self._supervisor = fleet, ingest, repair, supervisor
        # Three connections: the event loop's (the leader's writes, Fleet API reads) and one for
        # each loop's thread, so a slow statement in one never holds the others. The event
        # loop's calls are synchronous: while PostgreSQL cannot be reached, a leader's pass may
        # wait up to the connect timeout per attempt until the lease loop deposes it (within
        # 0.8 x leader_lease_s); a refused connection fails at once.
        self.state = open_state()
        self._lease_state = open_state()
        self._lease = ReplicaRecords(self._lease_state)
        self._sync_state = open_state()
        # The lease and sync loops' calls run here: two threads, so a stalled sync never
        # delays a renewal, and asyncio's default executor (shared) never delays either.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="control-plane")
        self._check_name_free()
        self.epoch: int | None = None
        self.lease_info: LeaseInfo | None = None
        self._lease_read_at = time.monotonic()  # this process's clock when lease_info was asked for
        self.replicas: list[ReplicaInfo] = []
        self.workflows: dict[str, Workflow] = {}  # as the leader last saved them (for followers)
        self.addresses: dict[str, str] = {}  # this replica's fleet and ingest addresses
        self._valid_until = 0.0
        self._cursor = 0  # the newest live-view version read
        self._result_cursor = 0
        self._syncs = 0
        self.last_sync_monotonic = time.monotonic()  # the last sync that reached the store
        self.sync_errors_total = 0
        self.lease_errors_total = 0
        self.terms_total = 0
        repair.remote_command = self._queue_command
        ingest.fanout.on_command_result("control_plane", self._on_command_result)

    def _check_name_free(self) -> None:
        """Two live replicas with one name would share a lease: refuse to start as the second."""
        me = f"{socket.gethostname()}:{os.getpid()}"
        for r in ReplicaRecords(self.state).replicas(max_age_s=2 * self._lease_s):
            if r.replica == self.replica and r.info.get("process") not in (None, me):
                raise ValueError(
                    f"replica_id {self.replica!r} is in use by {r.info.get('process')} (heartbeat "
                    f"{r.age_s:.1f} s ago); give each aggregator replica its own replica_id"
                )

    def unhealthy(self) -> list[str]:
        """Why this replica should not be sent collectors or dashboards now."""
        quiet_s = time.monotonic() - self.last_sync_monotonic
        if quiet_s > max(3 * self._lease_s, 10 * self._sync_s):
            return [f"the control plane ({self.url}) has not been reachable for {quiet_s:.0f} s"]
        return []

    # --- leadership -------------------------------------------------------------------------
    @property
    def leader(self) -> bool:
        return self.epoch is not None

    def leader_address(self) -> tuple[str, str]:
        """(replica id, Fleet API address) of the leader as last seen; ("", "") when none."""
        lease = self.lease_info
        if lease is None or not lease.live:
            return "", ""
        for r in self.replicas:
            if r.replica == lease.holder:
                return r.replica, str(r.info.get("fleet", ""))
        return lease.holder, ""

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A control-plane call on the loops' own threads (not asyncio's default executor, which
        other work shares): each returns within the call timeout (repair/state_postgres.py)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def lease_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                if self.epoch is None:
                    epoch = await self._call(self._lease.acquire_lease, self.replica, self._lease_s)
                    # Not a leader until a renewal also went through: an acquisition that
                    # lands just as the store stalls would otherwise act in a term that ends
                    # before its first renewal (docs/architecture.md "When the control plane hangs").
                    if epoch is not None:
                        began = time.monotonic()
                        if await self._call(self._lease.renew_lease, self.replica, epoch, self._lease_s):
                            self._valid_until = began + self._lease_s * LEASE_TRUST
                            self._elected(epoch)
                elif await self._renewed_in_trust(self.epoch):
                    self._valid_until = began + self._lease_s * LEASE_TRUST
                else:
                    lost = await self._call(self._lease_state.lease)
                    await self._deposed(f"the repair lease is {lost.describe()}", lease=lost)
                asked = time.monotonic()
                self._saw_lease(await self._call(self._lease_state.lease), asked)
            except StateError as exc:
                self.lease_errors_total += 1
                log.warning("repair lease: %s", exc, extra={"replica": self.replica})
            await self._depose_if_due()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._next_lease_check_s())
        if self.epoch is not None:
            epoch = self.epoch
            await self._deposed("this aggregator is stopping", logging.INFO)
            with contextlib.suppress(StateError):
                await self._call(self._lease.release_lease, self.replica, epoch)

    async def _renewed_in_trust(self, epoch: int) -> bool:
        """Renew, waiting no longer than this term can still be trusted: a renewal that has
        not come back by then counts as failed, whatever the call's own timeout."""
        renewal = self._call(self._lease.renew_lease, self.replica, epoch, self._lease_s)
        try:
            return bool(await asyncio.wait_for(renewal, max(0.01, self._valid_until - time.monotonic())))
        except TimeoutError as exc:
            raise StateError("the renewal had no answer before this term's trust ran out") from exc

    async def _depose_if_due(self) -> None:
        if self.epoch is not None and time.monotonic() >= self._valid_until:
            await self._deposed(
                f"the lease could not be renewed within {LEASE_TRUST:g} x leader_lease_s "
                f"({self._lease_s * LEASE_TRUST:g} s) of the last renewal; it stops acting before "
                "the lease can run out"
            )
        controller = self._repair.controller
        if self.epoch is not None and controller is not None and controller.fenced:
            await self._deposed(controller.fenced)

    def _next_lease_check_s(self) -> float:
        """A leader renews every third of its lease, and wakes when its trust runs out whatever
        a renewal is doing; a follower also wakes just after the holder's lease would run
        out, so a dead leader is replaced within one lease period (plus one round trip)."""
        period = self._lease_s / 3
        if self.epoch is not None:
            return max(0.0, min(period, self._valid_until - time.monotonic()))
        lease = self.lease_info
        if lease is None or not lease.live:
            return period
        # The lease's time left as the store's clock said when it was read, less the time
        # since (this process's clock): only durations are compared, so neither clock's
        # offset matters, and a lease read by the sync loop a moment ago is not waited out late.
        left_s = (lease.expires_ns - lease.now_ns) / 1e9 - (time.monotonic() - self._lease_read_at)
        return max(0.0, min(period, left_s + 0.05))

    def _saw_lease(self, lease: LeaseInfo | None, asked_monotonic: float) -> None:
        if lease is not None:
            self.lease_info, self._lease_read_at = lease, asked_monotonic

    def _elected(self, epoch: int) -> None:
        self.epoch = epoch
        self.terms_total += 1
        with contextlib.suppress(StateError):
            self._result_cursor = ReplicaRecords(self.state).last_command_result_seq()
        log.warning(
            "this replica is the repair leader now (epoch %d); workflows, ledger and breaker loaded from %s",
            epoch,
            self.url,
            extra={"replica": self.replica, "epoch": epoch},
        )
        self._audit("leader_elected", f"epoch {epoch}; lease {self._lease_s:g} s", epoch)
        self._repair.start_term(self.state.fenced(self.replica, epoch), self._supervisor.start)

    async def _deposed(self, why: str, level: int = logging.ERROR, lease: LeaseInfo | None = None) -> None:
        epoch, self.epoch = self.epoch, None
        # What status shows as the lease: as just read, or unknown until the next read (not
        # this replica's own lease, which it no longer trusts).
        self.lease_info, self._lease_read_at = lease, time.monotonic()
        log.log(
            level,
            "this replica is no longer the repair leader (epoch %s): %s; its repair controller stops",
            epoch,
            why,
            extra={"replica": self.replica, "epoch": epoch},
        )
        await self._repair.end_term()
        self._audit("leader_deposed", why, epoch)

    def _audit(self, action: str, reason: str, epoch: int | None) -> None:
        """Leadership changes in the audit log (unfenced: they claim no authority), best effort:
        a replica cut off from the store cannot write, and says so in its log."""
        try:
            self.state.audit(
                AuditRecord(time.time_ns(), f"{self.replica} (epoch {epoch})", "", action, reason[:300], OK)
            )
        except StateError as exc:
            log.warning("%s not in the audit log: %s", action, exc, extra={"replica": self.replica})

    # --- the shared live view, heartbeats and commands ------------------------------------------
    async def sync_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sync_once()
            except StateError as exc:
                self.sync_errors_total += 1
                log.warning("control-plane sync failed (%d so far): %s", self.sync_errors_total, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._sync_s)

    async def sync_once(self) -> None:
        fleet = self._fleet
        rows = []
        for node in fleet.take_changed():
            live = fleet.nodes.get(node)
            if live is not None and not live.replica:
                rows.append(
                    (node, live.last_heard_ns, live.connected, fleet.detail(live).SerializeToString())
                )
        held = self._ingest.streaming_nodes()
        info: dict[str, Any] = {
            **self.addresses,
            "streams": len(held),
            "process": f"{socket.gethostname()}:{os.getpid()}",
        }
        full = self._syncs % FULL_SYNC_EVERY == 0
        asked = time.monotonic()
        try:
            got = await self._call(self._exchange, rows, held, info, full, self.leader)
        except StateError:
            fleet.mark_changed(node for node, *_ in rows)  # written next time
            raise
        self._syncs += 1
        self.last_sync_monotonic = time.monotonic()
        self._apply(got, asked)

    def _exchange(
        self,
        rows: list[tuple[str, int, bool, bytes]],
        held: list[str],
        info: dict[str, Any],
        full: bool,
        leader: bool,
    ) -> _SyncResult:
        """One round trip's worth of work in the sync loop's thread."""
        s, records = self._sync_state, ReplicaRecords(self._sync_state)
        records.put_live(self.replica, rows)
        records.heartbeat(self.replica, info)
        out = _SyncResult()
        out.remote = records.live_rows(0 if full else self._cursor)
        out.commands = records.take_commands(self.replica, held, COMMAND_MAX_AGE_S)
        if leader:
            out.results = records.command_results(self._result_cursor)
        else:
            out.workflows = s.workflows()
        out.replicas = records.replicas(max_age_s=3 * self._lease_s)
        out.lease = s.lease()
        return out

    def _apply(self, got: _SyncResult, asked_monotonic: float) -> None:
        for row in got.remote:
            self._cursor = max(self._cursor, row.version)
            if row.replica == self.replica:
                continue
            detail = fleet_pb2.NodeDetail.FromString(row.body)
            events = self._fleet.apply_remote(row.replica, row.heard_ns, row.connected, detail)
            if events is not None and self.leader:
                self._repair.watch_remote(row.node, detail.summary.gpus, events)
        for queued in got.commands:
            command = ingest_pb2.Command.FromString(queued.body)
            if not self._ingest.send_command(queued.node, command):
                self._write_result(
                    queued.node,
                    ingest_pb2.CommandResult(
                        id=command.id,
                        outcome=vocabulary_pb2.COMMAND_OUTCOME_FAILED,
                        detail=f"the node's stream on replica {self.replica} closed before it was sent",
                    ),
                )
        for seq, node, body in got.results:
            self._result_cursor = max(self._result_cursor, seq)
            if self.leader:
                self._repair.on_command_result(node, ingest_pb2.CommandResult.FromString(body))
        if got.workflows is not None:
            self.workflows = got.workflows
        # A replica that stopped heartbeating (killed, cut off) holds no streams any more,
        # whatever its last rows said; its nodes show as disconnected until a replica has them.
        alive = {r.replica for r in got.replicas} | {self.replica}
        for live in self._fleet.nodes.values():
            if live.replica and live.replica not in alive:
                live.connected = False
        self.replicas = got.replicas
        self._saw_lease(got.lease, asked_monotonic)

    def _queue_command(self, state: RepairState, node: str, command: ingest_pb2.Command) -> bool:
        """The leader's command for a node whose stream another replica holds (fenced: the
        leader's own view of the store). False when no replica holds the node's stream."""
        live = self._fleet.nodes.get(node)
        if live is None or not live.replica or not live.connected:
            return False
        ReplicaRecords(state).queue_command(node, command.id, command.SerializeToString())
        log.info(
            "command %s queued for replica %s",
            command.id,
            live.replica,
            extra={"node": node, "replica": live.replica},
        )
        return True

    def _on_command_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        if not self.leader:  # the leader got it directly (repair_wiring's listener)
            self._write_result(node, result)

    def _write_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        try:
            ReplicaRecords(self.state).put_command_result(node, result.id, result.SerializeToString())
        except StateError as exc:
            log.error(
                "result of command %s could not be passed to the leader: %s",
                result.id,
                exc,
                extra={"node": node},
            )

    def call_timeouts_total(self) -> int:
        return sum(
            int(getattr(s, "call_timeouts_total", 0))
            for s in (self.state, self._lease_state, self._sync_state)
        )

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        for s in (self.state, self._lease_state, self._sync_state):
            s.close()


def register_metrics(plane: ControlPlane, registry: CollectorRegistry) -> None:
    """This replica's control-plane gauges, read at scrape time."""
    for name, text, read in (
        (
            "gpufleet_control_plane_sync_errors",
            "control-plane syncs that failed (each logged)",
            "sync_errors_total",
        ),
        (
            "gpufleet_control_plane_lease_errors",
            "lease reads or renewals that failed",
            "lease_errors_total",
        ),
        ("gpufleet_repair_leader_terms", "times this replica became the repair leader", "terms_total"),
    ):
        Gauge(name, text, registry=registry).set_function(lambda read=read: float(getattr(plane, read)))
    Gauge(
        "gpufleet_control_plane_call_timeouts",
        "control-plane calls that had no answer within the call timeout (PostgreSQL hung or cut off)",
        registry=registry,
    ).set_function(lambda: float(plane.call_timeouts_total()))
    Gauge(
        "gpufleet_control_plane_sync_age_seconds",
        "seconds since this replica last reached the control plane",
        registry=registry,
    ).set_function(lambda: time.monotonic() - plane.last_sync_monotonic)
