"""Slurm: `scontrol update NodeName=N State=DRAIN Reason="gpufleet: ..."` to cordon (Slurm's
DRAIN both stops new jobs and lets running ones finish, so it is cordon and drain at once),
`State=RESUME` to return. gpufleet only resumes a node whose drain reason it wrote.

Ownership is checked at the point of action: right before a cordon or a resume the node is
read again (`scontrol -o show node NAME`), and the automation neither drains over someone
else's drain reason nor resumes a node whose reason is not its own. (scontrol has no
conditional update, so a person's change in the milliseconds between that read and the update
can still be lost; the next pass sees and audits it.)

Load: the whole cluster (`scontrol -o show node`) is read at most every
repair_observe_interval_s; in between, only nodes with a workflow under way, in one call
(`scontrol -o show node a,b,c`).

Node names in gpufleet are the Slurm NodeNames. scontrol is run as a subprocess: Slurm has
no maintained Python client, and scontrol is the interface its admins script against."""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.common.settings import setting
from gpufleet.repair.backends.base import (
    AUTOMATION_PREFIX,
    Backend,
    BackendError,
    BackendSettings,
    DrainProgress,
    EngineCommand,
    NotOurs,
    Observed,
    scheduler_node,
    scheduler_nodes,
)

_BUSY = {"ALLOCATED", "ALLOC", "MIXED", "COMPLETING"}
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\])?(?= \w+=|$)")


def parse_nodes(text: str) -> dict[str, tuple[set[str], str]]:
    """`scontrol -o show node` output → {name: (state words, reason)}."""
    nodes = {}
    for line in text.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        state = re.search(r"\bState=(\S+)", line)
        if not name or not state:
            continue
        reason = _REASON.search(line)
        words = set(re.split(r"[+*~#!%$@^-]+", state.group(1).upper())) - {""}
        nodes[name.group(1)] = (words, reason.group(1).strip() if reason else "")
    return nodes


@dataclass
class SlurmSettings(BackendSettings):
    chosen_by: ClassVar[str] = "repair_backend = slurm"
    repair_slurm_scontrol: str = setting("scontrol", "the scontrol program (repair_backend = slurm)")
    repair_slurm_conf: str = setting("", "SLURM_CONF for scontrol (empty: Slurm's default)")


class SlurmBackend(Backend):
    name = "slurm"
    help = "scontrol DRAIN and RESUME"
    settings = SlurmSettings

    @classmethod
    def from_settings(cls, settings: SlurmSettings) -> Backend:
        return cls(
            settings.repair_slurm_scontrol,
            settings.repair_slurm_conf,
            settings.repair_hook_timeout_s,
            settings.repair_drain_engine_command,
        )

    def __init__(
        self,
        scontrol: str = "scontrol",
        slurm_conf: str = "",
        timeout_s: float = 30.0,
        drain_engine_command: str = "",
    ) -> None:
        self._engines = EngineCommand(drain_engine_command, timeout_s)
        self._scontrol = scontrol
        self._env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        self._timeout_s = timeout_s

    async def _run(self, *args: str) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                self._scontrol,
                *args,
                env=self._env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise BackendError(f"cannot run {self._scontrol!r}: {exc}; is Slurm installed here?") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BackendError(f"scontrol {' '.join(args)} did not answer in {self._timeout_s:g} s") from None
        if proc.returncode != 0:
            raise BackendError(f"scontrol {' '.join(args)} failed: {err.decode(errors='replace').strip()}")
        return out.decode(errors="replace")

    async def observe(self, nodes: list[str], whole_fleet: bool = True) -> dict[str, Observed]:
        if not nodes:
            return {}
        nodes = scheduler_nodes(nodes)
        if whole_fleet:
            text = await self._run("-o", "show", "node")
        else:
            try:
                text = await self._run("-o", "show", "node", ",".join(nodes))
            except BackendError:
                # One name Slurm does not know fails the whole list: read everything instead.
                text = await self._run("-o", "show", "node")
        parsed = parse_nodes(text)
        seen = {}
        for name in nodes:
            if name not in parsed:
                continue
            words, reason = parsed[name]
            cordoned = bool(words & {"DRAIN", "DRAINED", "DRAINING"})
            seen[name] = Observed(
                cordoned=cordoned,
                ours=cordoned and reason.startswith(AUTOMATION_PREFIX),
                reason=reason,
                drained=cordoned and not (words & _BUSY),
            )
        return seen

    async def _read(self, node: str) -> Observed:
        seen = (await self.observe([node], whole_fleet=False)).get(node)
        if seen is None:
            raise BackendError(f"node {node} is not a Slurm node (scontrol show node does not list it)")
        return seen

    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        scheduler_node(node, "slurm")
        if automation:
            seen = await self._read(node)
            if seen.cordoned and not seen.ours:
                raise NotOurs(node, seen.reason)
        await self._run("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    async def leave_rotation(self, node: str, ports: list[int]) -> str | None:
        return await self._engines.leave(node, ports, "slurm")

    async def drain(self, node: str) -> DrainProgress:
        scheduler_node(node, "slurm")
        seen = await self._read(node)
        if seen.drained:
            return DrainProgress(True, "no jobs left")
        return DrainProgress(False, "jobs still running (Slurm lets them finish)")

    async def uncordon(self, node: str, automation: bool = True) -> None:
        scheduler_node(node, "slurm")
        seen = await self._read(node)
        if not seen.cordoned:
            return
        if automation and not seen.ours:
            raise NotOurs(node, seen.reason)
        await self._run("update", f"NodeName={node}", "State=RESUME")
