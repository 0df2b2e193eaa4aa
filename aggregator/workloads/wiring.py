"""The aggregator's workloads, put together (docs/workloads.md): the scheduler source chosen by
`workload_scheduler`, read every `workload_poll_s` by a supervised loop; the ledger fed by the
fan-out with every durable report; each ended workload's summary written to the history store
(through the group-commit writer: spooled, never lost, when the store is down); and the reads
the Fleet API answers (running workloads, one workload, usage by owner)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gpufleet.aggregator.declared_metrics import counter, gauges
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.store import Store, StoreError
from gpufleet.aggregator.store.base import Point, ProratedSum
from gpufleet.aggregator.workloads.ledger import REFUSAL_REASONS, Workload, WorkloadLedger
from gpufleet.aggregator.workloads.schedulers import WORKLOAD_SCHEDULERS, SchedulerReadError
from gpufleet.aggregator.workloads.summary import (
    MEASUREMENT,
    OWNER_DIMENSIONS,
    USAGE_DIMENSIONS,
    Summary,
    UsagePart,
    UsageRow,
    from_point,
    owner_points,
    parse_prices,
    summarise,
    summary_parts,
    to_point,
    usage,
)
from gpufleet.repair.idle import Activity
from gpufleet.repair.policy import Policy, load_policy
from gpufleet.repair.state import StateError

if TYPE_CHECKING:
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.aggregator.ingest.fanout import Fanout
    from gpufleet.repair.kept_values import KeptValues

log = logging.getLogger("gpufleet.aggregator.workloads")
MAX_UNWRITTEN_OWNER_POINTS = 10_000
KEPT_KEY = "workloads_live"
KEEP_EVERY_S = 30.0


class Workloads:
    def __init__(
        self,
        config: AggregatorConfig,
        fleet: FleetState,
        store: Store,
        fanout: Fanout,
        write: Callable[[list[Point]], Awaitable[None]],
        registry: CollectorRegistry,
        policy: Callable[[], Policy] = load_policy,
    ) -> None:
        self.scheduler = config.workload_scheduler
        self.source = WORKLOAD_SCHEDULERS[self.scheduler].from_settings(config)
        self.poll_s = config.workload_poll_s
        self.prices = parse_prices(config.gpu_hour_prices)
        self._fleet, self._store, self._write = fleet, store, write
        self._unwritten: list[Point] = []
        self.refused = counter(registry, "gpufleet_workload_claims_refused")
        for reason in REFUSAL_REASONS:
            self.refused.labels(reason=reason)
        self.owner_points_dropped = counter(registry, "gpufleet_workload_owner_points_dropped")
        self.read_failures = counter(registry, "gpufleet_workload_scheduler_read_failures")
        self.ledger = WorkloadLedger(
            self.scheduler,
            on_end=self._ended,
            on_refused=lambda reason, node: self.refused.labels(reason=reason).inc(),
            activity=lambda: Activity.of(policy()),
        )
        gauges(
            registry,
            {
                "gpufleet_workloads_running": lambda: len(self.ledger.live()),
                "gpufleet_workload_scheduler_read_age_seconds": self._read_age_s,
            },
        )
        fanout.on_report("workloads", self.ledger.on_report)
        self._kept: KeptValues | None = None
        self._saved_at = 0.0

    def keep_in(self, kept: KeptValues) -> None:
        """Keep the running workloads' figures in the control-plane state (one box): read back at
        start, written at most every KEEP_EVERY_S."""
        self._kept = kept

    async def _restore(self) -> None:
        if self._kept is None:
            return
        try:
            raw = await asyncio.to_thread(self._kept.get, KEPT_KEY)
            taken = self.ledger.restore(json.loads(raw)) if raw else 0
        except (StateError, ValueError) as exc:
            log.warning("cannot read the kept workloads back (%s): their figures start again", exc)
            return
        if taken:
            log.info(
                "%d running workload(s) read back from the control-plane state: their figures go on", taken
            )

    async def _keep(self, now: float) -> None:
        if self._kept is None or now - self._saved_at < KEEP_EVERY_S:
            return
        self._saved_at = now
        try:
            await asyncio.to_thread(self._kept.put, KEPT_KEY, json.dumps(self.ledger.snapshot()))
        except StateError as exc:
            log.warning(
                "cannot keep the running workloads' figures (%s): retried in %.0f s", exc, KEEP_EVERY_S
            )

    def _read_age_s(self) -> float:
        read = self.ledger.refreshed_unix_s
        return time.time() - read if read is not None else float("nan")

    def model_of(self, w: Workload) -> str:
        """Its GPUs' model, read once from the live view and kept (a node's `gpus` decodes its
        latest columns: not something to do for every workload at every listing)."""
        if not w.model:
            for node in sorted(w.job.gpus_by_node):
                live = self._fleet.nodes.get(node)
                if live is not None and live.gpus:
                    w.model = next(iter(live.gpus.values())).model
                    break
        return w.model

    def _ended(self, w: Workload) -> None:
        s = summarise(w, time.time(), self.model_of(w))
        log.info(
            "workload %s:%s of %s (account %s) ended: %.3f GPU-hours on %d GPU(s), utilization %s",
            s.scheduler,
            s.id,
            s.user or "-",
            s.account or "-",
            s.gpu_hours_allocated,
            s.gpus,
            f"{s.util_mean_pct:.1f} %" if s.util_mean_pct is not None else "not read",
            extra={"workload": f"{s.scheduler}:{s.id}", "nodes": list(s.nodes)},
        )
        self._unwritten.append(to_point(s))

    async def poll_loop(self, stop: asyncio.Event) -> None:
        """Read the scheduler every poll_s; write the summaries of the workloads that ended."""
        if self.scheduler == "none":
            await stop.wait()
            return
        await self._restore()
        while not stop.is_set():
            try:
                jobs = await asyncio.to_thread(self.source.read)
            except SchedulerReadError as exc:
                self.read_failures.inc()
                log.warning(
                    "cannot read the %s scheduler (%s): workloads keep their last known state; retrying "
                    "in %.0f s",
                    self.scheduler,
                    exc,
                    self.poll_s,
                )
            else:
                self.ledger.refresh(jobs)
            now_ns = time.time_ns()
            for dimension in OWNER_DIMENSIONS:
                self._unwritten += owner_points(self.ledger.owner_readings(dimension), dimension, now_ns)
            await self._flush()
            await self._keep(time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)
        await self._flush()
        self._saved_at = 0.0
        await self._keep(time.monotonic())  # as it stopped: a restart goes on from here

    async def _flush(self) -> None:
        if not self._unwritten:
            return
        points, self._unwritten = self._unwritten, []
        try:
            await self._write(points)
        except StoreError as exc:
            kept = points + self._unwritten
            # Summaries are kept whatever it takes; owner series points, past a bound, are not
            # (a gap in a history chart, counted), so a store down for days cannot fill memory.
            owner = [p for p in kept if p.measurement != MEASUREMENT]
            over = max(0, len(owner) - MAX_UNWRITTEN_OWNER_POINTS)
            if over:
                dropped = set(map(id, owner[:over]))
                kept = [p for p in kept if id(p) not in dropped]
                self.owner_points_dropped.inc(over)
            self._unwritten = kept
            log.warning(
                "cannot write %d workload points yet (%s); kept to retry%s",
                len(points),
                exc,
                f", {over} owner-series points dropped" if over else "",
            )

    # --- reads (Fleet API threads) --------------------------------------------------
    def running(self) -> list[Summary]:
        now = time.time()
        return [summarise(w, now, self.model_of(w)) for w in self.ledger.live()]

    def ended(self, since_s: float, until_s: float) -> list[Summary]:
        """Workloads that ended in [since, until), from the history store (each once: the
        newest point of an id wins, as a replay may write one twice)."""
        points = self._store.query_points(MEASUREMENT, int(since_s * 1e9), int(until_s * 1e9))
        by_id = {}
        for p in points:
            s = from_point(p)
            by_id[(s.scheduler, s.id)] = s
        # Summaries not yet durable still count (they are written at the next poll).
        for p in self._unwritten:
            if p.measurement != MEASUREMENT:
                continue
            s = from_point(p)
            if since_s * 1e9 <= p.time_unix_ns < until_s * 1e9:
                by_id[(s.scheduler, s.id)] = s
        return list(by_id.values())

    def find(self, scheduler: str, workload_id: str, search_s: float = 30 * 86400) -> Summary | None:
        now = time.time()
        live = self.ledger.find(scheduler, workload_id)
        if live is not None:
            return summarise(live, now, self.model_of(live))
        # A summary is stored at its workload's end: read back a day at a time, newest first,
        # so finding last night's job does not read a month of summaries.
        until = now + 1
        while until > now - search_s:
            since = max(until - 86_400, now - search_s)
            try:
                ended = self.ended(since, until)
            except StoreError:
                return None
            found = [s for s in ended if scheduler in ("", s.scheduler) and s.id == workload_id]
            if found:
                return found[-1]
            until = since
        return None

    def usage(self, since_s: float, until_s: float, by: str) -> list[UsageRow]:
        """GPU-hours by owner in [since, until): the ended workloads summed where they are stored
        (Store.sum_prorated: a workload is stored at its end, so those ending up to now are
        read), the running ones and the summaries not yet durable from memory."""
        if by not in USAGE_DIMENSIONS:
            raise ValueError(f"usage by {by!r}: use one of {', '.join(USAGE_DIMENSIONS)}")
        by_field = by in ("user",)  # a field of the summary, never a tag
        stored = self._store.sum_prorated(
            ProratedSum(
                MEASUREMENT,
                int(since_s * 1e9),
                int((max(until_s, time.time()) + 1) * 1e9),
                since_s,
                until_s,
                "start_unix_s",
                "end_unix_s",
                ("gpu_hours_allocated", "gpu_hours_effective", "gpu_hours_idle"),
                ("model", *(("user",) if by_field else ())),
            )
        )
        parts = [
            UsagePart(
                (row.group[1] if by_field else row.tags.get(by, "")) or "(none)",
                row.group[0],
                row.count,
                *row.sums,
            )
            for row in stored
        ]
        pending = [from_point(p) for p in self._unwritten if p.measurement == MEASUREMENT]
        parts += summary_parts(
            pending + [s for s in self.running() if s.start_unix_s < until_s], since_s, until_s, by
        )
        return usage(parts, self.prices)
