"""Delivers alerts to every sink without ever blocking the repair controller.

- notify() only queues; each sink has its own worker that POSTs in order and retries failed
  deliveries with exponential backoff (1 s doubling to 60 s) for up to max_age_s, then drops
  the alert with an error log and a count.
- A new incident's first alert waits group_wait_s (as Alertmanager's group_wait does). If the
  breaker trips meanwhile (a storm), those alerts are held and the one breaker alert lists
  their nodes: a storm pages once. Held alerts go out when the breaker is reset.
- With a store (the repair state), all of that survives a restart: which identities were sent
  (so the "resolved" of an incident whose "firing" went out is sent too), the alerts waiting or
  held, and each sink's queue (an alert is kept until delivered or dropped, and a restart
  delivers what was queued, in order).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Protocol

from gpufleet.repair.alerts.base import Alert, Request, Sink, links
from gpufleet.repair.outcome import OK, Outcome, Status
from gpufleet.repair.state import StateError

log = logging.getLogger("gpufleet.repair.alerts")
# Starts a named long-running coroutine: (name, body) -> task.
Spawn = Callable[[str, Callable[[], Awaitable[None]]], "asyncio.Task[None]"]


class AlertStore(Protocol):
    """Where delivery state is kept (repair/state.py's RepairState implements it)."""

    def alert_identities(self) -> list[tuple[str, str, str]]: ...
    def put_alert_identity(self, key: str, status: str, body: str) -> None: ...
    def drop_alert_identity(self, key: str) -> None: ...
    def queue_alert(self, sink: str, body: str) -> int: ...
    def finish_alert(self, seq: int, outcome: Outcome) -> None: ...
    def queued_alerts(self) -> list[tuple[int, str, str]]: ...


def _body(alert: Alert) -> str:
    return json.dumps(asdict(alert))


def _alert(body: str) -> Alert:
    return Alert(**json.loads(body))


class AlertDispatcher:
    def __init__(
        self,
        sinks: list[Sink],
        group_wait_s: float = 10.0,
        max_age_s: float = 3600.0,
        timeout_s: float = 10.0,
        count: Callable[[str, str], None] = lambda sink, outcome: None,
        store: AlertStore | None = None,
        dashboard_url: str = "",
    ) -> None:
        self._sinks = sinks
        self._group_wait_s = group_wait_s
        self._max_age_s = max_age_s
        self._timeout_s = timeout_s
        self._count = count
        self._store = store
        self._dashboard_url = dashboard_url
        self._queues: dict[str, asyncio.Queue[tuple[int, Alert]]] = {}
        # What is firing now, as last sent: sent again to the sinks that want it refreshed.
        self._firing: dict[str, Alert] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._sent_keys: set[str] = set()
        self._waiting: dict[str, Alert] = {}  # first alerts in their group wait
        self._held: dict[str, Alert] = {}  # held while the breaker is tripped
        self._breaker_tripped = False
        # Writes the store refused (Fenced: this replica no longer leads; or the store is
        # unreachable), counted; each kind logged once, without a traceback.
        self.store_errors_total = 0
        self._store_errors_logged: set[type[StateError]] = set()
        for key, status, body in store.alert_identities() if store else []:
            if status == "sent":
                self._sent_keys.add(key)
                self._firing[key] = _alert(body)
            elif status == "held":
                self._held[key] = _alert(body)
            else:
                self._waiting[key] = _alert(body)  # its group wait starts again at start()

    def restore_breaker(self, tripped: bool) -> None:
        """The breaker as the repair state says it stands (after a restart)."""
        self._breaker_tripped = tripped
        if tripped:
            self._hold_waiting()

    def _remember(self, key: str, status: str, alert: Alert, body: str = "") -> None:
        if self._store is not None:
            self._store.put_alert_identity(key, status, body or _body(alert))

    def _forget(self, key: str) -> None:
        if self._store is not None:
            self._store.drop_alert_identity(key)

    def _hold_waiting(self) -> None:
        for key in list(self._waiting):
            self._hold(key, self._waiting.pop(key))

    def _hold(self, key: str, alert: Alert) -> None:
        self._held[key] = alert
        self._remember(key, "held", alert)

    def start(self, spawn: Spawn | None = None) -> None:
        """One delivery worker per sink, started with spawn(name, body) when given (the
        aggregator's supervisor: a crash is logged, counted and restarted), else as a task."""
        for sink in self._sinks:
            queue: asyncio.Queue[tuple[int, Alert]] = asyncio.Queue()
            self._queues[sink.name] = queue

            def body(sink: Sink = sink, queue: asyncio.Queue[tuple[int, Alert]] = queue) -> Awaitable[None]:
                return self._deliver_forever(sink, queue)

            self._workers.append(spawn(f"alerts-{sink.name}", body) if spawn else asyncio.create_task(body()))
            if sink.refresh_s:

                def refresh(
                    sink: Sink = sink, queue: asyncio.Queue[tuple[int, Alert]] = queue
                ) -> Awaitable[None]:
                    return self._refresh_forever(sink, queue)

                name = f"alerts-{sink.name}-refresh"
                self._workers.append(spawn(name, refresh) if spawn else asyncio.create_task(refresh()))
        # What an earlier process queued and did not deliver goes first, in order.
        store = self._store
        for seq, sink_name, body_text in store.queued_alerts() if store else []:
            if sink_name in self._queues:
                self._queues[sink_name].put_nowait((seq, _alert(body_text)))
            elif store is not None:  # the sink was removed from the configuration meanwhile
                store.finish_alert(seq, Outcome(Status.SKIPPED, "the sink is no longer configured"))
        loop = asyncio.get_running_loop()
        for key in list(self._waiting):  # restored ones (a second flush of a key is a no-op)
            loop.call_later(self._group_wait_s, self._flush, key)

    async def close(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    @property
    def held(self) -> int:
        return len(self._held)

    def outstanding(self) -> set[str]:
        """The alert identities still out or about to go: sent and firing, held, or waiting."""
        return set(self._firing) | set(self._held) | set(self._waiting)

    def notify(self, alert: Alert) -> None:
        alert.links = links(alert, self._dashboard_url)
        key = alert.key
        if key in self._sent_keys:
            self._send(alert)
        elif self._breaker_tripped:
            if alert.status == "resolved" and key not in self._held:
                return  # resolved before anyone was told: nothing to say
            self._hold(key, alert)
        elif key in self._waiting:
            self._waiting[key] = alert  # still waiting: the newest state goes out
            self._remember(key, "waiting", alert)
        elif alert.status == "resolved":
            return  # resolved before anyone was told: nothing to say
        else:
            self._waiting[key] = alert
            self._remember(key, "waiting", alert)
            asyncio.get_running_loop().call_later(self._group_wait_s, self._flush, key)

    def _store_refused(self, what: str, exc: StateError) -> None:
        self.store_errors_total += 1
        if type(exc) in self._store_errors_logged:
            return
        self._store_errors_logged.add(type(exc))
        log.warning(
            "%s: not done, the repair state refused it (%s); further refusals of this kind are "
            "only counted (gpufleet_alert_store_errors_total)",
            what,
            exc,
        )

    def _flush(self, key: str) -> None:
        """A group wait ended (a timer callback: nothing may escape to asyncio's handler)."""
        try:
            self._flush_now(key)
        except StateError as exc:  # Fenced included: the new leader alerts instead
            self._store_refused(f"alert {key} after its group wait", exc)

    def _flush_now(self, key: str) -> None:
        alert = self._waiting.pop(key, None)
        if alert is None:
            return
        if self._breaker_tripped:
            self._hold(key, alert)
        elif alert.status != "resolved":
            self._send(alert)
        else:
            self._forget(key)  # resolved within its group wait: never told

    def breaker(self, alert: Alert) -> None:
        """The breaker tripped (alert.status firing) or was reset (resolved)."""
        alert.links = links(alert, self._dashboard_url)
        if alert.status == "firing":
            self._breaker_tripped = True
            self._hold_waiting()
            alert.details["held_incidents"] = {k: a.node for k, a in self._held.items()}
            self._send(alert)
            return
        self._breaker_tripped = False
        self._send(alert)
        held, self._held = self._held, {}
        for key, held_alert in held.items():
            if held_alert.status != "resolved":
                self._send(held_alert)
            else:
                self._forget(key)

    def _send(self, alert: Alert) -> None:
        body = _body(alert)
        if alert.status == "resolved":
            # Its last word: the identity is done once this is queued (it is kept in the outbox
            # until delivered). A later "firing" with the same key starts afresh.
            self._sent_keys.discard(alert.key)
            self._firing.pop(alert.key, None)
            self._forget(alert.key)
        else:
            self._sent_keys.add(alert.key)
            self._firing[alert.key] = alert
            self._remember(alert.key, "sent", alert, body)
        for name, queue in self._queues.items():
            seq = self._store.queue_alert(name, body) if self._store else 0
            queue.put_nowait((seq, alert))

    async def _refresh_forever(self, sink: Sink, queue: asyncio.Queue[tuple[int, Alert]]) -> None:
        """Every sink.refresh_s, what is firing goes to this sink again (not kept in the
        outbox: the next refresh is the retry). A breaker that holds incidents sends only its
        own alert, as it does the first time."""
        while True:
            await asyncio.sleep(sink.refresh_s)  # the refresh period, not synchronisation
            if queue.qsize() > len(self._firing):
                continue  # the sink is behind (unreachable): do not pile up copies
            for alert in list(self._firing.values()):
                queue.put_nowait((0, alert))

    async def _deliver_forever(self, sink: Sink, queue: asyncio.Queue[tuple[int, Alert]]) -> None:
        while True:
            seq, alert = await queue.get()
            outcome = await self._deliver(sink, alert)
            if self._store is not None and seq:
                try:
                    self._store.finish_alert(seq, outcome)
                except StateError as exc:  # delivered; the outbox row is finished by a later leader
                    self._store_refused(f"alert {alert.key}'s delivery to {sink.name} recorded", exc)

    async def _deliver(self, sink: Sink, alert: Alert) -> Outcome:
        """Sent (OK), or FAILED: dropped after max_age_s of failed attempts (each counted)."""
        request = sink.request(alert)
        delay_s, first = 1.0, time.monotonic()
        while True:
            error = await asyncio.to_thread(self._post, request)
            if error is None:
                self._count(sink.name, "sent")
                log.info(
                    "alert %s (%s, %s) sent to %s",
                    alert.key,
                    alert.status,
                    alert.state,
                    sink.name,
                    extra={"node": alert.node},
                )
                return OK
            self._count(sink.name, "failed_attempt")
            if time.monotonic() - first + delay_s > self._max_age_s:
                self._count(sink.name, "dropped")
                log.error(
                    "alert %s to %s dropped after %.0f s of failures: %s",
                    alert.key,
                    sink.name,
                    time.monotonic() - first,
                    error,
                    extra={"node": alert.node},
                )
                return Outcome(Status.FAILED, f"dropped after {time.monotonic() - first:.0f} s: {error}")
            log.warning(
                "alert %s to %s failed (%s); retrying in %.0f s",
                alert.key,
                sink.name,
                error,
                delay_s,
                extra={"node": alert.node},
            )
            await asyncio.sleep(delay_s)  # retry backoff, not synchronisation
            delay_s = min(delay_s * 2, 60.0)

    def _post(self, request: Request) -> str | None:
        return post(request, self._timeout_s)


def post(request: Request, timeout_s: float) -> str | None:
    """POST one alert request; None when the sink took it, else what went wrong (blocking)."""
    data = json.dumps(request.body).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "gpufleet", **request.headers}
    req = urllib.request.Request(request.url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {request.url}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{request.url}: {exc}"
    return None
