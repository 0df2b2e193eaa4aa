"""Times and durations as an SRE types them: 10m, 1h30m, 7d, now, 2026-11-29T10:00Z."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from gpufleet.common.timefmt import iso

_UNITS_NS = {
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
    "d": 86400 * 10**9,
    "w": 7 * 86400 * 10**9,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration_ns(text: str) -> int:
    """'90s', '1h30m', '7d' -> nanoseconds. A bare number is seconds."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return int(float(s) * 10**9)
    pos, total = 0, 0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += int(float(m.group(1)) * _UNITS_NS[m.group(2)])
        pos = m.end()
    if pos != len(s) or not s or total <= 0:
        raise ValueError(f"{text!r} is not a duration; write e.g. 30s, 10m, 1h30m, 7d")
    return total


def parse_time_ns(text: str, now_ns: int | None = None) -> int:
    """'now', a duration meaning that long ago ('10m'), or an ISO 8601 time (UTC if no zone)."""
    now_ns = now_ns or time.time_ns()
    s = text.strip()
    if s.lower() == "now":
        return now_ns
    try:
        return now_ns - parse_duration_ns(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time; write 'now', a time ago such as 10m or 2h, "
            "or an ISO 8601 time such as 2026-11-29T10:00:00Z"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 10**9)


def parse_range_ns(since: str, until: str, now_ns: int | None = None) -> tuple[int, int]:
    """(start, end) of a --since/--until pair, read against one "now"; a ValueError in the words
    the user typed when the start is not before the end (never raw nanoseconds)."""
    now_ns = now_ns or time.time_ns()
    start, end = parse_time_ns(since, now_ns), parse_time_ns(until, now_ns)
    if start >= end:
        raise ValueError(
            f"--since {since} ({iso(start)}) must be before --until {until} ({iso(end)}); "
            "a time ago such as 2h is further back than 1h"
        )
    return start, end
