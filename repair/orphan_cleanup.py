"""The opt-in action on an orphaned process (docs/workloads.md "Cleaning up orphans"): the site's
own kill or cleanup command (`repair_orphan_command`, e.g. `ssh {node} kill {pid}`), run once for
each process of no running job on the GPU an orphaned_process finding names, once that finding
has persisted for its window. Off unless the command is set; with repair_dry_run the decision is
audited and nothing is run.

Like every repair action it goes through the action ledger first (RepairState.begin_action: a
process killed, restarted or replaced by another replica never runs it twice for one process)
and the audit log (actor "automation", action "orphan_cleanup": started, then its outcome). The
command is split as a hook's (repair/hooks.py: no shell); its values are the control plane's or
checked here: the node name by the name grammar, the GPU and pid as numbers, and the workload id
only when it is made of the characters a scheduler's ids use (and does not start with '-'),
else left empty: a node's word never becomes an option of the site's command."""

from __future__ import annotations

import re
from collections.abc import Callable

from gpufleet.repair.hooks import HookRunner, run_hook
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.model import CLAIM_ENDED, CLAIM_NONE, CLAIM_UNKNOWN, Finding, NodeSnapshot
from gpufleet.repair.outcome import STARTED, Outcome, Status, failed
from gpufleet.repair.rails import Rails
from gpufleet.repair.state import RepairState
from gpufleet.repair.step_runner import Hooks

ACTION = "orphan_cleanup"
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}")
_ORPHAN_STATUSES = (CLAIM_ENDED, CLAIM_NONE, CLAIM_UNKNOWN)
SEEN_MAX = 100_000


def orphan_pids(f: Finding, snap: NodeSnapshot | None) -> list[int]:
    """The processes of no running job on the finding's GPU (what the finding is about)."""
    if snap is None or f.gpu is None:
        return []
    claims = [c for c in snap.claims if c.status in _ORPHAN_STATUSES and f.gpu in c.gpus]
    return sorted({pid for c in claims for pid in c.pids})


def safe_id(workload: str) -> str:
    """The workload id as a command argument: itself when it is made of an id's characters, else ""."""
    return workload if _SAFE_ID.fullmatch(workload) else ""


class OrphanCleanup:
    def __init__(
        self,
        command: str,
        timeout_s: float,
        state: RepairState,
        desk: IncidentDesk,
        dry_run: bool,
        clock: Callable[[], int],
        hook_runner: HookRunner = run_hook,
    ) -> None:
        """desk: where every repair action is audited, logged and counted (its audit_node)."""
        self._command, self._timeout_s, self._state, self._desk = command, timeout_s, state, desk
        self._dry_run, self._clock, self._run = dry_run, clock, hook_runner
        self._pending: list[tuple[Finding, list[int]]] = []
        # (node, GPU, pid) already handed to act(): the ledger is asked once per process, not
        # every pass its finding stays (bounded; past it, the ledger alone says "begun before").
        self._seen: set[tuple[str, int, int]] = set()

    def found(self, f: Finding, snap: NodeSnapshot | None) -> None:
        """An orphaned_process finding that has persisted for its window, at a look: its processes
        not handled yet are cleaned up at the next act()."""
        if f.gpu is None:
            return
        pids = [p for p in orphan_pids(f, snap) if (f.node, f.gpu, p) not in self._seen]
        if not pids:
            return
        if len(self._seen) + len(pids) > SEEN_MAX:
            self._seen.clear()
        self._seen.update((f.node, f.gpu, p) for p in pids)
        self._pending.append((f, pids))

    async def act(self, halted: bool = False) -> None:
        """Run the command for each process found since the last call, each at most once ever.
        halted (the breaker is tripped: all automation halts): nothing is run, and what was found
        is found again at a later look."""
        pending, self._pending = self._pending, []
        if halted:
            self._seen.difference_update((f.node, f.gpu, p) for f, pids in pending for p in pids)
            return
        for f, pids in pending:
            for pid in pids:
                await self._one(f, pid)

    async def _one(self, f: Finding, pid: int) -> None:
        key = f"{ACTION}:{f.node}:{pid}"  # once per process, however many GPUs it holds
        if not self._state.begin_action(key):
            return  # begun before, by this process, an earlier one or another replica
        where = f"pid {pid} on GPU {f.gpu}" + (f" (job {f.workload})" if f.workload else "")
        self._desk.audit_node(f.node, "", ACTION, where, STARTED, self._clock())
        if self._dry_run:
            outcome = Outcome(Status.DRY_RUN, "nothing run")
        else:
            result = await self._run(
                self._command,
                self._timeout_s,
                node=f.node,
                gpu=str(f.gpu),
                pid=str(pid),
                workload=safe_id(f.workload),
            )
            outcome = Outcome(Status.OK, result.detail) if result.ok else failed(result.detail)
        self._state.finish_action(key, outcome)
        self._desk.audit_node(f.node, "", ACTION, where, outcome, self._clock())


def orphan_cleanup(
    hooks: Hooks,
    state: RepairState,
    desk: IncidentDesk,
    rails: Rails,
    clock: Callable[[], int],
    runner: HookRunner,
) -> OrphanCleanup | None:
    """The cleanup the settings ask for; None when no command is set (the default: alerts only)."""
    if not hooks.orphan_command:
        return None
    return OrphanCleanup(hooks.orphan_command, hooks.timeout_s, state, desk, rails.dry_run, clock, runner)
