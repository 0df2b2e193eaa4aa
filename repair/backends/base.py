"""The one interface every cordon backend has (Slurm, Kubernetes, a command hook, none)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet.common.settings import setting
from gpufleet.protos.credentials import node_name_problem
from gpufleet.repair.hooks import run_hook

# Reasons the automation writes start with this; it only ever undoes cordons that carry it.
AUTOMATION_PREFIX = "gpufleet:"


class BackendError(Exception):
    """The scheduler refused or could not be reached; the message says which and why.
    status: the API's HTTP status where there is one (Kubernetes), else 0."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotOurs(BackendError):
    """Read right before acting: the node is cordoned by someone else (a person, another
    tool). The automation leaves it exactly as it is."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"{node} is cordoned by someone else ({reason or 'no reason given'}); not touched")
        self.node, self.reason = node, reason


def scheduler_node(node: str, backend: str) -> str:
    """node, when it is a name by the one grammar (protos/credentials.py); BackendError before
    any argv, URL or path is built from one that is not (defence in depth: ingest refuses such
    a name at the Hello, and no token is issued for one). Slurm never sees a hostlist or a
    comma, a tool never sees an option, a URL never sees a '/'."""
    problem = node_name_problem(node)
    if problem:
        raise BackendError(f"{backend}: refusing node name {node[:120]!r}: {problem}")
    return node


def scheduler_nodes(nodes: list[str]) -> list[str]:
    """The names among nodes that are names by the grammar (observe leaves the others out, as
    it does a node the scheduler does not know)."""
    return [n for n in nodes if not node_name_problem(n)]


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


class EngineCommand:
    """Slurm and hook backends: the operator's command that takes one engine replica out of
    rotation (a load balancer's API, an InferencePool's endpoint picker...), run once per
    replica with {node} and {port} substituted (never through a shell; no value a node chose
    beyond its checked name and a port number)."""

    def __init__(self, command: str, timeout_s: float) -> None:
        self.command, self._timeout_s = command, timeout_s

    async def leave(self, node: str, ports: list[int], backend: str) -> str | None:
        if not self.command:
            return None
        scheduler_node(node, backend)
        for port in ports:
            result = await run_hook(self.command, self._timeout_s, node=node, port=str(port), reason="")
            if not result.ok:
                raise BackendError(f"drain engine command for {node} port {port}: {result.detail}")
        return f"{len(ports)} engine(s) out of rotation by repair_drain_engine_command"


@dataclass
class BackendSettings:
    """What the backends that call a scheduler or run a command share."""

    chosen_by: ClassVar[str] = "repair_backend = slurm, kubernetes or hook"
    repair_hook_timeout_s: float = setting(600.0, "longest a repair hook or scheduler call may run")
    repair_drain_engine_command: str = setting(
        "",
        "slurm and hook backends: command that takes one inference engine out of rotation before a "
        "drain ({node}, {port}; once per replica); empty: drains do not wait for engines to finish "
        "(Kubernetes uses the pods' gpufleet.io/in-rotation label instead)",
    )


class Backend(abc.ABC):
    name = ""
    help = ""  # one line for people: the settings reference and errors say it
    settings: ClassVar[type | None] = None  # its own settings dataclass (common/registry.py)
    # True when observe() sees the scheduler's real state (cordons made by people outside
    # gpufleet included); False when gpufleet's own records are the only truth.
    observes = True

    @classmethod
    def from_settings(cls, settings: Any) -> Backend:
        """This backend from the aggregator's settings (which include its settings dataclass)."""
        return cls()

    @classmethod
    def check_settings(cls, settings: Any, chosen: bool) -> None:
        """ValueError naming the setting when its settings cannot work (chosen: it is the
        repair_backend); nothing to check by default."""
        return None

    @abc.abstractmethod
    async def observe(self, nodes: list[str], whole_fleet: bool = True) -> dict[str, Observed]:
        """The scheduler's view of these nodes; a node it does not know is left out. With
        whole_fleet the backend may read every node in one request (one LIST, one `scontrol
        show node`) instead of asking for each."""

    @abc.abstractmethod
    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        """Take the node out of scheduling; `automation` marks it as gpufleet's own cordon.
        With automation the node is read first and NotOurs raised when someone else has it
        cordoned: a cordon never overwrites a person's."""

    @abc.abstractmethod
    async def drain(self, node: str) -> DrainProgress:
        """Start or continue moving workloads off; called each pass until done."""

    async def leave_rotation(self, node: str, ports: list[int]) -> str | None:
        """Take the node's inference engines (on these ports) out of rotation before its drain
        evicts anything: new requests go to other replicas, those in flight finish. The detail
        of what was done, or None when this backend has no way to (the drain then does not wait
        for them: docs/repair.md "Graceful drain")."""
        return None

    @abc.abstractmethod
    async def uncordon(self, node: str, automation: bool = True) -> None:
        """Return the node to scheduling. With automation the node is read first: only a
        cordon the automation made is undone (NotOurs otherwise); a node already in service
        is left as it is. A person's uncordon through gpufleet (automation False) undoes any."""
