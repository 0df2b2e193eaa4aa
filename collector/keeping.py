"""What a collector keeps across a restart: unacknowledged reports carried over in its state_dir,
and how far into the kernel log its XIDs are reported (collector/kmsg_cursor.py)."""

from __future__ import annotations

import logging

from gpufleet.collector import carryover
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.report_book import ReportBook
from gpufleet.collector.sources.xid_kmsg import KernelLogXidWatcher
from gpufleet.collector.xid_fold import XidFolder

log = logging.getLogger("gpufleet.collector")


class Keeping:
    def __init__(self, config: CollectorConfig, book: ReportBook, xid_fold: XidFolder) -> None:
        self._config = config
        self._book = book
        self._xid_fold = xid_fold
        self.kmsg: KernelLogXidWatcher | None = None  # set when the kernel log is read

    def advance_kmsg_cursor(self, carried: bool = False) -> None:
        """Move the kernel-log cursor past every record whose XIDs are acknowledged (or, with
        carried, kept in the carry-over file)."""
        if self.kmsg is None or self.kmsg.cursor is None:
            return
        read = self.kmsg.read_seq  # read before the sets: a record counted here is in one of them
        book = self._book
        if carried:
            book.kmsg_unacked.clear()
        else:
            for seq in [s for s in book.kmsg_unacked if not book.buffer.holds(s)]:
                del book.kmsg_unacked[seq]  # acknowledged, rejected or dropped (each counted)
        unsent = [s for s in list(book.kmsg_inflight) if s] + list(book.kmsg_unacked.values())
        oldest_folded = self._xid_fold.oldest_unsent_kmsg_seq()
        if oldest_folded is not None:
            unsent.append(oldest_folded)
        self.kmsg.cursor.advance(min(unsent) - 1 if unsent else read)

    def carry_in(self) -> None:
        """Reports a previous run of this node's collector left unacknowledged go first."""
        if not self._config.state_dir:
            return
        path = carryover.carry_path(self._config.state_dir, self._config.node)
        try:
            carried = carryover.load(path, self._config.node, self._config.buffer_reports)
        except OSError as exc:
            log.error("cannot read carried-over reports from %s: %s", path, exc)
            return
        self._book.take_carried(carried)
        if carried:
            log.info("%d report(s) left unacknowledged by the last run are sent first", len(carried))

    def carry_out(self) -> bool:
        """True when every unacknowledged report is kept for the next start (or none is left)."""
        left = self._book.buffer.after(0)
        if not left:
            self.advance_kmsg_cursor(carried=True)
            return True
        if not self._config.state_dir:
            log.warning(
                "exiting with %d unacknowledged report(s), not kept: set state_dir to send them after "
                "the restart",
                len(left),
                extra={"unacked": len(left)},
            )
            return False
        path = carryover.carry_path(self._config.state_dir, self._config.node)
        try:
            carryover.save(path, left)
        except OSError as exc:
            log.error("cannot keep %d unacknowledged report(s) in %s: %s", len(left), path, exc)
            return False
        log.info("%d unacknowledged report(s) kept in %s for the next start", len(left), path)
        self.advance_kmsg_cursor(carried=True)
        return True
