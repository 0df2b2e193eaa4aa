"""Health rules, registered by name (common/registry.py: each Rule subclass names itself). A new
rule: one file with a Rule subclass, one line here, and its defaults in default_policy.toml."""

from __future__ import annotations

from gpufleet.common.registry import Registry
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
from gpufleet.repair.rules.waste import GpuOutsideAllocation, IdleAllocation, OrphanedProcess
from gpufleet.repair.rules.xid import Xid

# Every rule but xid has a [rules.NAME] table in the policy; xid reads [buckets], [xid], [[xid_workflow]].
RULES: Registry[type[Rule]] = Registry(
    "policy rule",
    (
        Xid,
        EccUncorrected,
        RemapPending,
        RemapFailure,
        RetiredPages,
        RetiredPagesPending,
        NvlinkErrors,
        NvlinkDown,
        PcieReplays,
        ThermalSlowdown,
        PowerSlowdown,
        GpuLost,
        GpuMissing,
        CollectorSilent,
        # Failures the driver hides (docs/repair.md).
        DriverUnresponsive,
        RecoveryActionPending,
        PcieDowntrained,
        FabricDown,
        GpuMissingFromDriver,
        EccCorrectedStorm,
        GpuSlow,
        # GPUs held and not used (docs/workloads.md "Waste findings"): notify, never cordon by default.
        IdleAllocation,
        OrphanedProcess,
        GpuOutsideAllocation,
    ),
)

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
