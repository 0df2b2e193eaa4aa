"""What the collector has reported from the kernel log, kept across restarts (docs/architecture.md
"Boot catch-up").

`STATE_DIR/kmsg-cursor-NODE.json` holds the kernel's boot id and the sequence number of the
last /dev/kmsg record whose XIDs are all reported: acknowledged by the aggregator, or kept in
the carry-over file of unacknowledged reports at a stop. At start the collector reads the
kernel log from the beginning of the current boot and skips every record at or below it; a
new boot id (the node rebooted) starts again from its first record. Written by write-to-temp,
fsync and rename: a crash leaves the old cursor or the new one, never half of one.

A crash after the aggregator stored a report and before its acknowledgement arrived sends
that report's XIDs again: their times come from the kernel's record, so the stored event is
the same point and overwrites itself (docs/architecture.md "Storage"), and the live view
drops an XID it already holds with that boot id and sequence number."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("gpufleet.collector.kmsg")


def cursor_path(state_dir: str, node: str) -> Path:
    return Path(state_dir) / f"kmsg-cursor-{node}.json"


def read_boot_id(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        log.warning(
            "cannot read the kernel boot id from %s (%s): records are remembered by number only", path, exc
        )
        return ""


class KmsgCursor:
    def __init__(self, path: Path, boot_id: str) -> None:
        self.path, self.boot_id = path, boot_id
        self.seq = 0  # records up to this one, in this boot, are reported
        try:
            saved = json.loads(path.read_text())
            if saved.get("boot_id") == boot_id and isinstance(saved.get("seq"), int):
                self.seq = saved["seq"]
            else:
                log.info(
                    "kernel boot %s is new (the cursor in %s is for boot %s): reading its log from the start",
                    boot_id or "?",
                    path,
                    saved.get("boot_id"),
                )
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.error("cannot read %s (%s): reading the kernel log from the start of the boot", path, exc)

    def reported(self, seq: int) -> bool:
        return 0 < seq <= self.seq

    def advance(self, seq: int) -> None:
        """Records up to seq are reported; kept durably (an error is logged, and retried at the
        next advance: a repeat after a crash is harmless, see above)."""
        if seq <= self.seq:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                json.dump({"boot_id": self.boot_id, "seq": seq}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(self.path)
        except OSError as exc:
            log.error("cannot keep the kernel-log cursor in %s: %s", self.path, exc)
            return
        self.seq = seq
