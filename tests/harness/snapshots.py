"""A node's snapshot as the repair controller sees it, for the tests that give a rule its own
input (repair/model.py NodeSnapshot): reporting, connected, its GPUs' samples at a time."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.model import NodeSnapshot


def reporting(node: str, gpus: list[telemetry_pb2.GpuSample], sample_time_ns: int = 1) -> NodeSnapshot:
    return NodeSnapshot.reporting(node, gpus, sample_time_ns)
