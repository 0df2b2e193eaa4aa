"""The repair leader's lease, this replica's side of it (docs/architecture.md "Control plane
and replicas", "When the control plane hangs"): take it when free, renew it every third of
the lease, stop acting when trust runs out whatever a renewal is doing, act only after a
first renewal, and wake just after the holder's lease would run out. ControlPlane
(aggregator/replication/control_plane.py) makes one, on the lease's own connection, and reads
who leads from it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.aggregator.repair_wiring import RepairWiring
from gpufleet.aggregator.replication.records import ReplicaRecords
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.repair.outcome import OK
from gpufleet.repair.state import AuditRecord, LeaseInfo, RepairState, ReplicaInfo, StateError

log = logging.getLogger("gpufleet.aggregator.replication.control_plane")

LEASE_TRUST = 0.8  # a leader acts for this fraction of its lease after a renewal began


class Leadership:
    def __init__(
        self,
        replica: str,
        url: str,
        lease_s: float,
        term_state: RepairState,
        lease_state: RepairState,
        repair: RepairWiring,
        supervisor: Supervisor,
        call: Callable[..., Awaitable[Any]],
        replicas: Callable[[], list[ReplicaInfo]],
    ) -> None:
        self.replica = replica
        self._url = url
        self._lease_s = lease_s
        self._term_state = term_state  # what a term is given, fenced by its epoch
        self._lease_state = lease_state
        self._lease = ReplicaRecords(lease_state)
        self._repair = repair
        self._supervisor = supervisor
        self._call = call  # a control-plane call on the control plane's own threads
        self._replicas = replicas  # the replicas as the sync loop last read them
        self.epoch: int | None = None
        self.lease_info: LeaseInfo | None = None
        self._lease_read_at = time.monotonic()  # this process's clock when lease_info was asked for
        self._valid_until = 0.0
        self.result_cursor = 0  # the last command result the leader has taken
        self.terms_total = 0
        self.lease_errors_total = 0

    @property
    def leader(self) -> bool:
        return self.epoch is not None

    def leader_address(self) -> tuple[str, str]:
        """(replica id, Fleet API address) of the leader as last seen; ("", "") when none."""
        lease = self.lease_info
        if lease is None or not lease.live:
            return "", ""
        for r in self._replicas():
            if r.replica == lease.holder:
                return r.replica, str(r.info.get("fleet", ""))
        return lease.holder, ""

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
                            await self._elected(epoch)
                elif await self._renewed_in_trust(self.epoch):
                    self._valid_until = began + self._lease_s * LEASE_TRUST
                else:
                    lost = await self._call(self._lease_state.lease)
                    await self._deposed(f"the repair lease is {lost.describe()}", lease=lost)
                asked = time.monotonic()
                self.saw_lease(await self._call(self._lease_state.lease), asked)
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
        if left_s <= -0.05:
            # Already past it, and the store could not be read since: try again soon, not at
            # once (a store that fails every call at once would otherwise spin this loop).
            return period / 4
        return min(period, left_s + 0.05)

    def saw_lease(self, lease: LeaseInfo | None, asked_monotonic: float) -> None:
        if lease is not None:
            self.lease_info, self._lease_read_at = lease, asked_monotonic

    async def _elected(self, epoch: int) -> None:
        self.epoch = epoch
        self.terms_total += 1
        with contextlib.suppress(StateError):
            self.result_cursor = await self._call(self._lease.last_command_result_seq)
        log.warning(
            "this replica is the repair leader now (epoch %d); its repair term loads workflows, ledger "
            "and breaker from %s",
            epoch,
            self._url,
            extra={"replica": self.replica, "epoch": epoch},
        )
        await self._audit("leader_elected", f"epoch {epoch}; lease {self._lease_s:g} s", epoch)
        self._repair.start_term(self._term_state.fenced(self.replica, epoch), self._supervisor)

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
        await self._audit("leader_deposed", why, epoch)

    async def _audit(self, action: str, reason: str, epoch: int | None) -> None:
        """Leadership changes in the audit log (unfenced: they claim no authority), best effort:
        a replica cut off from the store cannot write, and says so in its log. Written on the
        lease loop's thread, never the event loop's."""
        record = AuditRecord(time.time_ns(), f"{self.replica} (epoch {epoch})", "", action, reason[:300], OK)
        try:
            await self._call(self._lease_state.audit, record)
        except StateError as exc:
            log.warning("%s not in the audit log: %s", action, exc, extra={"replica": self.replica})
