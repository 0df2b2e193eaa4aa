"""Whose work is on every GPU, on Kubernetes (issue 53), with the most faithful stand-ins this
machine can run (no kubelet, no API server here): the kubelet's PodResources API (the real v1
gRPC service on a unix socket: tests/harness/pod_resources.py) says which GPU UUID each pod's
container holds; the API server stand-in (tests/harness/k8s_standin.py, real HTTP, read by the
official client) says each pod's node, namespace, team label, owner and GPU count. Usage by
namespace and by team follows; a pod the API does not know, or places on another node, named
by a node is refused and counted."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from gpufleet.client.present import workload_row
from gpufleet.protos import fleet_pb2
from harness.alert_receiver import AlertReceiver
from harness.k8s_standin import KubeStandin
from harness.pod_resources import PodResourcesStandin
from harness.processes import Cluster
from harness.repair import gpufleet_cli, incidents, xid_scenario
from harness.streams import RawStream, hello, report
from harness.waiting import wait_until

NODE, OTHER = "k8s-gpu-a", "k8s-gpu-b"
GIB = 1 << 30


WASTE_POLICY = """
[rules.idle_allocation]
window_s = 5.0
[rules.orphaned_process]
window_s = 2.0
[rules.gpu_outside_allocation]
window_s = 2.0
"""


def _gpu_process(node: str, tag: str, gpus: str, util: float, hbm: int) -> subprocess.Popen[bytes]:
    """A real process the simulated NVML lists on the node's GPUs (collector/simnvml/gpu_users.py),
    in no pod's cgroup."""
    env = {
        **os.environ,
        "GPUFLEET_SIM_NODE": node,
        "GPUFLEET_SIM_TAG": tag,
        "GPUFLEET_SIM_UTIL_PCT": f"{util:g}",
        "GPUFLEET_SIM_HBM_BYTES": str(hbm),
        "CUDA_VISIBLE_DEVICES": gpus,
    }
    return subprocess.Popen(["sleep", "600"], env=env)


CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


@contextlib.contextmanager
def _in_pod_cgroup(pod_uid: str, proc: subprocess.Popen[bytes]) -> Iterator[Path]:
    """proc moved into a real kernel cgroup named as the kubelet's cgroupfs driver names a pod's
    container (/kubepods/burstable/pod<UID>/<container id>): what the collector reads in
    /proc/PID/cgroup on a Kubernetes node. Skips where this machine lets no cgroup be made."""
    made: list[Path] = []
    for root in CGROUP_ROOTS:
        folder = root / "kubepods" / "burstable" / f"pod{pod_uid}" / uuid4().hex.ljust(64, "0")
        try:
            folder.mkdir(parents=True)
            (folder / "cgroup.procs").write_text(str(proc.pid))
        except OSError:
            continue
        made = [folder, *folder.parents[:3]]
        break
    if not made:
        pytest.skip(f"no writable cgroup hierarchy under {', '.join(map(str, CGROUP_ROOTS))}")
    try:
        yield made[0]
    finally:
        proc.kill()
        proc.wait()
        for folder in made:  # the pod's folders, leaf first; kubepods kept if another test uses it
            with contextlib.suppress(OSError):
                folder.rmdir()


