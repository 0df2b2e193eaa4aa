"""Thermal and power slowdown; the persistence window makes them "sustained"."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import Entry
from gpufleet.repair.rules.base import GpuCheck


class ThermalSlowdown(GpuCheck):
    name = "thermal_slowdown"
    watch_fields = ("throttle_thermal",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if gpu.HasField("throttle_thermal") and gpu.throttle_thermal:
            temp = f", {gpu.temp_gpu_c:.0f} °C" if gpu.HasField("temp_gpu_c") else ""
            return f"thermal slowdown active{temp}"
        return None


class PowerSlowdown(GpuCheck):
    name = "power_slowdown"
    watch_fields = ("throttle_power",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if gpu.HasField("throttle_power") and gpu.throttle_power:
            power = f", {gpu.power_w:.0f} W" if gpu.HasField("power_w") else ""
            return f"power slowdown active{power}"
        return None
