"""Who uses a simulated node's GPUs (docs/workloads.md "Stand-ins"):

- ProcGpuUsers: real processes on this machine that say they run on this node's GPUs, as a CUDA
  program holds a context on the devices it was given: a process whose environment has
  `GPUFLEET_SIM_TAG` equal to the collector's tag (one machine may run several test Slurms whose
  node names are the same: the tag says whose), `SLURMD_NODENAME` (or `GPUFLEET_SIM_NODE`) equal
  to this node, `GPUFLEET_SIM_UTIL_PCT` (the load it runs) and its GPUs in `SLURM_JOB_GPUS` or
  `CUDA_VISIBLE_DEVICES` (`GPUFLEET_SIM_HBM_BYTES`: memory it holds on each, default 1 GiB).
  The tests' real Slurm jobs are such processes: NVML then lists their real pids on the GPUs
  Slurm gave them, at exactly their load, and the collector maps those pids as on any node.
- DemoJobs: the demo's scheduler, for the node's own simulated jobs: each job is a Slurm-like
  job of a user in an account, with a cgroup file for its made-up pid (in a folder of its own
  beside /proc: made-up pids are above Linux's pid_max, so they never name a real process) and
  a record in the demo scheduler's jobs folder that the aggregator's `site` scheduler reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpufleet.collector.sim")

GIB = 1 << 30
MADE_UP_PID_BASE = 4_194_304  # Linux's largest pid_max (2^22): no real process has a pid above it
SCAN_EVERY_S = 1.0


@dataclass(frozen=True)
class GpuUse:
    pid: int
    util_pct: float
    hbm_bytes: int


def _environ(pid_dir: Path) -> dict[str, str]:
    try:
        raw = (pid_dir / "environ").read_bytes()[: 256 << 10]
    except OSError:
        return {}
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in (
            b"SLURMD_NODENAME",
            b"GPUFLEET_SIM_NODE",
            b"GPUFLEET_SIM_TAG",
            b"GPUFLEET_SIM_UTIL_PCT",
            b"GPUFLEET_SIM_HBM_BYTES",
            b"SLURM_JOB_GPUS",
            b"CUDA_VISIBLE_DEVICES",
        ):
            env[key.decode()] = value.decode("ascii", "replace")
    return env


def _indices(text: str, gpu_count: int) -> list[int]:
    out = []
    for part in text.split(","):
        if part.strip().isdigit() and int(part) < gpu_count:
            out.append(int(part))
    return out


class ProcGpuUsers:
    """The real processes that run on this simulated node's GPUs, read from /proc at most once
    a SCAN_EVERY_S."""

    def __init__(self, node: str, gpu_count: int, tag: str, proc: Path = Path("/proc")) -> None:
        self.node, self.gpu_count, self.tag, self.proc = node, gpu_count, tag, proc
        self._scanned_at = float("-inf")
        self._uses: dict[int, list[GpuUse]] = {}

    def uses(self) -> dict[int, list[GpuUse]]:
        now = time.monotonic()
        if now - self._scanned_at >= SCAN_EVERY_S:
            self._scanned_at = now
            self._uses = self._scan()
        return self._uses

    def _scan(self) -> dict[int, list[GpuUse]]:
        uses: dict[int, list[GpuUse]] = {}
        me = os.getpid()
        for entry in os.scandir(self.proc):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            env = _environ(Path(entry.path))
            if "GPUFLEET_SIM_UTIL_PCT" not in env or env.get("GPUFLEET_SIM_TAG") != self.tag:
                continue
            if self.node not in (env.get("SLURMD_NODENAME"), env.get("GPUFLEET_SIM_NODE")):
                continue
            try:
                util = min(100.0, max(0.0, float(env["GPUFLEET_SIM_UTIL_PCT"])))
                hbm = int(env.get("GPUFLEET_SIM_HBM_BYTES", GIB))
            except ValueError:
                continue
            gpus = _indices(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES", ""), self.gpu_count)
            for index in gpus:
                uses.setdefault(index, []).append(GpuUse(int(entry.name), util, hbm))
        return uses


def made_up_proc_dir(jobs_dir: Path, node: str) -> Path:
    """Where a simulated node's made-up processes have their /proc entries (PID/cgroup)."""
    return jobs_dir / "proc" / node


