"""Health rules, registered by name. A new rule: one file with a Rule subclass, one line here,
and its defaults in default_policy.toml."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.repair.rules.base import Rule
from gpufleet.repair.rules.driver import DriverUnresponsive, GpuMissingFromDriver, RecoveryActionPending
from gpufleet.repair.rules.ecc import EccUncorrected
from gpufleet.repair.rules.gpu_lost import GpuLost, GpuMissing
from gpufleet.repair.rules.nvlink import FabricDown, NvlinkDown, NvlinkErrors
from gpufleet.repair.rules.pcie import PcieDowntrained, PcieReplays
from gpufleet.repair.rules.peers import EccCorrectedStorm
from gpufleet.repair.rules.remap import RemapFailure, RemapPending
from gpufleet.repair.rules.retired_pages import RetiredPages, RetiredPagesPending
from gpufleet.repair.rules.silent import CollectorSilent
from gpufleet.repair.rules.slowness import GpuSlow
from gpufleet.repair.rules.throttle import PowerSlowdown, ThermalSlowdown
from gpufleet.repair.rules.xid import Xid

# Every rule but xid has a [rules.NAME] table in the policy; xid reads [buckets], [xid], [[xid_workflow]].
RULES: dict[str, Callable[[], Rule]] = {
    "xid": Xid,
    "ecc_uncorrected": EccUncorrected,
    "remap_pending": RemapPending,
    "remap_failure": RemapFailure,
    "retired_pages": RetiredPages,
    "retired_pages_pending": RetiredPagesPending,
    "nvlink_errors": NvlinkErrors,
    "nvlink_down": NvlinkDown,
    "pcie_replays": PcieReplays,
    "thermal_slowdown": ThermalSlowdown,
    "power_slowdown": PowerSlowdown,
    "gpu_lost": GpuLost,
    "gpu_missing": GpuMissing,
    "collector_silent": CollectorSilent,
    # Failures the driver hides (docs/repair.md).
    "driver_unresponsive": DriverUnresponsive,
    "recovery_action": RecoveryActionPending,
    "pcie_downtrained": PcieDowntrained,
    "fabric_down": FabricDown,
    "gpu_missing_from_driver": GpuMissingFromDriver,
    "ecc_corrected_storm": EccCorrectedStorm,
    "gpu_slow": GpuSlow,
}

# Rules whose findings change with time alone (rates): derived, as everything else, from RULES.
TIME_DEPENDENT: frozenset[str] = frozenset(
    name for name, factory in RULES.items() if getattr(factory, "changes_with_time", False)
)

# The GpuSample fields the aggregator's health watch compares report to report.
WATCH_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(f for factory in RULES.values() for f in getattr(factory, "watch_fields", ()))
)

# The fields rules read beside the watched ones that change rarely (GpuSample fields, and the
# node's GPU counts): a replay of the store's history reads their changes too.
CONTEXT_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(f for factory in RULES.values() for f in getattr(factory, "context_fields", ()))
)
