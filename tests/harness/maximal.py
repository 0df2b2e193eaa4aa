"""The largest messages a node may send: every string and repeated field of a Hello or a report
filled to what the wire rules (aggregator/ingest/wire_rules.py RULES) allow, every number at
the top of its range, and still valid (the identity fields a stream is checked against kept
consistent). What one node can put on the fleet's answers is measured with these."""

from __future__ import annotations

import time
from typing import Any

from gpufleet.aggregator.ingest.wire_rules import MAX_PROCESSES_PER_NODE, RULES, Many, Num, Text
from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.limits import MAX_GPUS_PER_NODE

# Set per message by the stream or the test, never filled: what identifies the node, its GPUs
# and its events (a filled value would be refused as another node's, or as out of order).
_IDENTITY = {
    "Hello.node", "Hello.cluster", "Hello.boot_id", "Hello.protocol_version", "Hello.interval_s",
    "Hello.columnar_gpus", "GpuIdentity.index", "GpuIdentity.uuid",
    "NodeReport.node", "NodeReport.cluster", "NodeReport.boot_id", "NodeReport.seq",
    "NodeReport.time_unix_ns", "NodeReport.interval_s", "NodeReport.gpu_columns", "NodeReport.events",
    "NodeReport.gpus_on_pci_bus", "GpuSample.index", "GpuSample.uuid", "GpuSample.lost",
    "GpuSample.processes", "EngineSample.port", "EngineSample.readable",
}  # fmt: skip


def fill(msg: Any) -> Any:
    """Every field of msg the rules bound, at its bound (identity fields left to the caller)."""
    for f in msg.DESCRIPTOR.fields:
        key = f"{msg.DESCRIPTOR.name}.{f.name}"
        rule = RULES.get(key)
        if key in _IDENTITY or rule is None:
            continue
        if isinstance(rule, Text):
            setattr(msg, f.name, "a" * rule.max_len)
        elif isinstance(rule, Num):
            setattr(msg, f.name, type(getattr(msg, f.name))(rule.high))
        elif isinstance(rule, Many) and f.message_type is not None:
            for _ in range(rule.max_items):
                fill(getattr(msg, f.name).add())
        elif isinstance(rule, Many) and isinstance(rule.each, Text):
            getattr(msg, f.name).extend(["a" * rule.each.max_len] * rule.max_items)
        elif isinstance(rule, Many) and isinstance(rule.each, Num):
            getattr(msg, f.name).extend([int(rule.each.high)] * rule.max_items)
    return msg


def gpu_uuid(i: int) -> str:
    """A GPU's uuid at the rule's length (96), distinct per index."""
    return f"GPU-{i:02d}-".ljust(RULES["GpuIdentity.uuid"].max_len, "u")  # type: ignore[union-attr]


def node_name() -> str:
    """A node name at the grammar's length (253: DNS labels of up to 63)."""
    return ".".join(["n" * 63] * 3 + ["n" * 61])


def maximal_hello(node: str, cluster: str, boot_id: str) -> Any:
    hello = fill(ingest_pb2.Hello())
    hello.node, hello.cluster, hello.boot_id = node, cluster, boot_id
    hello.protocol_version, hello.interval_s = 1, 1.0
    for i, gpu in enumerate(hello.gpus):
        gpu.index, gpu.uuid = i, gpu_uuid(i)
    return ingest_pb2.CollectorMessage(hello=hello)


def maximal_event(i: int, now_ns: int) -> Any:
    event = fill(telemetry_pb2.Event())
    event.kind, event.source = vocabulary_pb2.EVENT_KIND_XID, vocabulary_pb2.EVENT_SOURCE_KMSG
    event.gpu_index, event.xid, event.kmsg_seq = i % MAX_GPUS_PER_NODE, 13, 10_000 + i
    event.time_unix_ns = event.first_time_unix_ns = now_ns
    return event


def maximal_report(node: str, cluster: str, boot_id: str, seq: int, events: int = 0) -> Any:
    """A report of 64 GPUs (with the most processes a node may list), 64 engines and `events`
    XID events, each field at its bound; events=0 and gpus filled, or an events-only report
    with gpus=False (what a collector pushing events sends)."""
    now_ns = time.time_ns()
    report = fill(telemetry_pb2.NodeReport())
    report.node, report.cluster, report.boot_id, report.seq = node, cluster, boot_id, seq
    report.time_unix_ns, report.interval_s = now_ns, 1.0
    per_gpu = MAX_PROCESSES_PER_NODE // MAX_GPUS_PER_NODE
    for i, gpu in enumerate(report.gpus):
        gpu.index, gpu.uuid = i, gpu_uuid(i)
        gpu.hbm_used_bytes = gpu.hbm_total_bytes  # used within total
        for p in range(per_gpu):
            gpu.processes.add(pid=2**32 - 1 - p, used_memory_bytes=gpu.hbm_total_bytes)
    for i, engine in enumerate(report.engines):
        engine.port, engine.readable = 1024 + i, True
    report.events.extend(maximal_event(i, now_ns) for i in range(events))
    return ingest_pb2.CollectorMessage(report=report)


def events_report(node: str, cluster: str, boot_id: str, seq: int, events: int, first: int) -> Any:
    """A report of `events` maximal XID events only (numbered from `first`)."""
    now_ns = time.time_ns()
    report = telemetry_pb2.NodeReport(
        node=node, cluster=cluster, boot_id=boot_id, seq=seq, time_unix_ns=now_ns, interval_s=1.0
    )
    report.events.extend(maximal_event(first + i, now_ns) for i in range(events))
    return ingest_pb2.CollectorMessage(report=report)
