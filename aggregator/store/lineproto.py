"""InfluxDB line protocol, escaped for any measurement, tag or field value (spaces, commas,
equals signs, quotes, backslashes, unicode), and InfluxQL string literals.

Written here rather than taken from influxdb-client: that client targets the 2.x API, and
gpufleet speaks the v1 /write and /query endpoints that InfluxDB 1.x, 2.x and 3.x all serve;
the escaping rules are short and are tested directly."""

from __future__ import annotations

import math

from gpufleet.aggregator.store.base import FieldValue, Point


def _escape(text: str, chars: str) -> str:
    out = text.replace("\\", "\\\\")
    for c in chars:
        out = out.replace(c, "\\" + c)
    return out.replace("\n", "\\n")


def measurement(name: str) -> str:
    return _escape(name, ", ")


def key(name: str) -> str:
    """A tag key, tag value or field key."""
    return _escape(name, ",= ")


def field_value(value: FieldValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} cannot be written to InfluxDB")
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def line(point: Point) -> str:
    """One point as a line. Tags with empty values are left out (InfluxDB has no empty tag)."""
    tags = "".join(f",{key(k)}={key(v)}" for k, v in sorted(point.tags.items()) if v != "")
    fields = ",".join(f"{key(k)}={field_value(v)}" for k, v in point.fields.items())
    return f"{measurement(point.measurement)}{tags} {fields} {point.time_unix_ns}"


def influxql_string(text: str) -> str:
    """A single-quoted InfluxQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def influxql_identifier(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class LineEncoder:
    """line() with the escaping remembered: the measurement-and-tags prefix per series and the
    escaped field keys are computed once. Escaping every point afresh cost ~26 µs a point — at
    fleet scale, most of a core in the writer thread. Bounded: the caches are cleared when full."""

    MAX_SERIES = 200_000

    def __init__(self) -> None:
        self._prefix: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._keys: dict[str, str] = {}

    def line(self, point: Point) -> str:
        series = (point.measurement, tuple(point.tags.items()))
        prefix = self._prefix.get(series)
        if prefix is None:
            if len(self._prefix) >= self.MAX_SERIES:
                self._prefix.clear()
            tags = "".join(f",{key(k)}={key(v)}" for k, v in sorted(point.tags.items()) if v != "")
            prefix = self._prefix[series] = measurement(point.measurement) + tags + " "
        keys = self._keys
        parts = []
        for k, v in point.fields.items():
            escaped = keys.get(k)
            if escaped is None:
                escaped = keys[k] = key(k)
            if v.__class__ is float and math.isfinite(v):
                parts.append(f"{escaped}={v!r}")
            else:
                parts.append(f"{escaped}={field_value(v)}")
        return f"{prefix}{','.join(parts)} {point.time_unix_ns}"
