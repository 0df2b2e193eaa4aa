"""XIDs from the kernel log, pushed as soon as the line is read.

Reads /dev/kmsg, or any file or FIFO named by `kmsg_path` (tests feed one). Each NVRM Xid line is
parsed (kmsg_parse.py), its PCI bus id mapped to an NVML GPU index, and the event handed to
a callback. Lines that look like an XID but do not parse, and XIDs for a bus id that is no
GPU we know, are counted and logged (rate-limited) — never fatal.

Boot catch-up (docs/architecture.md "Boot catch-up"): with a cursor (the collector has a
state_dir), the log is read from the start of the current boot (/dev/kmsg's oldest record; a
regular file from its first line), and records the cursor says were reported are skipped, so
an XID logged while the collector was down, or before it started, is reported once. A record's
number is its /dev/kmsg sequence number (a regular file's lines without one are numbered from
1) and its time the kernel's (boot time + its microseconds). Without a cursor the log is read
from its end, as before: nothing remembers what an earlier run reported.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable

from gpufleet.collector.kmsg_cursor import KmsgCursor
from gpufleet.collector.sources.kmsg_parse import (
    KernelLogParser,
    KernelXid,
    Unparsed,
    bus_key,
    kmsg_payload,
    record_position,
)
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.protos import telemetry_pb2, vocabulary_pb2

log = logging.getLogger("gpufleet.collector.kmsg")

MAX_MESSAGE_CHARS = 512
_POLL_S = 0.5


class KernelLogXidWatcher:
    def __init__(
        self,
        path: str,
        source: NvmlSource,
        on_event: Callable[[telemetry_pb2.Event], None],
        cursor: KmsgCursor | None = None,
    ) -> None:
        self.path = path
        self._on_event = on_event
        self.cursor = cursor
        self.read_seq = 0  # the last record handed on (its XID, if any, is with on_event)
        self.caught_up_total = 0  # XIDs found in the backlog at start (logged before we read)
        self._backlog = cursor is not None  # until the first read finds nothing new
        self._line_no = 0
        self._last_payload = ""
        self._last_event: telemetry_pb2.Event | None = None  # the last line's, when it was an XID
        # The kernel's records carry microseconds of its local clock since boot (which, like
        # CLOCK_MONOTONIC, stops in a suspend); boot time on the wall clock:
        self._boot_wall_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
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
        if (record_device or stat.S_ISREG(mode)) and self.cursor is None:
            os.lseek(fd, 0, os.SEEK_END)
        pending = b""
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([fd], [], [], _POLL_S)
                if not ready:
                    self._end_of_backlog()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    self._end_of_backlog()
                    continue
                except BrokenPipeError:
                    # /dev/kmsg: records were overwritten before we read them; go on.
                    log.warning("kernel log records were lost before they could be read")
                    continue
                if not chunk:
                    self._end_of_backlog()
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

    def _end_of_backlog(self) -> None:
        if self._backlog:
            self._backlog = False
            if self.caught_up_total:
                log.warning(
                    "%d XID(s) logged since boot and not reported before were found in the kernel log",
                    self.caught_up_total,
                    extra={"caught_up": self.caught_up_total},
                )

    def _line(self, raw: str) -> None:
        self._line_no += 1
        seq, usec = record_position(raw)
        seq = seq or self._line_no
        if self.cursor is not None and self.cursor.reported(seq):
            return  # an earlier run reported it (or it holds no XID)
        try:
            self._parse(raw, seq, usec)
        finally:
            self.read_seq = seq

    def _parse(self, raw: str, seq: int, usec: int | None) -> None:
        payload = kmsg_payload(raw)
        if payload == self._last_payload and self._last_event is not None:
            # A storm repeats one line: its parse and its GPU are the last one's (an XID line's
            # parse depends on nothing before it), only the time and record number differ.
            # Skipping the regexes keeps 10,000 lines a second cheap (docs/architecture.md
            # "XID storms").
            event = telemetry_pb2.Event()
            event.CopyFrom(self._last_event)
            event.time_unix_ns = self._event_time(usec)
            if event.kmsg_seq:
                event.kmsg_seq = seq
            if self._backlog:
                self.caught_up_total += 1
            self._on_event(event)
            return
        self._last_payload, self._last_event = payload, None
        parsed = self._parser.feed(payload)
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
        if self._backlog:
            self.caught_up_total += 1
        event = self._event(parsed, seq, usec)
        if event.HasField("gpu_index"):  # an unknown bus is counted per line: not cached
            self._last_event = telemetry_pb2.Event()
            self._last_event.CopyFrom(event)  # its own copy: the folder may keep and change `event`
        self._on_event(event)

    def _event_time(self, usec: int | None) -> int:
        # Catching up, the kernel's time of the record (an XID is reported at when it happened,
        # and a repeat after a crash is the same point); a record that claims to be from the
        # future (a file written by hand) is now. Read from the end, the time it was read.
        now_ns = time.time_ns()
        if usec is None or self.cursor is None:
            return now_ns
        return min(now_ns, self._boot_wall_ns + usec * 1000)

    def _event(self, xid: KernelXid, seq: int, usec: int | None) -> telemetry_pb2.Event:
        message = xid.message
        if xid.recovery_action:
            message = f"recovery action now {xid.recovery_action}: {message}"
        event = telemetry_pb2.Event(
            kind=vocabulary_pb2.EVENT_KIND_XID,
            source=vocabulary_pb2.EVENT_SOURCE_KMSG,
            time_unix_ns=self._event_time(usec),
            kmsg_seq=seq if self.cursor is not None else 0,
            kernel_boot_id=self.cursor.boot_id if self.cursor is not None else "",
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
            if self.xids_unknown_gpu_total <= 10 or self.xids_unknown_gpu_total % 1000 == 0:
                log.warning(
                    "XID %d for PCI bus %s, which is no GPU NVML lists on this node (%d so far)",
                    xid.xid,
                    xid.bus_id,
                    self.xids_unknown_gpu_total,
                    extra={"xid": xid.xid, "pci_bus_id": xid.bus_id},
                )
        else:
            event.gpu_index = gpu.index
            event.pci_bus_id = gpu.identity.pci_bus_id
        return event

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
