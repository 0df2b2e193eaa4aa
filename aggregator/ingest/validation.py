"""Checks on what collectors send. Every field is checked against its rule in
`wire_rules.RULES` (what both stores can hold and what is sane); on top of that, what only
the stream knows: the node and boot the stream is authenticated as, the GPUs the hello
declared, the sequence number and the time window. Each failure names the node, the report,
the field and the value, and carries the gRPC status the sender gets back plus a short reason
label for the aggregator's rejection counter."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import grpc

from gpufleet.aggregator.ingest.columns import CHECKED_HERE, ColumnChecker
from gpufleet.aggregator.ingest.schema import GPU_IDENTITY, GPU_VALUE_FIELDS, PointConverter
from gpufleet.aggregator.ingest.wire_rules import (
    INT64_MAX,
    MAX_ENGINES_PER_REPORT,
    MAX_EVENTS_PER_REPORT,
    MAX_GPUS_PER_NODE,
    Rejection,
    WireValidator,
)
from gpufleet.aggregator.store import Point
from gpufleet.protos import ingest_pb2, telemetry_pb2
from gpufleet.protos.credentials import node_name_problem
from gpufleet.protos.names import workload_problem

SUPPORTED_PROTOCOLS = frozenset({1})
_CHECKED_APART = frozenset({"gpus", "gpu_columns"})  # the GPU samples: _gpu_rows
GPU_VALUES = frozenset(GPU_VALUE_FIELDS)

__all__ = [
    "MAX_ENGINES_PER_REPORT",
    "MAX_EVENTS_PER_REPORT",
    "MAX_GPUS_PER_NODE",
    "Checker",
    "Rejection",
]


@dataclass(frozen=True)
class DroppedPart:
    """A part of a report dropped or marked, the rest kept (Checker.drop_inconsistent_parts)."""

    reason: str  # bounded label: gpu_index, engine, timestamp
    message: str  # names the node, the report, the part and what was done


def _drop_at(repeated: Any, indices: list[int]) -> None:
    """A repeated field without the entries at `indices` (ascending)."""
    for i in reversed(indices):
        del repeated[i]


def _invalid(reason: str, message: str) -> Rejection:
    return Rejection(grpc.StatusCode.INVALID_ARGUMENT, reason, message)


class Checker:
    """The ingest checks, with the wire rules compiled once."""

    def __init__(self, max_report_bytes: int, retention_s: float, max_clock_skew_s: float) -> None:
        self.max_report_bytes = max_report_bytes
        self.retention_s = retention_s
        self.max_clock_skew_s = max_clock_skew_s
        self._wire = WireValidator()
        # Each GPU sample: its stored values and (index, uuid, model, lost), checked in one pass.
        self._gpu_values = self._wire.values_for(telemetry_pb2.GpuSample.DESCRIPTOR, GPU_VALUES, GPU_IDENTITY)
        self._converter = PointConverter()
        self._columns = ColumnChecker(self._check_gpu_identities)
        self._declared_by_stream: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}

    def _declared(self, hello: ingest_pb2.Hello) -> dict[int, tuple[str, str]]:
        """index -> (uuid, model) as the hello declared them, worked out once per stream."""
        key = (hello.node, hello.boot_id)
        declared = self._declared_by_stream.get(key)
        if declared is None:
            if len(self._declared_by_stream) > 100_000:
                self._declared_by_stream.clear()
            declared = self._declared_by_stream[key] = {g.index: (g.uuid, g.model) for g in hello.gpus}
        return declared

    def check_message(self, msg: ingest_pb2.CollectorMessage, where: str) -> None:
        """The wire rules alone (a command result, or anything not checked below)."""
        self._wire.check(msg, where)

    def check_hello(self, hello: ingest_pb2.Hello) -> None:
        where = f"node {hello.node!r}: hello"
        if hello.protocol_version not in SUPPORTED_PROTOCOLS:
            raise Rejection(
                grpc.StatusCode.FAILED_PRECONDITION,
                "protocol_version",
                f"node {hello.node!r}: collector speaks protocol version {hello.protocol_version}; "
                f"this aggregator speaks {', '.join(map(str, sorted(SUPPORTED_PROTOCOLS)))}. "
                "Run matching collector and aggregator releases.",
            )
        for what, value in (("node name", hello.node), ("cluster name", hello.cluster or "default")):
            # One grammar for names (protos/credentials.py): a node name reaches scheduler argv
            # and hooks, a cluster name tags, alerts and Grafana variables.
            why = node_name_problem(value)
            if why:
                raise _invalid("bad_name", f"{what} {value[:300]!r} is not usable: {why}")
        try:
            self._wire.check(hello, where)
        except Rejection as r:
            if r.reason in ("bad_text", "bad_value"):
                raise _invalid("bad_hello", r.message) from None
            raise
        if not hello.boot_id:
            raise _invalid("bad_hello", f"{where} needs a boot_id of 1-64 characters")
        if not (math.isfinite(hello.interval_s) and 0.05 <= hello.interval_s <= 3600):
            raise _invalid("bad_hello", f"{where}: interval_s={hello.interval_s} must be 0.05..3600")
        indices = [g.index for g in hello.gpus]
        if len(set(indices)) != len(indices):
            raise _invalid("gpu_index", f"{where} declares GPU indices {indices}: each at most once")

    def check_report(
        self,
        report: telemetry_pb2.NodeReport,
        hello: ingest_pb2.Hello,
        now_ns: int | None = None,
        size: int | None = None,
    ) -> list[Point]:
        """The points the report is stored as; Rejection if it must not be stored. Every GPU
        sample's fields are checked and copied in one pass (this is the ingest hot path). Its
        inconsistent parts were dropped before, once, by ingest (`drop_inconsistent_parts`).
        size: the report's serialized size when the caller has its bytes (else computed)."""
        where = f"node {hello.node!r}: report seq {report.seq}"
        now_ns = now_ns or time.time_ns()
        self._check_envelope(report, hello, where, report.ByteSize() if size is None else size, now_ns)
        gpu_rows = self._gpu_rows(report, hello, where)
        return self._converter.convert(report, gpu_rows)

    def drop_inconsistent_parts(
        self, report: telemetry_pb2.NodeReport, hello: ingest_pb2.Hello, now_ns: int | None = None
    ) -> list[DroppedPart]:
        """One inconsistent part never silences a node (docs/security.md "Parts dropped, reports
        kept"): the report is changed in place, each part that disagrees with the stream is
        dropped or marked, and what was done is returned for the caller to count and log; the
        rest of the report is stored and acknowledged. Ingest calls it in the main process,
        before a report goes to the writer or a worker, so the live view and the store see the
        same report.

        - an engine naming a GPU the hello did not declare keeps its readings without that GPU
          (a node whose NVML did not start still reports its engines' KV-cache);
        - an engine a second time (same engine, model and port) is dropped: one point per
          replica and report, a second would overwrite the first;
        - an event for a GPU the hello did not declare stays, as the node's (its GPU index cleared);
        - an event outside the accepted time window is dropped (it cannot be stored at a time
          the store refuses); a folded XID whose first time is after its last keeps its last.
        """
        where = f"node {hello.node!r}: report seq {report.seq}"
        gpu_count = len(hello.gpus)
        dropped: list[DroppedPart] = []
        seen: set[tuple[str, str, int]] = set()
        twice = []
        for at, eng in enumerate(report.engines):
            key = (eng.engine, eng.model, eng.port)
            if key in seen:
                dropped.append(
                    DroppedPart("engine", f"{where} has engine {eng.engine}:{eng.port} twice: dropped")
                )
                twice.append(at)
                continue
            seen.add(key)
            dropped += _only_declared(eng.gpu_indices, gpu_count, f"{where} engine {eng.engine}:{eng.port}")
        _drop_at(report.engines, twice)
        if report.events:
            dropped += self._drop_events(report, gpu_count, where, now_ns or time.time_ns())
        if report.workloads:
            dropped += _drop_workloads(report, gpu_count, where)
        return dropped

    def _drop_events(
        self, report: telemetry_pb2.NodeReport, gpu_count: int, where: str, now_ns: int
    ) -> list[DroppedPart]:
        oldest_ns, newest_ns = self._window(now_ns)
        dropped: list[DroppedPart] = []
        outside = []
        for at, ev in enumerate(report.events):
            if ev.time_unix_ns and not oldest_ns <= ev.time_unix_ns <= newest_ns:
                dropped.append(
                    DroppedPart(
                        "timestamp", self._time_message(where, "has an event at", ev.time_unix_ns, now_ns)
                    )
                )
                outside.append(at)
                continue
            if ev.HasField("gpu_index") and ev.gpu_index >= gpu_count:
                dropped.append(
                    DroppedPart(
                        "gpu_index",
                        f"{where} has an event for GPU {ev.gpu_index}; the node declared {gpu_count}: "
                        "kept as the node's",
                    )
                )
                ev.ClearField("gpu_index")
            if ev.first_time_unix_ns and not oldest_ns <= ev.first_time_unix_ns <= (
                ev.time_unix_ns or newest_ns
            ):
                dropped.append(
                    DroppedPart(
                        "timestamp",
                        f"{where} has a folded XID {ev.xid} whose first occurrence "
                        f"first_time_unix_ns={ev.first_time_unix_ns} is after its last or outside the "
                        "accepted range: kept with its last",
                    )
                )
                ev.first_time_unix_ns = 0
        _drop_at(report.events, outside)
        return dropped

    def _window(self, now_ns: int) -> tuple[int, int]:
        """The oldest and newest times a report or event may carry."""
        return now_ns - int(self.retention_s * 1e9), now_ns + int(self.max_clock_skew_s * 1e9)

    def _check_envelope(
        self, report: telemetry_pb2.NodeReport, hello: ingest_pb2.Hello, where: str, size: int, now_ns: int
    ) -> None:
        """What only the stream knows: its size, node, boot, cluster, seq and time window, and the
        repeated fields' counts and wire rules (GPU samples apart: _gpu_rows)."""
        node = hello.node
        if size > self.max_report_bytes:
            raise Rejection(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "oversized",
                f"{where} is {size} bytes; the limit is {self.max_report_bytes}",
            )
        if report.node != node:
            raise Rejection(
                grpc.StatusCode.PERMISSION_DENIED,
                "node_mismatch",
                f"{where} names node {report.node!r}, but this stream is authenticated as {node!r}; "
                "a collector may only report for its own node",
            )
        if report.boot_id != hello.boot_id:
            raise _invalid(
                "boot_id", f"{where} carries boot_id {report.boot_id!r}, the stream's is {hello.boot_id!r}"
            )
        if report.cluster != hello.cluster:
            raise _invalid(
                "cluster",
                f"{where} names cluster {report.cluster!r}, but this stream's hello named "
                f"{hello.cluster!r}; a node reports for the cluster it said hello in",
            )
        if not 1 <= report.seq <= INT64_MAX:
            raise _invalid("bad_seq", f"{where}: seq must be 1..{INT64_MAX}")
        oldest_ns, newest_ns = self._window(now_ns)
        if not oldest_ns <= report.time_unix_ns <= newest_ns:
            raise _invalid("timestamp", self._time_message(where, "has", report.time_unix_ns, now_ns))
        if len(report.engines) > MAX_ENGINES_PER_REPORT or len(report.events) > MAX_EVENTS_PER_REPORT:
            raise Rejection(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "oversized",
                f"{where} has {len(report.engines)} engines and {len(report.events)} "
                f"events; limits are {MAX_ENGINES_PER_REPORT} and {MAX_EVENTS_PER_REPORT}",
            )
        if len(report.gpus) > MAX_GPUS_PER_NODE or not self._wire.ok(report, skip=_CHECKED_APART):
            self._wire.check(report, where)

    def _gpu_rows(
        self, report: telemetry_pb2.NodeReport, hello: ingest_pb2.Hello, where: str
    ) -> list[tuple[dict, tuple]]:
        """Each GPU sample's checked values and identity; Rejection naming the GPU, the field and
        the value, or an index or identity the hello did not declare."""
        if report.HasField("gpu_columns"):
            return self._column_rows(report, hello, where)
        gpu_rows = []
        for gpu in report.gpus:
            row = self._gpu_values(gpu)
            if row is None:
                self._wire.check(report, where)  # names the GPU, the field and the value
                raise AssertionError("unreachable: check() raises when values() says no")
            gpu_rows.append(row)
            values = row[0]
            if "hbm_used_bytes" in values and "hbm_total_bytes" in values:
                used, total = values["hbm_used_bytes"], values["hbm_total_bytes"]
                if used > total:
                    raise _invalid(
                        "bad_value",
                        f"{where} GPU {row[1][0]} has hbm_used_bytes={used} above hbm_total_bytes={total}",
                    )
        if gpu_rows:
            self._check_gpu_identities([ident for _, ident in gpu_rows], hello, where)
        return gpu_rows

    def _column_rows(
        self, report: telemetry_pb2.NodeReport, hello: ingest_pb2.Hello, where: str
    ) -> list[tuple[dict, tuple]]:
        if report.gpus:
            raise _invalid("columns", f"{where} carries both gpus and gpu_columns; send one or the other")
        if not hello.columnar_gpus:
            raise _invalid(
                "columns",
                f"{where} carries gpu_columns, but the stream's hello did not say columnar_gpus; "
                "a collector announces columns in its hello",
            )
        cols = report.gpu_columns
        if not self._wire.ok(cols, skip=CHECKED_HERE):
            self._wire.check(report, where)  # names the field: a size over its limit
        return self._columns.rows(cols, hello, where)

    def _check_gpu_identities(self, idents: list[tuple], hello: ingest_pb2.Hello, where: str) -> None:
        gpu_count = len(hello.gpus)
        indices = [ident[0] for ident in idents]
        if max(indices) >= gpu_count:
            index = next(i for i in indices if i >= gpu_count)
            raise _invalid(
                "gpu_index",
                f"{where} has GPU index {index}; the node declared {gpu_count} GPU(s) "
                f"(indices 0..{gpu_count - 1})",
            )
        if len(set(indices)) != len(indices):
            twice = next(i for i in indices if indices.count(i) > 1)
            raise _invalid("gpu_index", f"{where} has GPU index {twice} twice")
        declared = self._declared(hello)
        for ident in idents:  # (index, uuid, model, lost)
            if declared.get(ident[0]) != ident[1:3]:
                uuid, model = declared[ident[0]]
                raise _invalid(
                    "gpu_identity",
                    f"{where} has GPU {ident[0]} as uuid {ident[1]!r}, model {ident[2]!r}; the hello "
                    f"declared uuid {uuid!r}, model {model!r}. A GPU's identity is the one its "
                    "collector said hello with (a new GPU is a new collector start)",
                )

    def _time_message(self, where: str, verb: str, ts: int, now_ns: int) -> str:
        return (
            f"{where} {verb} time_unix_ns={ts} ({(ts - now_ns) / 1e9:+.0f} s from the aggregator's "
            f"clock); accepted: up to {self.max_clock_skew_s:g} s ahead and {self.retention_s:g} s back. "
            "Check the node's clock (NTP)."
        )


