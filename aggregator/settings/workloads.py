"""Workloads: which scheduler says whose each job is, how often it is read, and what a GPU-hour
costs (docs/workloads.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.settings import require, setting
from gpufleet.aggregator.workloads.schedulers import WORKLOAD_SCHEDULERS
from gpufleet.aggregator.workloads.summary import parse_prices


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

    def check_workloads(self) -> None:
        require(
            self.workload_scheduler in WORKLOAD_SCHEDULERS,
            f"workload_scheduler={self.workload_scheduler!r}: use one of {WORKLOAD_SCHEDULERS.described()}",
        )
        require(
            0.5 <= self.workload_poll_s <= 3600,
            f"workload_poll_s={self.workload_poll_s:g} must be between 0.5 and 3600 seconds",
        )
        try:
            parse_prices(self.gpu_hour_prices)
        except ValueError as exc:
            require(False, str(exc))
