"""Run an operator-configured command (reboot via IPMI, open a ticket, a cordon hook...).

The command is a shell-like string; {node}, {reason}, {incident} and {gpus} are replaced in
each argument after splitting, so a value with spaces stays one argument and is never
interpreted by a shell."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpufleet.protos.credentials import node_name_problem


@dataclass
class HookResult:
    ok: bool
    detail: str


# run_hook's signature: (template, timeout_s, node=, reason=, incident=, gpus=) -> HookResult.
HookRunner = Callable[..., Awaitable["HookResult"]]


async def run_hook(template: str, timeout_s: float, **values: str) -> HookResult:
    node = values.get("node")
    if node is not None:
        problem = node_name_problem(node)
        if problem:  # defence in depth: ingest and token issuance refuse such names first
            return HookResult(False, f"refused: node name {node[:120]!r} is not one: {problem}")
    try:
        argv = [arg.format(**values) for arg in shlex.split(template)]
    except (ValueError, KeyError, IndexError) as exc:
        return HookResult(False, f"bad hook command {template!r}: {exc}")
    if not argv:
        return HookResult(False, "empty hook command")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as exc:
        return HookResult(False, f"cannot start {argv[0]!r}: {exc}")
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return HookResult(False, f"{argv[0]} did not finish within {timeout_s:g} s and was killed")
    tail = output.decode(errors="replace").strip()[-500:]
    if proc.returncode != 0:
        return HookResult(False, f"{argv[0]} exited {proc.returncode}: {tail}")
    return HookResult(True, tail)
