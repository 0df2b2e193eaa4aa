"""What every field of every message a collector sends may hold: one table of rules, checked
against the proto descriptors.

The table says, for each field (`Message.field`), what both stores can hold and what is sane:
integers within int64 (SQLite cannot hold an integer ≥ 2^63; InfluxDB's integers are int64)
and within the field's own range, doubles finite and within range, strings bounded and free of
the characters that break line protocol or a tag, enums one of their defined values, repeated
fields bounded. Measurement fields take their range from `schema.METRICS`, so a metric's
plausible range is written once.

`WireValidator` compiles the table against the descriptors at start-up and refuses to start if
a field has no rule (tests/ingest/test_wire_rules.py walks the descriptors for the same reason: a
field added to a .proto without a rule fails the suite). Checking walks only the fields a
message actually carries (`ListFields`), so an absent optional field costs nothing.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from gpufleet.aggregator.ingest.schema import INT64_MAX, METRICS
from gpufleet.protos import ingest_pb2, telemetry_pb2
from gpufleet.protos.columns import getter
from gpufleet.protos.limits import (
    MAX_ENGINES_PER_REPORT,
    MAX_EVENTS_PER_REPORT,
    MAX_GPUS_PER_NODE,
    MAX_PIDS_PER_WORKLOAD,
    MAX_PROCESSES_PER_GPU,
    MAX_WORKLOADS_PER_REPORT,
)

UINT32_MAX = 2**32 - 1
MAX_COLUMNS = 128  # measurement columns in one GpuColumns: GpuSample has fewer scalar fields
# Compute processes on one node's GPUs, in one report's columns (each GPU also at most
# MAX_PROCESSES_PER_GPU): far beyond any real node, and within the repeated-field bound of 4,096.
MAX_PROCESSES_PER_NODE = 4096
MAX_NAME = 253  # a DNS name: node and cluster names
_TIB = 1 << 40

# C0 and C1 control characters and DEL: never in a tag (line protocol ends a line at a newline
# and InfluxDB keeps no escape for the others); a backslash neither (a tag value ending in one
# escapes the separator after it). Free text may hold a tab, nothing else of these.
_TAG_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")
_TEXT_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


class Rejection(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason  # bounded label: bad_value, gpu_index, node_mismatch, ...
        self.message = message


@dataclass(frozen=True)
class Num:
    """An integer or double field: finite and within low..high (inclusive)."""

    low: float
    high: float
    unit: str = ""


@dataclass(frozen=True)
class Text:
    """A string of at most max_len characters. tag: stored as a tag or name (no control
    characters, no backslash, no surrounding spaces); otherwise free text (a tab allowed)."""

    max_len: int
    tag: bool = False


@dataclass(frozen=True)
class Blob:
    """Bytes, at most max_len of them; what they hold is checked where they are read (the GPU
    columns: aggregator/ingest/columns.py)."""

    max_len: int


@dataclass(frozen=True)
class Flag:
    """A bool: every value is fine."""


@dataclass(frozen=True)
class Known:
    """An enum: one of its defined values."""


@dataclass(frozen=True)
class Nested:
    """A message field: its own fields are checked by their own rules."""


@dataclass(frozen=True)
class Many:
    """A repeated field: at most max_items, each checked by `each`."""

    max_items: int
    each: Num | Text | Nested
    code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason: str = "oversized"


Rule = Num | Text | Blob | Flag | Known | Nested | Many


def _metric_rules(message: str, fields: list[str]) -> dict[str, Rule]:
    """A measurement field's range is the metric's (schema.METRICS); bools are flags."""
    descriptor = getattr(telemetry_pb2, message).DESCRIPTOR
    out: dict[str, Rule] = {}
    for name in fields:
        if descriptor.fields_by_name[name].type == FieldDescriptor.TYPE_BOOL:
            out[f"{message}.{name}"] = Flag()
        else:
            m = METRICS[name]
            out[f"{message}.{name}"] = Num(m.low, m.high, m.unit)
    return out


_GPU_METRICS = [
    f.name for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields if f.name in METRICS and f.name != "lost"
]
_ENGINE_METRICS = [f.name for f in telemetry_pb2.EngineSample.DESCRIPTOR.fields if f.name in METRICS]
_STATS_METRICS = [f.name for f in telemetry_pb2.CollectorStats.DESCRIPTOR.fields]  # each in METRICS
_COUNTER = Num(0, INT64_MAX)

# The one table. Keys are `Message.field` of every message reachable from CollectorMessage.
RULES: dict[str, Rule] = {
    "CollectorMessage.hello": Nested(),
    "CollectorMessage.report": Nested(),
    "CollectorMessage.command_result": Nested(),
    # Hello
    "Hello.protocol_version": Num(0, UINT32_MAX),  # which versions are spoken: check_hello
    "Hello.node": Text(MAX_NAME, tag=True),
    "Hello.cluster": Text(MAX_NAME, tag=True),
    "Hello.boot_id": Text(64, tag=True),
    "Hello.collector_version": Text(64, tag=True),
    "Hello.interval_s": Num(0.05, 3600, "s"),
    "Hello.gpus": Many(MAX_GPUS_PER_NODE, Nested(), grpc.StatusCode.INVALID_ARGUMENT, "gpu_count"),
    "Hello.driver_version": Text(64, tag=True),
    "Hello.simulated": Flag(),
    "Hello.columnar_gpus": Flag(),
    "GpuIdentity.index": Num(0, MAX_GPUS_PER_NODE - 1),
    "GpuIdentity.uuid": Text(96, tag=True),
    "GpuIdentity.model": Text(128, tag=True),
    "GpuIdentity.pci_bus_id": Text(32, tag=True),
    "GpuIdentity.hbm_total_bytes": Num(0, 16 * _TIB, "bytes"),
    # NodeReport
    "NodeReport.node": Text(MAX_NAME, tag=True),
    "NodeReport.cluster": Text(MAX_NAME, tag=True),
    "NodeReport.boot_id": Text(64, tag=True),
    "NodeReport.seq": Num(1, INT64_MAX),
    "NodeReport.time_unix_ns": Num(1, INT64_MAX, "ns"),  # and within retention: check_report
    "NodeReport.interval_s": Num(0, 3600, "s"),
    "NodeReport.gpus": Many(MAX_GPUS_PER_NODE, Nested(), grpc.StatusCode.INVALID_ARGUMENT, "gpu_index"),
    "NodeReport.engines": Many(MAX_ENGINES_PER_REPORT, Nested()),
    "NodeReport.events": Many(MAX_EVENTS_PER_REPORT, Nested()),
    "NodeReport.stats": Nested(),
    "NodeReport.gpus_on_pci_bus": Num(0, 1024, "GPUs"),
    "NodeReport.gpu_columns": Nested(),  # its arrays: aggregator/ingest/columns.py
    # The names' grammar and the GPUs against the hello: aggregator/ingest/validation.py
    # (a bad workload is dropped from its report, not the report refused).
    "NodeReport.workloads": Many(MAX_WORKLOADS_PER_REPORT, Nested()),
    "WorkloadSample.scheduler": Text(16),
    "WorkloadSample.id": Text(127),
    "WorkloadSample.part": Text(127),
    "WorkloadSample.gpu_indices": Many(MAX_GPUS_PER_NODE, Num(0, MAX_GPUS_PER_NODE - 1)),
    "WorkloadSample.pids": Many(MAX_PIDS_PER_WORKLOAD, Num(0, 2**31 - 1)),
    "WorkloadSample.process_count": Num(0, MAX_PROCESSES_PER_GPU * MAX_GPUS_PER_NODE),
    "WorkloadSample.hbm_used_bytes": Num(0, 1024 * _TIB, "bytes"),
    "WorkloadSample.source": Text(16),
    # GpuColumns: sizes here; what the arrays hold (each value against its GpuSample field's
    # rule, each array's length against count) is checked in bulk by aggregator/ingest/columns.py.
    "GpuColumns.count": Num(0, MAX_GPUS_PER_NODE),
    "GpuColumns.index": Many(
        MAX_GPUS_PER_NODE, Num(0, MAX_GPUS_PER_NODE - 1), grpc.StatusCode.INVALID_ARGUMENT, "gpu_index"
    ),
    "GpuColumns.uuid": Many(
        MAX_GPUS_PER_NODE, Text(96, tag=True), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.model": Many(
        MAX_GPUS_PER_NODE, Text(128, tag=True), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.pci_bus_id": Many(
        MAX_GPUS_PER_NODE, Text(32, tag=True), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.lost": Blob(MAX_GPUS_PER_NODE),
    "GpuColumns.double_fields": Many(
        MAX_COLUMNS, Num(1, 536_870_911), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.doubles": Blob(MAX_COLUMNS * MAX_GPUS_PER_NODE * 8),
    "GpuColumns.integer_fields": Many(
        MAX_COLUMNS, Num(1, 536_870_911), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.integers": Blob(MAX_COLUMNS * MAX_GPUS_PER_NODE * 8),
    "GpuColumns.bool_fields": Many(
        MAX_COLUMNS, Num(1, 536_870_911), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.bools": Blob(MAX_COLUMNS * MAX_GPUS_PER_NODE),
    "GpuColumns.present": Blob((MAX_COLUMNS * MAX_GPUS_PER_NODE + 7) // 8),
    "GpuColumns.driver_unresponsive_call": Many(
        MAX_GPUS_PER_NODE, Text(64), grpc.StatusCode.INVALID_ARGUMENT, "columns"
    ),
    "GpuColumns.process_gpu_index": Many(
        MAX_PROCESSES_PER_NODE, Num(0, MAX_GPUS_PER_NODE - 1), grpc.StatusCode.RESOURCE_EXHAUSTED, "oversized"
    ),
    "GpuColumns.process_pid": Many(MAX_PROCESSES_PER_NODE, Num(0, UINT32_MAX)),
    "GpuColumns.process_used_memory_bytes": Blob(MAX_PROCESSES_PER_NODE * 8),
    "GpuColumns.process_used_memory_present": Blob((MAX_PROCESSES_PER_NODE + 7) // 8),
    # GpuSample: identity, then every measurement from METRICS
    "GpuSample.index": Num(0, MAX_GPUS_PER_NODE - 1),
    "GpuSample.uuid": Text(96, tag=True),
    "GpuSample.model": Text(128, tag=True),
    "GpuSample.pci_bus_id": Text(32, tag=True),
    "GpuSample.lost": Flag(),
    "GpuSample.processes": Many(MAX_PROCESSES_PER_GPU, Nested()),
    "GpuSample.driver_unresponsive_call": Text(64),  # an NVML function name; never a tag
    **_metric_rules("GpuSample", _GPU_METRICS),
    "GpuProcess.pid": Num(0, UINT32_MAX),
    "GpuProcess.used_memory_bytes": Num(0, 16 * _TIB, "bytes"),
    # EngineSample
    "EngineSample.engine": Text(32, tag=True),
    "EngineSample.model": Text(MAX_NAME, tag=True),
    "EngineSample.pool": Text(MAX_NAME, tag=True),
    "EngineSample.port": Num(0, 65535),
    "EngineSample.endpoint": Text(2048),
    "EngineSample.gpu_indices": Many(
        MAX_GPUS_PER_NODE, Num(0, MAX_GPUS_PER_NODE - 1), grpc.StatusCode.INVALID_ARGUMENT, "gpu_index"
    ),
    "EngineSample.readable": Flag(),
    "EngineSample.unreadable_reason": Text(1024),
    **_metric_rules("EngineSample", _ENGINE_METRICS),
    # Event
    "Event.kind": Known(),
    "Event.source": Known(),
    "Event.time_unix_ns": Num(0, INT64_MAX, "ns"),  # 0: the report's time; else within retention
    "Event.gpu_index": Num(0, MAX_GPUS_PER_NODE - 1),
    "Event.pci_bus_id": Text(32),
    "Event.xid": Num(0, 1_000_000),
    "Event.message": Text(4096),
    "Event.pid": Num(0, 2**31 - 1),  # pid_t is a signed 32-bit integer on Linux
    "Event.process_name": Text(256),
    "Event.count": _COUNTER,  # a folded storm: 100,000 lines a second for years stays far below
    "Event.first_time_unix_ns": Num(0, INT64_MAX, "ns"),  # checked against time_unix_ns in validation
    "Event.kmsg_seq": _COUNTER,
    "Event.kernel_boot_id": Text(64),
    # CollectorStats: the collector's own health, every field a metric
    **_metric_rules("CollectorStats", _STATS_METRICS),
    # CommandResult
    "CommandResult.id": Text(64, tag=True),
    "CommandResult.outcome": Known(),
    "CommandResult.detail": Text(4096),
}


def reachable(root: Descriptor) -> Iterator[Descriptor]:
    """Every message type reachable from root (root included), each once."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        d = todo.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        yield d
        todo.extend(f.message_type for f in d.fields if f.message_type is not None)


