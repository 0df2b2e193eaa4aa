"""The waste digest (docs/workloads.md "The daily digest"): once a period (a day by default, at
`waste_digest_at_utc`), each owner's idle GPU-hours over the period that just ended go through the
alert sinks, as `gpufleet waste --since 1d --by account` shows them: one alert per owner, its
owner in the labels (Alertmanager routes it to the team as it routes the waste findings), updated
in place each period and resolved once the owner falls under `waste_digest_min_idle_gpu_hours`.

The period's runs fall on fixed times (every `waste_digest_every_s` from the day's
`waste_digest_at_utc`), not "a period after the process started": a restart neither sends a second
digest nor skips one unless it spans the run's time. It runs with the repair term (the leader's),
whose alert dispatcher delivers, retries and keeps the outbox through restarts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.aggregator.workloads.summary import UsageRow
from gpufleet.common.timefmt import iso
from gpufleet.protos.presentation import NA
from gpufleet.repair.alerts.base import Alert

if TYPE_CHECKING:  # the settings import this module's parser: they need no dispatcher
    from gpufleet.repair.alerts.dispatcher import AlertDispatcher

log = logging.getLogger("gpufleet.aggregator.workloads")
KEY_PREFIX = "waste-digest/"
ALERT_NAME = "GpufleetWasteDigest"
RETRY_S = 60.0  # a digest the store could not answer is tried again this much later


def at_utc_offset_s(text: str) -> float:
    """'HH:MM' (UTC) as seconds into the day; ValueError naming the value otherwise."""
    hours, sep, minutes = text.partition(":")
    if not (sep and hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60):
        raise ValueError(f"{text!r} is not a time of day: write HH:MM in UTC, e.g. 08:00")
    return int(hours) * 3600.0 + int(minutes) * 60.0


def next_run_s(now_s: float, every_s: float, offset_s: float) -> float:
    """The first run time after now_s: offset_s + k * every_s, k whole."""
    return offset_s + (math.floor((now_s - offset_s) / every_s) + 1) * every_s


def _iso(seconds: float) -> str:
    return iso(int(seconds * 1e9))


class WasteDigest:
    def __init__(
        self,
        usage: Callable[[float, float, str], list[UsageRow]],
        alerts: AlertDispatcher,
        every_s: float,
        at_utc: str,
        by: str,
        min_idle_gpu_hours: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """usage(since_s, until_s, by): GPU-hours by owner (aggregator/workloads/wiring.py)."""
        self._usage, self._alerts, self._clock = usage, alerts, clock
        self.every_s, self.offset_s = every_s, at_utc_offset_s(at_utc) % every_s
        self.by, self.min_idle_gpu_hours = by, min_idle_gpu_hours
        self.sent_total = 0  # digests sent (each a set of owners' alerts)
        self.failures_total = 0  # digests the store could not answer in time

    def send(self, rows: list[UsageRow], until_s: float) -> list[str]:
        """The digest of the period ending at until_s (rows: its usage by owner): each owner over
        the floor told (firing), each one told last time and not over it now resolved. The alert
        keys of the owners told, most idle first."""
        since_s = until_s - self.every_s
        now_ns = int(self._clock() * 1e9)
        told = []
        for r in sorted(rows, key=lambda r: -r.gpu_hours_idle):
            if r.gpu_hours_idle < self.min_idle_gpu_hours or r.gpu_hours_idle <= 0:
                continue
            key = f"{KEY_PREFIX}{self.by}/{r.owner}"
            told.append(key)
            allocated = r.gpu_hours_allocated
            pct = f"{100.0 * r.gpu_hours_idle / allocated:.0f} %" if allocated else NA
            summary = (
                f"{self.by} {r.owner}: {r.gpu_hours_idle:.2f} GPU-hours idle of "
                f"{r.gpu_hours_allocated:.2f} allocated ({pct}) in {r.workloads} workload(s), "
                f"{_iso(since_s)} to {_iso(until_s)}"
            )
            details = {
                "kind": "waste_digest",
                "by": self.by,
                "owner": r.owner,
                "since": _iso(since_s),
                "until": _iso(until_s),
                "workloads": r.workloads,
                "gpu_hours_idle": r.gpu_hours_idle,
                "gpu_hours_allocated": r.gpu_hours_allocated,
            }
            labels = {"alertname": ALERT_NAME, self.by: r.owner}
            alert = Alert(key, "firing", "", "waste", "info", summary, now_ns, details, labels=labels)
            self._alerts.notify(alert)
        for key in sorted(k for k in self._alerts.outstanding() if k.startswith(KEY_PREFIX)):
            if key not in told:
                self._alerts.notify(
                    Alert(key, "resolved", "", "waste", "info", "under the digest's floor now", now_ns,
                          {"kind": "waste_digest"})
                )  # fmt: skip
        self.sent_total += 1
        log.info(
            "waste digest by %s for %s to %s: %d owner(s) over %.1f idle GPU-hours",
            self.by,
            _iso(since_s),
            _iso(until_s),
            len(told),
            self.min_idle_gpu_hours,
        )
        return told

    async def run(self, stop: asyncio.Event) -> None:
        """Each run time, the period's digest (the store read on a thread of its own), until stop."""
        due = next_run_s(self._clock(), self.every_s, self.offset_s)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                # Until the run time or the stop: a schedule, not synchronisation.
                await asyncio.wait_for(stop.wait(), max(0.0, due - self._clock()))
            if stop.is_set():
                return
            try:
                rows = await asyncio.to_thread(self._usage, due - self.every_s, due, self.by)
            except Exception as exc:  # the store is down: said, counted, tried again
                self.failures_total += 1
                log.error("waste digest for %s not sent: %s; trying again in %g s", _iso(due), exc, RETRY_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)  # a retry delay, stoppable
                continue
            self.send(rows, due)
            due = next_run_s(max(due, self._clock()), self.every_s, self.offset_s)
