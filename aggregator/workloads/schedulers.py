"""Where the aggregator reads whose each job is (docs/workloads.md "From the scheduler"): the
scheduler, which the aggregator trusts and the node does not. Each source answers the jobs it
knows now, running and recently ended, with their owners and the GPUs they hold on each node.

- `slurm`: `squeue --json --all` from slurmctld (user, account, partition, QOS, name, start,
  time limit, end; the GPUs of each node from `gres_detail`'s `IDX:` lists, which Slurm pairs
  with the job's allocated nodes in order). squeue shows running jobs and the jobs that ended
  within slurmctld's MinJobAge (300 s by default): a job that ended between two reads is seen
  with its end time. Read as a subprocess, as the repair backend reads scontrol: Slurm has no
  maintained Python client and these are the commands its admins script against.
- `site`: a folder of JSON files, one per job, that the site's own scheduler (or a cron job
  over its API) writes: {"id", "user", "account", "partition", "team", "name", "nodes": {NODE:
  [GPU indices]}, "start_unix_s", "end_unix_s" (null while running), "time_limit_s",
  "scheduler" (optional: "slurm" or "kubernetes" where the records export a Slurm's or a
  cluster's jobs, so the nodes' cgroup ids match; default "site")}. The demo's scheduler writes
  these (collector/simnvml/gpu_users.py), as a Slurm's.
- `kubernetes`: the API server's running pods that ask for GPUs (`nvidia.com/gpu` limits): their
  namespace, a team label, what runs them (Deployment, Job...), their node and start. Which
  GPUs of the node a pod holds the API does not say: the node's kubelet does (PodResources,
  collector/sources/pod_resources.py), checked against the pod's node and its GPU count.
- `none`: no scheduler read; no workload is attributed (every node's claim is refused as
  unverifiable, counted).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from gpufleet.common.registry import Registry
from gpufleet.common.settings import setting
from gpufleet.protos.names import WORKLOAD_ID_RE

log = logging.getLogger("gpufleet.aggregator.workloads")

MAX_JOBS = 200_000  # jobs one read may answer; beyond: the read fails (a scheduler this large needs paging)
_OWNER_MAX = 128  # characters of a user, account, partition, QOS, team or job name kept


class SchedulerReadError(RuntimeError):
    """The scheduler could not be read; the message names it and what to check."""


@dataclass(frozen=True)
class Job:
    """One job as the scheduler says: its owners and, per node, the GPU indices it was given."""

    scheduler: str
    id: str
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    team: str = ""
    namespace: str = ""
    name: str = ""
    start_unix_s: float = 0.0
    end_unix_s: float | None = None  # None: running
    time_limit_s: float | None = None
    gpus_by_node: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Kubernetes: the GPUs the pod's containers asked for (their limits), where the API says how
    # many but not which (the node's kubelet says which: collector/sources/pod_resources.py).
    gpu_limit: int = 0
    aliases: tuple[str, ...] = ()  # other ids the nodes may name it by (a pod's UID)

    @property
    def running(self) -> bool:
        return self.end_unix_s is None


def _clean(value: Any) -> str:
    """An owner field as text: bounded, no control characters (it reaches logs and screens)."""
    text = "" if value is None else str(value)
    return "".join(ch for ch in text[:_OWNER_MAX] if ch.isprintable())


def _num(value: Any) -> float | None:
    """A Slurm JSON number: a plain number (22.05) or {"set": bool, "infinite": bool, "number": n}
    (23.02 and later); None when unset or infinite."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


_IDX = re.compile(r"IDX:([0-9,\-]+)")


def gpu_indices(gres: str) -> tuple[int, ...]:
    """The GPU indices of one node's `gres_detail` entry ("gpu:2(IDX:0-1)", "gpu:a100:3(IDX:0,2-3)")."""
    if not gres.startswith("gpu"):
        return ()
    m = _IDX.search(gres)
    if not m:
        return ()
    out: list[int] = []
    for part in m.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return ()
        top = int(high) if high else int(low)
        if top - int(low) > 1024:
            return ()
        out.extend(range(int(low), top + 1))
    return tuple(out)


