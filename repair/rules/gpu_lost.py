"""A GPU that NVML reports lost, or GPUs missing compared with what the node had."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import GpuCheck, Rule


class GpuLost(GpuCheck):
    name = "gpu_lost"

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        return f"GPU {gpu.index} ({gpu.pci_bus_id or gpu.uuid}) is lost" if gpu.lost else None


class GpuMissing(Rule):
    """The most GPUs a node has announced is remembered; fewer later means one went missing
    (e.g. it did not come back after a reboot)."""

    name = "gpu_missing"

    def __init__(self) -> None:
        self._most: dict[str, int] = {}

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        most = self._most[snap.node] = max(self._most.get(snap.node, 0), snap.gpu_count)
        if snap.gpu_count and snap.gpu_count < most:
            return [entry.finding(snap.node, None, self.name, f"{snap.gpu_count} GPUs, had {most}", now_ns)]
        return []
