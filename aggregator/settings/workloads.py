"""Workloads: which scheduler says whose each job is, how often it is read, and what a GPU-hour
costs (docs/workloads.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.settings import require, setting
from gpufleet.aggregator.workloads.digest import at_utc_offset_s
from gpufleet.aggregator.workloads.schedulers import WORKLOAD_SCHEDULERS
from gpufleet.aggregator.workloads.summary import USAGE_DIMENSIONS, parse_prices


@dataclass
class WorkloadSettings:
    workload_scheduler: str = setting(
        "none", f"where jobs and their owners are read: {WORKLOAD_SCHEDULERS.described()}"
    )
    workload_poll_s: float = setting(
        10.0, "seconds between reads of the scheduler (a job's start and end are known to this)"
    )
    gpu_hour_prices: str = setting(
        "",
        "price of a GPU-hour by GPU model, e.g. 'H100=2.50, A100=1.10' (a model's name or part of "
        "it); usage then shows allocated and effective cost; empty: no cost",
    )
    show_user_names: bool = setting(
        False,
        "viewers see user names on workloads and usage (off: they see accounts, teams and "
        "namespaces; operators and admins always see users)",
    )
    waste_digest_every_s: float = setting(
        86400.0,
        "seconds between two waste digests through the alert sinks: each owner's idle GPU-hours over "
        "the period, one alert per owner (0: none; the leader sends it, with a workload scheduler)",
    )
    waste_digest_at_utc: str = setting("08:00", "when in the day (HH:MM, UTC) the digests' period starts")
    waste_digest_by: str = setting("account", f"the digest's owner: {', '.join(USAGE_DIMENSIONS)}")
    waste_digest_min_idle_gpu_hours: float = setting(
        1.0, "an owner is in the digest from this many idle GPU-hours in the period"
    )

    def check_workloads(self) -> None:
        require(
            self.workload_scheduler in WORKLOAD_SCHEDULERS,
            f"workload_scheduler={self.workload_scheduler!r}: use one of {WORKLOAD_SCHEDULERS.described()}",
        )
        require(
            0.5 <= self.workload_poll_s <= 3600,
            f"workload_poll_s={self.workload_poll_s:g} must be between 0.5 and 3600 seconds",
        )
        require(
            self.waste_digest_every_s == 0 or 1 <= self.waste_digest_every_s <= 31 * 86400,
            f"waste_digest_every_s={self.waste_digest_every_s:g} must be 0 (no digest) or between 1 s "
            "and 31 days",
        )
        require(
            self.waste_digest_by in USAGE_DIMENSIONS,
            f"waste_digest_by={self.waste_digest_by!r}: use one of {', '.join(USAGE_DIMENSIONS)}",
        )
        require(
            0 <= self.waste_digest_min_idle_gpu_hours < 1e6,
            f"waste_digest_min_idle_gpu_hours={self.waste_digest_min_idle_gpu_hours:g} must be 0 or more",
        )
        try:
            at_utc_offset_s(self.waste_digest_at_utc)
        except ValueError as exc:
            require(False, f"waste_digest_at_utc: {exc}")
        try:
            parse_prices(self.gpu_hour_prices)
        except ValueError as exc:
            require(False, str(exc))
