"""Whose work is on every GPU, on a real Slurm (issue 53): the tests' slurmctld and slurmd with
GPU GRES; jobs submitted with sbatch as two users in two accounts; their processes are what the
simulated NVML lists on the GPUs Slurm gave them (collector/simnvml/gpu_users.py: a process
that says what it runs), at exactly the load they say. The collectors map those processes to
their Slurm jobs from the processes themselves (no scheduler cgroup under proctrack/linuxproc:
their environment), the aggregator reads owners and GRES indices from slurmctld
(`squeue --json`), and `gpufleet jobs`, `job ID` and `usage --by account` give the figures this
test computes from Slurm's own times and the load it asked for. A node that names a job Slurm
runs elsewhere is refused and counted."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from typing import Any

import pytest

from gpufleet.client.present import workload_row
from gpufleet.protos import fleet_pb2
from harness.processes import Cluster, gpufleet_argv
from harness.repair import gpufleet_cli
from harness.streams import RawStream, hello, report
from harness.waiting import wait_until

NODE_A, NODE_B = "gpu-node-19", "gpu-node-20"  # no other test's nodes
UTIL_A, UTIL_B = 40.0, 90.0
GIB = 1 << 30


def _sbatch(
    slurm: Any, user: str, account: str, node: str, gpus: int, util: float, name: str, tag: str
) -> str:
    """A real batch job as `user` (sbatch --uid, run as root) on node, holding `gpus` GPUs and
    running `util` % on each (the simulated NVML reads it from the process)."""
    out = slurm.run(
        "sbatch",
        "--parsable",
        f"--uid={user}",
        "-A",
        account,
        "-J",
        name,
        "-w",
        node,
        f"--gres=gpu:{gpus}",
        "-o",
        "/dev/null",
        "--chdir=/tmp",
        f"--export=ALL,GPUFLEET_SIM_TAG={tag},GPUFLEET_SIM_UTIL_PCT={util:g},"
        f"GPUFLEET_SIM_HBM_BYTES={3 * GIB}",
        "--wrap",
        "exec sleep 600",
    )
    return out.strip().split(";")[0]


def _squeue(slurm: Any) -> dict[str, dict[str, Any]]:
    return {str(j["job_id"]): j for j in json.loads(slurm.run("squeue", "--json", "--all"))["jobs"]}


def _cli_json(agg: Any, cluster: Cluster, *args: str) -> Any:
    out = gpufleet_cli(agg, cluster, "ops", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_jobs_of_two_users_in_two_accounts_are_attributed_from_slurm(slurm: Any, cluster: Cluster) -> None:
    for user in ("gpufleet-alice", "gpufleet-bob"):
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            pytest.fail(f"the system user {user} is missing: scripts/install-test-deps.sh creates it")
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--workload-scheduler",
        "slurm",
        "--workload-slurm-conf",
        str(slurm.conf),
        "--workload-poll-s",
        "1",
        "--gpu-hour-prices",
        "H100=2.00",
    )
    # This run's jobs only (another test Slurm on this machine may name its nodes the same).
    tag = uuid.uuid4().hex[:12]
    for node in (NODE_A, NODE_B):
        cluster.collector(
            node, agg.ingest, "--interval-s", "1", "--sim-gpus", "4", "--sim-gpu-users-tag", tag
        )
    job_a = _sbatch(slurm, "gpufleet-alice", "vision", NODE_A, 2, UTIL_A, "vit-finetune", tag)
    job_b = _sbatch(slurm, "gpufleet-bob", "llm-train", NODE_B, 3, UTIL_B, "pretrain", tag)

    stub, meta = agg.fleet_stub(), cluster.secrets.metadata("ops")

    def running() -> dict[str, dict[str, Any]]:
        # Polled through the Fleet API (a CLI process per check was most of this test's CPU);
        # the rows are the CLI's own (client/present.py), and the CLI is read at each step below.
        answer = stub.ListWorkloads(fleet_pb2.ListWorkloadsRequest(), metadata=meta, timeout=30)
        return {r["workload"]: r for r in map(workload_row, answer.running)}

    # Both running, with their owners from slurmctld and readings of their GPUs.
    def both_read() -> bool:
        rows = running()
        return all(rows.get(f"slurm:{j}", {}).get("util_mean_pct") is not None for j in (job_a, job_b))

    wait_until(
        both_read,
        60,
        "both jobs running with readings",
        context=lambda: f"listed: {running()}; squeue: {_squeue(slurm)}",
    )
    rows = {r["workload"]: r for r in _cli_json(agg, cluster, "jobs")["running"]}
    a, b = rows[f"slurm:{job_a}"], rows[f"slurm:{job_b}"]
    assert (a["user"], a["account"], a["partition"], a["name"], a["nodes"], a["gpus"]) == (
        "gpufleet-alice",
        "vision",
        "gpu",
        "vit-finetune",
        [NODE_A],
        2,
    )
    assert (b["user"], b["account"], b["nodes"], b["gpus"]) == ("gpufleet-bob", "llm-train", [NODE_B], 3)
    # Utilization exactly what the jobs run: each reading counted comes with the job's process on
    # that GPU (before its loading time ends, nothing else counts).
    assert a["util_mean_pct"] == pytest.approx(UTIL_A, abs=1e-9) and a["util_max_pct"] == UTIL_A
    assert b["util_mean_pct"] == pytest.approx(UTIL_B, abs=1e-9)
    assert a["hbm_peak_bytes"] == 3 * GIB + 512 * (1 << 20)  # the process's 3 GiB and the driver's 512 MiB

    # The job's report: its processes, on the GPUs Slurm gave it (GRES indices, from slurmctld).
    detail = _cli_json(agg, cluster, "job", job_a)
    squeue = _squeue(slurm)
    assert squeue[job_a]["gres_detail"] == ["gpu:2(IDX:0-1)"]
    assert sorted((g["node"], g["gpu"]) for g in detail["per_gpu"]) == [(NODE_A, 0), (NODE_A, 1)]
    assert [(p["node"], p["gpus"]) for p in detail["processes"]] == [(NODE_A, [0, 1])]

    # A node that names a job Slurm runs elsewhere (its own credential, a real stream): refused
    # and counted, charged to nobody.
    refused_before = agg.metric_value("gpufleet_workload_claims_refused_total", reason="not_on_node")
    liar = RawStream(agg.ingest, cluster.secrets.collector_token("gpu-node-18"))
    try:
        liar.send(hello("gpu-node-18", gpus=4))
        assert liar.recv().WhichOneof("body") == "welcome"
        forged = report("gpu-node-18", 1, gpus=4)
        forged.report.workloads.add(
            scheduler="slurm", id=job_b, part="batch", gpu_indices=[0, 1, 2], pids=[4242], process_count=1
        )
        liar.send(forged)
        assert liar.recv().WhichOneof("body") == "ack"
        wait_until(
            lambda: (
                agg.metric_value("gpufleet_workload_claims_refused_total", reason="not_on_node")
                == refused_before + 1
            ),
            20,
            "the forged claim refused and counted",
        )
    finally:
        liar.close()
    detail_b = _cli_json(agg, cluster, "job", job_b)
    assert [p["node"] for p in detail_b["processes"]] == [NODE_B]
    assert all(g["node"] == NODE_B for g in detail_b["per_gpu"])

    # The aggregator restarts mid-job (same data, same ports: the collectors reconnect): the
    # running jobs' figures go on from the control-plane state, not from zero.
    read = {g["gpu"]: g["seconds"] for g in _cli_json(agg, cluster, "job", job_a)["per_gpu"]}
    args = (
        "--workload-scheduler",
        "slurm",
        "--workload-slurm-conf",
        str(slurm.conf),
        "--workload-poll-s",
        "1",
    )
    agg.proc.stop(signal.SIGTERM, timeout_s=15)
    ingest_port, fleet_port = (int(a.rsplit(":", 1)[1]) for a in (agg.ingest, agg.fleet))
    agg = cluster.aggregator(
        "aggregator-again", ingest_port, fleet_port, agg.data_dir, *args, "--gpu-hour-prices", "H100=2.00"
    )
    stub = agg.fleet_stub()

    def goes_on() -> bool:
        detail = stub.GetWorkload(fleet_pb2.GetWorkloadRequest(id=job_a), metadata=meta, timeout=10)
        return all(g.seconds > read[g.gpu] for g in detail.gpus) and len(detail.gpus) == 2

    wait_until(goes_on, 60, "job A's figures going on after the restart")
    again = {r["workload"]: r for r in _cli_json(agg, cluster, "jobs")["running"]}[f"slurm:{job_a}"]
    assert again["util_mean_pct"] == pytest.approx(UTIL_A, abs=1e-9) and again["user"] == "gpufleet-alice"

    # Job A ends: its summary stays, GPU-hours to the second from Slurm's own times.
    slurm.run("scancel", job_a)
    wait_until(lambda: f"slurm:{job_a}" not in running(), 30, "job A ended")
    ended = _squeue(slurm)[job_a]
    hours_a = 2 * (ended["end_time"] - ended["start_time"]) / 3600
    listed = _cli_json(agg, cluster, "jobs", "--ended", "--since", "1h")
    summary = next(r for r in listed["ended"] if r["workload"] == f"slurm:{job_a}")
    assert summary["gpu_hours_allocated"] == pytest.approx(hours_a, abs=1e-9)
    assert summary["util_mean_pct"] == pytest.approx(UTIL_A, abs=1e-9)
    assert summary["gpu_hours_effective"] == pytest.approx(hours_a * UTIL_A / 100, abs=1e-9)
    assert summary["cost_allocated"] == pytest.approx(hours_a * 2.0, abs=1e-9)
    assert _cli_json(agg, cluster, "job", job_a)["end"] == summary["end"]

    # Usage by account: job A's GPU-hours to the second, job B's so far (still running).
    usage = {
        r["owner"]: r for r in _cli_json(agg, cluster, "usage", "--by", "account", "--since", "1h")["rows"]
    }
    assert set(usage) == {"vision", "llm-train"}
    assert usage["vision"]["gpu_hours_allocated"] == pytest.approx(hours_a, abs=1e-9)
    assert usage["vision"]["efficiency_pct"] == pytest.approx(UTIL_A, abs=1e-6)
    assert usage["llm-train"]["workloads"] == 1 and usage["llm-train"]["gpu_hours_allocated"] > 0
    # History by account: each account's GPUs' utilization, from the owner series (no job or user
    # is a tag): exactly the load each job ran while it held its GPUs.
    history = _cli_json(agg, cluster, "history", "util_gpu_pct", "--group-by", "account", "--since", "10m")
    by_account = {
        s["tags"]["account"]: [p["value"] for p in s["points"] if p["value"] is not None]
        for s in history["series"]
    }
    assert set(by_account) == {"vision", "llm-train"}, history
    assert by_account["vision"] and all(v == pytest.approx(UTIL_A, abs=1e-9) for v in by_account["vision"])
    assert by_account["llm-train"] and all(
        v == pytest.approx(UTIL_B, abs=1e-9) for v in by_account["llm-train"]
    )
    # Viewers see accounts, not users (show_user_names is off).
    viewer = subprocess.run(
        gpufleet_argv("jobs", "--json", "--fleet", agg.fleet, "--token", cluster.secrets.tokens["viewer"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert viewer.returncode == 0, viewer.stderr
    seen = json.loads(viewer.stdout)["running"][0]
    assert seen["user"] == "(hidden)" and seen["account"] == "llm-train"
    by_user = gpufleet_cli(agg, cluster, "viewer", "usage", "--by", "user")
    assert by_user.returncode != 0 and "operator" in by_user.stderr