class MissingRule(LookupError):
    """A wire field without an entry in RULES (a .proto changed without its rule)."""


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def num_why(value: float, rule: Num) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    if not rule.low <= value <= rule.high:
        return f"is outside {_fmt(rule.low)}..{_fmt(rule.high)} {rule.unit}".rstrip()
    return None


def text_why(value: str, rule: Text) -> str | None:
    if len(value) > rule.max_len:
        return f"is {len(value)} characters; at most {rule.max_len}"
    bad = (_TAG_BAD if rule.tag else _TEXT_BAD).search(value)
    if bad:
        return f"holds {bad.group()!r} at {bad.start()}: no control characters" + (
            " or backslashes" if rule.tag else ""
        )
    if rule.tag and value != value.strip():
        return "has surrounding spaces"
    return None


# A check gets (value, path) and returns None or (path, value, why).
_Check = Callable[[object, str], "tuple[str, object, str] | None"]


_NUM, _TEXT, _TAG, _FLAG, _ENUM, _MSG, _BLOB = range(7)
_TYPE_RANGE = {FieldDescriptor.TYPE_UINT32: (0, UINT32_MAX)}
_GOOD_TEXT_MAX = 100_000
# (kind, repeated, max items, a, b, field name): Num a..b; Text/tag max length a; enum values a.
_Spec = tuple[int, bool, int, object, object, str]


