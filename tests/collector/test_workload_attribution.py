"""The node's half of attribution (collector/sources/workloads.py): each GPU process's workload
read from its cgroup file and, without a scheduler cgroup, its environment — real files in a
folder laid out as /proc is. Whatever a process's cgroup or environment holds (it is the
process's to write: a job can make its environment anything, a container runtime names its own
cgroups), the ids reported pass one grammar (protos/names.py) or the process is named as no
workload's; nothing is ever read past a bound; 10,000 processes on a GPU give a bounded report."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector.sources.workloads import NO_WORKLOAD, Owner, WorkloadReader, owner_from_cgroup
from gpufleet.protos import telemetry_pb2
from gpufleet.protos.limits import MAX_PIDS_PER_WORKLOAD, MAX_WORKLOADS_PER_REPORT
from gpufleet.protos.names import workload_problem

POD = "0f3c9d9e-6a3b-4c55-9a1e-2b7f1c4d5e6f"
CONTAINER = "a" * 64

CGROUPS = {
    # Slurm, cgroup v1 (task/cgroup): one line per controller.
    "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n11:cpuset:/slurm/uid_1000/job_4242/step_0\n": Owner(
        "slurm", "4242", "0", "cgroup"
    ),
    "5:devices:/slurm_gpu-node-07/uid_0/job_77/step_batch/task_0\n": Owner("slurm", "77", "batch", "cgroup"),
    # Slurm, cgroup v2 (slurmstepd's own scope).
    "0::/system.slice/slurmstepd.scope/job_123456/step_extern/user/task_special\n": Owner(
        "slurm", "123456", "extern", "cgroup"
    ),
    # Kubernetes, cgroupfs driver, v1 and v2.
    f"8:memory:/kubepods/burstable/pod{POD}/{CONTAINER}\n": Owner(
        "kubernetes", POD, CONTAINER[:12], "cgroup"
    ),
    f"0::/kubepods/pod{POD}/{CONTAINER}\n": Owner("kubernetes", POD, CONTAINER[:12], "cgroup"),
    # Kubernetes, systemd driver (containerd, CRI-O).
    (
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{POD.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n"
    ): Owner("kubernetes", POD, CONTAINER[:12], "cgroup"),
    f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CONTAINER}.scope\n": Owner(
        "kubernetes", POD, CONTAINER[:12], "cgroup"
    ),
    # A system process: no scheduler's cgroup.
    "0::/system.slice/nvidia-persistenced.service\n": None,
    # Path-like and look-alike lines: nothing taken from them.
    "0::/slurm/uid_0/job_../step_0/task_0\n": None,
    "0::/home/user/job_99/step_0\n": None,
    f"0::/kubepods/burstable/pod../../etc/{CONTAINER}\n": None,
}


def test_each_schedulers_cgroup_layout_names_its_workload() -> None:
    for text, owner in CGROUPS.items():
        assert owner_from_cgroup(text) == owner, text


def _proc(root: Path, pid: int, cgroup: bytes, environ: bytes = b"") -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_bytes(cgroup)
    (root / str(pid) / "environ").write_bytes(environ)


def _gpu(index: int, pids: list[int]) -> telemetry_pb2.GpuSample:
    gpu = telemetry_pb2.GpuSample(index=index)
    for pid in pids:
        gpu.processes.add(pid=pid, used_memory_bytes=1 << 30)
    return gpu


def test_processes_are_grouped_into_workloads_and_the_rest_named_as_none(tmp_path: Path) -> None:
    _proc(tmp_path, 10, b"0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n")
    _proc(tmp_path, 11, b"0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n")
    # Slurm without a cgroup of its own (proctrack/linuxproc): the task's environment.
    _proc(tmp_path, 12, b"0::/\n", b"HOME=/root\0SLURM_JOB_ID=6\0SLURMD_NODENAME=n1\0")
    _proc(tmp_path, 13, b"0::/system.slice/ssh.service\n", b"PATH=/bin\0")
    reader = WorkloadReader([tmp_path])
    got = reader.read([_gpu(0, [10, 13]), _gpu(1, [11, 12, 99])])  # 99: gone, unreadable
    assert [(w.scheduler, w.id, w.part, list(w.gpu_indices), list(w.pids)) for w in got] == [
        ("slurm", "5", "0", [0, 1], [10, 11]),
        ("slurm", "6", "batch", [1], [12]),
        # The processes of no workload, one entry per GPU: which holds how much of which GPU.
        ("none", "", "", [0], [13]),
        ("none", "", "", [1], [99]),
    ]
    assert got[0].hbm_used_bytes == 2 << 30 and got[0].source == "cgroup" and got[1].source == "environ"
    assert reader.unreadable_total == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cgroup=st.one_of(
        st.binary(max_size=400),
        st.builds(
            lambda a, b, c: f"0::/{a}slurmstepd.scope/job_{b}/step_{c}/task_0\n".encode(),
            st.text(max_size=30),
            st.text(max_size=30),
            st.text(max_size=30),
        ),
        st.builds(
            lambda a, b: f"0::/kubepods/burstable/pod{a}/{b}\n".encode(),
            st.text(max_size=40),
            st.text(max_size=70),
        ),
    ),
    environ=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda j, s: b"SLURM_JOB_ID=" + j + b"\0SLURM_STEP_ID=" + s + b"\0",
            st.binary(max_size=20),
            st.binary(max_size=20),
        ),
    ),
)
def test_whatever_a_process_writes_its_reported_ids_pass_the_grammar(
    tmp_path_factory: object, cgroup: bytes, environ: bytes
) -> None:
    root = tmp_path_factory.mktemp("proc")  # type: ignore[attr-defined]
    _proc(root, 4242, cgroup, environ)
    owner = WorkloadReader([root]).owner(4242)
    assert owner == NO_WORKLOAD or workload_problem(owner.scheduler, owner.id, owner.part) == "", owner


def test_ten_thousand_processes_on_a_gpu_give_a_bounded_report(tmp_path: Path) -> None:
    # Every process a job of its own: the report names at most MAX_WORKLOADS_PER_REPORT workloads
    # (the rest as no workload's), each listing at most MAX_PIDS_PER_WORKLOAD pids.
    for pid in range(1, 10_001):
        _proc(tmp_path, pid, f"0::/system.slice/slurmstepd.scope/job_{pid}/step_0/user/task_0\n".encode())
    got = WorkloadReader([tmp_path]).read([_gpu(0, list(range(1, 10_001)))])
    assert len(got) == MAX_WORKLOADS_PER_REPORT
    assert all(len(w.pids) <= MAX_PIDS_PER_WORKLOAD for w in got)
    assert got[-1].scheduler == "none" and got[-1].process_count == 10_000 - (MAX_WORKLOADS_PER_REPORT - 1)
    assert sum(w.process_count for w in got) == 10_000
    assert telemetry_pb2.NodeReport(workloads=got).ByteSize() < 64 << 10
