"""Parse NVIDIA driver (NVRM) lines from the kernel log into XIDs.

Accepts a line as /dev/kmsg gives it ("6,1234,5678,-;NVRM: ..."), as dmesg prints it
("[ 1843.30] NVRM: ...") or as the journal does ("... kernel: NVRM: ..."). Forms handled:
- classic:   NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
- older:     NVRM: Xid (0000:01:00): 13, 0005 00000000 ...            (no "PCI:" prefix)
- unknown:   NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, ...
- XID 154:   ...: 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
- NVLink5:   ...: 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 ...)
- no number: NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this
             system has / NVRM: fallen off the bus and is not responding to commands.
             (several lines; reported as XID 79, the XID for "fallen off the bus")
Anything else is not an XID; a line that starts like one but does not parse is reported as
unparsed, so it can be counted — the parser never raises on odd input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

XID_FALLEN_OFF_BUS = 79
MAX_XID = 1_000_000  # what the aggregator accepts; NVIDIA's catalog ends in the hundreds
MAX_PID = 2**31 - 1  # pid_t; a larger "pid=" is no pid and is reported as unknown (0)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?\):"
    r"\s*(?P<xid>\d+)\s*(?:,\s*(?P<rest>.*))?$"
)
_PID = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|\d+),\s*(?:name=(?P<name>[^,]*),\s*)?")
_RECOVERY = re.compile(
    r"GPU recovery action changed from (?P<old>0x[0-9a-fA-F]+) \((?P<old_name>[^)]*)\) "
    r"to (?P<new>0x[0-9a-fA-F]+) \((?P<new_name>[^)]*)\)"
)
_NVLINK = re.compile(
    r"^(?P<unit>[A-Z][A-Z0-9_]*) (?P<severity>Fatal|Nonfatal) XC\d+ i\d+ Link (?P<link>-?\d+)"
)
_FALLEN_GPU = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})")
_FALLEN_ONE_LINE = re.compile(
    r"NVRM: GPU (?:at PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?:? "
    r".*fallen off the bus"
)


def bus_key(bus_id: str) -> tuple[int, int, int]:
    """(domain, bus, device) of any spelling: 0000:3b:00, 00000000:3B:00.0, PCI:0000:3b:00."""
    text = bus_id.removeprefix("PCI:").split(".")[0]
    domain, bus, device = text.split(":")
    return int(domain, 16), int(bus, 16), int(device, 16)


@dataclass(frozen=True)
class KernelXid:
    xid: int
    bus_id: str  # as written in the log
    message: str  # the driver's text after the number (and pid/name)
    pid: int = 0
    process_name: str = ""
    recovery_action: str = ""  # XID 154: the action now required, e.g. "GPU Reset Required"
    nvlink_unit: str = ""  # XID 144-150: RLW_RXPIPE, NETIR_LINK_EVT, ...
    nvlink_fatal: bool = False
    nvlink_link: int | None = None


@dataclass(frozen=True)
class Unparsed:
    line: str


class KernelLogParser:
    """Feed it lines in order; it returns an XID, an Unparsed NVRM Xid line, or None.

    Keeps one piece of state: the GPU named by a multi-line "fallen off the bus" message."""

    def __init__(self) -> None:
        self._pending_fallen_bus: str | None = None

    def feed(self, raw: str) -> KernelXid | Unparsed | None:
        line = raw.rstrip("\n")
        if "NVRM:" not in line:
            return None
        fallen = _FALLEN_GPU.search(line)
        if fallen:
            self._pending_fallen_bus = fallen.group("bus")
            return None
        if "fallen off the bus" in line and "Xid" not in line:
            one_line = _FALLEN_ONE_LINE.search(line)
            bus = one_line.group("bus") if one_line else self._pending_fallen_bus
            self._pending_fallen_bus = None
            if bus:
                return KernelXid(XID_FALLEN_OFF_BUS, bus, "GPU has fallen off the bus (no Xid line)")
            return Unparsed(line)
        if "NVRM: Xid" not in line:
            return None
        match = _XID.search(line)
        if not match:
            return Unparsed(line)
        rest = (match.group("rest") or "").strip()
        pid, name = 0, ""
        pid_match = _PID.match(rest)
        if pid_match:
            pid_text = pid_match.group("pid")
            pid = int(pid_text) if pid_text.isdigit() else 0
            pid = pid if pid <= MAX_PID else 0
            name = (pid_match.group("name") or "").strip()
            name = "" if name == "<unknown>" else name
            rest = rest[pid_match.end() :]
        xid = int(match.group("xid"))
        if xid > MAX_XID:
            return Unparsed(line)
        # /dev/kmsg escapes unprintable bytes, but a log file or a driver may not: control
        # characters in the free text would make the aggregator refuse the whole report.
        rest, name = _CONTROL.sub("?", rest), _CONTROL.sub("?", name)
        fields: dict[str, object] = {}
        recovery = _RECOVERY.search(rest)
        if recovery:
            fields["recovery_action"] = recovery.group("new_name")
        nvlink = _NVLINK.match(rest)
        if nvlink and 144 <= xid <= 150:
            fields.update(
                nvlink_unit=nvlink.group("unit"),
                nvlink_fatal=nvlink.group("severity") == "Fatal",
                nvlink_link=int(nvlink.group("link")),
            )
        return KernelXid(xid, match.group("bus"), rest, pid, name, **fields)  # type: ignore[arg-type]


def kmsg_payload(record: str) -> str:
    """The text of a /dev/kmsg record ("prio,seq,usec,flags;text"); other lines unchanged."""
    head, sep, text = record.partition(";")
    if sep and head.count(",") >= 3 and head.split(",", 1)[0].isdigit():
        return text
    return record


def record_position(record: str) -> tuple[int, int | None]:
    """(sequence number, microseconds since boot) of a /dev/kmsg record; (0, None) for a line
    in another form (dmesg, the journal, a plain log file)."""
    head, sep, _ = record.partition(";")
    if not sep:
        return 0, None
    parts = head.split(",")
    if len(parts) < 4 or not (parts[0].isdigit() and parts[1].isdigit() and parts[2].isdigit()):
        return 0, None
    return int(parts[1]), int(parts[2])