_SHAPES_MAX = 4096
ValuesFn = Callable[[Message], "tuple[dict, tuple] | None"]  # see WireValidator.values_for
_GOOD_TAGS_MAX = 400_000  # about 50,000 nodes x 8 GPUs; cleared when full (then only slower)


class _Shape:
    """The checks and copy for messages of one type carrying one set of fields."""

    __slots__ = (
        "_defaults",
        "_highs",
        "_ident",
        "_lows",
        "_nums",
        "_other",
        "_out",
        "_out_names",
        "_tag_max",
        "_tags",
        "_text_max",
        "_texts",
        "_validator",
    )

    def __init__(
        self,
        validator: WireValidator,
        specs: list[_Spec],
        wanted: frozenset[str],
        identity: tuple[tuple[str, object], ...] = (),
    ) -> None:
        self._validator = validator
        # identity: (field, default) pairs read out as a tuple beside the values, the default
        # standing in for a field the message does not carry (proto3 leaves zeros unset).
        names = [spec[5] for spec in specs]
        absent = [(n, d) for n, d in identity if n not in names]
        self._defaults = tuple(d for _, d in absent)
        where = {n: i for i, n in enumerate(names)} | {n: len(names) + k for k, (n, _) in enumerate(absent)}
        self._ident = getter([where[n] for n, _ in identity])
        nums, tags, texts, other, out = [], [], [], [], []
        self._lows: list[object] = []
        self._highs: list[object] = []
        self._tag_max: list[object] = []
        self._text_max: list[object] = []
        for i, spec in enumerate(specs):
            kind, many, _, a, b, name = spec
            if name in wanted:
                out.append(i)
            if many or kind in (_ENUM, _MSG):
                other.append((i, spec))
            elif kind == _NUM:
                nums.append(i)
                self._lows.append(a)
                self._highs.append(b)
            elif kind == _TAG:
                tags.append(i)
                self._tag_max.append(a)
            elif kind == _TEXT:
                texts.append(i)
                self._text_max.append(a)
        self._nums, self._tags, self._texts = getter(nums), getter(tags), getter(texts)
        self._other = other
        self._out = getter(out)
        self._out_names = [specs[i][5] for i in out]

    def values(self, vals: tuple) -> dict | None:
        nums = self._nums(vals)
        # False for NaN too: every comparison with NaN is False.
        if not (all(map(operator.le, self._lows, nums)) and all(map(operator.le, nums, self._highs))):
            return None
        tags = self._tags(vals)
        if tags:
            # The same GPU sends the same uuid, model and bus id in every report: a tuple of tags
            # that passed for this shape passes again (one set lookup). Otherwise text_why's
            # tests, a C-level loop each: the length, a bad character, surrounding spaces.
            known = (self, tags)
            good = self._validator._good_tags
            if known not in good:
                if (
                    not all(map(operator.ge, self._tag_max, map(len, tags)))
                    or any(map(_TAG_BAD.search, tags))
                    or tuple(map(str.strip, tags)) != tags
                ):
                    return None
                if len(good) >= _GOOD_TAGS_MAX:
                    good.clear()
                good.add(known)
        texts = self._texts(vals)
        if texts and (
            not all(map(operator.ge, self._text_max, map(len, texts))) or any(map(_TEXT_BAD.search, texts))
        ):
            return None
        for i, spec in self._other:
            if not self._validator._field_ok(spec, vals[i]):
                return None
        return dict(zip(self._out_names, self._out(vals)))  # noqa: B905 (equal lengths by construction)

    def checked(self, vals: tuple) -> tuple[dict, tuple] | None:
        """(values, identity fields in the order asked for, defaults for those not carried),
        or None if a field breaks its rule."""
        found = self.values(vals)
        return None if found is None else (found, self._ident(vals + self._defaults))


