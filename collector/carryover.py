"""Unacknowledged reports carried over a collector restart.

When the collector stops with reports the aggregator has not acknowledged (the aggregator
was down, or the grace period ran out), they are written to `STATE_DIR/unacked-NODE.pb`
(NodeReports, each after its length as 4 big-endian bytes; fsynced and renamed into place).
The next start of the
collector for the same node reads them back and sends them first, under its new boot id
with new sequence numbers — the aggregator accepts a report only for the boot its stream
said hello with — and with their sampling time and values unchanged, so they are stored
where they belong. The file is removed once read: a report is then in the replay buffer like
any other. At most `buffer_reports` reports are kept (the newest)."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

from google.protobuf.message import DecodeError

from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector.carryover")
_LENGTH = struct.Struct(">I")


def carry_path(state_dir: str, node: str) -> Path:
    return Path(state_dir) / f"unacked-{node}.pb"


def save(path: Path, reports: list[telemetry_pb2.NodeReport]) -> None:
    """Write reports durably (raises OSError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        for report in reports:
            data = report.SerializeToString()
            fh.write(_LENGTH.pack(len(data)) + data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def load(path: Path, node: str, limit: int) -> list[telemetry_pb2.NodeReport]:
    """The reports saved for this node, oldest first (at most limit, the newest); the file is
    removed. A damaged tail is logged and skipped; what came before it is kept."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    reports: list[telemetry_pb2.NodeReport] = []
    pos = 0
    try:
        while pos < len(data):
            if pos + _LENGTH.size > len(data):
                raise DecodeError("a record's length is cut short")
            (size,) = _LENGTH.unpack_from(data, pos)
            pos += _LENGTH.size
            if pos + size > len(data):
                raise DecodeError(f"a record of {size} bytes runs past the end of the file")
            report = telemetry_pb2.NodeReport.FromString(data[pos : pos + size])
            pos += size
            if report.node == node:
                reports.append(report)
    except DecodeError as exc:
        log.error(
            "%s is damaged at byte %d (%s): %d report(s) before it are kept", path, pos, exc, len(reports)
        )
    path.unlink(missing_ok=True)
    if len(reports) > limit:
        log.error("%s holds %d reports; keeping the newest %d", path, len(reports), limit)
        reports = reports[-limit:]
    return reports
