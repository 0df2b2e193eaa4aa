"""GPU samples as columns (telemetry.proto `GpuColumns`) and back.

A collector that says `Hello.columnar_gpus` sends a report's GPU samples as one array per field
over the node's GPUs instead of one `GpuSample` message per GPU: the aggregator then checks and
stores a whole column at a time (aggregator/ingest/columns.py) instead of walking every field
of every GPU in Python (docs/architecture.md "Columnar GPU samples"). Numbers travel as
little-endian fixed-width arrays in `bytes`: `struct` reads a whole block in one C call.

Which fields go in which block is read from GpuSample's descriptor, so a field added to
GpuSample travels in columns with no change here: doubles as float64, integers (uint32, uint64)
as int64, bools as one byte each; `driver_unresponsive_call` is the one text field, `processes`
the one repeated field. Absent stays absent: the presence bitmap says which GPU carries which
field, and an absent slot holds 0."""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Sequence
from functools import lru_cache

from google.protobuf.descriptor import FieldDescriptor

from gpufleet.protos import telemetry_pb2

_D = telemetry_pb2.GpuSample.DESCRIPTOR
IDENTITY = ("index", "uuid", "model", "pci_bus_id", "lost")
TEXT_FIELD = "driver_unresponsive_call"
_SCALAR = [f for f in _D.fields if f.name not in IDENTITY and f.name != TEXT_FIELD and not f.is_repeated]
DOUBLE = frozenset(f.number for f in _SCALAR if f.type == FieldDescriptor.TYPE_DOUBLE)
BOOL = frozenset(f.number for f in _SCALAR if f.type == FieldDescriptor.TYPE_BOOL)
INTEGER = frozenset(f.number for f in _SCALAR if f.number not in DOUBLE and f.number not in BOOL)
NAME = {f.number: f.name for f in _SCALAR}
_NUMBER = {f.name: f.number for f in _SCALAR}


