"""Hypothesis strategies for whole wire messages, generated over the proto descriptors: every
field either absent, valid (what the wire rules accept: what a correct collector sends) or at
its edges (0, type max, 2^63-1, 2^63, 2^64-1, NaN, +-Inf, -0.0, subnormals, empty, huge and
unicode strings, control characters, duplicate and out-of-range indices). Used by the ingest
fuzz test (over real gRPC) and the wire-rules tests (in process)."""

from __future__ import annotations

import itertools
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from gpufleet.aggregator.ingest.wire_rules import RULES, Many, Num, Text
from gpufleet.protos import columns, ingest_pb2, telemetry_pb2
from gpufleet.protos.credentials import NODE_NAME_RE, RESERVED_NODE_NAMES

NODE, BOOT, GPUS, CLUSTER = "fuzz-node", "fuzz-boot", 8, "test"
MODEL = "NVIDIA H100 80GB HBM3"
# Node and cluster names by the one grammar (protos/credentials.py); up to 40 characters here.
NAMES = st.from_regex(NODE_NAME_RE, fullmatch=True).filter(
    lambda n: len(n) <= 40 and n.lower() not in RESERVED_NODE_NAMES
)


def declared_uuid(i: int) -> str:
    """The uuid the fuzz stream's hello declares for GPU i (harness.streams.hello)."""
    return f"GPU-{NODE}-{i}"


# --- values at their edges ------------------------------------------------------------------
INT_EDGES = [0, 1, 7, 8, 63, 64, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]
INT64_EDGES = [0, 1, -1, 2**62, 2**63 - 1, -(2**63)]
DOUBLE_EDGES = [
    0.0, -0.0, 5e-324, 2.2250738585072014e-308, 0.5, 1.0, 99.999, 100.0, 1e15, 1e308, -1.0, -1e308,
    math.nan, math.inf, -math.inf,
]  # fmt: skip
STRING_EDGES = [
    "", "GPU-0", "NVIDIA H100 80GB HBM3", "ünïcødé 🚀 ☃", "tab\there", "new\nline", "nul\x00byte",
    "back\\slash", " padded ", "x" * 300, "y" * 5000, "del\x7f", "c1\x85", 'comma, space =equals"quote\'',
]  # fmt: skip
UINT_MAX = {FieldDescriptor.TYPE_UINT32: 2**32 - 1, FieldDescriptor.TYPE_UINT64: 2**64 - 1}
TAG_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cc", "Cs"), exclude_characters="\\")
TEXT_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs",)).filter(
    lambda c: c == "\t" or not (ord(c) < 32 or 0x7F <= ord(c) <= 0x9F)
)


def rule_of(field: FieldDescriptor) -> Any:
    rule = RULES[f"{field.containing_type.name}.{field.name}"]
    return rule.each if isinstance(rule, Many) else rule


