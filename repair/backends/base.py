"""The one interface every cordon backend has (Slurm, Kubernetes, a command hook, none)."""

from __future__ import annotations

import abc
from dataclasses import dataclass

# Reasons the automation writes start with this; it only ever undoes cordons that carry it.
AUTOMATION_PREFIX = "gpufleet:"


class BackendError(Exception):
    """The scheduler refused or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class Observed:
    """A node as the scheduler sees it."""

    cordoned: bool
    ours: bool  # cordoned by gpufleet's automation (its marker/reason prefix is there)
    reason: str = ""
    drained: bool = False  # no workload left on it


@dataclass(frozen=True)
class DrainProgress:
    done: bool
    detail: str


class Backend(abc.ABC):
    name = ""
    # True when observe() sees the scheduler's real state (cordons made by people outside
    # gpufleet included); False when gpufleet's own records are the only truth.
    observes = True

    @abc.abstractmethod
    async def observe(self, nodes: list[str]) -> dict[str, Observed]:
        """The scheduler's view of these nodes; a node it does not know is left out."""

    @abc.abstractmethod
    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        """Take the node out of scheduling; `automation` marks it as gpufleet's own cordon."""

    @abc.abstractmethod
    async def drain(self, node: str) -> DrainProgress:
        """Start or continue moving workloads off; called each pass until done."""

    @abc.abstractmethod
    async def uncordon(self, node: str) -> None:
        """Return the node to scheduling."""
