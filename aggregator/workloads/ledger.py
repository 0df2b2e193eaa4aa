"""Whose work is on each GPU, kept by the aggregator (docs/workloads.md): the scheduler's jobs
(aggregator/workloads/schedulers.py) are the allocations — who, which GPUs of which nodes, from
when to when — and each report of a node with an allocation adds its GPUs' readings to that
allocation's figures. When a job ends its summary is written (the history store's `workload`
measurement and the ledger's recent list) and the allocation is closed.

Trust: a node's own word (NodeReport.workloads: the ids its processes belong to) is a claim.
A claim is attributed only where the scheduler places that job on that node; any other is
refused, counted (`gpufleet_workload_claims_refused_total{reason}`) and logged once a minute per
node: a node cannot charge its GPU-hours to another team's job, or hide one. Figures come from
the scheduler's allocation and the node's GPU readings of its own GPUs, never from one node's
word about another.

Figures, per allocation (each GPU of each node it holds):
- GPU-hours allocated: GPUs x (end or now - start), from the scheduler's times, to the second;
- utilization: the mean and max of util_gpu_pct over the reports received while it ran (each
  report weighted by its interval), counting a GPU's reading while the job's processes are on it
  and, after its first LOADING_GRACE_S (60 s), whatever is on it; GPU-hours effective: the
  allocated GPU-hours x mean utilization / 100 (what the GPUs did); GPU-hours idle: the report
  intervals whose utilization was under IDLE_UTIL_PCT;
- SM activity (GPM, where the GPU has it), HBM peak, energy (power x interval).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpufleet.aggregator.workloads.schedulers import Job
from gpufleet.protos import columns, telemetry_pb2
from gpufleet.repair.idle import Activity, IdleClock
from gpufleet.repair.model import (
    CLAIM_ENDED,
    CLAIM_NONE,
    CLAIM_RUNNING,
    CLAIM_UNKNOWN,
    Owner,
    ProcessClaim,
    WorkloadOnNode,
)

log = logging.getLogger("gpufleet.aggregator.workloads")

IDLE_UTIL_PCT = 5.0  # a report interval under this utilization counts as idle GPU time
# A job's loading time: before it, an allocated GPU's readings count only while the job's own
# processes are on it (a job that has not started its GPU work yet is not charged idle time).
LOADING_GRACE_S = 60.0
RECENT_ENDED = 10_000  # ended workloads kept in memory for listing (the store keeps them all)
_FIELDS = ("util_gpu_pct", "sm_active_pct", "hbm_used_bytes", "hbm_total_bytes", "power_w")
MAX_CLAIMS_KEPT = 256  # a node's process claims kept for the waste rules (MAX_WORKLOADS_PER_REPORT)


def owner_of(job: Job) -> Owner:
    return Owner(job.user, job.account, job.namespace, job.team)


def engine_busy_gpus(report: telemetry_pb2.NodeReport) -> set[int]:
    """GPUs an inference engine with requests running or waiting is on: a serving replica
    between bursts of requests is not idle while it has any."""
    busy: set[int] = set()
    for e in report.engines:
        if e.requests_running > 0 or e.requests_waiting > 0:
            busy.update(e.gpu_indices)
    return busy


REFUSAL_REASONS = ("unknown_job", "not_on_node", "no_scheduler")


@dataclass
class GpuFigures:
    """One GPU's readings while a workload held it."""

    seconds: float = 0.0  # report intervals covered
    util_weighted: float = 0.0  # util % x seconds
    util_max_pct: float = 0.0
    idle_seconds: float = 0.0
    sm_weighted: float = 0.0
    sm_seconds: float = 0.0
    hbm_peak_bytes: int = 0
    energy_j: float = 0.0
    last: dict[str, float] = field(default_factory=dict)  # the newest reading counted

    def add(self, reading: dict[str, float], interval_s: float) -> None:
        self.last = reading
        util = reading.get("util_gpu_pct")
        if util is not None:
            self.seconds += interval_s
            self.util_weighted += util * interval_s
            self.util_max_pct = max(self.util_max_pct, util)
            if util < IDLE_UTIL_PCT:
                self.idle_seconds += interval_s
        sm = reading.get("sm_active_pct")
        if sm is not None:
            self.sm_weighted += sm * interval_s
            self.sm_seconds += interval_s
        hbm = reading.get("hbm_used_bytes")
        if hbm is not None:
            self.hbm_peak_bytes = max(self.hbm_peak_bytes, int(hbm))
        power = reading.get("power_w")
        if power is not None:
            self.energy_j += power * interval_s

    @property
    def util_mean_pct(self) -> float | None:
        return self.util_weighted / self.seconds if self.seconds else None

    @property
    def sm_mean_pct(self) -> float | None:
        return self.sm_weighted / self.sm_seconds if self.sm_seconds else None


