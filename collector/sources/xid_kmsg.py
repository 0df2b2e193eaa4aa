"""XIDs from the kernel log, pushed as soon as the line is read.

Reads /dev/kmsg (from its end: XIDs already in the buffer at start-up are history, not
news), or any file or FIFO named by `kmsg_path` (tests feed one). Each NVRM Xid line is
parsed (kmsg_parse.py), its PCI bus id mapped to an NVML GPU index, and the event handed to
a callback. Lines that look like an XID but do not parse, and XIDs for a bus id that is no
GPU we know, are counted and logged (rate-limited) — never fatal.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable

from gpufleet.collector.sources.kmsg_parse import KernelLogParser, KernelXid, Unparsed, bus_key, kmsg_payload
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.protos import telemetry_pb2, vocabulary_pb2

log = logging.getLogger("gpufleet.collector.kmsg")

MAX_MESSAGE_CHARS = 512
_POLL_S = 0.5


class KernelLogXidWatcher:
    def __init__(
        self, path: str, source: NvmlSource, on_event: Callable[[telemetry_pb2.Event], None]
    ) -> None:
        self.path = path
        self._on_event = on_event
        self._gpu_by_bus = {}
        for gpu in source.gpus:
            try:
                self._gpu_by_bus[bus_key(gpu.identity.pci_bus_id)] = gpu
            except ValueError:
                continue  # a GPU whose identity could not be read
        self._parser = KernelLogParser()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines_unparsed_total = 0
        self.xids_unknown_gpu_total = 0

    def start(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                # Held open read-write, a FIFO never reads as end-of-file between writers.
                os.close(fd)
                fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        except OSError as exc:
            log.warning(
                "cannot read the kernel log at %s (%s); XIDs come from NVML events only. "
                "The collector needs read access to it (CAP_SYSLOG, or root).",
                self.path,
                exc,
            )
            return False
        self._thread = threading.Thread(target=self._run, args=(fd,), name="kmsg-xid", daemon=True)
        self._thread.start()
        return True

    def _run(self, fd: int) -> None:
        mode = os.fstat(fd).st_mode
        record_device = stat.S_ISCHR(mode)  # /dev/kmsg: one record per read()
        if record_device or stat.S_ISREG(mode):
            os.lseek(fd, 0, os.SEEK_END)
        pending = b""
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([fd], [], [], _POLL_S)
                if not ready:
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    # /dev/kmsg: records were overwritten before we read them; go on.
                    log.warning("kernel log records were lost before they could be read")
                    continue
                if not chunk:
                    self._stop.wait(_POLL_S)  # a regular file at its end: wait for it to grow
                    continue
                if record_device:
                    self._line(chunk.decode(errors="replace"))
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(line.decode(errors="replace"))
        finally:
            os.close(fd)

    def _line(self, raw: str) -> None:
        parsed = self._parser.feed(kmsg_payload(raw))
        if parsed is None:
            return
        if isinstance(parsed, Unparsed):
            self.lines_unparsed_total += 1
            if self.lines_unparsed_total <= 10 or self.lines_unparsed_total % 100 == 0:
                log.warning(
                    "kernel log line looks like an XID but does not parse (%d so far): %.200s",
                    self.lines_unparsed_total,
                    parsed.line,
                )
            return
        self._on_event(self._event(parsed))

    def _event(self, xid: KernelXid) -> telemetry_pb2.Event:
        message = xid.message
        if xid.recovery_action:
            message = f"recovery action now {xid.recovery_action}: {message}"
        event = telemetry_pb2.Event(
            kind=vocabulary_pb2.EVENT_KIND_XID,
            source=vocabulary_pb2.EVENT_SOURCE_KMSG,
            time_unix_ns=time.time_ns(),
            xid=xid.xid,
            message=message[:MAX_MESSAGE_CHARS],
            pid=xid.pid,
            process_name=xid.process_name[:64],
            pci_bus_id=xid.bus_id,
        )
        try:
            gpu = self._gpu_by_bus.get(bus_key(xid.bus_id))
        except ValueError:
            gpu = None
        if gpu is None:
            self.xids_unknown_gpu_total += 1
            log.warning(
                "XID %d for PCI bus %s, which is no GPU NVML lists on this node",
                xid.xid,
                xid.bus_id,
                extra={"xid": xid.xid, "pci_bus_id": xid.bus_id},
            )
        else:
            event.gpu_index = gpu.index
            event.pci_bus_id = gpu.identity.pci_bus_id
            log.warning(
                "XID %d on GPU %d (kernel log): %.200s",
                xid.xid,
                gpu.index,
                message,
                extra={"gpu": gpu.index, "xid": xid.xid},
            )
        return event

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
