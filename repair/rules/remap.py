"""Row remapping (Ampere and later): a remap waiting for a reset, or a failed remap."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import Entry
from gpufleet.repair.rules.base import GpuCheck


class RemapPending(GpuCheck):
    name = "remap_pending"
    watch_fields = ("remap_pending",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        return "remap_pending=true" if gpu.HasField("remap_pending") and gpu.remap_pending else None


class RemapFailure(GpuCheck):
    name = "remap_failure"
    watch_fields = ("remap_failure",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        return "remap_failure=true" if gpu.HasField("remap_failure") and gpu.remap_failure else None