def _drop_workloads(report: telemetry_pb2.NodeReport, gpu_count: int, where: str) -> list[DroppedPart]:
    """A workload whose names break the grammar (protos/names.py) is dropped; one that names a
    GPU the hello did not declare keeps the GPUs it did; one named twice is dropped the second
    time (the processes of no workload come one entry per GPU set: collector/sources/workloads.py).
    Whether the scheduler places it on this node is the aggregator's check, later
    (aggregator/workloads/ledger.py)."""
    dropped: list[DroppedPart] = []
    seen: set[tuple[object, ...]] = set()
    gone = []
    for at, w in enumerate(report.workloads):
        key = (w.scheduler, w.id, w.part) if w.scheduler != "none" else ("none", *w.gpu_indices)
        problem = workload_problem(w.scheduler, w.id, w.part) or ("named twice" if key in seen else "")
        if problem:
            dropped.append(
                DroppedPart("workload", f"{where} has a workload that is unusable ({problem}): dropped")
            )
            gone.append(at)
            continue
        seen.add(key)
        dropped += _only_declared(w.gpu_indices, gpu_count, f"{where} workload {w.scheduler}:{w.id}")
    _drop_at(report.workloads, gone)
    return dropped


def _only_declared(indices: Any, gpu_count: int, what: str) -> list[DroppedPart]:
    """A part's GPU indices (a repeated field, changed in place) kept to the GPUs the hello
    declared: one DroppedPart naming the rest, or none."""
    bad = [i for i in indices if i >= gpu_count]
    if not bad:
        return []
    kept = [i for i in indices if i < gpu_count]
    del indices[:]
    indices.extend(kept)
    said = f"{what} names GPU {bad[0]}; the node declared {gpu_count}: kept without GPU(s) {bad}"
    return [DroppedPart("gpu_index", said)]