class WireValidator:
    """RULES compiled against the descriptors. check(message) answers in two steps: `ok`, a
    tight loop over the fields a message carries (this runs for every report: no function
    call, path or message is built for a field that passes), and only when that says no,
    `find`, which names the first bad field, its value and the rule it breaks. A test checks
    that both always agree."""

    def __init__(self, root: Descriptor = ingest_pb2.CollectorMessage.DESCRIPTOR) -> None:
        self._checks: dict[str, dict[str, _Check]] = {}
        # Keyed by the field descriptor ListFields hands back (the same object every time):
        # no field-name string is made per field checked.
        self._specs: dict[str, dict[FieldDescriptor, _Spec]] = {}
        # Tag and text values whose characters passed (bounded; lengths are checked every time,
        # per field): the same GPU model, uuid and bus id come in every report, so their
        # character checks run once, not once per report.
        self._good_text: set[tuple[int, str]] = set()
        self._good_tags: set[tuple[_Shape, tuple[str, ...]]] = set()
        self._values_fns: dict[tuple[str, frozenset[str]], ValuesFn] = {}
        missing = []
        for d in reachable(root):
            table: dict[str, _Check] = {}
            specs: dict[FieldDescriptor, _Spec] = {}
            for f in d.fields:
                rule = RULES.get(f"{d.name}.{f.name}")
                if rule is None:
                    missing.append(f"{d.name}.{f.name}")
                    continue
                table[f.name] = self._compile(f, rule)
                specs[f] = self._spec(f, rule)
            self._checks[d.full_name] = table
            self._specs[d.full_name] = specs
        if missing:
            raise MissingRule(
                f"wire fields without a rule in aggregator/ingest/wire_rules.py RULES: {', '.join(missing)}"
            )

    @staticmethod
    def _spec(f: FieldDescriptor, rule: Rule) -> _Spec:
        many = isinstance(rule, Many)
        max_items = rule.max_items if isinstance(rule, Many) else 0
        one = rule.each if isinstance(rule, Many) else rule
        if isinstance(one, Num):
            if f.type in _TYPE_RANGE and (one.low, one.high) == _TYPE_RANGE[f.type]:
                return (_FLAG, many, max_items, None, None, f.name)  # every value its type holds is fine
            return (_NUM, many, max_items, one.low, one.high, f.name)
        if isinstance(one, Text):
            return (_TAG if one.tag else _TEXT, many, max_items, one.max_len, None, f.name)
        if isinstance(one, Known):
            return (_ENUM, many, max_items, frozenset(f.enum_type.values_by_number), None, f.name)
        if isinstance(one, Nested):
            return (_MSG, many, max_items, None, None, f.name)
        if isinstance(one, Blob):
            return (_BLOB, many, max_items, one.max_len, None, f.name)
        return (_FLAG, many, max_items, None, None, f.name)

    def _text_ok(self, kind: int, max_len: object, value: str) -> bool:
        # The length is the field's own; the characters allowed depend only on the kind, so
        # that is what the cache of good values remembers.
        if len(value) > max_len:  # type: ignore[operator]
            return False
        if (kind, value) in self._good_text:
            return True
        if text_why(value, Text(max_len, tag=kind == _TAG)) is not None:  # type: ignore[arg-type]
            return False
        if len(self._good_text) >= _GOOD_TEXT_MAX:
            self._good_text.clear()
        self._good_text.add((kind, value))
        return True

    def _value_ok(self, kind: int, a: object, b: object, v: object) -> bool:
        if kind == _NUM:
            return a <= v <= b  # type: ignore[operator]  # False for NaN too
        if kind == _MSG:
            return self.ok(v)  # type: ignore[arg-type]
        if kind in (_TAG, _TEXT):
            return self._text_ok(kind, a, v)  # type: ignore[arg-type]
        if kind == _ENUM:
            return v in a  # type: ignore[operator]
        if kind == _BLOB:
            return len(v) <= a  # type: ignore[arg-type,operator]
        return True

    def _field_ok(self, spec: _Spec, value: object) -> bool:
        kind, many, max_items, a, b, _ = spec
        if not many:
            return self._value_ok(kind, a, b, value)
        if len(value) > max_items:  # type: ignore[arg-type]
            return False
        if kind == _MSG:
            return all(map(self.ok, value))  # type: ignore[call-overload]
        if kind == _FLAG:
            return True
        return all(self._value_ok(kind, a, b, v) for v in value)  # type: ignore[attr-defined]

    def ok(self, msg: Message, skip: frozenset[str] = frozenset()) -> bool:
        """True if every field the message carries (at any depth) keeps its rule; the message
        fields named in skip (top level only) are left to the caller (see values)."""
        specs = self._specs[msg.DESCRIPTOR.full_name]
        for fd, value in msg.ListFields():
            spec = specs[fd]
            if spec[0] == _NUM and not spec[1]:  # most fields: a number, checked inline
                if not spec[3] <= value <= spec[4]:  # type: ignore[operator]  # False for NaN too
                    return False
            elif spec[5] not in skip and not self._field_ok(spec, value):
                return False
        return True

    def values_for(
        self, descriptor: Descriptor, wanted: frozenset[str], identity: tuple[tuple[str, object], ...] = ()
    ) -> ValuesFn:
        """A function doing ok(msg) for messages of this type and, in the same pass, copying the
        values of the fields in wanted (what is stored of it) and reading the identity fields
        ((name, default) pairs); it returns (values, identity), or None if a field breaks its
        rule. Each GPU sample of every report goes through it, so it does no Python work per
        field: the fields a message carries (its *shape*: which fields are set) are compiled once
        into getters and bound tuples, and a message of a known shape is checked with C-level
        loops (`map` over `operator.le`, one regex search per string) and copied with one zip."""
        specs = self._specs[descriptor.full_name]
        shapes: dict[tuple[FieldDescriptor, ...], _Shape] = {}
        empty: tuple = ()

        def values(msg: Message) -> tuple[dict, tuple] | None:
            listed = msg.ListFields()
            fds, vals = zip(*listed) if listed else (empty, empty)  # noqa: B905 (pairs)
            shape = shapes.get(fds)
            if shape is None:
                if len(shapes) >= _SHAPES_MAX:  # bounded: an attacker varying shapes costs only speed
                    shapes.clear()
                shape = shapes[fds] = _Shape(self, [specs[fd] for fd in fds], wanted, identity)
            return shape.checked(vals)

        return values

    def values(self, msg: Message, wanted: frozenset[str]) -> dict[str, object] | None:
        """ok(msg), and the values of the fields in wanted; None if a field breaks its rule."""
        key = (msg.DESCRIPTOR.full_name, wanted)
        fn = self._values_fns.get(key)
        if fn is None:
            fn = self._values_fns[key] = self.values_for(msg.DESCRIPTOR, wanted)
        found = fn(msg)
        return None if found is None else found[0]

    def _compile(self, f: FieldDescriptor, rule: Rule) -> _Check:
        if isinstance(rule, Many):
            each = self._compile_one(f, rule.each)

            def many(values: object, path: str) -> tuple[str, object, str] | None:
                items = list(values)  # type: ignore[call-overload]
                if len(items) > rule.max_items:
                    return path, len(items), f"is more than {rule.max_items}"
                for i, item in enumerate(items):
                    bad = each(item, f"{path}[{i}]")
                    if bad:
                        return bad
                return None

            return many
        return self._compile_one(f, rule)

    def _compile_one(self, f: FieldDescriptor, rule: Rule) -> _Check:
        if isinstance(rule, Num):
            return lambda v, path: (path, v, why) if (why := num_why(v, rule)) else None  # type: ignore[arg-type]
        if isinstance(rule, Text):
            return lambda v, path: (path, v, why) if (why := text_why(v, rule)) else None  # type: ignore[arg-type]
        if isinstance(rule, Flag):
            return lambda v, path: None
        if isinstance(rule, Blob):
            return lambda v, path: (  # type: ignore[arg-type,return-value]
                (f"{path} (length)", len(v), f"is over the limit of {rule.max_len} bytes")
                if len(v) > rule.max_len  # type: ignore[arg-type]
                else None
            )
        if isinstance(rule, Known):
            names = f.enum_type.values_by_number

            def known(v: object, path: str) -> tuple[str, object, str] | None:
                if v in names:
                    return None
                return path, v, f"is no {f.enum_type.name} value ({', '.join(map(str, sorted(names)))})"

            return known
        if isinstance(rule, Nested):
            return lambda v, path: self.find(v, path)  # type: ignore[arg-type]
        raise TypeError(f"rule {rule!r} for {f.full_name} cannot apply to one value")

    def find(self, msg: Message, prefix: str = "") -> tuple[str, object, str] | None:
        """(field path, value, why) of the first field that breaks its rule, or None."""
        table = self._checks[msg.DESCRIPTOR.full_name]
        for fd, value in msg.ListFields():
            path = f"{prefix}.{fd.name}" if prefix else fd.name
            bad = table[fd.name](value, path)
            if bad:
                return bad
        return None

    def check(self, msg: Message, where: str) -> None:
        """Raise Rejection naming where, the field, the value and the rule it breaks."""
        if self.ok(msg):
            return
        bad = self.find(msg)
        if bad is None:  # ok and find disagree: a bug in this module; refuse rather than store
            raise Rejection(
                grpc.StatusCode.INTERNAL, "internal", f"{where} failed a wire rule no field names"
            )
        path, value, why = bad
        rule = self._rule_at(msg.DESCRIPTOR, path)
        code, reason = grpc.StatusCode.INVALID_ARGUMENT, "bad_value"
        if isinstance(rule, Many) and why.startswith("is more than"):
            raise Rejection(
                rule.code,
                rule.reason,
                f"{where} has {value} {path}, more than the {rule.max_items} accepted; refused",
            )
        elif isinstance(rule, Text) or (isinstance(rule, Many) and isinstance(rule.each, Text)):
            reason = "bad_text"
        if isinstance(value, str) and len(value) > 80:
            value = value[:80] + "…"
        raise Rejection(code, reason, f"{where} has {path}={value!r}, which {why}; refused")

    @staticmethod
    def _rule_at(root: Descriptor, path: str) -> Rule | None:
        d: Descriptor | None = root
        rule: Rule | None = None
        for part in path.split("."):
            name = part.split("[")[0]
            if d is None:
                return None
            rule = RULES.get(f"{d.name}.{name}")
            d = d.fields_by_name[name].message_type
        return rule
