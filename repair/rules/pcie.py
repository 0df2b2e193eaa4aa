"""PCIe replay rate."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.rules.base import RateCheck


def _pcie_replays(gpu: telemetry_pb2.GpuSample) -> int | None:
    return gpu.pcie_replay_total if gpu.HasField("pcie_replay_total") else None


class PcieReplays(RateCheck):
    name = "pcie_replays"
    watch_fields = ("pcie_replay_total",)  # a counter that moved: evaluated at that report

    def __init__(self) -> None:
        super().__init__(_pcie_replays)
