"""Scheduler names: a collector's node name as the scheduler knows the node.

A collector names its node by the host name (`gpu-017.dc1.example.com`); Slurm may know it as
NodeName `gpu017`, Kubernetes as `gpu-017`. The mapping is an explicit table (a TOML file,
`[nodes]` collector name = scheduler name) and a pattern (a regular expression that must match
the whole collector name, and a replacement in Python's `re.sub` syntax: `\\1`, `\\g<name>`). The
table wins; a name neither maps is the scheduler's name as it is.

`MappedBackend` puts the mapping in front of any backend, so every call a backend gets (observe,
cordon, drain, uncordon) names the node the scheduler's way and every answer comes back under
the collector's name: the rest of repair never sees a scheduler name.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

from gpufleet.repair.backends.base import Backend, DrainProgress, NotOurs, Observed


class NameMapError(ValueError):
    """The mapping's settings cannot be used; the message names the setting and the value."""


class SchedulerNames:
    def __init__(self, regex: str = "", replace: str = "", table: dict[str, str] | None = None) -> None:
        if bool(regex) != bool(replace):
            raise NameMapError(
                "scheduler_name_regex and scheduler_name_replace go together "
                f"(got regex {regex!r}, replacement {replace!r})"
            )
        try:
            self._pattern = re.compile(regex) if regex else None
        except re.error as exc:
            raise NameMapError(f"scheduler_name_regex={regex!r} is not a regular expression: {exc}") from exc
        if self._pattern is not None:
            try:  # a replacement naming a group the pattern lacks fails here, not at the first cordon
                _check_template(self._pattern, replace)
            except IndexError as exc:
                raise NameMapError(
                    f"scheduler_name_replace={replace!r} does not fit scheduler_name_regex={regex!r}: {exc}"
                ) from exc
        self._replace = replace
        self._table = dict(table or {})
        clashes = sorted(name for name, n in Counter(self._table.values()).items() if n > 1)
        if clashes:
            raise NameMapError(
                f"scheduler_names_file maps several collector nodes to {clashes[0]!r}: "
                "each scheduler node must belong to one collector node"
            )

    @classmethod
    def from_settings(cls, regex: str, replace: str, table_file: str) -> SchedulerNames:
        table: dict[str, str] = {}
        if table_file:
            try:
                data = tomllib.loads(Path(table_file).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise NameMapError(f"scheduler_names_file={table_file!r} cannot be read: {exc}") from exc
            nodes = data.get("nodes", {})
            bad = (
                [k for k, v in nodes.items() if not isinstance(v, str) or not v]
                if isinstance(nodes, dict)
                else []
            )
            if not isinstance(nodes, dict) or bad:
                raise NameMapError(
                    f"scheduler_names_file={table_file!r}: [nodes] must map collector node names to "
                    f"scheduler node names (strings); {bad[:3] or 'nodes'} is not"
                )
            table = dict(nodes)
        return cls(regex, replace, table)

    @property
    def identity(self) -> bool:
        return self._pattern is None and not self._table

    def to_scheduler(self, node: str) -> str:
        mapped = self._table.get(node)
        if mapped is not None:
            return mapped
        if self._pattern is not None and self._pattern.fullmatch(node):
            return self._pattern.sub(self._replace, node, count=1)
        return node


def _check_template(pattern: re.Pattern[str], replace: str) -> None:
    """Raise IndexError when replace names a group the pattern does not have."""
    for m in re.finditer(r"\\(\d+)|\\g<(\w+)>", replace):
        ref = m.group(1) or m.group(2)
        if ref.isdigit():
            if int(ref) > pattern.groups:
                raise IndexError(f"group {ref} is not in the pattern (it has {pattern.groups})")
        elif ref not in pattern.groupindex:
            raise IndexError(f"group {ref!r} is not in the pattern")


class MappedBackend(Backend):
    """Any backend, spoken to in the scheduler's names."""

    def __init__(self, inner: Backend, names: SchedulerNames) -> None:
        self.inner, self.names = inner, names
        self.name = inner.name
        self.observes = inner.observes

    async def observe(self, nodes: list[str], whole_fleet: bool = True) -> dict[str, Observed]:
        asked = {self.names.to_scheduler(n): n for n in nodes}
        seen = await self.inner.observe(list(asked), whole_fleet)
        return {asked[s]: o for s, o in seen.items() if s in asked}

    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        try:
            await self.inner.cordon(self.names.to_scheduler(node), reason, automation)
        except NotOurs as exc:
            raise NotOurs(node, exc.reason) from exc

    async def drain(self, node: str) -> DrainProgress:
        return await self.inner.drain(self.names.to_scheduler(node))

    async def leave_rotation(self, node: str, ports: list[int]) -> str | None:
        return await self.inner.leave_rotation(self.names.to_scheduler(node), ports)

    async def uncordon(self, node: str, automation: bool = True) -> None:
        try:
            await self.inner.uncordon(self.names.to_scheduler(node), automation)
        except NotOurs as exc:
            raise NotOurs(node, exc.reason) from exc
