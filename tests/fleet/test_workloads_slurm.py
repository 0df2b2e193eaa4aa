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

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.client.present import workload_row
from gpufleet.protos import fleet_pb2
from harness.alert_receiver import AlertReceiver
from harness.processes import Cluster, gpufleet_argv
from harness.repair import (
    FAST_POLICY,
    audit,
    gpufleet_cli,
    repair_aggregator,
    slurm_args,
    xid_scenario,
)
from harness.slurm import WORKLOAD_NODES
from harness.streams import RawStream, hello, report
from harness.waiting import wait_until

NODE_A, NODE_B = WORKLOAD_NODES  # no other test's nodes
UTIL_A, UTIL_B = 40.0, 90.0
GIB = 1 << 30


def _sbatch(
    slurm: Any,
    user: str,
    account: str,
    node: str,
    gpus: int,
    util: float,
    name: str,
    tag: str,
    script: str = "exec sleep 600",
) -> str:
    """A real batch job as `user` (sbatch --uid, run as root) on node, holding `gpus` GPUs and
    running `util` % on each (the simulated NVML reads it from the process); `script` is what
    the job runs."""
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
        script,
    )
    return out.strip().split(";")[0]


def _squeue(slurm: Any) -> dict[str, dict[str, Any]]:
    return {str(j["job_id"]): j for j in json.loads(slurm.run("squeue", "--json", "--all"))["jobs"]}