@pytest.mark.slow
def test_pods_gpus_come_from_the_kubelet_and_their_owners_from_the_api(
    kube: KubeStandin, cluster: Cluster, alert_receiver: Callable[..., AlertReceiver]
) -> None:
    started = time.time() - 1800
    started_iso = datetime.fromtimestamp(int(started), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for node in (NODE, OTHER):
        kube.add_node(node)
    kube.add_pod(
        "ml-serving", "llama-0", NODE, labels={"team": "inference"}, owner_kind="StatefulSet",
        owner_name="llama", gpus=2, started=started_iso,
    )  # fmt: skip
    kube.add_pod(
        "research", "nb-1", NODE, labels={"team": "science"}, owner_kind="ReplicaSet",
        owner_name="notebook-7d9f8b6c5", gpus=1, started=started_iso,
    )  # fmt: skip
    kube.add_pod("research", "elsewhere", OTHER, labels={"team": "science"}, gpus=1, started=started_iso)
    kubelet = PodResourcesStandin(cluster.tmp / "kubelet.sock")
    receiver = alert_receiver()
    policy = cluster.tmp / "policy.toml"
    policy.write_text(WASTE_POLICY)
    # llama-0's GPUs 0-1 work (a process at 80 %); nb-1's GPU 3 reads idle; a process of no pod
    # holds 3 GiB on GPU 2, which the API gives no pod on this node.
    tag = uuid4().hex[:12]
    procs = [_gpu_process(NODE, tag, "0,1", 80.0, GIB), _gpu_process(NODE, tag, "2", 0.0, 3 * GIB)]
    try:
        agg = cluster.aggregator(
            "aggregator",
            0,
            0,
            None,
            "--workload-scheduler",
            "kubernetes",
            "--workload-kubeconfig",
            str(kube.kubeconfig(cluster.tmp / "kubeconfig")),
            "--workload-poll-s",
            "1",
            "--repair-policy-file",
            str(policy),
            "--repair-observe-interval-s",
            "1",
            "--alert-webhooks",
            receiver.url,
            "--alert-group-wait-s",
            "0.2",
            # The waste digest every 3 s (a day by default), by namespace, every owner in it.
            "--waste-digest-every-s",
            "3",
            "--waste-digest-by",
            "namespace",
            "--waste-digest-min-idle-gpu-hours",
            "0",
        )
        collector_args = (
            "--interval-s", "1", "--sim-gpus", "4", "--sim-gpu-users-tag", tag,
            "--kubelet-pod-resources-socket", str(kubelet.path),
        )  # fmt: skip
        first = cluster.collector(NODE, agg.ingest, *collector_args)
        stub, meta = agg.fleet_stub(), cluster.secrets.metadata("ops")
        detail = wait_until(
            lambda: (
                (
                    d := stub.GetNode(fleet_pb2.GetNodeRequest(node=NODE), metadata=meta, timeout=10)
                ).summary.gpus
                and d
            ),
            30,
            "the node's GPUs",
        )
        uuid = {g.index: g.uuid for g in detail.summary.gpus}
        kubelet.allocations = [
            ("ml-serving", "llama-0", "main", "nvidia.com/gpu", [uuid[0], uuid[1]]),
            ("research", "nb-1", "main", "nvidia.com/gpu", [uuid[3]]),
            # The node's word about pods the API places elsewhere or does not know: refused.
            ("research", "elsewhere", "main", "nvidia.com/gpu", [uuid[2]]),
            ("kube-system", "forged", "main", "nvidia.com/gpu", [uuid[2]]),
        ]

        def listed() -> dict[str, dict[str, object]]:
            answer = stub.ListWorkloads(fleet_pb2.ListWorkloadsRequest(), metadata=meta, timeout=30)
            return {r["workload"]: r for r in map(workload_row, answer.running)}

        def placed() -> bool:
            rows = listed()
            return all(
                rows.get(w, {}).get("util_mean_pct") is not None
                for w in ("kubernetes:ml-serving/llama-0", "kubernetes:research/nb-1")
            )

        wait_until(placed, 60, "both pods attributed, with readings", context=lambda: repr(listed()))
        out = gpufleet_cli(agg, cluster, "ops", "jobs", "--json")
        assert out.returncode == 0, out.stderr
        rows = {r["workload"]: r for r in json.loads(out.stdout)["running"]}
        llama, nb = rows["kubernetes:ml-serving/llama-0"], rows["kubernetes:research/nb-1"]
        assert (llama["namespace"], llama["team"], llama["name"], llama["nodes"], llama["gpus"]) == (
            "ml-serving",
            "inference",
            "StatefulSet/llama",
            [NODE],
            2,
        )
        assert (nb["namespace"], nb["team"], nb["name"], nb["gpus"]) == (
            "research",
            "science",
            "Deployment/notebook",
            1,
        )
        assert "kubernetes:research/elsewhere" in rows and rows["kubernetes:research/elsewhere"]["nodes"] == [
            OTHER
        ]
        # The pod's GPUs are the ones the kubelet gave it (on this node), read by their UUIDs.
        job = json.loads(gpufleet_cli(agg, cluster, "ops", "job", "ml-serving/llama-0", "--json").stdout)
        assert sorted(g["gpu"] for g in job["per_gpu"]) == [0, 1]

        wait_until(
            lambda: (
                agg.metric_value("gpufleet_workload_claims_refused_total", reason="not_on_node") >= 1
                and agg.metric_value("gpufleet_workload_claims_refused_total", reason="unknown_job") >= 1
            ),
            30,
            "the pod of another node and the unknown pod refused and counted",
        )
        elsewhere = json.loads(
            gpufleet_cli(agg, cluster, "ops", "job", "research/elsewhere", "--json").stdout
        )
        assert elsewhere["per_gpu"] == [], "a node charged GPU time to another node's pod"

        # Another enrolled node names pods by UID, as a kubepods cgroup does: llama-0's real UID
        # (the API places it on NODE, not here) and a forged one. Both refused and counted.
        llama_uid = kube.pods[("ml-serving", "llama-0")]["metadata"]["uid"]
        before = {
            r: agg.metric_value("gpufleet_workload_claims_refused_total", reason=r)
            for r in ("not_on_node", "unknown_job")
        }
        liar = RawStream(agg.ingest, cluster.secrets.collector_token("k8s-gpu-c"))
        try:
            liar.send(hello("k8s-gpu-c", gpus=4))
            assert liar.recv().WhichOneof("body") == "welcome"
            forged = report("k8s-gpu-c", 1, gpus=4)
            for uid in (llama_uid, "0f3c9d9e-6a3b-4c55-9a1e-2b7f1c4d5e6f"):
                forged.report.workloads.add(
                    scheduler="kubernetes", id=uid, part="a" * 12, gpu_indices=[0, 1], source="cgroup"
                )
            liar.send(forged)
            assert liar.recv().WhichOneof("body") == "ack"
            wait_until(
                lambda: all(
                    agg.metric_value("gpufleet_workload_claims_refused_total", reason=r) >= before[r] + 1
                    for r in before
                ),
                30,
                "the other node's UID claims refused: not_on_node (llama-0's), unknown_job (forged)",
            )
        finally:
            liar.close()
        again = json.loads(gpufleet_cli(agg, cluster, "ops", "job", "ml-serving/llama-0", "--json").stdout)
        assert {p["node"] for p in again["processes"]} == {NODE}

        # Usage by namespace and by team: GPU-hours from the API's start time, the pods' GPUs.
        now = time.time()
        for by, owners in (
            ("namespace", {"ml-serving": 2, "research": 2}),
            ("team", {"inference": 2, "science": 2}),
        ):
            out = gpufleet_cli(agg, cluster, "ops", "usage", "--by", by, "--since", "2h", "--json")
            assert out.returncode == 0, out.stderr
            usage = {r["owner"]: r for r in json.loads(out.stdout)["rows"]}
            assert set(usage) == set(owners), usage
            for owner, gpus in owners.items():
                expected = gpus * (now - int(started)) / 3600
                assert usage[owner]["gpu_hours_allocated"] == pytest.approx(expected, abs=gpus * 30 / 3600), (
                    owner,
                    usage[owner],
                )

        # Issue 54: the pod holding its GPU idle is found, its namespace and team in the alert's
        # labels (what Alertmanager routes on); the working pod is not; the process of no pod on
        # a GPU no pod holds is an orphan of no job.
        idle_key = "waste/idle_allocation/kubernetes:research/nb-1"
        idle = wait_until(lambda: receiver.for_key(idle_key), 30, "the idle pod's alert")[0]
        assert idle["labels"] == {
            "alertname": "GpufleetWaste",
            "finding": "idle_allocation",
            "namespace": "research",
            "team": "science",
            "workload": "kubernetes:research/nb-1",
        }
        orphan = wait_until(
            lambda: receiver.for_key(f"waste/orphaned_process/{NODE}:2"), 30, "the orphan of no pod"
        )[0]
        assert f"pid(s) {procs[1].pid} holding 3.0 GiB on GPU(s) 2 in no job" in orphan["summary"]
        assert not receiver.for_key("waste/idle_allocation/kubernetes:ml-serving/llama-0"), "llama-0 works"

        # The digest through the sinks: the idle pod's namespace, with its idle GPU-hours over the
        # period, routed by its namespace label; the working pod's namespace is not in it.
        digest = wait_until(
            lambda: receiver.for_key("waste-digest/namespace/research"), 30, "the research namespace's digest"
        )[0]
        assert digest["labels"] == {"alertname": "GpufleetWasteDigest", "namespace": "research"}, digest
        said = digest["summary"]
        assert said.startswith("namespace research: ") and "GPU-hours idle of" in said, said
        assert digest["details"]["gpu_hours_idle"] > 0, digest["details"]
        assert not receiver.for_key("waste-digest/namespace/ml-serving"), "a working pod is not waste"

        # nb-1's own process (in its pod's cgroup, read by the collector from /proc/PID/cgroup) on
        # GPU 2, which the kubelet did not give it: a GPU used outside its allocation.
        nb_uid = kube.pods[("research", "nb-1")]["metadata"]["uid"]
        stray = _gpu_process(NODE, tag, "2", 50.0, GIB)
        with _in_pod_cgroup(nb_uid, stray):
            outside = wait_until(
                lambda: receiver.for_key("waste/gpu_outside_allocation/kubernetes:research/nb-1"),
                30,
                "nb-1's process on a GPU the kubelet did not give it",
            )[0]
            assert outside["labels"]["namespace"] == "research" and outside["labels"]["team"] == "science"
            said = outside["summary"]
            assert f"runs pid(s) {stray.pid}" in said and "on GPU 2" in said, outside

        # An XID on llama-0's GPU 0, the pods placed (the node's collector restarted with it: the
        # same GPUs, the kubelet's allocations as they were): its incident and the incident's alert
        # name the pod, its namespace and team, as hit (nb-1, on GPU 3, is on the node, not hit).
        first.stop()
        # The XID 10 s after the restart: the new collector has read the kubelet by then (it does
        # at its first report), so the fault lands on GPUs whose pods are known, as on a node up.
        xid = xid_scenario(cluster.tmp / "xid.toml", 79, gpu=0, at_s=10.0)
        cluster.collector(NODE, agg.ingest, *collector_args, "--sim-scenario", str(xid))
        # This node's: the liar's stream above closed, and on a slow run its collector_silent
        # (a warning, an incident of its own) can open first.
        (incident,) = wait_until(lambda: incidents(agg, cluster, "--node", NODE), 60, "the XID's incident")
        hit = {w["workload"]: (w["namespace"], w["team"], w["hit"]) for w in incident["workloads"]}
        assert hit == {
            "kubernetes:ml-serving/llama-0": ("ml-serving", "inference", True),
            "kubernetes:research/nb-1": ("research", "science", False),
        }, incident["workloads"]
        paged = wait_until(lambda: receiver.for_key(incident["id"]), 30, "the incident's alert")[0]
        assert "work hit: kubernetes:ml-serving/llama-0 (ml-serving, inference) hit" in paged["summary"], (
            paged
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        kubelet.close()
