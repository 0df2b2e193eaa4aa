"""Repair: the policy, the safety rails, the scheduler backend (its own settings are the
backend's: repair/backends/) and its names, the hooks, alerts (each sink's settings are the
sink's: repair/alerts/), and how far back a replay may read."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.settings import require, setting
from gpufleet.repair.backends import BACKENDS
from gpufleet.repair.backends.scheduler_names import NameMapError, SchedulerNames


@dataclass
class RepairSettings:
    repair_backend: str = setting("none", f"where cordons go: {BACKENDS.described()}")
    repair_dry_run: bool = setting(False, "decide and audit, but cordon, drain, reset and reboot nothing")
    repair_policy_file: str = setting(
        "", "local health-policy overrides on top of the shipped defaults (`gpufleet policy check`)"
    )
    repair_max_out_of_service: int = setting(10, "at most this many nodes out of service at once")
    repair_max_out_of_service_fraction: float = setting(
        0.1, "... and at most this fraction of the fleet (the smaller wins; never below 1 node)"
    )
    repair_breaker_nodes: int = setting(
        5, "this many nodes failing within repair_breaker_window_s trips the breaker: all automation halts"
    )
    repair_breaker_window_s: float = setting(600.0, "the breaker's window, in seconds")
    repair_interval_s: float = setting(1.0, "seconds between repair passes (events trigger one at once)")
    replay_max_days: float = setting(
        31.0,
        "the longest range `gpufleet replay --since` (and the dashboard's Policy what-if) may read "
        "from the store: a replay reads raw samples node by node",
    )
    repair_observe_interval_s: float = setting(
        15.0,
        "the whole fleet's scheduler state is read at most this often; nodes with a workflow under "
        "way are read every pass (the polling budget: one small read per pass, one full read per interval)",
    )
    repair_reboot_command: str = setting(
        "", "command that reboots a node ({node}, {incident}, {gpus}, {reason}); empty: skip reboots"
    )
    repair_ticket_command: str = setting("", "command that opens a hardware ticket (same placeholders)")
    repair_orphan_command: str = setting(
        "",
        "the site's cleanup of an orphaned process, run once per process when its finding has "
        "persisted, e.g. 'ssh {node} kill {pid}' ({node}, {gpu}, {pid}, {workload}); empty: alert only",
    )
    scheduler_name_regex: str = setting(
        "",
        "collector node names the scheduler knows by another name: a regular expression matching the "
        "whole collector name (with scheduler_name_replace), e.g. '(gpu-\\d+)\\..*'",
    )
    scheduler_name_replace: str = setting(
        "",
        "the scheduler's name for a node scheduler_name_regex matches, in re.sub syntax: '\\1', '\\g<name>'",
    )
    scheduler_names_file: str = setting(
        "",
        "TOML file whose [nodes] table maps collector node names to scheduler node names (wins over "
        "the pattern); used for every Slurm, Kubernetes and hook call",
    )
    dashboard_url: str = setting(
        "",
        "the dashboard's address as people open it, e.g. https://gpufleet.example: every alert "
        "links its incident's and node's page; empty: no links",
    )
    alert_group_wait_s: float = setting(
        10.0, "a new incident's first alert waits this long, so a storm folds into one breaker alert"
    )
    alert_max_age_s: float = setting(3600.0, "failed alert deliveries are retried for this long")

    def check_repair(self) -> None:
        require(
            not self.dashboard_url or self.dashboard_url.startswith(("http://", "https://")),
            f"dashboard_url={self.dashboard_url!r} must start with http:// or https://",
        )
        require(
            self.repair_backend in BACKENDS,
            f"repair_backend={self.repair_backend!r}: use one of {BACKENDS.described()}",
        )
        require(
            self.repair_max_out_of_service >= 1 and 0 < self.repair_max_out_of_service_fraction <= 1,
            f"repair_max_out_of_service={self.repair_max_out_of_service} must be ≥ 1 and "
            f"repair_max_out_of_service_fraction={self.repair_max_out_of_service_fraction:g} in (0, 1]",
        )
        require(
            self.repair_breaker_nodes >= 1 and self.repair_breaker_window_s > 0,
            f"repair_breaker_nodes={self.repair_breaker_nodes} must be ≥ 1 and "
            f"repair_breaker_window_s={self.repair_breaker_window_s:g} > 0",
        )
        require(
            0 < self.replay_max_days <= 3650,
            f"replay_max_days={self.replay_max_days:g} must be more than 0 and at most 3650",
        )
        require(
            0.05 <= self.repair_interval_s <= 60,
            f"repair_interval_s={self.repair_interval_s:g} must be between 0.05 and 60",
        )
        require(
            0 <= self.repair_observe_interval_s <= 3600,
            f"repair_observe_interval_s={self.repair_observe_interval_s:g} must be between 0 and 3600 "
            "(seconds between whole-fleet scheduler reads)",
        )
        try:
            # Read and checked once, here; the repair wiring uses this one.
            self._scheduler_names = SchedulerNames.from_settings(
                self.scheduler_name_regex, self.scheduler_name_replace, self.scheduler_names_file
            )
        except NameMapError as exc:
            raise ValueError(str(exc)) from exc

    def scheduler_names(self) -> SchedulerNames:
        """collector node name -> the repair backend's (scheduler_name_*, scheduler_names_file),
        as read when these settings were checked."""
        return self._scheduler_names