# The demo's users: (user, account, partition, share of jobs, utilization range %). One account
# holds GPUs it barely uses (the waste the Workloads page shows).
ROSTER = (
    ("alice", "llm-train", "gpu", 0.35, (85.0, 99.0)),
    ("bob", "llm-train", "gpu", 0.2, (80.0, 97.0)),
    ("carol", "vision", "gpu", 0.25, (40.0, 75.0)),
    ("dave", "research", "debug", 0.2, (0.5, 3.0)),
)


TEAMS = {"llm-train": "foundation", "vision": "perception", "research": "science"}
# The demo's orphans: a research notebook that ends leaves a process on its node's first GPU,
# holding this much HBM for this long (bytes, seconds): what the orphaned_process rule finds.
LEAVES_BEHIND = {"research": (6 << 30, 600.0)}


@dataclass
class DemoJob:
    job_id: str
    user: str
    account: str
    partition: str
    name: str
    util_range: tuple[float, float]


class DemoJobs:
    """The demo scheduler's jobs on one simulated node: who each simulated job belongs to, its
    cgroup file (proc_dir/PID/cgroup) and its record (jobs_dir/ID.json, what the aggregator's
    `site` scheduler reads: docs/workloads.md "The site's scheduler")."""

    def __init__(self, node: str, gpu_count: int, jobs_dir: Path) -> None:
        self.node, self.gpu_count = node, gpu_count
        self.proc_dir, self.jobs_dir = made_up_proc_dir(jobs_dir, node), jobs_dir
        self.proc_dir.mkdir(parents=True, exist_ok=True)
        jobs_dir.mkdir(parents=True, exist_ok=True)
        self._base = (zlib.crc32(node.encode()) % 9000 + 1000) * 100_000
        self._count = 0

    def pick(self, draw: float) -> DemoJob:
        """The owner of the next job, drawn from the roster (draw: uniform in [0, 1))."""
        self._count += 1
        acc = 0.0
        for entry in ROSTER:
            acc += entry[3]
            if draw < acc:
                break
        user, account, partition, _share, util_range = entry
        name = {"llm-train": "pretrain", "vision": "vit-finetune", "research": "notebook"}[account]
        return DemoJob(str(self._base + self._count), user, account, partition, name, util_range)

    def started(self, job: DemoJob, pid: int, ends_in_s: float) -> None:
        pid_dir = self.proc_dir / str(pid)
        pid_dir.mkdir(parents=True, exist_ok=True)
        _write(pid_dir / "cgroup", f"0::/system.slice/slurmstepd.scope/job_{job.job_id}/step_0/user/task_0\n")
        limit_s = max(60.0, ends_in_s * 1.5)
        self._record(job, {"start_unix_s": time.time(), "time_limit_s": limit_s, "end_unix_s": None})

    def ended(self, job: DemoJob, pid: int, keep_process: bool = False) -> None:
        """The job ended: its record says so; its process goes, unless it is left behind (its
        cgroup file stays until forget(pid): the demo's orphaned process)."""
        if not keep_process:
            self.forget(pid)
        path = self.jobs_dir / f"{job.job_id}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        record["end_unix_s"] = time.time()
        _write(path, json.dumps(record))

    def forget(self, pid: int) -> None:
        """A made-up process is gone: its /proc entry too."""
        (self.proc_dir / str(pid) / "cgroup").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (self.proc_dir / str(pid)).rmdir()

    def _record(self, job: DemoJob, times: dict[str, object]) -> None:
        record = {
            "scheduler": "slurm",  # its processes' cgroups are Slurm's (started() writes them)
            "id": job.job_id,
            "user": job.user,
            "account": job.account,
            "team": TEAMS[job.account],
            "partition": job.partition,
            "name": job.name,
            "nodes": {self.node: list(range(self.gpu_count))},
            **times,
        }
        _write(self.jobs_dir / f"{job.job_id}.json", json.dumps(record))


def _write(path: Path, text: str) -> None:
    """Whole or absent: the reader (another process) never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
