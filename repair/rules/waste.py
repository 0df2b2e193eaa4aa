"""GPUs held and not used (docs/workloads.md "Waste findings"): an allocation idle for its window,
a process holding HBM that no running job owns, and a process on a GPU its job was not given.

They read what the aggregator's workload ledger puts in the snapshot (NodeSnapshot.workloads and
.claims): the scheduler's word for which job holds which GPU, this node's own GPU readings and
process list for what is on them. A node's word moves only its own findings: its snapshot holds
its own GPUs and the jobs the scheduler places on it, and a job it names that the scheduler never
placed there is "unknown", never another node's job.

They notify and never cordon by default ([rules.*] cordon = false): the repair controller sends
them to their owners as alerts (repair/waste_desk.py), not into node incidents. A policy may make
an orphan a reason to take the node out (cordon = true with a ladder: drain and clean before
the next job lands on the GPU)."""

from __future__ import annotations

from gpufleet.repair.model import (
    CLAIM_ENDED,
    CLAIM_NONE,
    CLAIM_RUNNING,
    CLAIM_UNKNOWN,
    WASTE_RULES,
    Finding,
    NodeSnapshot,
    Owner,
    ProcessClaim,
)
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import Rule

GIB = 1 << 30
MIB = 1 << 20


def _whose(owner: Owner) -> str:
    return owner.group() or "owner unknown"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


class IdleAllocation(Rule):
    """A workload whose GPUs on this node all read under the activity threshold (SM activity
    where GPM has it, else utilization; [rules.idle_allocation] threshold, %), with no engine
    request on them, since `idle_since`: the finding's window counts from then (a job's loading
    time after its start is within that window), and the ledger restarts it at any active report,
    so a data-loading pause or a checkpoint shorter than the window is never found."""

    name = "idle_allocation"
    changes_with_time = True  # the window fills as time passes, the readings staying the same
    window_from_seen = True  # active again between two looks: the window starts again

    def __init__(self) -> None:
        self._due: dict[str, int] = {}  # node -> when its earliest idle window is whole (ns)

    def look_again_at_ns(self, node: str, entry: Entry) -> int | None:
        return self._due.get(node)

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        found = []
        due = None
        for w in snap.workloads:
            if w.idle_since_unix_s is None or not w.gpus:
                continue
            since_ns = int(w.idle_since_unix_s * 1e9)
            idle_s = max(0.0, (now_ns - since_ns) / 1e9)
            evidence = (
                f"{w.key} ({_whose(w.owner)}) holds GPU(s) {','.join(map(str, w.gpus))} idle for "
                f"{idle_s:.0f} s (under {entry.threshold:g} % activity, no engine request; "
                f"{_gib(w.hbm_used_bytes)} of HBM held)"
            )
            found.append(entry.finding(snap.node, w.gpus[0], self.name, evidence, since_ns, w.key))
            whole = since_ns + int(entry.window_s * 1e9)
            due = whole if due is None else min(due, whole)
        if due is None:
            self._due.pop(snap.node, None)
        else:
            self._due[snap.node] = due
        return found


def _allocated(snap: NodeSnapshot) -> dict[int, str]:
    """This node's GPUs the scheduler gave to a running workload: GPU -> workload."""
    return {gpu: w.key for w in snap.workloads for gpu in w.gpus}


def _claim_text(c: ProcessClaim) -> str:
    pids = ",".join(map(str, c.pids[:8])) + ("…" if len(c.pids) > 8 else "")
    gpus = ",".join(map(str, c.gpus))
    return f"pid(s) {pids or '?'} holding {_gib(c.hbm_used_bytes)} on GPU(s) {gpus}"


class OrphanedProcess(Rule):
    """A process holding at least [rules.orphaned_process] threshold MiB of HBM whose job has
    ended (the scheduler placed it on this node, and it ended), or that belongs to no running
    job on a GPU no running job holds (no job's, or a job the scheduler never placed here). It
    makes the next job on that GPU fail with out-of-memory."""

    name = "orphaned_process"

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        allocated = _allocated(snap)
        by_gpu: dict[int, list[str]] = {}
        workload_of: dict[int, str] = {}
        for c in snap.claims:
            if c.hbm_used_bytes < entry.threshold * MIB or not c.gpus:
                continue
            if c.status == CLAIM_ENDED:
                said = f"{_claim_text(c)}: its job {c.workload} ({_whose(c.owner)}) has ended"
                gpus = c.gpus
            elif c.status in (CLAIM_NONE, CLAIM_UNKNOWN):
                gpus = tuple(g for g in c.gpus if g not in allocated)
                whose = (
                    "in no job"
                    if c.status == CLAIM_NONE
                    else f"named by the node as {c.workload[:80]}, which the scheduler never placed here"
                )
                said = f"{_claim_text(c)} {whose}, on a GPU no running job holds"
            else:
                continue
            for gpu in gpus:
                by_gpu.setdefault(gpu, []).append(said)
                if c.status == CLAIM_ENDED:
                    workload_of.setdefault(gpu, c.workload)
        t = snap.sample_time_ns or now_ns
        return [
            entry.finding(snap.node, gpu, self.name, "; ".join(said)[:500], t, workload_of.get(gpu, ""))
            for gpu, said in sorted(by_gpu.items())
        ]


class GpuOutsideAllocation(Rule):
    """A running job's process on a GPU of this node the scheduler did not give that job (it
    ignored CUDA_VISIBLE_DEVICES, or the cgroup does not confine devices): another job's GPU, or
    one the scheduler thinks free. [rules.gpu_outside_allocation] threshold: HBM MiB it must hold
    (0: any process)."""

    name = "gpu_outside_allocation"

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        given = {w.key: set(w.gpus) for w in snap.workloads}
        allocated = _allocated(snap)
        t = snap.sample_time_ns or now_ns
        found = []
        for c in snap.claims:
            if c.status != CLAIM_RUNNING or c.workload not in given:
                continue
            if c.hbm_used_bytes < entry.threshold * MIB:
                continue
            for gpu in sorted(set(c.gpus) - given[c.workload]):
                holder = allocated.get(gpu)
                whose = f"{holder}'s GPU" if holder else "a GPU no job was given"
                evidence = (
                    f"{c.workload} ({_whose(c.owner)}), given GPU(s) "
                    f"{','.join(map(str, sorted(given[c.workload]))) or 'none'} here, runs {_claim_text(c)} "
                    f"on GPU {gpu}: {whose}"
                )
                found.append(entry.finding(snap.node, gpu, self.name, evidence, t, c.workload))
        return found


assert (IdleAllocation.name, OrphanedProcess.name, GpuOutsideAllocation.name) == WASTE_RULES
