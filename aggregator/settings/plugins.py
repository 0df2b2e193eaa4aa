"""The settings the plug-ins declare for themselves: the history store's (InfluxDB's connection),
each cordon backend's and each alert sink's, gathered from their registries (common/registry.py),
each checked by its plug-in. The settings reference lists them under the plug-in that takes them."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.store import STORES
from gpufleet.aggregator.workloads.schedulers import WORKLOAD_SCHEDULERS
from gpufleet.repair.alerts import SINKS
from gpufleet.repair.backends import BACKENDS

REGISTRIES = (STORES, BACKENDS, SINKS, WORKLOAD_SCHEDULERS)
_DECLARED = tuple(dict.fromkeys(cls for registry in REGISTRIES for cls in registry.settings_classes()))


# Reversed: dataclasses list the last base's fields first, so they read in the registries' order.
@dataclass
class PluginSettings(*reversed(_DECLARED)):  # type: ignore[misc]
    def check_plugins(self, store: str, repair_backend: str, workload_scheduler: str = "none") -> None:
        """Each plug-in checks its own settings; a store's and a backend's only when chosen."""
        STORES.check_settings(self, [store])
        BACKENDS.check_settings(self, [repair_backend])
        WORKLOAD_SCHEDULERS.check_settings(self, [workload_scheduler])
        SINKS.check_settings(self, list(SINKS))
