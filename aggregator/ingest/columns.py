"""GPU samples that came as columns (telemetry.proto `GpuColumns`), checked and turned into
store rows in bulk (docs/architecture.md "Columnar GPU samples").

The per-GPU path walks every field of every GPU sample in Python (`ListFields`, a bound per
field). Here each block of numbers is read as one numpy array (`frombuffer`, no copy) and
checked with two comparisons against bounds laid out once per column layout (numpy: about half
the time of a C-level `map(operator.le, ...)` over 8 GPUs x 34 fields on this project's 2-core
machine): a node sends the same layout (fields, GPU count, presence) in every report, so the layout's
plan — each value's bounds, each GPU's field names and value positions — is worked out once
and cached. The checks are the per-GPU path's, value for value: each measurement against its
GpuSample field's rule in wire_rules.RULES, identity against the Hello, HBM used ≤ total, an
absent slot holding 0. A refusal names the GPU index, the field and the value. The rows are
built per GPU with one `zip` each, never a Python loop per field."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable

import grpc
import numpy as np

from gpufleet.aggregator.ingest.wire_rules import (
    MAX_GPUS_PER_NODE,
    MAX_PROCESSES_PER_GPU,
    RULES,
    UINT32_MAX,
    Flag,
    Num,
    Rejection,
    Text,
    num_why,
    text_why,
)
from gpufleet.protos import columns, ingest_pb2, telemetry_pb2

_PLANS_MAX = 4096  # layouts remembered (bounded: an attacker varying layouts costs only speed)
_GOOD_IDENTITIES_MAX = 100_000
# The GpuColumns fields this module checks itself; the wire rules check the rest (sizes).
CHECKED_HERE = frozenset(
    {
        "process_gpu_index",
        "index",
        "uuid",
        "model",
        "pci_bus_id",
        "double_fields",
        "integer_fields",
        "bool_fields",
        "driver_unresponsive_call",
    }
)
_ID_TEXT = (("uuid", Text(96, tag=True)), ("model", Text(128, tag=True)), ("pci_bus_id", Text(32, tag=True)))
_CALL_TEXT = Text(64)
_PROCESS_MEMORY = RULES["GpuProcess.used_memory_bytes"]
assert isinstance(_PROCESS_MEMORY, Num)
Row = tuple[dict, tuple]


def _invalid(reason: str, message: str) -> Rejection:
    return Rejection(grpc.StatusCode.INVALID_ARGUMENT, reason, message)


def _bounds(number: int) -> tuple[float, float, str]:
    rule = RULES[f"GpuSample.{columns.NAME[number]}"]
    if isinstance(rule, Num):
        return rule.low, rule.high, rule.unit
    assert isinstance(rule, Flag)
    return 0, UINT32_MAX, ""


class _Plan:
    """What one layout needs checked and how its rows are read out."""

    __slots__ = ("absent_bools", "bounds", "hbm", "highs", "layout", "lows", "units")

    def __init__(self, layout: columns.Layout) -> None:
        self.layout = layout
        n = layout.count
        numeric = layout.doubles + layout.integers
        lows, highs, units = [], [], []
        for k, number in enumerate(numeric):
            low, high, unit = _bounds(number)
            for i in range(n):
                present = layout.has(k, i)
                # An absent slot holds 0 and nothing else.
                lows.append(low if present else 0)
                highs.append(high if present else 0)
            units.append(unit)
        self.lows, self.highs, self.units = tuple(lows), tuple(highs), tuple(units)
        # The same bounds as arrays, one per block: float64 for the doubles, int64 for the
        # integers (every integer bound is within int64).
        split = len(layout.doubles) * n
        self.bounds = (
            (np.array(lows[:split], dtype="<f8"), np.array(highs[:split], dtype="<f8")),
            (np.array(lows[split:], dtype="<i8"), np.array(highs[split:], dtype="<i8")),
        )
        first_bool = len(numeric)
        self.absent_bools = [
            (k - first_bool) * n + i
            for k in range(first_bool, len(layout.order))
            for i in range(n)
            if not layout.has(k, i)
        ]
        # (GPU position, used slot, total slot) where a GPU carries both HBM figures.
        used, total = columns.number_of("hbm_used_bytes"), columns.number_of("hbm_total_bytes")
        self.hbm: list[tuple[int, int, int]] = []
        if used in layout.order and total in layout.order:
            ku, kt = layout.order.index(used), layout.order.index(total)
            self.hbm = [
                (i, ku * n + i, kt * n + i) for i in range(n) if layout.has(ku, i) and layout.has(kt, i)
            ]


class ColumnChecker:
    def __init__(self, identities: Callable[[list[tuple], ingest_pb2.Hello, str], None]) -> None:
        self._identities = identities  # Checker._check_gpu_identities: indices and the Hello's GPUs
        self._plans: dict[tuple, _Plan] = {}
        self._good_identities: set[tuple] = set()

    def rows(self, cols: telemetry_pb2.GpuColumns, hello: ingest_pb2.Hello, where: str) -> list[Row]:
        """Each GPU's checked values and (index, uuid, model, lost), as the per-GPU path gives
        them; Rejection naming the GPU, the field and the value."""
        n = cols.count
        plan = self._plan(cols, where)
        index, uuid, model, bus = (
            tuple(cols.index),
            tuple(cols.uuid),
            tuple(cols.model),
            tuple(cols.pci_bus_id),
        )
        self._check_identity(cols, index, uuid, model, bus, hello, where)
        if len(cols.lost) != n or (n and max(cols.lost) > 1):
            raise _invalid("columns", f"{where}: gpu_columns.lost must hold {n} bytes of 0 or 1")
        doubles = np.frombuffer(cols.doubles, dtype="<f8")
        integers = np.frombuffer(cols.integers, dtype="<i8")
        (dlow, dhigh), (ilow, ihigh) = plan.bounds
        # One comparison per block and bound; False for NaN too (every comparison with NaN is).
        numbers = tuple(doubles.tolist()) + tuple(integers.tolist())
        if not (
            ((doubles >= dlow) & (doubles <= dhigh)).all()
            and ((integers >= ilow) & (integers <= ihigh)).all()
        ):
            raise self._bad_number(plan, numbers, index, where)
        bools = cols.bools
        if bools and (max(bools) > 1 or any(bools[p] for p in plan.absent_bools)):
            raise _invalid(
                "bad_value", f"{where}: gpu_columns.bools must hold 0 or 1, and 0 where a GPU has no value"
            )
        for i, used, total in plan.hbm:
            if numbers[used] > numbers[total]:
                raise _invalid(
                    "bad_value",
                    f"{where} has GPU {index[i]} hbm_used_bytes={numbers[used]} (gpu_columns) above "
                    f"hbm_total_bytes={numbers[total]}",
                )
        texts = self._texts(cols, n, where)
        self._check_processes(cols, index, where)
        values = numbers + tuple(map(bool, bools))
        rows = []
        for i, (names, get) in enumerate(plan.layout.gpus):
            found = dict(zip(names, get(values), strict=True))
            if texts and texts[i]:
                found[columns.TEXT_FIELD] = texts[i]
            rows.append((found, (index[i], uuid[i], model[i], bool(cols.lost[i]))))
        return rows

    def _plan(self, cols: telemetry_pb2.GpuColumns, where: str) -> _Plan:
        key = (
            tuple(cols.double_fields),
            tuple(cols.integer_fields),
            tuple(cols.bool_fields),
            cols.count,
            cols.present,
        )
        plan = self._plans.get(key)
        if plan is None:
            plan = self._new_plan(cols, key, where)
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            self._plans[key] = plan
        n = cols.count
        if len(cols.doubles) != 8 * n * len(key[0]) or len(cols.integers) != 8 * n * len(key[1]):
            raise _invalid(
                "columns",
                f"{where}: gpu_columns.doubles and .integers must hold 8 bytes per GPU ({n}) and field "
                f"({len(key[0])} and {len(key[1])}); they hold {len(cols.doubles)} and {len(cols.integers)}",
            )
        if len(cols.bools) != n * len(key[2]):
            raise _invalid("columns", f"{where}: gpu_columns.bools must hold {n * len(key[2])} bytes")
        return plan

    def _new_plan(self, cols: telemetry_pb2.GpuColumns, key: tuple, where: str) -> _Plan:
        doubles, integers, bools, n, present = key
        if n > MAX_GPUS_PER_NODE:
            raise _invalid("gpu_index", f"{where}: gpu_columns.count={n}; at most {MAX_GPUS_PER_NODE} GPUs")
        for fields, kind, allowed in (
            (doubles, "double", columns.DOUBLE),
            (integers, "integer", columns.INTEGER),
            (bools, "bool", columns.BOOL),
        ):
            wrong = [f for f in fields if f not in allowed]
            if wrong:
                raise _invalid(
                    "columns",
                    f"{where}: gpu_columns.{kind}_fields holds {wrong[0]}, which is no {kind} measurement "
                    "of GpuSample (a field number of telemetry.proto)",
                )
        order = doubles + integers + bools
        if len(set(order)) != len(order):
            raise _invalid("columns", f"{where}: gpu_columns names a field twice")
        if present and len(present) != (len(order) * n + 7) // 8:
            raise _invalid(
                "columns",
                f"{where}: gpu_columns.present must be empty or {(len(order) * n + 7) // 8} bytes "
                f"(a bit per field and GPU); it is {len(present)}",
            )
        return _Plan(columns.layout(doubles, integers, bools, n, present))

    def _check_identity(
        self,
        cols: telemetry_pb2.GpuColumns,
        index: tuple,
        uuid: tuple,
        model: tuple,
        bus: tuple,
        hello: ingest_pb2.Hello,
        where: str,
    ) -> None:
        """Identity arrays one per GPU, their texts within their rules, the GPUs the Hello
        declared: once per node boot and identity (the same GPUs come in every report)."""
        key = (hello.node, hello.boot_id, index, uuid, model, bus)
        if key in self._good_identities:
            return
        n = cols.count
        if not len(index) == len(uuid) == len(model) == len(bus) == n:
            raise _invalid(
                "columns",
                f"{where}: gpu_columns has {n} GPUs but {len(index)} indices, {len(uuid)} uuids, "
                f"{len(model)} models and {len(bus)} PCI bus ids; give one each per GPU",
            )
        for name, rule in _ID_TEXT:
            for i, value in enumerate(getattr(cols, name)):
                why = text_why(value, rule)
                if why:
                    raise _invalid(
                        "bad_text",
                        f"{where} has GPU {index[i]} {name}={value[:80]!r} (gpu_columns), which {why}; "
                        "refused",
                    )
        if n:
            self._identities(list(zip(index, uuid, model, strict=True)), hello, where)
        if len(self._good_identities) >= _GOOD_IDENTITIES_MAX:
            self._good_identities.clear()
        self._good_identities.add(key)

    def _texts(self, cols: telemetry_pb2.GpuColumns, n: int, where: str) -> list[str]:
        texts = list(cols.driver_unresponsive_call)
        if texts and len(texts) != n:
            raise _invalid(
                "columns", f"{where}: gpu_columns.driver_unresponsive_call needs {n} entries or none"
            )
        for i, text in enumerate(texts):
            why = text and text_why(text, _CALL_TEXT)
            if why:
                raise _invalid(
                    "bad_text",
                    f"{where} has GPU {cols.index[i]} driver_unresponsive_call={text[:80]!r} (gpu_columns), "
                    f"which {why}; refused",
                )
        return texts

    @staticmethod
    def _check_processes(cols: telemetry_pb2.GpuColumns, index: tuple, where: str) -> None:
        """The process arrays: one entry each per process, on GPUs of the batch, at most
        MAX_PROCESSES_PER_GPU a GPU, used memory within its rule (0 where absent)."""
        gpus, count = cols.process_gpu_index, len(cols.process_gpu_index)
        if not count and not cols.process_pid and not cols.process_used_memory_bytes:
            return
        present = cols.process_used_memory_present
        if (
            len(cols.process_pid) != count
            or len(cols.process_used_memory_bytes) != 8 * count
            or (present and len(present) != (count + 7) // 8)
        ):
            raise _invalid(
                "columns",
                f"{where}: gpu_columns.process_gpu_index, process_pid and process_used_memory_bytes must "
                f"describe the same processes ({count}, {len(cols.process_pid)} and "
                f"{len(cols.process_used_memory_bytes)} bytes), with a presence bit each or none",
            )
        if not set(gpus) <= set(index):
            stray = next(g for g in gpus if g not in index)
            raise _invalid(
                "gpu_index", f"{where}: gpu_columns has a process on GPU {stray}, which is not in the batch"
            )
        if count > MAX_PROCESSES_PER_GPU:
            gpu, most = Counter(gpus).most_common(1)[0]
            if most > MAX_PROCESSES_PER_GPU:
                raise Rejection(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "oversized",
                    f"{where} has {most} processes on GPU {gpu} (gpu_columns), more than the "
                    f"{MAX_PROCESSES_PER_GPU} accepted; refused",
                )
        memory = struct.unpack(f"<{count}q", cols.process_used_memory_bytes)
        in_range = min(memory) >= 0 and max(memory) <= _PROCESS_MEMORY.high
        if in_range and (
            not present or all(memory[k] == 0 for k in range(count) if not columns.has_bit(present, k))
        ):
            return
        for k, value in enumerate(memory):
            why = (
                num_why(value, _PROCESS_MEMORY)
                if columns.has_bit(present, k)
                else (None if value == 0 else "is not 0 where the process has no value (absent)")
            )
            if why:
                raise _invalid(
                    "bad_value",
                    f"{where} has GPU {gpus[k]} process {cols.process_pid[k]} used_memory_bytes={value} "
                    f"(gpu_columns), which {why}; refused",
                )

    @staticmethod
    def _bad_number(plan: _Plan, numbers: tuple, index: tuple, where: str) -> Rejection:
        n = plan.layout.count
        for position, (low, high, value) in enumerate(zip(plan.lows, plan.highs, numbers, strict=True)):
            if low <= value <= high:
                continue
            k, i = divmod(position, n)
            name = plan.layout.names[k]
            if not plan.layout.has(k, i):
                why = "is not 0 where the GPU has no value (absent)"
            else:
                why = num_why(value, Num(low, high, plan.units[k])) or "is out of range"
            return _invalid(
                "bad_value",
                f"{where} has GPU {index[i]} {name}={value!r} (gpu_columns), which {why}; refused",
            )
        return Rejection(
            grpc.StatusCode.INTERNAL, "internal", f"{where} failed a column bound no value names"
        )