@dataclass
class Workload:
    """One job's allocation and figures (live or ended)."""

    job: Job
    gpus: dict[tuple[str, int], GpuFigures] = field(default_factory=dict)
    # What the nodes said of it: (node, pids listed, processes, HBM its processes hold).
    claims: dict[str, telemetry_pb2.WorkloadSample] = field(default_factory=dict)
    ended_unix_s: float | None = None
    listed_unix_s: float = 0.0  # when the scheduler last listed it running
    model: str = ""  # its GPUs' model, once read from the live view (Workloads.model_of)
    # Per node: since when all its GPUs there read idle, and the HBM they held (the
    # idle_allocation rule's input: repair/rules/waste.py).
    idle: IdleClock = field(default_factory=IdleClock)

    @property
    def key(self) -> tuple[str, str]:
        return (self.job.scheduler, self.job.id)

    @property
    def gpu_count(self) -> int:
        """The GPUs it holds: the scheduler's indices, or (a pod before its node said which) the
        count the scheduler gave it."""
        return max(sum(len(g) for g in self.job.gpus_by_node.values()), self.job.gpu_limit)

    def end_or(self, now_s: float) -> float:
        return self.ended_unix_s if self.ended_unix_s is not None else now_s

    def gpu_hours_allocated(self, now_s: float) -> float:
        return self.gpu_count * max(0.0, self.end_or(now_s) - self.job.start_unix_s) / 3600.0

    def util_mean_pct(self) -> float | None:
        seconds = sum(g.seconds for g in self.gpus.values())
        return sum(g.util_weighted for g in self.gpus.values()) / seconds if seconds else None

    def util_max_pct(self) -> float | None:
        seen = [g.util_max_pct for g in self.gpus.values() if g.seconds]
        return max(seen) if seen else None

    def sm_mean_pct(self) -> float | None:
        seconds = sum(g.sm_seconds for g in self.gpus.values())
        return sum(g.sm_weighted for g in self.gpus.values()) / seconds if seconds else None

    def gpu_hours_effective(self, now_s: float) -> float | None:
        mean = self.util_mean_pct()
        return None if mean is None else self.gpu_hours_allocated(now_s) * mean / 100.0

    def gpu_hours_idle(self) -> float:
        return sum(g.idle_seconds for g in self.gpus.values()) / 3600.0

    def hbm_peak_bytes(self) -> int:
        return max((g.hbm_peak_bytes for g in self.gpus.values()), default=0)

    def energy_j(self) -> float:
        return sum(g.energy_j for g in self.gpus.values())

    def learn_gpus(self, node: str, claim: telemetry_pb2.WorkloadSample) -> None:
        """A pod's GPUs on its node, as the node's kubelet says (its PodResources answer), no
        more than the API gave the pod: the scheduler placed the pod on this node, and the node
        names which of its own GPUs (docs/workloads.md "Trust")."""
        if not self.job.gpu_limit or claim.source != "podresources":
            return
        learned = tuple(sorted(set(claim.gpu_indices))[: self.job.gpu_limit])
        if learned and self.job.gpus_by_node.get(node) != learned:
            self.job = dataclasses.replace(self.job, gpus_by_node={**self.job.gpus_by_node, node: learned})

    def on_node_view(self, node: str) -> WorkloadOnNode:
        """It on one node, as the repair snapshot holds it (repair/rules/waste.py)."""
        j = self.job
        gpus = tuple(j.gpus_by_node.get(node, ()))
        since, hbm = self.idle.since.get(node), self.idle.hbm_bytes.get(node, 0)
        return WorkloadOnNode(f"{j.scheduler}:{j.id}", j.name, owner_of(j), gpus, j.start_unix_s, since, hbm)

    def to_kept(self) -> dict[str, object]:
        """Its job and each GPU's figures so far, as JSON-ready values (kept across a restart)."""
        return {
            "job": dataclasses.asdict(self.job),
            "listed_unix_s": self.listed_unix_s,
            "gpus": [[node, index, dataclasses.asdict(g)] for (node, index), g in self.gpus.items()],
        }

    @classmethod
    def from_kept(cls, entry: dict[str, object]) -> Workload:
        raw = dict(entry["job"])  # type: ignore[call-overload]
        raw["gpus_by_node"] = {n: tuple(g) for n, g in raw["gpus_by_node"].items()}
        raw["aliases"] = tuple(raw.get("aliases", ()))
        w = cls(Job(**raw), listed_unix_s=float(entry.get("listed_unix_s") or 0.0))  # type: ignore[arg-type]
        for node, index, figures in entry["gpus"]:  # type: ignore[union-attr]
            w.gpus[(str(node), int(index))] = GpuFigures(**figures)
        return w


