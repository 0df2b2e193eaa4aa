"""NVLink: links down, the rate of replay/recovery/CRC errors, and the NVSwitch fabric."""

from __future__ import annotations

import pynvml

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import Entry
from gpufleet.repair.rules.base import GpuCheck, RateCheck


def _nvlink_errors(gpu: telemetry_pb2.GpuSample) -> int | None:
    fields = ("nvlink_replay_total", "nvlink_recovery_total", "nvlink_crc_total")
    if not any(gpu.HasField(f) for f in fields):
        return None
    return sum(getattr(gpu, f) for f in fields)


class NvlinkErrors(RateCheck):
    name = "nvlink_errors"
    # A counter that moved: evaluated at that report (the rate needs its samples), not only when
    # the node's turn in a full pass comes.
    watch_fields = ("nvlink_replay_total", "nvlink_recovery_total", "nvlink_crc_total")

    def __init__(self) -> None:
        super().__init__(_nvlink_errors)


class NvlinkDown(GpuCheck):
    name = "nvlink_down"
    watch_fields = ("nvlink_links_inactive",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        down = gpu.nvlink_links_inactive if gpu.HasField("nvlink_links_inactive") else 0
        return f"{down} NVLink link(s) inactive" if down else None


FABRIC_COMPLETED = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
_FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}


class FabricDown(GpuCheck):
    """On NVSwitch systems: every GPU looks healthy while the fabric (Fabric Manager) has not
    come up or failed, and every multi-GPU job fails."""

    name = "fabric_down"
    watch_fields = ("fabric_state", "fabric_status")

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if not gpu.HasField("fabric_state"):
            return None
        status = gpu.fabric_status if gpu.HasField("fabric_status") else 0
        if gpu.fabric_state == FABRIC_COMPLETED and status == 0:
            return None
        state = _FABRIC_STATES.get(gpu.fabric_state, str(gpu.fabric_state))
        return f"NVLink fabric {state}, status {status}"
