"""Whose work is on each GPU, as this node can tell (docs/workloads.md "On the node"): every
compute process NVML lists is mapped to the workload that owns it through its cgroup, or, where
the scheduler puts no cgroup of its own (Slurm's proctrack/linuxproc), its environment. The
node names ids only (a Slurm job and step, a Kubernetes pod and container); owners come from
the scheduler, read by the aggregator, which also checks that the scheduler places each id on
this node.

cgroup paths recognised (/proc/PID/cgroup, every line; v1 and v2):
- Slurm, cgroup v1: `.../slurm/uid_1000/job_1234/step_0/task_0` (also `slurm_NODE/`);
- Slurm, cgroup v2: `.../slurmstepd.scope/job_1234/step_batch/user/task_0`;
- Kubernetes, cgroupfs driver: `/kubepods/burstable/pod<UID>/<container id>`;
- Kubernetes, systemd driver: `.../kubepods-burstable-pod<UID with _>.slice/cri-containerd-<id>.scope`
  (also `crio-`, `docker-`).
A Kubernetes process is named by its pod UID; the kubelet's PodResources answer names pods by
namespace/name, and the aggregator reads both from the API server.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.protos import telemetry_pb2
from gpufleet.protos.limits import MAX_PIDS_PER_WORKLOAD, MAX_WORKLOADS_PER_REPORT
from gpufleet.protos.names import workload_problem

log = logging.getLogger("gpufleet.collector.workloads")

_SLURM = re.compile(r"/job_(\d{1,12})/step_([A-Za-z0-9_]{1,32})(?:/|$)")
_KUBE_CGROUPFS = re.compile(
    r"/kubepods(?:/besteffort|/burstable|/guaranteed)?/pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"/([0-9a-f]{64})(?:/|$)"
)
_KUBE_SYSTEMD = re.compile(
    r"kubepods(?:-besteffort|-burstable|-guaranteed)?-pod"
    r"([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})\.slice/"
    r"(?:cri-containerd|crio|docker)-([0-9a-f]{64})\.scope"
)
# Read at most this much of a process's cgroup file and environment: a process's own
# environment is its to make as large as it likes.
_CGROUP_MAX_BYTES = 16 << 10
_ENVIRON_MAX_BYTES = 256 << 10


@dataclass(frozen=True)
class Owner:
    """The workload a process belongs to, as this node tells: scheduler "none" for none."""

    scheduler: str
    id: str = ""
    part: str = ""
    source: str = ""


NO_WORKLOAD = Owner("none")


def owner_from_cgroup(text: str) -> Owner | None:
    """The workload a /proc/PID/cgroup file names; None when it names no scheduler's."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _SLURM.search(path)
        if m and ("/slurm" in path or "slurmstepd.scope" in path):
            return Owner("slurm", m.group(1), m.group(2), "cgroup")
        m = _KUBE_CGROUPFS.search(path)
        if m:
            return Owner("kubernetes", m.group(1), m.group(2)[:12], "cgroup")
        m = _KUBE_SYSTEMD.search(path)
        if m:
            return Owner("kubernetes", m.group(1).replace("_", "-"), m.group(2)[:12], "cgroup")
    return None


def owner_from_environ(raw: bytes) -> Owner | None:
    """A Slurm task's job and step from its environment (SLURM_JOB_ID, SLURM_STEP_ID): where
    Slurm tracks processes without a cgroup of its own (proctrack/linuxproc, pgid)."""
    job = step = ""
    for entry in raw.split(b"\0"):
        if entry.startswith(b"SLURM_JOB_ID="):
            job = entry[13:].decode("ascii", "replace")
        elif entry.startswith(b"SLURM_STEP_ID="):
            step = entry[14:].decode("ascii", "replace")
    if not job.isdigit() or len(job) > 12:
        return None
    return Owner("slurm", job, step if step.isdigit() else "batch", "environ")


def _read_bounded(path: Path, limit: int) -> bytes:
    with path.open("rb") as f:
        return f.read(limit)


@dataclass
class _Found:
    owner: Owner
    gpus: set[int] = field(default_factory=set)
    pids: list[int] = field(default_factory=list)
    hbm_used_bytes: int = 0


class WorkloadReader:
    """Maps the NVML processes of a report's GPUs to their workloads. proc_roots: where a PID's
    cgroup and environ are read, first root first (a simulated node's made-up processes live
    in a folder of its own, beside /proc: collector/simnvml/processes.py)."""

    def __init__(self, proc_roots: Sequence[Path]) -> None:
        self.proc_roots = list(proc_roots)
        self.unreadable_total = 0  # processes whose cgroup could not be read (gone, or not ours)
        self.refused_total = 0  # owners whose names broke the grammar (never reported)

    def owner(self, pid: int) -> Owner:
        for root in self.proc_roots:
            base = root / str(pid)
            try:
                text = _read_bounded(base / "cgroup", _CGROUP_MAX_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            found = owner_from_cgroup(text)
            if found is None:
                try:
                    found = owner_from_environ(_read_bounded(base / "environ", _ENVIRON_MAX_BYTES))
                except OSError:
                    found = None
            if found is None:
                return NO_WORKLOAD
            if workload_problem(found.scheduler, found.id, found.part):
                self.refused_total += 1
                return NO_WORKLOAD
            return found
        self.unreadable_total += 1
        return NO_WORKLOAD

    def read(self, gpus: Sequence[telemetry_pb2.GpuSample]) -> list[telemetry_pb2.WorkloadSample]:
        """The workloads on these GPU samples' processes, the processes of no workload last (one
        entry per GPU, scheduler "none": which process holds how much of which GPU is what an
        orphan is named by); at most MAX_WORKLOADS_PER_REPORT."""
        found: dict[tuple[Owner, int], _Found] = {}
        owners: dict[int, Owner] = {}
        room = MAX_WORKLOADS_PER_REPORT - len(gpus)
        for gpu in gpus:
            for proc in gpu.processes:
                owner = owners.get(proc.pid)
                if owner is None:
                    owner = owners[proc.pid] = self.owner(proc.pid)
                if owner != NO_WORKLOAD and (owner, -1) not in found and len(found) >= room:
                    owner = NO_WORKLOAD  # room is kept for each GPU's entry of no workload
                key = (owner, gpu.index if owner == NO_WORKLOAD else -1)
                entry = found.get(key)
                if entry is None:
                    entry = found[key] = _Found(owner)
                entry.gpus.add(gpu.index)
                entry.pids.append(proc.pid)
                entry.hbm_used_bytes += proc.used_memory_bytes if proc.HasField("used_memory_bytes") else 0
        ordered = [
            found[k]
            for k in sorted(found, key=lambda k: (k[0] == NO_WORKLOAD, k[0].scheduler, k[0].id, k[1]))
        ]
        return [
            telemetry_pb2.WorkloadSample(
                scheduler=f.owner.scheduler,
                id=f.owner.id,
                part=f.owner.part,
                gpu_indices=sorted(f.gpus),
                pids=sorted(set(f.pids))[:MAX_PIDS_PER_WORKLOAD],
                process_count=len(set(f.pids)),
                hbm_used_bytes=f.hbm_used_bytes,
                source=f.owner.source,
            )
            for f in ordered
        ]