def to_columns(samples: Sequence[telemetry_pb2.GpuSample]) -> telemetry_pb2.GpuColumns:
    """The samples (one per GPU) as one GpuColumns; every field any of them carries gets a column."""
    n = len(samples)
    carried = [{fd.number: v for fd, v in s.ListFields() if fd.number in NAME} for s in samples]
    numbers = set().union(*carried) if carried else set()
    doubles = sorted(numbers & DOUBLE)
    integers = sorted(numbers & INTEGER)
    bools = sorted(numbers & BOOL)
    order = doubles + integers + bools
    present = bytearray((len(order) * n + 7) // 8)
    everywhere = True
    for k, number in enumerate(order):
        for i, values in enumerate(carried):
            if number in values:
                bit = k * n + i
                present[bit >> 3] |= 1 << (bit & 7)
            else:
                everywhere = False

    def block(fields: list[int]) -> list[object]:
        return [values.get(number, 0) for number in fields for values in carried]

    # int64 on the wire: a uint64 past int64 (never a real count) arrives negative, and is refused.
    wrapped = [v if v < 2**63 else v - 2**64 for v in block(integers)]

    cols = telemetry_pb2.GpuColumns(
        count=n,
        index=[s.index for s in samples],
        uuid=[s.uuid for s in samples],
        model=[s.model for s in samples],
        pci_bus_id=[s.pci_bus_id for s in samples],
        lost=bytes(int(s.lost) for s in samples),
        double_fields=doubles,
        doubles=struct.pack(f"<{len(doubles) * n}d", *block(doubles)),
        integer_fields=integers,
        integers=struct.pack(f"<{len(integers) * n}q", *wrapped),
        bool_fields=bools,
        bools=bytes(int(bool(v)) for v in block(bools)),
        present=b"" if everywhere else bytes(present),
    )
    if any(s.driver_unresponsive_call for s in samples):
        cols.driver_unresponsive_call.extend(s.driver_unresponsive_call for s in samples)
    processes = [(s.index, p) for s in samples for p in s.processes]
    if processes:
        memory = [p.used_memory_bytes for _, p in processes]
        cols.process_gpu_index.extend(index for index, _ in processes)
        cols.process_pid.extend(p.pid for _, p in processes)
        cols.process_used_memory_bytes = struct.pack(
            f"<{len(memory)}q", *(v if v < 2**63 else v - 2**64 for v in memory)
        )
        if not all(p.HasField("used_memory_bytes") for _, p in processes):
            present = bytearray((len(processes) + 7) // 8)
            for k, (_, p) in enumerate(processes):
                if p.HasField("used_memory_bytes"):
                    present[k >> 3] |= 1 << (k & 7)
            cols.process_used_memory_present = bytes(present)
    return cols


def has_bit(bitmap: bytes, bit: int) -> bool:
    """Whether a presence bitmap (least significant bit first; empty: all set) has this bit."""
    return not bitmap or bool(bitmap[bit >> 3] >> (bit & 7) & 1)


def getter(at: list[int]) -> Callable[[tuple], tuple]:
    """The items at these positions, always as a tuple (itemgetter gives a bare item for one)."""
    if not at:
        return lambda _values: ()
    if len(at) == 1:
        only = at[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*at)


class Layout:
    """One report's column layout (fields, GPU count, presence), worked out once and reused:
    a node sends the same layout in every report. `gpus[i]` is GPU i's (field names, positions
    of its values in the concatenated doubles + integers + bools, as a getter)."""

    __slots__ = ("bools", "count", "doubles", "gpus", "integers", "names", "order", "present")

    def __init__(
        self,
        doubles: tuple[int, ...],
        integers: tuple[int, ...],
        bools: tuple[int, ...],
        count: int,
        present: bytes,
    ) -> None:
        self.doubles, self.integers, self.bools, self.count, self.present = (
            doubles,
            integers,
            bools,
            count,
            present,
        )
        self.order = doubles + integers + bools
        self.names = tuple(NAME[number] for number in self.order)
        self.gpus: list[tuple[tuple[str, ...], Callable[[tuple], tuple]]] = []
        for i in range(count):
            at = [k * count + i for k in range(len(self.order)) if self.has(k, i)]
            self.gpus.append((tuple(self.names[p // count] for p in at), getter(at)))

    def has(self, k: int, i: int) -> bool:
        """Whether GPU i carries the k-th field."""
        return has_bit(self.present, k * self.count + i)


@lru_cache(maxsize=4096)
def layout(
    doubles: tuple[int, ...], integers: tuple[int, ...], bools: tuple[int, ...], count: int, present: bytes
) -> Layout:
    """The (bounded, cached) Layout of these arguments; they must already be checked."""
    return Layout(doubles, integers, bools, count, present)


def values(cols: telemetry_pb2.GpuColumns) -> tuple:
    """Every value of the numeric columns, field by field: doubles, then integers, then bools
    (as bool). The block lengths must already be checked."""
    n = cols.count
    d = struct.unpack(f"<{len(cols.double_fields) * n}d", cols.doubles)
    q = struct.unpack(f"<{len(cols.integer_fields) * n}q", cols.integers)
    return d + q + tuple(map(bool, cols.bools))


def of(cols: telemetry_pb2.GpuColumns) -> Layout:
    return layout(
        tuple(cols.double_fields),
        tuple(cols.integer_fields),
        tuple(cols.bool_fields),
        cols.count,
        cols.present,
    )


def to_samples(cols: telemetry_pb2.GpuColumns) -> list[telemetry_pb2.GpuSample]:
    """The per-GPU samples a (checked) GpuColumns holds, as `NodeReport.gpus` would carry them."""
    vals = values(cols)
    texts = list(cols.driver_unresponsive_call)
    out = []
    for (names, get), index, uuid, model, bus, lost in zip(
        of(cols).gpus, cols.index, cols.uuid, cols.model, cols.pci_bus_id, cols.lost, strict=True
    ):
        sample = telemetry_pb2.GpuSample(
            index=index,
            uuid=uuid,
            model=model,
            pci_bus_id=bus,
            lost=bool(lost),
            **dict(zip(names, get(vals), strict=True)),
        )
        out.append(sample)
    if cols.process_gpu_index:
        by_index = {s.index: s for s in out}
        memory = struct.unpack(f"<{len(cols.process_pid)}q", cols.process_used_memory_bytes)
        for k, (index, pid) in enumerate(zip(cols.process_gpu_index, cols.process_pid, strict=True)):
            process = by_index[index].processes.add(pid=pid)
            if has_bit(cols.process_used_memory_present, k):
                process.used_memory_bytes = memory[k]
    if texts:
        for sample, text in zip(out, texts, strict=True):
            if text:
                sample.driver_unresponsive_call = text
    return out


def number_of(name: str) -> int:
    """The GpuSample field number of a measurement carried in columns."""
    return _NUMBER[name]
