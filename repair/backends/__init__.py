"""Cordon backends, registered by name: a new one is a file with a Backend subclass (its name,
help and from_settings) and a line in BACKENDS. The settings' choices, help and errors are
derived from BACKENDS."""

from __future__ import annotations

from typing import Any

from gpufleet.repair.backends.base import Backend
from gpufleet.repair.backends.hook import HookBackend
from gpufleet.repair.backends.kubernetes import KubernetesBackend
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.backends.scheduler_names import MappedBackend, SchedulerNames
from gpufleet.repair.backends.slurm import SlurmBackend

BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (NoBackend, SlurmBackend, KubernetesBackend, HookBackend)
}


def described() -> str:
    """ "none (gpufleet's own records, no scheduler), slurm (...), ...": for help and errors."""
    return ", ".join(f"{name} ({cls.help})" for name, cls in BACKENDS.items())


def open_backend(name: str, names: SchedulerNames | None = None, **settings: Any) -> Backend:
    """The backend `name`, spoken to in the scheduler's node names where `names` maps them."""
    kind = BACKENDS.get(name)
    if kind is None:
        raise ValueError(f"repair_backend={name!r}: use one of {', '.join(BACKENDS)}")
    backend = kind.from_settings(settings)
    if names is None or names.identity:
        return backend
    return MappedBackend(backend, names)