def gpu_readings(report: telemetry_pb2.NodeReport, wanted: set[int]) -> dict[int, dict[str, float]]:
    """The _FIELDS of the wanted GPUs of a (checked) report, whichever form it carries."""
    out: dict[int, dict[str, float]] = {}
    if report.HasField("gpu_columns"):
        cols = report.gpu_columns
        lay, vals = columns.of(cols), columns.values(cols)
        for index, (names, get) in zip(cols.index, lay.gpus, strict=True):
            if index in wanted:
                got = dict(zip(names, get(vals), strict=True))
                out[index] = {f: got[f] for f in _FIELDS if f in got}
        return out
    for gpu in report.gpus:
        if gpu.index in wanted:
            out[gpu.index] = {f: getattr(gpu, f) for f in _FIELDS if gpu.HasField(f)}
    return out


def _keep_known_gpus(job: Job, known: Job) -> Job:
    """Which GPUs a job held stays known where the scheduler's new answer does not say (Slurm
    lists an ended job without its GRES detail; the API never says which GPUs a pod holds: its
    node did)."""
    was = known.gpus_by_node
    now = {node: gpus or was.get(node, ()) for node, gpus in (job.gpus_by_node or was).items()}
    return dataclasses.replace(job, gpus_by_node=now)


class WorkloadLedger:
    """The live allocations and recent ended workloads. `refresh(jobs)` takes the scheduler's
    answer (from a supervised loop: aggregator/workloads/wiring.py); `on_report` (a fan-out
    listener) adds a node's readings and checks its claims. Thread-safe: the API reads from
    its own threads."""

    def __init__(
        self,
        scheduler: str,
        on_end: Callable[[Workload], None],
        on_refused: Callable[[str, str], None] = lambda reason, node: None,
        now: Callable[[], float] = time.time,
        activity: Callable[[], Activity] = Activity,
    ) -> None:
        self.scheduler = scheduler
        self._activity = activity
        self._on_end = on_end
        self._on_refused = on_refused
        self._now = now
        self._lock = threading.Lock()
        self._live: dict[tuple[str, str], Workload] = {}
        self._by_node: dict[str, list[Workload]] = {}
        self.recent: deque[Workload] = deque(maxlen=RECENT_ENDED)
        # The workloads already summarised (insertion-ordered, bounded): the scheduler lists a
        # job for minutes after its end, and it is summarised once. The job where known: a
        # process of it still on a GPU is an orphan of that job, on the nodes it ran on.
        self._ended_keys: dict[tuple[str, str], Job | None] = {}
        # Each node's processes as its last report named them, judged (the waste rules' input).
        self._claims: dict[str, tuple[ProcessClaim, ...]] = {}
        self.refreshed_unix_s: float | None = None
        self.refused_total: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        # (node, scheduler, id) claims refused, so each episode is counted once.
        self._refused: dict[tuple[str, str, str], str] = {}
        self._logged_at: dict[str, float] = {}
        # Claims of jobs the scheduler did not list when last read: (first made, GPUs named).
        self._unknown: dict[tuple[str, str, str], tuple[float, list[int]]] = {}
        self._aliases: dict[tuple[str, str], tuple[str, str]] = {}  # (scheduler, pod UID) -> key

    # --- the scheduler's word ------------------------------------------------------
    def refresh(self, jobs: dict[str, Job]) -> list[Workload]:
        """The scheduler's jobs now: new allocations opened, ended ones closed (and returned)."""
        now = self._now()
        ended: list[Workload] = []
        with self._lock:
            seen = set()
            for job in jobs.values():
                self._take(job, seen, ended)
            # A job the scheduler no longer lists at all ended after it was last listed running:
            # counted to then (a read's interval short at most, never past its end).
            for key in [k for k in self._live if k not in seen]:
                gone = self._live.pop(key)
                gone.ended_unix_s = gone.listed_unix_s or now
                ended.append(gone)
                self._ended_keys[key] = gone.job
            while len(self._ended_keys) > RECENT_ENDED * 10:
                self._ended_keys.pop(next(iter(self._ended_keys)))
            self._index()
            self.recent.extend(ended)
            self.refreshed_unix_s = now
            self._settle_unknown(now)
        for w in ended:
            self._on_end(w)
        return ended

    def _take(self, job: Job, seen: set[tuple[str, str]], ended: list[Workload]) -> None:
        """One job of the scheduler's answer: a new allocation opened, a live one updated, an
        ended one closed (or, never seen running, summarised as it is)."""
        key = (job.scheduler, job.id)
        live = self._live.get(key)
        if live is None and not job.gpu_limit and not any(job.gpus_by_node.values()):
            return  # holds no GPU: not a GPU workload
        if live is not None:
            job = _keep_known_gpus(job, live.job)
        if job.running:
            seen.add(key)
            if live is None:
                live = self._live[key] = Workload(job)
                self._ended_keys.pop(key, None)
            else:
                live.job = job
            live.listed_unix_s = self._now()
            return
        if live is not None:
            live.job = job
            live.ended_unix_s = job.end_unix_s
            ended.append(self._live.pop(key))
        elif key not in self._ended_keys:
            # It ran and ended between two reads, or while this aggregator was not reading: its
            # GPU-hours still count (no readings). Summarised once; a restart may write its
            # summary again, which the store keeps as one point (same series, same time).
            ended.append(Workload(job, ended_unix_s=job.end_unix_s))
        self._ended_keys[key] = job

    # --- kept across a restart (wiring.py keeps it in the control-plane state) -----------
    def snapshot(self, limit: int = 20_000) -> list[dict[str, object]]:
        """The live workloads: their job and each GPU's figures so far, as JSON-ready values."""
        with self._lock:
            return [w.to_kept() for w in list(self._live.values())[:limit]]

    def restore(self, kept: list[dict[str, object]]) -> int:
        """The live workloads a snapshot held (before any scheduler read): their figures go on
        from where they were; the next read closes those that ended. How many were taken."""
        taken = 0
        with self._lock:
            for entry in kept:
                try:
                    w = Workload.from_kept(entry)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    log.warning("a kept workload could not be read back (%s): skipped", exc)
                    continue
                self._live[w.key] = w
                taken += 1
            self._index()
        return taken

    def _index(self) -> None:
        """The live workloads by node, and by the other ids nodes may name them by."""
        self._by_node, self._aliases = {}, {}
        for w in self._live.values():
            for node in w.job.gpus_by_node:
                self._by_node.setdefault(node, []).append(w)
            for alias in w.job.aliases:
                self._aliases[(w.job.scheduler, alias)] = w.key

    # --- a node's reports -----------------------------------------------------------
    def on_report(self, report: telemetry_pb2.NodeReport, heard_ns: int = 0, stream: int = 0) -> None:
        """A durable report (the fan-out's listener signature; when and on which stream it came
        do not matter here)."""
        node = report.node
        with self._lock:
            held = self._by_node.get(node)
            on_gpus: dict[tuple[str, str], set[int]] = {}
            judged: list[ProcessClaim] = []
            if report.workloads:
                on_gpus = self._check_claims(node, report.workloads, judged)
            if judged or node in self._claims:
                self._claims[node] = tuple(judged)
            if not held:
                return
            wanted = {i for w in held for i in w.job.gpus_by_node.get(node, ())}
            readings = gpu_readings(report, wanted)
            interval = report.interval_s or 0.0
            time_s = report.time_unix_ns / 1e9
            activity = self._activity()
            serving = engine_busy_gpus(report) if report.engines else set()
            for w in held:
                # A GPU's reading counts while the job's processes are on it, and after its
                # loading time whatever is on it (a GPU held with nothing running is idle time).
                used = on_gpus.get(w.key, set())
                loaded = time_s - w.job.start_unix_s >= LOADING_GRACE_S
                indices = w.job.gpus_by_node.get(node, ())
                for index in indices:
                    reading = readings.get(index)
                    if reading and (loaded or index in used):
                        w.gpus.setdefault((node, index), GpuFigures()).add(reading, interval)
                w.idle.note(node, indices, readings, serving, activity, time_s, w.job.start_unix_s)

    def _check_claims(
        self, node: str, claims: Iterable[telemetry_pb2.WorkloadSample], judged: list[ProcessClaim]
    ) -> dict[tuple[str, str], set[int]]:
        """The GPUs each attributed workload's processes are on; the others refused. Each claim,
        judged (what the scheduler says of its workload), goes into `judged`."""
        on_gpus: dict[tuple[str, str], set[int]] = {}
        for claim in claims:
            key = self._aliases.get((claim.scheduler, claim.id), (claim.scheduler, claim.id))
            live = self._live.get(key)
            status, owner = self._judge(node, key, live)
            if len(judged) < MAX_CLAIMS_KEPT and claim.gpu_indices:
                named = "" if status == CLAIM_NONE else ":".join(key)
                pids = tuple(claim.pids)
                hbm = claim.hbm_used_bytes
                judged.append(ProcessClaim(named, status, tuple(claim.gpu_indices), pids, hbm, owner))
            if status == CLAIM_NONE:
                continue
            if live is not None and node in live.job.gpus_by_node:
                live.claims[node] = claim
                live.learn_gpus(node, claim)
                on_gpus.setdefault(key, set()).update(claim.gpu_indices)
                continue
            episode = (node, claim.scheduler, claim.id)
            if self.scheduler == "none":
                self._refuse(episode, "no_scheduler", list(claim.gpu_indices), "")
            elif live is not None:
                self._refuse(
                    episode, "not_on_node", list(claim.gpu_indices), ", ".join(sorted(live.job.gpus_by_node))
                )
            elif episode not in self._refused and len(self._unknown) < 100_000:
                # Not refused yet: a job that started since the scheduler was last read is listed
                # by the next read. The next read that still does not list it refuses it.
                self._unknown.setdefault(episode, (self._now(), list(claim.gpu_indices)))
        return on_gpus

    def _judge(self, node: str, key: tuple[str, str], live: Workload | None) -> tuple[str, Owner]:
        """What the scheduler says of the workload (`key`, its id resolved; `live`, its running
        allocation) a node's processes name: running here, ended after running here (its owner
        named), or unknown here (the node's word only: another node's job is never named as this
        node's)."""
        if key[0] == "none":
            return CLAIM_NONE, Owner()
        if live is not None:
            if node in live.job.gpus_by_node:
                return CLAIM_RUNNING, owner_of(live.job)
            return CLAIM_UNKNOWN, Owner()
        ended = self._ended_keys.get(key)
        if ended is not None and node in ended.gpus_by_node:
            return CLAIM_ENDED, owner_of(ended)
        return CLAIM_UNKNOWN, Owner()

    def waste_view(self, node: str) -> tuple[tuple[WorkloadOnNode, ...], tuple[ProcessClaim, ...]]:
        """The node's allocations (with their idle state) and judged process claims, for its
        repair snapshot (repair/rules/waste.py)."""
        with self._lock:
            workloads = tuple(w.on_node_view(node) for w in self._by_node.get(node, ()))
            if self.scheduler == "none" or self.refreshed_unix_s is None:
                # Without the scheduler's word no process can be judged: every one would look
                # like no job's (an orphan). Nothing is found until a scheduler is read.
                return workloads, ()
            return workloads, self._claims.get(node, ())

    def _refuse(self, episode: tuple[str, str, str], reason: str, gpus: list[int], runs_on: str) -> None:
        """A node's claim refused: counted once an episode, logged once a minute per node."""
        if self._refused.get(episode) == reason:
            return
        if len(self._refused) > 100_000:
            self._refused.clear()
        self._refused[episode] = reason
        self.refused_total[reason] += 1
        node, scheduler, workload_id = episode
        self._on_refused(reason, node)
        now = time.monotonic()
        if now - self._logged_at.get(node, -120.0) < 60.0:
            return
        self._logged_at[node] = now
        said = {
            "unknown_job": "does not run",
            "not_on_node": f"runs on {runs_on[:200]}",
            "no_scheduler": "is not read (workload_scheduler = none)",
        }[reason]
        log.warning(
            "node %s names workload %s:%s on GPU(s) %s, which the scheduler %s: not attributed "
            "(counted in gpufleet_workload_claims_refused_total; said once a minute per node)",
            node,
            scheduler,
            workload_id,
            gpus,
            said,
            extra={"node": node, "workload": f"{scheduler}:{workload_id}", "reason": reason},
        )

    def _settle_unknown(self, read_at: float) -> None:
        """After a scheduler read: each claim of a job it did not list, first made before the read,
        is refused (unknown_job); a claim of a job it now lists waits for that node's next report."""
        for episode, (first, gpus) in list(self._unknown.items()):
            _, scheduler, workload_id = episode
            key = self._aliases.get((scheduler, workload_id), (scheduler, workload_id))
            if key in self._live:
                del self._unknown[episode]
            elif first < read_at:
                del self._unknown[episode]
                self._refuse(episode, "unknown_job", gpus, "")

    def owner_readings(self, dimension: str) -> dict[str, list[dict[str, float]]]:
        """Each owner's (by account, namespace, team or partition) running GPUs' newest
        readings; a GPU not read yet is an empty dict (allocated, nothing known)."""
        out: dict[str, list[dict[str, float]]] = {}
        with self._lock:
            for w in self._live.values():
                owner = getattr(w.job, dimension)
                if not owner:
                    continue
                for node, indices in w.job.gpus_by_node.items():
                    for index in indices:
                        figures = w.gpus.get((node, index))
                        out.setdefault(owner, []).append(dict(figures.last) if figures else {})
        return out

    # --- reads ----------------------------------------------------------------------
    def live(self) -> list[Workload]:
        with self._lock:
            return list(self._live.values())

    def on_node(self, node: str) -> list[Workload]:
        with self._lock:
            return list(self._by_node.get(node, ()))

    def find(self, scheduler: str, workload_id: str) -> Workload | None:
        """A live or recently ended workload; scheduler "": any scheduler's with this id."""

        def match(w: Workload) -> bool:
            return w.job.id == workload_id and scheduler in ("", w.job.scheduler)

        with self._lock:
            live = self._live.get((scheduler, workload_id))
            if live is not None:
                return live
            found = next((w for w in self._live.values() if match(w)), None)
            return found or next((w for w in reversed(self.recent) if match(w)), None)
