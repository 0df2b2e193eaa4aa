"""Cordon backends, registered by name: a new one is a file with a Backend subclass and a line here."""

from __future__ import annotations

from typing import Any

from gpufleet.repair.backends.base import Backend
from gpufleet.repair.backends.names import MappedBackend, SchedulerNames


def open_backend(name: str, names: SchedulerNames | None = None, **settings: Any) -> Backend:
    """The backend `name`, spoken to in the scheduler's node names where `names` maps them."""
    backend = _open(name, **settings)
    if names is None or names.identity:
        return backend
    return MappedBackend(backend, names)


def _open(name: str, **settings: Any) -> Backend:
    if name == "none":
        from gpufleet.repair.backends.none import NoBackend

        return NoBackend()
    if name == "slurm":
        from gpufleet.repair.backends.slurm import SlurmBackend

        return SlurmBackend(settings["slurm_scontrol"], settings["slurm_conf"], settings["hook_timeout_s"])
    if name == "kubernetes":
        from gpufleet.repair.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(settings["kubeconfig"], settings["hook_timeout_s"])
    if name == "hook":
        from gpufleet.repair.backends.hook import HookBackend

        return HookBackend(
            settings["hook_cordon"],
            settings["hook_uncordon"],
            settings["hook_drain"],
            settings["hook_timeout_s"],
        )
    raise ValueError(f"repair_backend={name!r}: use one of none, slurm, kubernetes, hook")


BACKENDS = ("none", "slurm", "kubernetes", "hook")
