"""PCIe: the replay rate, and a link trained below what the GPU and its slot can do."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import Entry
from gpufleet.repair.rules.base import GpuCheck, RateCheck


def _pcie_replays(gpu: telemetry_pb2.GpuSample) -> int | None:
    return gpu.pcie_replay_total if gpu.HasField("pcie_replay_total") else None


class PcieReplays(RateCheck):
    name = "pcie_replays"
    watch_fields = ("pcie_replay_total",)  # a counter that moved: evaluated at that report

    def __init__(self) -> None:
        super().__init__(_pcie_replays)


# An idle GPU's link trains down to save power; a generation below the maximum counts only under
# load (the width never changes for power).
DOWNTRAINED_MIN_UTIL_PCT = 50.0


class PcieDowntrained(GpuCheck):
    """Gen5 x16 -> Gen3 x8 after maintenance: the GPU works, every transfer is slower."""

    name = "pcie_downtrained"
    watch_fields = ("pcie_link_gen", "pcie_link_width")
    context_fields = ("pcie_link_gen_max", "pcie_link_width_max")

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        fields = ("pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max")
        if not all(gpu.HasField(f) for f in fields):
            return None
        busy = gpu.HasField("util_gpu_pct") and gpu.util_gpu_pct >= DOWNTRAINED_MIN_UTIL_PCT
        narrow = 0 < gpu.pcie_link_width < gpu.pcie_link_width_max
        slow = busy and 0 < gpu.pcie_link_gen < gpu.pcie_link_gen_max
        if not (narrow or slow):
            return None
        return (
            f"PCIe link Gen{gpu.pcie_link_gen} x{gpu.pcie_link_width}, "
            f"can run Gen{gpu.pcie_link_gen_max} x{gpu.pcie_link_width_max}"
        )
