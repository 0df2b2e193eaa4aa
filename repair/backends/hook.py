"""Cordon, drain and uncordon through operator commands (IPMI, a cloud API, a ticket system).

{node} and {reason} are substituted per argument, never through a shell, and a node name outside
the grammar (protos/credentials.py) is refused before any argv is built. The grammar allows no
leading '-', so {node} is never read as an option; where a tool takes `--`, putting {node}
after it is still good practice (docs/security.md). A drain command that exits 0 means the node
is drained; non-zero means not yet (it is run again on the next pass). Without an observe
command gpufleet's own records are the truth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet.common.settings import require, setting
from gpufleet.repair.backends.base import (
    Backend,
    BackendError,
    BackendSettings,
    DrainProgress,
    EngineCommand,
    Observed,
    scheduler_node,
)
from gpufleet.repair.hooks import run_hook


@dataclass
class HookSettings(BackendSettings):
    chosen_by: ClassVar[str] = "repair_backend = hook"
    repair_hook_cordon: str = setting("", "hook backend: command to cordon ({node}, {reason})")
    repair_hook_uncordon: str = setting("", "hook backend: command to uncordon ({node})")
    repair_hook_drain: str = setting("", "hook backend: command that exits 0 once {node} is drained")


class HookBackend(Backend):
    name = "hook"
    help = "commands of yours (repair_hook_cordon, _uncordon, _drain)"
    settings = HookSettings
    observes = False

    @classmethod
    def from_settings(cls, settings: HookSettings) -> Backend:
        return cls(
            settings.repair_hook_cordon,
            settings.repair_hook_uncordon,
            settings.repair_hook_drain,
            settings.repair_hook_timeout_s,
            settings.repair_drain_engine_command,
        )

    @classmethod
    def check_settings(cls, settings: Any, chosen: bool) -> None:
        require(
            not chosen or bool(settings.repair_hook_cordon and settings.repair_hook_uncordon),
            "repair_backend=hook needs repair_hook_cordon and repair_hook_uncordon",
        )

    def __init__(
        self,
        cordon_command: str,
        uncordon_command: str,
        drain_command: str,
        timeout_s: float,
        drain_engine_command: str = "",
    ) -> None:
        if not cordon_command or not uncordon_command:
            raise ValueError("the hook backend needs repair_hook_cordon and repair_hook_uncordon commands")
        self._cordon, self._uncordon, self._drain = cordon_command, uncordon_command, drain_command
        self._timeout_s = timeout_s
        self._engines = EngineCommand(drain_engine_command, timeout_s)

    async def observe(self, nodes: list[str], whole_fleet: bool = True) -> dict[str, Observed]:
        return {}

    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        scheduler_node(node, "hook")
        result = await run_hook(self._cordon, self._timeout_s, node=node, reason=reason)
        if not result.ok:
            raise BackendError(f"cordon hook for {node}: {result.detail}")

    async def drain(self, node: str) -> DrainProgress:
        scheduler_node(node, "hook")
        if not self._drain:
            return DrainProgress(True, "no drain hook configured")
        result = await run_hook(self._drain, self._timeout_s, node=node, reason="")
        return DrainProgress(result.ok, result.detail or ("drained" if result.ok else "draining"))

    async def leave_rotation(self, node: str, ports: list[int]) -> str | None:
        return await self._engines.leave(node, ports, "hook")

    async def uncordon(self, node: str, automation: bool = True) -> None:
        scheduler_node(node, "hook")
        result = await run_hook(self._uncordon, self._timeout_s, node=node, reason="")
        if not result.ok:
            raise BackendError(f"uncordon hook for {node}: {result.detail}")