def _cli_json(agg: Any, cluster: Cluster, *args: str) -> Any:
    out = gpufleet_cli(agg, cluster, "ops", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def workload_nodes(slurm: Any) -> Iterator[Any]:
    """The workloads tests' own Slurm nodes, idle and in service at their start and end (one
    test at a time: the module's tests share an xdist group)."""
    for user in ("gpufleet-alice", "gpufleet-bob"):
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            pytest.fail(f"the system user {user} is missing: scripts/install-test-deps.sh creates it")

    def idle() -> None:
        slurm.cancel_on(WORKLOAD_NODES)
        for node in WORKLOAD_NODES:
            if slurm.state(node)[0] & {"DRAIN", "DRAINED", "DRAINING"}:
                slurm.scontrol("update", f"NodeName={node}", "State=RESUME")

    idle()
    try:
        yield slurm
    finally:
        idle()


@pytest.mark.slow
@pytest.mark.xdist_group("slurm-workloads")
def test_jobs_of_two_users_in_two_accounts_are_attributed_from_slurm(
    workload_nodes: Any, cluster: Cluster
) -> None:
    slurm = workload_nodes
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


WASTE_POLICY = (
    FAST_POLICY
    + """
[rules.idle_allocation]
window_s = 8.0
[rules.orphaned_process]
window_s = 3.0
[rules.gpu_outside_allocation]
window_s = 2.0
"""
)


def _escaped(tag: str) -> list[int]:
    """The processes a job left behind (they carry GPUFLEET_ORPHAN=tag in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"GPUFLEET_ORPHAN={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("slurm-workloads")
def test_idle_orphaned_and_outside_gpus_found_and_owners_told_and_an_xid_names_the_job(
    workload_nodes: Any, cluster: Cluster, alert_receiver: Callable[..., AlertReceiver]
) -> None:
    """Issue 54 on the real Slurm: a job holding its GPUs idle is found within its window plus an
    interval, its user and account in the alert, resolved when it ends; the process it left
    behind after `scancel` (daemonised: proctrack/linuxproc no longer tracks it) is an orphan of
    that job; a job's process on a GPU outside its GRES is found; an XID on a GPU a job runs on
    opens an incident whose alert and `gpufleet incidents` name the job, user and account."""
    slurm = workload_nodes
    receiver = alert_receiver()
    agg = repair_aggregator(
        cluster,
        *slurm_args(slurm, cluster),
        "--repair-observe-interval-s",
        "1",
        "--workload-scheduler",
        "slurm",
        "--workload-slurm-conf",
        str(slurm.conf),
        "--workload-poll-s",
        "1",
        "--alert-webhooks",
        receiver.url,
        "--alert-group-wait-s",
        "0.2",
        # The site's own cleanup of an orphan (opt-in): here a real kill of the real process the
        # simulated node's NVML lists, as `ssh {node} kill {pid}` would be on a fleet.
        "--repair-orphan-command",
        "kill {pid}",
        policy=WASTE_POLICY,
    )
    tag = uuid.uuid4().hex[:12]
    # Alice's job holds two GPUs and runs nothing on them; it starts a process that outlives it.
    leave_behind = f"setsid -f env GPUFLEET_ORPHAN={tag} GPUFLEET_SIM_HBM_BYTES={2 * GIB} sleep 600"
    idle_job = _sbatch(
        slurm, "gpufleet-alice", "vision", NODE_A, 2, 0.0, "notebook", tag, f"{leave_behind}; exec sleep 600"
    )
    # Bob's job is given GPUs 0-1 and runs a process on GPU 3 too (the simulated NVML places it
    # where SLURM_JOB_GPUS says, as CUDA would where a program picks its own device).
    outside = "env SLURM_JOB_GPUS=3 sleep 600 & exec sleep 600"
    busy_job = _sbatch(slurm, "gpufleet-bob", "llm-train", NODE_B, 2, UTIL_B, "pretrain", tag, outside)
    xid = xid_scenario(cluster.tmp / "xid.toml", 79, gpu=0, at_s=25.0)
    cluster.collector(NODE_A, agg.ingest, "--interval-s", "1", "--sim-gpus", "4", "--sim-gpu-users-tag", tag)
    started = time.monotonic()
    cluster.collector(
        NODE_B,
        agg.ingest,
        "--interval-s",
        "1",
        "--sim-gpus",
        "4",
        "--sim-gpu-users-tag",
        tag,
        "--sim-scenario",
        str(xid),
    )
    try:
        idle_key = f"waste/idle_allocation/slurm:{idle_job}"
        firing = wait_until(
            lambda: next((a for a in receiver.for_key(idle_key) if a["status"] == "firing"), None),
            8 + 30,
            "the idle allocation's alert",
            context=lambda: f"received: {[a['key'] for a in receiver.received]}",
        )
        assert firing["labels"] == {
            "alertname": "GpufleetWaste",
            "finding": "idle_allocation",
            "user": "gpufleet-alice",
            "account": "vision",
            "workload": f"slurm:{idle_job}",
        }
        assert firing["node"] == NODE_A and "GPU(s) 0,1" in firing["summary"]
        # `gpufleet waste` says the same: the job, its owner, its GPUs and what they hold.
        now = {
            r["finding"]: r
            for r in _cli_json(agg, cluster, "waste")["now"]
            if r["workload"] == f"slurm:{idle_job}"
        }
        idle_row = now["idle_allocation"]
        assert (idle_row["user"], idle_row["account"], idle_row["nodes"], idle_row["gpus"]) == (
            "gpufleet-alice",
            "vision",
            [NODE_A],
            [0, 1],
        )
        # On each of its two GPUs: the job's process (3 GiB), the one it leaves behind (2 GiB) and
        # the driver's 512 MiB.
        assert idle_row["hbm_used_bytes"] == 2 * (5 * GIB + 512 * (1 << 20))
        viewer = gpufleet_cli(agg, cluster, "viewer", "waste", "--json")
        assert viewer.returncode == 0, viewer.stderr
        seen_by_viewer = json.loads(viewer.stdout)
        assert {r["user"] for r in seen_by_viewer["now"]} == {"(hidden)"}

        outside_key = f"waste/gpu_outside_allocation/slurm:{busy_job}"
        seen = wait_until(lambda: receiver.for_key(outside_key), 30, "the GPU used outside its allocation")
        assert seen[0]["labels"]["user"] == "gpufleet-bob" and seen[0]["labels"]["account"] == "llm-train"
        assert "on GPU 3: a GPU no job was given" in seen[0]["summary"]
        assert not receiver.for_key(f"waste/idle_allocation/slurm:{busy_job}"), "a working job is not idle"

        # The XID on GPU 0 of bob's job: the incident and its alert name the job and its owner.
        (incident,) = wait_until(
            lambda: (
                [i for i in _cli_json(agg, cluster, "incidents")["incidents"] if i["node"] == NODE_B] or None
            ),
            max(5.0, 25.0 - (time.monotonic() - started)) + 30,
            "the XID's incident",
        )
        assert incident["workloads"] == [
            {
                "workload": f"slurm:{busy_job}",
                "name": "pretrain",
                "user": "gpufleet-bob",
                "account": "llm-train",
                "namespace": "",
                "team": "",
                "gpus": [0, 1],
                "hit": True,
            }
        ]
        paged = wait_until(lambda: receiver.for_key(incident["id"]), 20, "the incident's alert")
        assert f"work hit: slurm:{busy_job} (gpufleet-bob, llm-train) hit" in paged[0]["summary"]
        table = gpufleet_cli(agg, cluster, "viewer", "incidents")
        assert f"slurm:{busy_job} (llm-train)" in table.stdout, table.stdout
        # Slurm drains the node and lets bob's job finish: the drain says whose work it waits for.
        waits = wait_until(
            lambda: next(
                (
                    n["health_detail"]
                    for n in _cli_json(agg, cluster, "nodes")["nodes"]
                    if n["node"] == NODE_B and "waits for" in n["health_detail"]
                ),
                None,
            ),
            30,
            "the drain naming the job it waits for",
        )
        assert f"waits for slurm:{busy_job} (gpufleet-bob, llm-train)" in waits, waits

        # Alice's job ends: its idle alert resolves; what it left on GPU 0-1 is its orphan.
        (pid,) = _escaped(tag)
        slurm.run("scancel", idle_job)
        wait_until(
            lambda: any(a["status"] == "resolved" for a in receiver.for_key(idle_key)),
            30,
            "the idle alert resolved at the job's end",
        )
        orphan_key = f"waste/orphaned_process/slurm:{idle_job}"
        orphan = wait_until(lambda: receiver.for_key(orphan_key), 30, "the orphaned process's alert")[0]
        assert (
            orphan["labels"]["user"] == "gpufleet-alice" and orphan["labels"]["finding"] == "orphaned_process"
        )
        assert str(pid) in orphan["summary"] and f"slurm:{idle_job}" in orphan["summary"]
        # 2 GiB on each of the job's two GPUs.
        assert "has ended" in orphan["summary"] and "4.0 GiB on GPU(s) 0,1" in orphan["summary"]
        # The opt-in cleanup ran once for that process (not once per GPU it held), audited; the
        # process is gone, so the orphan's alert resolves.
        wait_until(
            lambda: any(a["status"] == "resolved" for a in receiver.for_key(orphan_key)),
            30,
            "the orphan's alert resolved once its process was killed",
            context=lambda: repr(audit(agg, cluster, NODE_A)),
        )
        assert not _escaped(tag), "the orphaned process outlived its cleanup"
        cleanups = [a for a in audit(agg, cluster, NODE_A) if a["action"] == "orphan_cleanup"]
        assert [(a["actor"], a["status"], a["reason"]) for a in cleanups] == [
            ("automation", "started", f"pid {pid} on GPU 0 (job slurm:{idle_job})"),
            ("automation", "ok", f"pid {pid} on GPU 0 (job slurm:{idle_job})"),
        ], cleanups
    finally:
        for pid in _escaped(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
