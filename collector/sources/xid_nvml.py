"""XIDs from NVML's event set, pushed as soon as NVML delivers them.

A thread blocks in nvmlEventSetWait (which releases the GIL, so sampling goes on) and hands
each XID to a callback; the agent sends it at once in an event-only report instead of
waiting for the next sampling tick.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable

import pynvml

from gpufleet.collector.sources.deadline import returns_within
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.protos import telemetry_pb2, vocabulary_pb2

log = logging.getLogger("gpufleet.collector.xid")

WAIT_MS = 500  # how often the thread looks up from the wait to see whether it should stop
STOP_WAIT_S = 1.0  # at a stop, the longest wait for the thread, and for freeing the event set


class NvmlXidWatcher:
    def __init__(self, source: NvmlSource, on_event: Callable[[telemetry_pb2.Event], None]) -> None:
        self._source = source
        self._on_event = on_event
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._index_by_address = {ctypes.addressof(g.handle.contents): g for g in source.gpus}
        self.registered: list[int] = []

    def start(self) -> bool:
        """Register every GPU for XID events; False if NVML offers none (logged)."""
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML event sets are unavailable (%s); XIDs come from the kernel log only", exc)
            return False
        for gpu in self._source.gpus:
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    gpu.handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                )
                self.registered.append(gpu.index)
            except pynvml.NVMLError as exc:
                log.warning(
                    "GPU %d: cannot register for XID events: %s", gpu.index, exc, extra={"gpu": gpu.index}
                )
        if not self.registered:
            pynvml.nvmlEventSetFree(self._event_set)
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait(self._event_set, WAIT_MS)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                log.error("waiting for NVML events failed: %s; retrying", exc)
                self._stop.wait(1.0)
                continue
            if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
                continue
            # Handles are compared by address: two handles to one GPU are not == (pynvml).
            gpu = self._index_by_address.get(ctypes.addressof(data.device.contents))
            event = telemetry_pb2.Event(
                kind=vocabulary_pb2.EVENT_KIND_XID,
                source=vocabulary_pb2.EVENT_SOURCE_NVML,
                time_unix_ns=time.time_ns(),
                xid=int(data.eventData),
                message=f"XID {int(data.eventData)} (NVML event)",
            )
            if gpu is not None:
                event.gpu_index = gpu.index
                event.pci_bus_id = gpu.identity.pci_bus_id
            log.warning(
                "XID %d on GPU %s",
                event.xid,
                gpu.index if gpu else "?",
                extra={"gpu": gpu.index if gpu else "", "xid": event.xid},
            )
            self._on_event(event)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # Its wait ends within WAIT_MS; freeing the set is an NVML call a stuck driver
            # never answers: bounded, so SIGTERM still ends the collector.
            self._thread.join(timeout=STOP_WAIT_S)
            returns_within(lambda: pynvml.nvmlEventSetFree(self._event_set), STOP_WAIT_S, "nvmlEventSetFree")
