"""Uncorrected (double-bit) ECC errors since the driver loaded."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import Entry
from gpufleet.repair.rules.base import GpuCheck


class EccUncorrected(GpuCheck):
    name = "ecc_uncorrected"
    watch_fields = ("ecc_dbe_volatile",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if gpu.HasField("ecc_dbe_volatile") and gpu.ecc_dbe_volatile >= max(entry.threshold, 1):
            return f"ecc_dbe_volatile={gpu.ecc_dbe_volatile}"
        return None
