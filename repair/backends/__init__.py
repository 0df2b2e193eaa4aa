"""Cordon backends, registered by name (common/registry.py): a new one is a file with a Backend
subclass (its name, help, its settings dataclass and their check, from_settings) and a line in
BACKENDS. The repair_backend setting's choices, help and errors, and the backend settings the
aggregator takes, are derived from BACKENDS."""

from __future__ import annotations

from typing import Any

from gpufleet.common.registry import Registry
from gpufleet.repair.backends.base import Backend
from gpufleet.repair.backends.hook import HookBackend
from gpufleet.repair.backends.kubernetes import KubernetesBackend
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.backends.scheduler_names import MappedBackend, SchedulerNames
from gpufleet.repair.backends.slurm import SlurmBackend

BACKENDS: Registry[type[Backend]] = Registry(
    "repair_backend", (NoBackend, SlurmBackend, KubernetesBackend, HookBackend)
)


def open_backend(name: str, settings: Any, names: SchedulerNames | None = None) -> Backend:
    """The backend `name` from the aggregator's settings, spoken to in the scheduler's node
    names where `names` maps them."""
    backend = BACKENDS[name].from_settings(settings)
    if names is None or names.identity:
        return backend
    return MappedBackend(backend, names)
