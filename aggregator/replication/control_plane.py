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
  the last reads (records.LiveViewCursor: a few reads back, as a row's write can commit after
  a later one's; the whole view every FULL_SYNC_EVERY reads), heartbeat, pass on commands the
  leader queued for this replica's streams, and — on the leader — read the results other replicas wrote back.

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

from prometheus_client import CollectorRegistry

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.declared_metrics import gauges, totals
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.service import IngestService
from gpufleet.aggregator.repair_wiring import RepairWiring
from gpufleet.aggregator.replication.leadership import Leadership
from gpufleet.aggregator.replication.records import LiveViewCursor, ReplicaRecords
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.common.redact import redact
from gpufleet.protos import fleet_pb2, ingest_pb2, vocabulary_pb2
from gpufleet.repair.state import (
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
COMMAND_MAX_AGE_S = 120.0  # a queued command older than this is never sent (its step timed out)
RESULTS_HELD_MAX = 10_000  # command results a follower keeps for the leader while the store is down


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
        open_state: Callable[[str], RepairState],
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
        # Four connections: the repair term's (the leader's writes, on the term's own thread:
        # aggregator/repair_term.py), one for each loop's thread and one for the Fleet API's
        # reads (on threads), so a slow statement in one never holds the others, and none is
        # ever waited on by the event loop (docs/architecture.md "When the control plane hangs").
        self.state = open_state("term")
        self._lease_state = open_state("lease")
        self._lease = ReplicaRecords(self._lease_state)
        self._sync_state = open_state("sync")
        # The Fleet API's reads (incidents, audit) on threads: never the event loop's connection.
        self.reads = open_state("reads")
        # The lease and sync loops' calls run here: two threads, so a stalled sync never
        # delays a renewal, and asyncio's default executor (shared) never delays either.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="control-plane")
        self._check_name_free()
        self.replicas: list[ReplicaInfo] = []
        self.workflows: dict[str, Workflow] = {}  # as the leader last saved them (for followers)
        self.addresses: dict[str, str] = {}  # this replica's fleet and ingest addresses
        self._cursor = LiveViewCursor()  # where the next read of the live view starts
        self._syncs = 0
        self.last_sync_monotonic = time.monotonic()  # the last sync that reached the store
        self.sync_errors_total = 0
        self.leadership = Leadership(
            self.replica,
            self.url,
            self._lease_s,
            self.state,
            self._lease_state,
            repair,
            supervisor,
            self._call,
            lambda: self.replicas,
        )
        self._results_out: list[tuple[str, ingest_pb2.CommandResult]] = []  # for the leader, next sync
        repair.remote_command = self._queue_command
        ingest.fanout.on_command_result("control_plane", self._on_command_result)

    # Who leads: the leadership's (leadership.py), read here by the status, the Fleet API and metrics.
    @property
    def epoch(self) -> int | None:
        return self.leadership.epoch

    @property
    def leader(self) -> bool:
        return self.leadership.leader

    @property
    def lease_info(self) -> LeaseInfo | None:
        return self.leadership.lease_info

    def leader_address(self) -> tuple[str, str]:
        return self.leadership.leader_address()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A control-plane call on the loops' own threads (not asyncio's default executor, which
        other work shares): each returns within the call timeout (repair/state_postgres.py)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

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
        results, self._results_out = self._results_out, []
        try:
            got = await self._call(self._exchange, rows, held, info, full, self.leader, results)
        except StateError:
            fleet.mark_changed(node for node, *_ in rows)  # written next time
            self._results_out[:0] = results  # so are the results, first
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
        results: list[tuple[str, ingest_pb2.CommandResult]],
    ) -> _SyncResult:
        """One round trip's worth of work in the sync loop's thread."""
        s, records = self._sync_state, ReplicaRecords(self._sync_state)
        for node, result in results:
            records.put_command_result(node, result.id, result.SerializeToString())
        records.put_live(self.replica, rows)
        records.heartbeat(self.replica, info)
        out = _SyncResult()
        out.remote = records.live_rows(0 if full else self._cursor.after())
        out.commands = records.take_commands(self.replica, held, COMMAND_MAX_AGE_S)
        if leader:
            out.results = records.command_results(self.leadership.result_cursor)
        else:
            out.workflows = s.workflows()
        out.replicas = records.replicas(max_age_s=3 * self._lease_s)
        out.lease = s.lease()
        return out

    def _apply(self, got: _SyncResult, asked_monotonic: float) -> None:
        self._cursor.read(got.remote)
        for row in got.remote:
            if row.replica == self.replica or self._cursor.taken(row):
                continue
            detail = fleet_pb2.NodeDetail.FromString(row.body)
            events = self._fleet.apply_remote(row.replica, row.heard_ns, row.connected, detail)
            if events is not None:
                self._cursor.took(row)
            if events is not None and self.leader:
                self._repair.watch_remote(row.node, detail.summary.gpus, events)
        for queued in got.commands:
            command = ingest_pb2.Command.FromString(queued.body)
            if not self._ingest.send_command(queued.node, command):
                self._pass_result(
                    queued.node,
                    ingest_pb2.CommandResult(
                        id=command.id,
                        outcome=vocabulary_pb2.COMMAND_OUTCOME_FAILED,
                        detail=f"the node's stream on replica {self.replica} closed before it was sent",
                    ),
                )
        for seq, node, body in got.results:
            self.leadership.result_cursor = max(self.leadership.result_cursor, seq)
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
        self.leadership.saw_lease(got.lease, asked_monotonic)

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
            self._pass_result(node, result)

    def _pass_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        """A command's result for the leader, written by the next sync on its thread (never on
        the event loop); kept until a sync succeeds. Bounded: a result is small and there is
        one per command the leader sent, but a store down for hours must not grow it for ever."""
        if len(self._results_out) >= RESULTS_HELD_MAX:
            dropped = self._results_out.pop(0)
            log.error(
                "result of command %s dropped: %d results wait for the control plane (unreachable)",
                dropped[1].id,
                RESULTS_HELD_MAX,
                extra={"node": dropped[0]},
            )
        self._results_out.append((node, result))

    def call_timeouts_total(self) -> int:
        return sum(
            int(getattr(s.db, "call_timeouts_total", 0))
            for s in (self.state, self._lease_state, self._sync_state, self.reads)
        )

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        for s in (self.state, self._lease_state, self._sync_state, self.reads):
            s.close()


def register_metrics(plane: ControlPlane, registry: CollectorRegistry) -> None:
    """This replica's control-plane counts and sync age, read at scrape time."""
    lead = plane.leadership
    totals(
        registry,
        {
            "gpufleet_control_plane_sync_errors": lambda: plane.sync_errors_total,
            "gpufleet_control_plane_lease_errors": lambda: lead.lease_errors_total,
            "gpufleet_repair_leader_terms": lambda: lead.terms_total,
            "gpufleet_control_plane_call_timeouts": plane.call_timeouts_total,
        },
    )
    gauges(
        registry,
        {"gpufleet_control_plane_sync_age_seconds": lambda: time.monotonic() - plane.last_sync_monotonic},
    )
