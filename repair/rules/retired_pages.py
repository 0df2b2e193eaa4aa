"""Dynamic page retirement (before Ampere): too many retired pages, or one waiting for a reset."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import Entry
from gpufleet.repair.rules.base import GpuCheck


class RetiredPages(GpuCheck):
    name = "retired_pages"
    watch_fields = ("retired_pages_sbe", "retired_pages_dbe")

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if not (gpu.HasField("retired_pages_sbe") or gpu.HasField("retired_pages_dbe")):
            return None
        total = gpu.retired_pages_sbe + gpu.retired_pages_dbe
        return (
            f"retired pages {total} (threshold {entry.threshold:g})" if total >= entry.threshold > 0 else None
        )


class RetiredPagesPending(GpuCheck):
    name = "retired_pages_pending"
    watch_fields = ("retired_pages_pending",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        pending = gpu.HasField("retired_pages_pending") and gpu.retired_pages_pending
        return "retired_pages_pending=true" if pending else None
