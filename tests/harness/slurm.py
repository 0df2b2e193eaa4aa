"""A real Slurm for the tests: munged, slurmctld and one slurmd per node name, all on loopback
ports in a throwaway directory (Debian's slurm-wlm and munge; scripts/install-test-deps.sh
installs them). Node names stand for GPU nodes; every slurmd runs on this machine (-N NAME)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from harness.processes import free_port
from harness.waiting import wait_until

# The session's Slurm (tests/conftest.py, slurm_cluster): node names standing for GPU nodes. The
# repair tests use gpu-node-01..20; the workloads tests (tests/fleet/test_workloads_slurm.py) run
# jobs for a minute on WORKLOAD_NODES, which no other test touches (another test's start cancels
# every job but theirs, and never resumes or drains them).
SLURM_NODES = [f"gpu-node-{i:02d}" for i in range(1, 23)]
WORKLOAD_NODES = ("gpu-node-21", "gpu-node-22")
GPUS_PER_NODE = 4  # GPU GRES of each node

CONF = """\
ClusterName=gpufleet-test
GresTypes=gpu
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={home}/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={home}/state
SlurmdSpoolDir={home}/spool/%n
SlurmctldPidFile={home}/run/slurmctld.pid
SlurmdPidFile={home}/run/slurmd-%n.pid
SlurmctldLogFile={home}/log/slurmctld.log
SlurmdLogFile={home}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
# Pending jobs are tried every 2 s, not every 60 (the default): a job submitted the moment a
# node comes back (resumed, "now responding") is not left waiting a minute.
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
ReturnToService=2
SlurmdTimeout=300
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, home: Path, nodes: list[str]) -> None:
        for exe in ("munged", "slurmctld", "slurmd", "scontrol"):
            if not shutil.which(exe):
                pytest.fail(
                    f"{exe} is not installed: scripts/install-test-deps.sh installs slurm-wlm and munge"
                )
        self.home, self.nodes = home, nodes
        self.procs: list[subprocess.Popen[bytes]] = []
        for sub in ("munge", "state", "run", "log", *[f"spool/{n}" for n in nodes]):
            (home / sub).mkdir(parents=True, exist_ok=True)
        key = home / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        lines = [
            f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname=localhost Port={free_port()} CPUs=1 "
            f"RealMemory=100 Gres=gpu:{GPUS_PER_NODE}"
            for n in nodes
        ]
        # Each node's GPUs for GRES: character devices (slurmd refuses a plain file), made here as
        # copies of /dev/null (major 1, minor 3): Slurm hands them out by index, and each job gets
        # SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES and its `IDX:` list as on a GPU node.
        dev = home / "dev"
        dev.mkdir(exist_ok=True)
        for i in range(GPUS_PER_NODE):
            if not (dev / f"nvidia{i}").exists():
                os.mknod(dev / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (home / "gres.conf").write_text(f"Name=gpu File={dev}/nvidia[0-{GPUS_PER_NODE - 1}]\n")
        self.conf = home / "slurm.conf"
        self.conf.write_text(
            CONF.format(home=home, ctld_port=free_port(), slurmd_port=free_port(), nodes="\n".join(lines))
        )
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.home / "log" / f"{name}.out", "ab") as out:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env))

    def start(self) -> None:
        m = self.home / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={m}/munge.key",
                f"--socket={m}/sock",
                f"--pid-file={m}/pid",
                f"--seed-file={m}/seed",
                f"--log-file={m}/log",
            ],
        )
        wait_until(lambda: (m / "sock").exists(), 20, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-f", str(self.conf), "-N", node])
        wait_until(
            lambda: all(self.state(n)[0] & {"IDLE"} for n in self.nodes), 60, "every slurmd to be idle"
        )

    def stop(self) -> None:
        # Jobs first: a batch job's processes outlive slurmd (they are the job's, not its), and a
        # test's `sleep` left running would hold a simulated node's GPUs in the next run.
        with contextlib.suppress(Exception):
            self.cancel_all()
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def scontrol(self, *args: str) -> str:
        return subprocess.run(
            ["scontrol", *args], env=self.env, check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def state(self, node: str) -> tuple[set[str], str]:
        """The node's state words (IDLE, DRAIN, ...) and its reason."""
        try:
            out = self.scontrol("-o", "show", "node", node)
        except subprocess.CalledProcessError:
            return set(), ""
        return _state_of(out.strip())

    def states(self) -> dict[str, tuple[set[str], str]]:
        """Every node's state words and reason, from one `scontrol show node` (one snapshot,
        one process: a checker looking at 20 nodes five times a second ran 100 a second)."""
        out = self.scontrol("-o", "show", "node")
        found = {}
        for line in out.splitlines():
            name = re.match(r"NodeName=(\S+)", line)
            if name:
                found[name.group(1)] = _state_of(line.strip())
        return found

    def run(self, exe: str, *args: str) -> str:
        return subprocess.run(
            [exe, *args], env=self.env, check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def submit(self, node: str, seconds: int) -> str:
        """A real batch job (a sleep) on the node; its job id."""
        # Submitted once the node is plainly IDLE (not "IDLE*", not responding, nor completing
        # the previous test's job), so the job starts at once.
        wait_until(lambda: self.raw_state(node) == "IDLE", 60, f"{node} idle and responding")
        out = self.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", f"sleep {seconds}")
        job = out.strip().split(";")[0]
        wait_until(
            lambda: "ALLOCATED" in self.state(node)[0] or "MIXED" in self.state(node)[0],
            30,
            f"job {job} running",
        )
        return job

    def raw_state(self, node: str) -> str:
        """The node's State= as scontrol prints it (IDLE, IDLE*, MIXED+DRAIN, ...)."""
        state = re.search(r"\bState=(\S+)", self.scontrol("-o", "show", "node", node))
        return state.group(1) if state else ""

    def jobs_by_node(self) -> list[tuple[str, str]]:
        """(job id, its node list) of every job in the queue (pending: no nodes yet)."""
        rows = [line.split() for line in self.run("squeue", "-h", "-o", "%i %N").splitlines()]
        return [(r[0], r[1] if len(r) > 1 else "") for r in rows if r]

    def cancel_all(self, spare: tuple[str, ...] = ()) -> None:
        """Cancel every job but those on the `spare` nodes (another test's own), and wait."""

        def left() -> list[str]:
            return [job for job, nodes in self.jobs_by_node() if nodes not in spare]

        for job in left():
            self.run("scancel", job)
        wait_until(lambda: not left(), 30, "every job to end")

    def wrapper(self, home: Path) -> FlakyScontrol:
        """An scontrol that logs each call and fails reads while told to (a scheduler that
        does not answer), for the aggregator's --repair-slurm-scontrol."""
        return FlakyScontrol(home, self.env)

    def cancel_on(self, nodes: tuple[str, ...]) -> None:
        """Cancel the jobs on these nodes (a workloads test's own), and wait."""

        def left() -> list[str]:
            return [job for job, on in self.jobs_by_node() if on in nodes]

        for job in left():
            self.run("scancel", job)
        wait_until(lambda: not left(), 30, "the jobs on " + ", ".join(nodes) + " to end")

    def resume_all(self, spare: tuple[str, ...] = ()) -> None:
        for node in self.nodes:
            if node not in spare and self.state(node)[0] & {"DRAIN", "DRAINED", "DRAINING"}:
                self.scontrol("update", f"NodeName={node}", "State=RESUME")


class FlakyScontrol:
    """A wrapper around the real scontrol: every call is logged (one line of arguments); while
    fail_reads(pct) is set, that percentage of reads (`show node`) fail as slurmctld does when
    it does not answer in time. Updates always go through: a read failing is the fault here."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.path, self.log, self._pct = home / "scontrol", home / "scontrol.calls", home / "fail.pct"
        real = shutil.which("scontrol", path=env.get("PATH"))
        self.path.write_text(
            "#!/bin/sh\n"
            f'echo "$*" >> {self.log}\n'
            'case "$*" in *"show node"*)\n'
            f"  pct=$(cat {self._pct} 2>/dev/null || echo 0)\n"
            "  r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')\n"
            '  if [ "$((r % 100))" -lt "$pct" ]; then\n'
            '    echo "slurm_load_node error: Socket timed out on send/recv operation" >&2; exit 1\n'
            "  fi;;\n"
            "esac\n"
            f'exec {real} "$@"\n'
        )
        self.path.chmod(0o755)

    def fail_reads(self, pct: int) -> None:
        self._pct.write_text(str(pct))

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def _state_of(line: str) -> tuple[set[str], str]:
    """A node's state words and reason from its line of `scontrol -o show node`."""
    state = re.search(r"\bState=(\S+)", line)
    reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\])?(?= \w+=|$)", line)
    words = set(re.split(r"[+*~#!%$@^-]+", state.group(1).upper())) - {""} if state else set()
    return words, reason.group(1).strip() if reason else ""