def _allocated_nodes(job: dict[str, Any]) -> list[str]:
    resources = job.get("job_resources") or {}
    nodes = resources.get("allocated_nodes")  # 22.05
    if isinstance(nodes, list):
        return [str(n.get("nodename", "")) for n in nodes if isinstance(n, dict)]
    nodes = (
        (resources.get("nodes") or {}).get("allocation") if isinstance(resources.get("nodes"), dict) else None
    )
    if isinstance(nodes, list):  # 23.11 and later
        return [str(n.get("name", "")) for n in nodes if isinstance(n, dict)]
    return []


def _state_words(job: dict[str, Any]) -> set[str]:
    state = job.get("job_state")
    return {str(s) for s in state} if isinstance(state, list) else {str(state)}


def parse_squeue(text: str) -> dict[str, Job]:
    """`squeue --json` → {job id: Job}, the jobs that hold or held nodes (pending ones left out)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SchedulerReadError(f"squeue --json answered no JSON ({exc})") from exc
    jobs_in = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs_in, list):
        raise SchedulerReadError("squeue --json answered no 'jobs' list")
    if len(jobs_in) > MAX_JOBS:
        raise SchedulerReadError(f"squeue --json answered {len(jobs_in)} jobs, more than {MAX_JOBS}")
    jobs: dict[str, Job] = {}
    for raw in jobs_in:
        if not isinstance(raw, dict):
            continue
        job_id = _num(raw.get("job_id"))
        start = _num(raw.get("start_time"))
        words = _state_words(raw)
        if job_id is None or not start or words & {"PENDING"}:
            continue
        nodes = _allocated_nodes(raw)
        gres = raw.get("gres_detail") or []
        by_node = {
            node: gpu_indices(str(gres[i])) if i < len(gres) else () for i, node in enumerate(nodes) if node
        }
        running = bool(words & {"RUNNING", "COMPLETING", "SUSPENDED"})
        end = _num(raw.get("end_time"))
        limit_min = _num(raw.get("time_limit"))
        jobs[str(int(job_id))] = Job(
            scheduler="slurm",
            id=str(int(job_id)),
            user=_clean(raw.get("user_name")),
            account=_clean(raw.get("account")),
            partition=_clean(raw.get("partition")),
            qos=_clean(raw.get("qos")),
            name=_clean(raw.get("name")),
            start_unix_s=start,
            end_unix_s=None if running else (end or start),
            time_limit_s=limit_min * 60 if limit_min else None,
            gpus_by_node=by_node,
        )
    return jobs


@dataclass
class SlurmJobsSettings:
    chosen_by: ClassVar[str] = "workload_scheduler = slurm"
    workload_slurm_squeue: str = setting("squeue", "the squeue program (workload_scheduler = slurm)")
    workload_slurm_conf: str = setting("", "SLURM_CONF for squeue (empty: Slurm's default)")
    workload_slurm_timeout_s: float = setting(30.0, "longest one squeue may take")


class SlurmJobs:
    name = "slurm"
    help = "squeue --json from slurmctld: owners and each node's GPUs (GRES indices)"
    settings: ClassVar[type | None] = SlurmJobsSettings

    def __init__(self, squeue: str = "squeue", slurm_conf: str = "", timeout_s: float = 30.0) -> None:
        self._argv = [squeue, "--json", "--all"]
        self._env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        self._timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: Any) -> SlurmJobs:
        return cls(
            settings.workload_slurm_squeue, settings.workload_slurm_conf, settings.workload_slurm_timeout_s
        )

    @staticmethod
    def check_settings(settings: Any, chosen: bool) -> None:
        if settings.workload_slurm_timeout_s <= 0:
            raise ValueError(
                f"workload_slurm_timeout_s = {settings.workload_slurm_timeout_s}: "
                "give a number of seconds above 0"
            )

    def read(self) -> dict[str, Job]:
        try:
            done = subprocess.run(
                self._argv,
                env=self._env,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SchedulerReadError(f"{' '.join(self._argv)} did not answer: {exc}") from exc
        if done.returncode != 0:
            raise SchedulerReadError(
                f"{' '.join(self._argv)} exited {done.returncode}: {done.stderr.strip()[:300]}; "
                "is slurmctld up and SLURM_CONF (workload_slurm_conf) right?"
            )
        return parse_squeue(done.stdout)


@dataclass
class SiteJobsSettings:
    chosen_by: ClassVar[str] = "workload_scheduler = site"
    workload_site_jobs_dir: str = setting(
        "", "folder of JSON job records the site's scheduler writes (workload_scheduler = site)"
    )


def parse_site_job(text: str) -> Job:
    """One site job record (the module's docstring has its fields); ValueError naming the fault."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("a job record is a JSON object")
    job_id = str(raw.get("id", ""))
    if not WORKLOAD_ID_RE.fullmatch(job_id):
        raise ValueError(f"job id {job_id[:40]!r} is not a usable id")
    nodes = raw.get("nodes")
    if not isinstance(nodes, dict):
        raise ValueError("'nodes' is not an object of node name -> GPU indices")
    by_node = {}
    for node, gpus in nodes.items():
        if not isinstance(gpus, list) or not all(isinstance(g, int) and 0 <= g < 1024 for g in gpus):
            raise ValueError(f"node {str(node)[:60]!r}: GPU indices are not a list of small integers")
        by_node[str(node)] = tuple(gpus)
    start = _num(raw.get("start_unix_s"))
    if not start:
        raise ValueError("'start_unix_s' is not a time")
    scheduler = str(raw.get("scheduler") or "site")
    if scheduler not in ("site", "slurm", "kubernetes"):
        raise ValueError(f"scheduler {scheduler[:40]!r} is none of site, slurm, kubernetes")
    return Job(
        scheduler=scheduler,
        id=job_id,
        user=_clean(raw.get("user")),
        account=_clean(raw.get("account")),
        partition=_clean(raw.get("partition")),
        team=_clean(raw.get("team")),
        namespace=_clean(raw.get("namespace")),
        name=_clean(raw.get("name")),
        start_unix_s=start,
        end_unix_s=_num(raw.get("end_unix_s")),
        time_limit_s=_num(raw.get("time_limit_s")),
        gpus_by_node=by_node,
    )


class SiteJobs:
    name = "site"
    help = "a folder of JSON job records the site's own scheduler writes"
    settings: ClassVar[type | None] = SiteJobsSettings

    def __init__(self, jobs_dir: str) -> None:
        self.jobs_dir = Path(jobs_dir)
        self.unreadable_total = 0

    @classmethod
    def from_settings(cls, settings: Any) -> SiteJobs:
        return cls(settings.workload_site_jobs_dir)

    @staticmethod
    def check_settings(settings: Any, chosen: bool) -> None:
        if chosen and not settings.workload_site_jobs_dir:
            raise ValueError(
                "workload_scheduler = site needs workload_site_jobs_dir: the folder of job records"
            )

    def read(self) -> dict[str, Job]:
        if not self.jobs_dir.is_dir():
            raise SchedulerReadError(f"the site's jobs folder {self.jobs_dir} is not a folder")
        jobs = {}
        for n, path in enumerate(sorted(self.jobs_dir.glob("*.json"))):
            if n >= MAX_JOBS:
                break
            try:
                job = parse_site_job(path.read_text()[: 1 << 20])
            except (OSError, ValueError) as exc:
                self.unreadable_total += 1
                if self.unreadable_total <= 10:
                    log.warning("site job record %s is unusable (%s): skipped", path.name, exc)
                continue
            jobs[job.id] = job
        return jobs


@dataclass
class KubernetesPodsSettings:
    chosen_by: ClassVar[str] = "workload_scheduler = kubernetes"
    workload_kubeconfig: str = setting(
        "", "kubeconfig for reading pods (workload_scheduler = kubernetes; empty: in-cluster)"
    )
    workload_team_label: str = setting("team", "the pod label that names its team (Kubernetes)")
    workload_gpu_resources: str = setting(
        "nvidia.com/gpu", "the extended resource names whose devices are GPUs (comma-separated)"
    )


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _owner_name(meta: dict[str, Any]) -> str:
    """What runs the pod: `Deployment/llama` (a ReplicaSet named NAME-HASH is a Deployment's),
    `Job/train-7`, `StatefulSet/db`; "" for a bare pod."""
    for ref in meta.get("ownerReferences") or []:
        if not isinstance(ref, dict) or not ref.get("controller", True):
            continue
        kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
        if kind == "ReplicaSet" and "-" in name:
            base, _, suffix = name.rpartition("-")
            if suffix.isalnum() and len(suffix) in range(5, 11):
                return _clean(f"Deployment/{base}")
        return _clean(f"{kind}/{name}")
    return ""


def parse_pods(items: list[Any], team_label: str, resources: tuple[str, ...]) -> dict[str, Job]:
    """The API's running pods → {namespace/name: Job}, the pods that ask for GPUs."""
    jobs: dict[str, Job] = {}
    for pod in items[:MAX_JOBS]:
        if not isinstance(pod, dict):
            continue
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        node = str(spec.get("nodeName") or "")
        limit = 0
        for container in spec.get("containers") or []:
            limits = ((container or {}).get("resources") or {}).get("limits") or {}
            for name in resources:
                value = str(limits.get(name, "0"))
                limit += int(value) if value.isdigit() else 0
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        pod_id = f"{namespace}/{name}"
        if not node or not limit or not WORKLOAD_ID_RE.fullmatch(pod_id):
            continue
        started = str(status.get("startTime") or meta.get("creationTimestamp") or "")
        try:
            start = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        ended = status.get("phase") in ("Succeeded", "Failed")
        labels = meta.get("labels") or {}
        jobs[pod_id] = Job(
            scheduler="kubernetes",
            id=pod_id,
            namespace=_clean(namespace),
            team=_clean(labels.get(team_label, "")) if isinstance(labels, dict) else "",
            name=_owner_name(meta),
            start_unix_s=start,
            end_unix_s=time.time() if ended else None,
            gpus_by_node={node: ()},
            gpu_limit=min(limit, 64),
            aliases=(str(meta.get("uid", "")),) if meta.get("uid") else (),
        )
    return jobs


class KubernetesPods:
    name = "kubernetes"
    help = "the API server's running pods that ask for GPUs (namespace, team label, owner)"
    settings: ClassVar[type | None] = KubernetesPodsSettings

    def __init__(self, kubeconfig: str, team_label: str, resources: tuple[str, ...], timeout_s: float = 30.0):
        try:
            import kubernetes  # optional dependency: pip install 'gpufleet[kubernetes]'
        except ImportError as exc:
            raise ValueError(
                "workload_scheduler = kubernetes needs the official client: "
                "pip install 'gpufleet[kubernetes]'"
            ) from exc
        if kubeconfig:
            api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        else:
            kubernetes.config.load_incluster_config()
            api_client = kubernetes.client.ApiClient()
        self._core = kubernetes.client.CoreV1Api(api_client)
        self.team_label, self.resources, self.timeout_s = team_label, resources, timeout_s

    @classmethod
    def from_settings(cls, settings: Any) -> KubernetesPods:
        resources = tuple(r.strip() for r in settings.workload_gpu_resources.split(",") if r.strip())
        return cls(settings.workload_kubeconfig, settings.workload_team_label, resources)

    @staticmethod
    def check_settings(settings: Any, chosen: bool) -> None:
        if chosen and not _DNS_LABEL.fullmatch(settings.workload_team_label.rsplit("/", 1)[-1] or "-"):
            raise ValueError(f"workload_team_label = {settings.workload_team_label!r} is not a label key")

    def read(self) -> dict[str, Job]:
        try:
            answer = self._core.list_pod_for_all_namespaces(
                field_selector="status.phase=Running", _request_timeout=self.timeout_s, _preload_content=False
            )
            doc = json.loads(answer.data)
        except Exception as exc:  # the client's ApiException, urllib3's errors, a body not JSON
            raise SchedulerReadError(f"the Kubernetes API's pod list failed: {str(exc)[:300]}") from exc
        return parse_pods(doc.get("items") or [], self.team_label, self.resources)


class NoJobs:
    name = "none"
    help = "no scheduler read: no workload is attributed"
    settings: ClassVar[type | None] = None

    @classmethod
    def from_settings(cls, settings: Any) -> NoJobs:
        return cls()

    def read(self) -> dict[str, Job]:
        return {}


WORKLOAD_SCHEDULERS: Registry[Any] = Registry(
    "workload_scheduler", [NoJobs, SlurmJobs, SiteJobs, KubernetesPods]
)