def edge_value(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in UINT_MAX:
        top = UINT_MAX[t]
        return st.one_of(st.sampled_from([v for v in INT_EDGES if v <= top]), st.integers(0, top))
    if t == FieldDescriptor.TYPE_INT64:
        return st.one_of(st.sampled_from(INT64_EDGES), st.integers(-(2**63), 2**63 - 1))
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.one_of(st.sampled_from(DOUBLE_EDGES), st.floats())
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(STRING_EDGES), st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(
            st.sampled_from([v.number for v in field.enum_type.values]), st.integers(0, 2**31 - 1)
        )
    raise AssertionError(f"no edge strategy for {field.full_name}")


def valid_value(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Values the wire rules accept (what a correct collector sends)."""
    rule = rule_of(field)
    t = field.type
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    if isinstance(rule, Num):
        if t == FieldDescriptor.TYPE_DOUBLE:
            return st.floats(rule.low, rule.high, allow_nan=False, allow_infinity=False)
        return st.integers(int(rule.low), int(rule.high))
    assert isinstance(rule, Text), field.full_name
    alphabet = TAG_ALPHABET if rule.tag else TEXT_ALPHABET
    text = st.text(alphabet, max_size=min(rule.max_len, 40))
    return text.map(str.strip) if rule.tag else text


@st.composite
def message(draw: st.DrawFn, descriptor: Descriptor, valid: bool, skip: frozenset[str] = frozenset()) -> Any:
    """A message of this type with any subset of its scalar fields set, valid or at the edges."""
    msg = getattr(telemetry_pb2, descriptor.name, None) or getattr(ingest_pb2, descriptor.name)
    out = msg()
    for field in descriptor.fields:
        if field.name in skip or field.type == FieldDescriptor.TYPE_MESSAGE or not draw(st.booleans()):
            continue
        value = valid_value(field) if valid else st.one_of(valid_value(field), edge_value(field))
        if field.is_repeated:
            getattr(out, field.name).extend(draw(st.lists(value, max_size=4)))
        else:
            setattr(out, field.name, draw(value))
    return out


@dataclass
class Case:
    report: telemetry_pb2.NodeReport
    valid: bool  # built only from values the rules accept: must be acknowledged
    # A columnar report: the GPU samples its columns were made from (what must be stored), and
    # whether its stream's hello offers columns (a report in columns on a stream that did not
    # is refused).
    samples: list[telemetry_pb2.GpuSample] | None = None
    columnar_hello: bool = False

    def gpu_samples(self) -> list[telemetry_pb2.GpuSample]:
        return list(self.report.gpus) if self.samples is None else self.samples


_times = itertools.count()
_BASE_NS = time.time_ns() - 600 * 10**9


def next_report_time_ns() -> int:
    """A report time no other example has used (100 µs apart): read-back sees only its own."""
    return _BASE_NS + next(_times) * 100_000


@st.composite
def reports(draw: st.DrawFn, columnar: bool = False) -> Case:
    """A whole report; columnar: its GPU samples as GpuColumns (telemetry.proto), and an invalid
    one now and then broken in the columns' own structure."""
    valid = draw(st.booleans())
    ts = next_report_time_ns()
    r = draw(
        message(telemetry_pb2.NodeReport.DESCRIPTOR, valid, frozenset({"node", "boot_id", "time_unix_ns"}))
    )
    r.node, r.boot_id, r.time_unix_ns = NODE, BOOT, ts
    if valid or draw(st.integers(0, 3)):
        r.cluster = CLUSTER  # bound to the stream: the hello's (an edge case now and then names another)
    if valid:
        r.seq = max(r.seq, 1)
    elif draw(st.integers(0, 9)) == 0:  # now and then, the stream-level identity at its edges
        r.node = draw(st.sampled_from(["other-node", ""]))
        r.boot_id = draw(st.sampled_from(["other-boot", ""]))
        r.time_unix_ns = draw(st.sampled_from([0, -1, 1, 2**63 - 1, ts - 30 * 86400 * 10**9]))
    indices = draw(st.lists(st.integers(0, GPUS - 1), unique=True, max_size=GPUS)) if valid else None
    for i in indices if valid else draw(st.lists(edge_value(_field("GpuSample", "index")), max_size=3)):
        gpu = draw(message(telemetry_pb2.GpuSample.DESCRIPTOR, valid, frozenset({"index", "processes"})))
        gpu.index = i
        if valid or draw(st.integers(0, 3)):
            # A GPU is what its collector's hello declared (an edge case now and then is not).
            gpu.uuid, gpu.model = declared_uuid(i) if isinstance(i, int) and 0 <= i < GPUS else "", MODEL
        for _ in range(draw(st.integers(0, 2))):
            gpu.processes.append(draw(message(telemetry_pb2.GpuProcess.DESCRIPTOR, valid)))
        if valid and gpu.HasField("hbm_used_bytes") and gpu.HasField("hbm_total_bytes"):
            gpu.hbm_used_bytes = min(gpu.hbm_used_bytes, gpu.hbm_total_bytes)
        r.gpus.append(gpu)
    seen: set[tuple[str, str, int]] = set()
    for _ in range(draw(st.integers(0, 2))):
        eng = draw(message(telemetry_pb2.EngineSample.DESCRIPTOR, valid, frozenset({"gpu_indices"})))
        eng.gpu_indices.extend(
            draw(
                st.lists(
                    st.integers(0, GPUS - 1) if valid else edge_value(_field("EngineSample", "gpu_indices"))
                )
            )
        )
        if valid and (eng.engine, eng.model, eng.port) in seen:
            continue
        seen.add((eng.engine, eng.model, eng.port))
        r.engines.append(eng)
    _events(draw, r, valid, ts)
    _workloads(draw, r, valid)
    if draw(st.booleans()):
        r.stats.CopyFrom(draw(message(telemetry_pb2.CollectorStats.DESCRIPTOR, valid)))
    if not valid and draw(st.integers(0, 14)) == 0:  # repeated fields past their bound
        which = draw(st.sampled_from(["engines", "events", "workloads"]))
        kind = {"engines": "EngineSample", "events": "Event", "workloads": "WorkloadSample"}[which]
        getattr(r, which).extend([getattr(telemetry_pb2, kind)()] * 1001)
    if not columnar:
        return Case(r, valid)
    samples = list(r.gpus)
    r.ClearField("gpus")
    r.gpu_columns.CopyFrom(columns.to_columns(samples))
    case = Case(r, valid, samples, columnar_hello=valid or draw(st.integers(0, 9)) > 0)
    if not valid and samples and draw(st.booleans()):
        COLUMN_BREAKS[draw(st.sampled_from(sorted(COLUMN_BREAKS)))](r.gpu_columns)
        case.samples = None  # refused: nothing is stored of it
    return case


_UTIL = columns.number_of("util_gpu_pct")
_THROTTLE = columns.number_of("throttle_thermal")


def _add_column(cols: telemetry_pb2.GpuColumns, kind: str, number: int, value: bytes) -> None:
    """One more column in a block, `value` for every GPU (presence left as it was)."""
    getattr(cols, f"{kind}_fields").append(number)
    block = {"double": "doubles", "integer": "integers", "bool": "bools"}[kind]
    setattr(cols, block, getattr(cols, block) + value * cols.count)


def _util_column(cols: telemetry_pb2.GpuColumns) -> int:
    """Where util_gpu_pct's column starts in the doubles (added, 1.5 on every GPU, if missing)."""
    if _UTIL not in cols.double_fields:
        _add_column(cols, "double", _UTIL, struct.pack("<d", 1.5))
    return list(cols.double_fields).index(_UTIL) * 8 * cols.count


def _bitmap_bytes(cols: telemetry_pb2.GpuColumns) -> int:
    fields = len(cols.double_fields) + len(cols.integer_fields) + len(cols.bool_fields)
    return (fields * cols.count + 7) // 8


def _same_field_twice(cols: telemetry_pb2.GpuColumns) -> None:
    if _THROTTLE not in cols.bool_fields:
        _add_column(cols, "bool", _THROTTLE, b"\0")
    _add_column(cols, "bool", _THROTTLE, b"\0")
    cols.present = b""


def _bool_byte_2(cols: telemetry_pb2.GpuColumns) -> None:
    if not cols.bool_fields:
        _add_column(cols, "bool", _THROTTLE, b"\0")
        cols.present = b""
    cols.bools = b"\2" * len(cols.bools)


def _absent_slot_not_zero(cols: telemetry_pb2.GpuColumns) -> None:
    at = _util_column(cols)
    cols.doubles = (
        cols.doubles[:at] + struct.pack("<d", 1.5) * cols.count + cols.doubles[at + 8 * cols.count :]
    )
    cols.present = bytes(_bitmap_bytes(cols))  # every value absent, util's slots not 0


def _nan_value(cols: telemetry_pb2.GpuColumns) -> None:
    at = _util_column(cols)
    cols.doubles = cols.doubles[:at] + struct.pack("<d", math.nan) + cols.doubles[at + 8 :]
    cols.present = b""


# Ways to break a GpuColumns' structure, each refused for any batch of one GPU or more.
COLUMN_BREAKS: dict[str, Any] = {
    "count_past_arrays": lambda c: setattr(c, "count", c.count + 1),
    "index_short": lambda c: c.index.pop(),
    "uuid_long": lambda c: c.uuid.append("GPU-extra"),
    "doubles_short": lambda c: setattr(c, "doubles", c.doubles + b"\0"),
    "integers_short": lambda c: setattr(c, "integers", c.integers + b"\0" * 3),
    "same_field_twice": _same_field_twice,
    "identity_as_column": lambda c: _add_column(c, "integer", 1, bytes(8)),
    "bool_as_double": lambda c: _add_column(c, "double", _THROTTLE, bytes(8)),
    "unknown_field": lambda c: _add_column(c, "double", 199, bytes(8)),
    "bool_byte_2": _bool_byte_2,
    "lost_byte_2": lambda c: setattr(c, "lost", b"\2" * c.count),
    "lost_short": lambda c: setattr(c, "lost", c.lost[:-1]),
    "present_wrong_length": lambda c: setattr(c, "present", bytes(_bitmap_bytes(c) + 1)),
    "absent_slot_not_zero": _absent_slot_not_zero,
    "nan_value": _nan_value,
    "texts_count": lambda c: c.driver_unresponsive_call.extend(["nvmlX"] * (c.count + 1)),
    "process_on_unknown_gpu": lambda c: (
        c.process_gpu_index.append(63),
        c.process_pid.append(1),
        setattr(c, "process_used_memory_bytes", c.process_used_memory_bytes + bytes(8)),
        setattr(c, "process_used_memory_present", b""),
    ),
    "process_arrays_differ": lambda c: c.process_pid.append(1),
}


def _events(draw: st.DrawFn, r: telemetry_pb2.NodeReport, valid: bool, ts: int) -> None:
    for _ in range(draw(st.integers(0, 3))):
        ev = draw(
            message(
                telemetry_pb2.Event.DESCRIPTOR,
                valid,
                frozenset({"time_unix_ns", "gpu_index", "first_time_unix_ns"}),
            )
        )
        if draw(st.booleans()):
            ev.gpu_index = draw(
                st.integers(0, GPUS - 1) if valid else edge_value(_field("Event", "gpu_index"))
            )
        ev.time_unix_ns = (
            draw(st.sampled_from([0, ts + draw(st.integers(0, 999))]))
            if valid or draw(st.booleans())
            else draw(edge_value(_field("Event", "time_unix_ns")))
        )
        if draw(st.booleans()):  # a folded storm: first..last, within the accepted range
            last = ev.time_unix_ns or ts
            ev.first_time_unix_ns = (
                last - draw(st.integers(0, 10**9))
                if valid
                else draw(st.sampled_from([min(last + 1, 2**63 - 1), -1, 2**63 - 1]))
            )
        r.events.append(ev)


def _workloads(draw: st.DrawFn, r: telemetry_pb2.NodeReport, valid: bool) -> None:
    """The workloads a node names: valid ones in the grammar (protos/names.py), on declared GPUs;
    edge ones anything the wire rules bound (a bad name or GPU is dropped from the report, which
    is kept: docs/security.md "Parts dropped, reports kept")."""
    for n in range(draw(st.integers(0, 2))):
        if valid:
            r.workloads.add(
                scheduler=draw(st.sampled_from(["slurm", "kubernetes", "site"])),
                id=str(1000 + n),
                part=draw(st.sampled_from(["", "batch", "0"])),
                gpu_indices=draw(st.lists(st.integers(0, GPUS - 1), unique=True, max_size=GPUS)),
                pids=draw(st.lists(st.integers(1, 2**22), max_size=16)),
                process_count=draw(st.integers(0, 64)),
                hbm_used_bytes=draw(st.integers(0, 80 << 30)),
                source=draw(st.sampled_from(["cgroup", "environ"])),
            )
        else:
            w = draw(message(telemetry_pb2.WorkloadSample.DESCRIPTOR, valid))
            if draw(st.booleans()):
                w.scheduler = draw(st.sampled_from(["slurm", "none", "../etc", "site"]))
                w.id = draw(st.sampled_from(["1234", "../../x", "$(reboot)", "a" * 127, "", "ns/pod"]))
            r.workloads.append(w)


def _field(message_name: str, field: str) -> FieldDescriptor:
    return getattr(telemetry_pb2, message_name).DESCRIPTOR.fields_by_name[field]


@st.composite
def hellos(draw: st.DrawFn) -> ingest_pb2.Hello:
    valid = draw(st.booleans())
    h = draw(message(ingest_pb2.Hello.DESCRIPTOR, valid, frozenset({"protocol_version"})))
    if valid:
        h.node, h.cluster = draw(NAMES), draw(NAMES)
    h.protocol_version = (
        1
        if valid or draw(st.booleans())
        else draw(edge_value(_field_of(ingest_pb2.Hello, "protocol_version")))
    )
    for i in range(draw(st.integers(0, 3)) if draw(st.integers(0, 9)) else 65):
        gpu = draw(message(telemetry_pb2.GpuIdentity.DESCRIPTOR, valid, frozenset({"index"})))
        gpu.index = i if valid else draw(edge_value(_field("GpuIdentity", "index")))
        h.gpus.append(gpu)
    return h


def _field_of(cls: Any, field: str) -> FieldDescriptor:
    return cls.DESCRIPTOR.fields_by_name[field]
