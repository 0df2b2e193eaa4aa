"""No scheduler: gpufleet's own records say which nodes are out of service (the demo, or a
fleet that only wants the incidents and alerts)."""

from __future__ import annotations

from gpufleet.repair.backends.base import Backend, DrainProgress, Observed


class NoBackend(Backend):
    name = "none"
    help = "gpufleet's own records, no scheduler"
    observes = False

    async def observe(self, nodes: list[str], whole_fleet: bool = True) -> dict[str, Observed]:
        return {}

    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        return None

    async def drain(self, node: str) -> DrainProgress:
        return DrainProgress(True, "no scheduler to drain")

    async def uncordon(self, node: str, automation: bool = True) -> None:
        return None
