"""XIDs on their way out of the collector: one XID seen by both sources sent once, and a storm
of identical XIDs folded into counts (docs/architecture.md "XID storms").

Called from the sources' threads (NVML events, the kernel log) and from the event loop (the
sampling tick flushes the counts), so every method takes one lock.

- An XID is *identical* to another when it is the same number on the same GPU (by index, or
  by PCI bus id for a GPU NVML does not list). The text may differ: XID 95 storms print many
  variants of one message.
- The first XID of a key, or one after `window_s` of quiet, is sent at once. Further identical
  ones within the window are folded: counted, not sent. At each sampling tick every key with
  folded XIDs becomes one event: count N, the first at first_time_unix_ns, the last at
  time_unix_ns, the first one's text. A storm of any length is one event per key per tick,
  and the counts add up to every line read: nothing is lost from the count.
- A different XID (another number, or another GPU) is a different key: sent at once, storm or
  not.
- Windows are measured in the XIDs' own times (the kernel's, for the kernel log), so a backlog
  read at start-up folds the same way it would have live."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpufleet.protos import telemetry_pb2, vocabulary_pb2

CROSS_SOURCE_WINDOW_S = 10.0  # NVML and the kernel log reporting one XID within this are one event


@dataclass
class _Fold:
    last_ns: int  # the newest occurrence seen (sent or folded)
    # The first folded occurrence (the folder keeps it: a caller does not touch an event it
    # offered once it is folded), None: none folded since the last flush.
    template: telemetry_pb2.Event | None = None
    count: int = 0
    first_ns: int = 0
    min_kmsg_seq: int = 0  # the oldest kernel-log record folded here, not yet sent
    max_kmsg_seq: int = 0


class XidFolder:
    def __init__(self, window_s: float = 60.0) -> None:
        if not 0 <= window_s <= 86400:
            raise ValueError(f"xid_storm_window_s={window_s} must be between 0 and 86400 seconds")
        self._window_ns = int(window_s * 1e9)
        self._lock = threading.Lock()
        self._folds: dict[tuple[str, int], _Fold] = {}
        self._recent: dict[tuple[str, int], tuple[float, int]] = {}  # key -> (monotonic, source)
        self._newest_ns = 0  # the newest XID time offered
        self.folded_total = 0  # XIDs folded into a later event's count
        self.duplicates_total = 0  # XIDs the other source had just reported

    @staticmethod
    def _key(event: telemetry_pb2.Event) -> tuple[str, int]:
        return (str(event.gpu_index) if event.HasField("gpu_index") else event.pci_bus_id, event.xid)

    def offer(self, event: telemetry_pb2.Event) -> bool:
        """True: send this event now. False: it was folded into a count (or was the other
        source's copy of an XID just sent)."""
        if event.kind != vocabulary_pb2.EVENT_KIND_XID:
            return True
        key = self._key(event)
        t = event.time_unix_ns or time.time_ns()
        source, n = event.source, event.count or 1
        with self._lock:
            now = time.monotonic()
            seen = self._recent.get(key)
            if seen is not None and now - seen[0] < CROSS_SOURCE_WINDOW_S and seen[1] != source:
                # The same XID through the other source (NVML events and the kernel log both
                # report it): sent once.
                self.duplicates_total += 1
                return False
            if seen is None and len(self._recent) > 10_000:
                self._recent = {k: v for k, v in self._recent.items() if now - v[0] < CROSS_SOURCE_WINDOW_S}
            self._recent[key] = (now, source)
            if t > self._newest_ns:
                self._newest_ns = t
            fold = self._folds.get(key)
            if fold is None or (fold.template is None and t - fold.last_ns > self._window_ns):
                self._folds[key] = _Fold(last_ns=t)
                return True
            if t > fold.last_ns:
                fold.last_ns = t
            if fold.template is None:
                fold.template = event
                fold.first_ns, fold.min_kmsg_seq = t, event.kmsg_seq
            fold.count += n
            if event.kmsg_seq > fold.max_kmsg_seq:
                fold.max_kmsg_seq = event.kmsg_seq
            self.folded_total += n
            return False

    def flush(self) -> list[telemetry_pb2.Event]:
        """One event per key with folded XIDs (count, first..last), oldest first; keys quiet for
        longer than the window are forgotten."""
        out = []
        with self._lock:
            now_ns = self._newest_ns  # in the XIDs' own times, as the windows are
            for key, fold in list(self._folds.items()):
                if fold.template is not None:
                    event = fold.template
                    event.count = fold.count
                    event.first_time_unix_ns = fold.first_ns
                    event.time_unix_ns = fold.last_ns
                    event.kmsg_seq = fold.max_kmsg_seq
                    out.append(event)
                    fold.template, fold.count, fold.min_kmsg_seq = None, 0, 0
                elif now_ns - fold.last_ns > self._window_ns:
                    del self._folds[key]
        out.sort(key=lambda e: e.time_unix_ns)
        return out

    def oldest_unsent_kmsg_seq(self) -> int | None:
        """The oldest kernel-log record folded and not yet flushed (None: none)."""
        with self._lock:
            seqs = [f.min_kmsg_seq for f in self._folds.values() if f.template is not None and f.min_kmsg_seq]
        return min(seqs, default=None)
