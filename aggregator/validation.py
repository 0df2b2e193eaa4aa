"""Checks on what collectors send. Each failure names the node, the report, the field and
the value, and carries the gRPC status the sender gets back plus a short reason label
for the aggregator's rejection counter."""

from __future__ import annotations

import math
import re
import time

import grpc

from gpufleet.aggregator.schema import BadValue, PointConverter
from gpufleet.aggregator.store import Point
from gpufleet.protos import ingest_pb2, telemetry_pb2

SUPPORTED_PROTOCOLS = frozenset({1})
MAX_GPUS_PER_NODE = 64
MAX_ENGINES_PER_REPORT = 64
MAX_EVENTS_PER_REPORT = 1000
_MAX_NAME = 253
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Rejection(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason  # bounded label: bad_value, gpu_index, node_mismatch, ...
        self.message = message


def _check_name(what: str, value: str) -> None:
    if not value or len(value) > _MAX_NAME or _CONTROL.search(value) or value != value.strip():
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "bad_name",
            f"{what} {value!r} is not usable: give 1-{_MAX_NAME} characters, no control "
            "characters or surrounding spaces",
        )


def check_hello(hello: ingest_pb2.Hello) -> None:
    if hello.protocol_version not in SUPPORTED_PROTOCOLS:
        raise Rejection(
            grpc.StatusCode.FAILED_PRECONDITION,
            "protocol_version",
            f"node {hello.node!r}: collector speaks protocol version {hello.protocol_version}; "
            f"this aggregator speaks {', '.join(map(str, sorted(SUPPORTED_PROTOCOLS)))}. "
            "Run matching collector and aggregator releases.",
        )
    _check_name("node name", hello.node)
    _check_name("cluster name", hello.cluster or "default")
    if not hello.boot_id or len(hello.boot_id) > 64:
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "bad_hello",
            f"node {hello.node!r}: hello needs a boot_id of 1-64 characters",
        )
    if not (math.isfinite(hello.interval_s) and 0.05 <= hello.interval_s <= 3600):
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "bad_hello",
            f"node {hello.node!r}: interval_s={hello.interval_s} must be 0.05..3600",
        )
    if len(hello.gpus) > MAX_GPUS_PER_NODE:
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "gpu_index",
            f"node {hello.node!r}: {len(hello.gpus)} GPUs is more than {MAX_GPUS_PER_NODE}",
        )


def check_report(
    report: telemetry_pb2.NodeReport,
    hello: ingest_pb2.Hello,
    max_report_bytes: int,
    retention_s: float,
    max_clock_skew_s: float,
    now_ns: int | None = None,
) -> None:
    """Raise Rejection if the report must not be stored."""
    node = hello.node
    where = f"node {node!r}: report seq {report.seq}"
    size = report.ByteSize()
    if size > max_report_bytes:
        raise Rejection(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "oversized",
            f"{where} is {size} bytes; the limit is {max_report_bytes}",
        )
    if report.node != node:
        raise Rejection(
            grpc.StatusCode.PERMISSION_DENIED,
            "node_mismatch",
            f"{where} names node {report.node!r}, but this stream is authenticated as {node!r}; "
            "a collector may only report for its own node",
        )
    if report.boot_id != hello.boot_id:
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "boot_id",
            f"{where} carries boot_id {report.boot_id!r}, the stream's is {hello.boot_id!r}",
        )
    if not (math.isfinite(report.interval_s) and 0 <= report.interval_s <= 3600):
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "bad_value",
            f"{where}: interval_s={report.interval_s} must be 0..3600",
        )
    if report.seq < 1:
        raise Rejection(grpc.StatusCode.INVALID_ARGUMENT, "bad_seq", f"{where}: seq must be ≥ 1")
    now_ns = now_ns or time.time_ns()
    ts = report.time_unix_ns
    if ts > now_ns + max_clock_skew_s * 1e9 or ts < now_ns - retention_s * 1e9:
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "timestamp",
            f"{where} has time_unix_ns={ts} ({(ts - now_ns) / 1e9:+.0f} s from the aggregator's "
            f"clock); accepted: up to {max_clock_skew_s:g} s ahead and {retention_s:g} s back. "
            "Check the node's clock (NTP).",
        )
    if len(report.engines) > MAX_ENGINES_PER_REPORT or len(report.events) > MAX_EVENTS_PER_REPORT:
        raise Rejection(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "oversized",
            f"{where} has {len(report.engines)} engines and {len(report.events)} "
            f"events; limits are {MAX_ENGINES_PER_REPORT} and {MAX_EVENTS_PER_REPORT}",
        )
    gpu_count = len(hello.gpus)
    seen: set[int] = set()
    for gpu in report.gpus:
        if gpu.index >= gpu_count:
            raise Rejection(
                grpc.StatusCode.INVALID_ARGUMENT,
                "gpu_index",
                f"{where} has GPU index {gpu.index}; the node declared {gpu_count} GPU(s) "
                f"(indices 0..{gpu_count - 1})",
            )
        if gpu.index in seen:
            raise Rejection(
                grpc.StatusCode.INVALID_ARGUMENT, "gpu_index", f"{where} has GPU index {gpu.index} twice"
            )
        seen.add(gpu.index)
        if (
            gpu.HasField("hbm_used_bytes")
            and gpu.HasField("hbm_total_bytes")
            and (gpu.hbm_used_bytes > gpu.hbm_total_bytes)
        ):
            raise Rejection(
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad_value",
                f"{where} GPU {gpu.index} has hbm_used_bytes={gpu.hbm_used_bytes} above "
                f"hbm_total_bytes={gpu.hbm_total_bytes}",
            )
    for eng in report.engines:
        for i in eng.gpu_indices:
            if i >= gpu_count:
                raise Rejection(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "gpu_index",
                    f"{where} engine {eng.engine}:{eng.port} names GPU {i}; the node declared {gpu_count}",
                )
    for ev in report.events:
        if ev.HasField("gpu_index") and ev.gpu_index >= gpu_count:
            raise Rejection(
                grpc.StatusCode.INVALID_ARGUMENT,
                "gpu_index",
                f"{where} has an event for GPU {ev.gpu_index}; the node declared {gpu_count}",
            )


def convert(converter: PointConverter, report: telemetry_pb2.NodeReport) -> list[Point]:
    """The report's points; Rejection if a measurement is implausible (checked as converted,
    so each field is visited once: this is the ingest hot path)."""
    try:
        return converter.convert(report)
    except BadValue as bad:
        raise Rejection(
            grpc.StatusCode.INVALID_ARGUMENT,
            "bad_value",
            f"node {report.node!r}: report seq {report.seq} {bad}; report rejected",
        ) from None
