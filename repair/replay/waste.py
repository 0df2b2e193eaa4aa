"""The waste findings on a generated job history (`gpufleet replay --generate jobs`;
docs/repair.md "Waste findings, replayed"): how many each rule raises, the GPU-hours flagged,
and how many were false, at a policy's windows and thresholds.

Each job is a stream of node reports every REPORT_S seconds, read the way NVML reads a GPU: its
utilization at that instant of the job's own work. The reports go through the aggregator's own
idle clock (repair/idle.py), the rules (repair/rules/waste.py) and the evaluator's windows
(repair/evaluator.py), as on a live aggregator; a finding is looked for when the rule says its
window is whole (look_again_at_ns), as the controller looks every second at a node with a
finding. The generator knows the truth: every instant a job worked.

Job patterns (our assumptions, seeded; their sources say such phases exist and are common, the
numbers are ours):
- training (half the jobs, 2-48 h): loading for 2-20 min at the start; compute at 85-99 %
  broken by data-loading stalls (every 2-20 min, lasting lognormal, median 30 s; Mohan et al.,
  "Analyzing and Mitigating Data Stalls in DNN Training", VLDB 2021) and checkpoint stalls
  (every 30-60 min, lognormal median 4 min, sigma 0.8: the slow tail of writing a checkpoint; the
  Llama 3 paper, section 3.3.4, and Check-N-Run, NSDI 2022, on checkpoint cost);
- inference (three in ten, 6-72 h): spells of 10-90 min, four in five bursts of requests
  (0.2-2 per s, each running 2-20 s: the GPU works throughout), one in five sparse (one request
  every 2-5 min, Poisson, each 2-20 s: most fall between two reports), between quiet spells
  with no request (lognormal median 5 min, sigma 1); Splitwise (ISCA 2024) and the Azure LLM
  inference traces show such bursty, diurnal arrivals;
- interactive (the rest, 1-12 h): bursts of work (10-60 min at 30-90 %) between think times
  (lognormal median 8 min, sigma 0.9); three in ten are left idle at the end for 1.5-8 h (an
  abandoned notebook: the waste the rule is for).
An idle stretch of any job at least as long as the rule's window is an allocation idle for its
window: it must be found. A finding while the job worked within the window before it is false.

At each job's end its processes exit after a lognormal delay (median 3 s, sigma 1); one job in fifty
leaves one behind for hours (an orphan: must be found). One job in a hundred runs a process on a
GPU it was not given (must be found); no other job ever does. A finding of either rule that is
not one of these is false."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.repair.evaluator import Evaluator
from gpufleet.repair.idle import Activity, IdleClock
from gpufleet.repair.model import (
    CLAIM_ENDED,
    CLAIM_RUNNING,
    WASTE_RULES,
    NodeSnapshot,
    Owner,
    ProcessClaim,
    WorkloadOnNode,
)
from gpufleet.repair.policy import Policy
from gpufleet.repair.state import Workflow, open_state

REPORT_S = 10.0  # the collector's default interval
GIB = 1 << 30
NODE = "replay"


@dataclass
class Job:
    kind: str  # training | inference | interactive
    start_s: float
    # (start, end) of each span the job worked, in order; between them it was idle.
    busy: list[tuple[float, float]]
    end_s: float
    orphan: bool = False  # leaves a process behind at its end
    outside: bool = False  # runs a process on a GPU it was not given
    teardown_s: float = 0.0  # how long its processes take to exit after its end

    def working_at(self, t: float, at: int) -> tuple[bool, int]:
        """Whether it worked at time t, and the index of the first busy span not yet over (the
        caller's cursor, so a job's reports walk its spans once)."""
        while at < len(self.busy) and self.busy[at][1] <= t:
            at += 1
        return at < len(self.busy) and self.busy[at][0] <= t, at


def _lognormal(rng: random.Random, median_s: float, sigma: float) -> float:
    return median_s * math.exp(rng.gauss(0.0, sigma))


def _training(rng: random.Random, start: float) -> Job:
    end = start + rng.uniform(2, 48) * 3600
    t, busy = start + rng.uniform(2, 20) * 60, []
    next_checkpoint = t + rng.uniform(30, 60) * 60
    while t < end:
        run = rng.uniform(2, 20) * 60
        busy.append((t, min(end, t + run)))
        t += run
        if t >= next_checkpoint:
            t += _lognormal(rng, 240.0, 0.8)
            next_checkpoint = t + rng.uniform(30, 60) * 60
        else:
            t += _lognormal(rng, 30.0, 1.0)
    return Job("training", start, busy, end)


def _inference(rng: random.Random, start: float) -> Job:
    end = start + rng.uniform(6, 72) * 3600
    t, busy = start + rng.uniform(1, 5) * 60, []
    while t < end:
        spell_end = min(end, t + rng.uniform(10, 90) * 60)
        if rng.random() < 0.2:
            # A sparse hour: one request every 2-5 min, each running 2-20 s.
            gap = rng.uniform(120, 300)
            while True:
                t += rng.expovariate(1 / gap)
                if t >= spell_end:
                    break
                busy.append((t, min(spell_end, t + rng.uniform(2, 20))))
        else:
            # A burst of 0.2-2 requests/s, each running 2-20 s: more than one in flight on
            # average, so the GPU works throughout (a gap between two requests is a second).
            busy.append((t, spell_end))
        t = spell_end + _lognormal(rng, 300.0, 1.0)  # a quiet spell: no request at all
    return Job("inference", start, [(a, min(b, end)) for a, b in busy if a < end], end)


def _interactive(rng: random.Random, start: float) -> Job:
    end = start + rng.uniform(1, 12) * 3600
    abandoned = rng.random() < 0.3
    work_until = end - rng.uniform(1.5, 8) * 3600 if abandoned else end
    t, busy = start + rng.uniform(1, 10) * 60, []
    while t < work_until:
        run = rng.uniform(10, 60) * 60
        busy.append((t, min(work_until, t + run)))
        t += run + _lognormal(rng, 480.0, 0.9)
    end = max(end, start + 60)
    return Job("interactive", start, busy, end)


def generate_jobs(count: int, seed: int = 0) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for _ in range(count):
        start = rng.uniform(0, 86400.0)
        pick = rng.random()
        make = _training if pick < 0.5 else _inference if pick < 0.8 else _interactive
        job = make(rng, start)
        job.orphan = rng.random() < 0.02
        job.outside = rng.random() < 0.01
        job.teardown_s = _lognormal(rng, 3.0, 1.0)
        jobs.append(job)
    return jobs


@dataclass
class RuleCount:
    findings: int = 0
    false: int = 0
    missed: int = 0  # what it had to find and did not
    to_find: int = 0
    gpu_hours_flagged: float = 0.0


@dataclass
class WasteReplay:
    jobs: int
    busy_job_hours: float
    rules: dict[str, RuleCount] = field(default_factory=dict)

    def false_per_1000_busy_job_hours(self, rule: str) -> float:
        return 1000.0 * self.rules[rule].false / self.busy_job_hours if self.busy_job_hours else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "busy_job_hours": round(self.busy_job_hours, 1),
            "rules": {
                name: {
                    "findings": c.findings,
                    "false": c.false,
                    "false_per_1000_busy_job_hours": round(self.false_per_1000_busy_job_hours(name), 3),
                    "to_find": c.to_find,
                    "missed": c.missed,
                    "gpu_hours_flagged": round(c.gpu_hours_flagged, 1),
                }
                for name, c in self.rules.items()
            },
        }

    def render(self) -> str:
        lines = [
            f"waste findings on {self.jobs:,} generated jobs ({self.busy_job_hours:,.0f} job-hours of work)",
            f"{'rule':<24}{'findings':>9}{'false':>7}{'false/1000 busy h':>19}{'to find':>9}"
            f"{'missed':>8}{'GPU-h flagged':>15}",
        ]
        for name, c in self.rules.items():
            lines.append(
                f"{name:<24}{c.findings:>9}{c.false:>7}{self.false_per_1000_busy_job_hours(name):>19.3f}"
                f"{c.to_find:>9}{c.missed:>8}{c.gpu_hours_flagged:>15.1f}"
            )
        return "\n".join(lines)


GPUS = (0, 1)  # each job holds two GPUs of its node
IDLE, ORPHAN, OUTSIDE = WASTE_RULES


class _Looker:
    """Looks at the replay node as the controller does: its snapshot through every rule, and
    whether the waste finding asked for has persisted for its window."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def persisted(
        self,
        code: str,
        t: float,
        workloads: Sequence[WorkloadOnNode] = (),
        claims: Sequence[ProcessClaim] = (),
    ) -> bool:
        snap = NodeSnapshot.reporting(NODE, [], int(t * 1e9))
        snap.workloads, snap.claims = tuple(workloads), tuple(claims)
        now = int(t * 1e9)
        found = self.evaluator.evaluate(Workflow(NODE), snap, now)
        return any(f.code == code and self.evaluator.persisted(f, now) for f in found)

    def clear(self, t: float) -> None:
        self.persisted("", t)


def _grid(job: Job, x: float) -> float:
    """The first report at or after x (reports every REPORT_S from the job's start)."""
    return job.start_s + max(1, math.ceil((x - job.start_s) / REPORT_S)) * REPORT_S


def _worked(job: Job, a: float, b: float) -> bool:
    return any(s < b and e > a for s, e in job.busy)


def _replay_idle(job: Job, policy: Policy, look: _Looker, key: str, count: RuleCount) -> None:
    """The job's reports through the aggregator's idle clock, and a look when the rule's window
    is whole: a busy span shorter than a report interval that falls between two reports is not
    seen (NVML reads the instant), which is where a false finding can come from."""
    window = policy.rules[IDLE].window_s
    activity, clock = Activity.of(policy), IdleClock()
    busy_reading = {g: {"util_gpu_pct": 90.0, "hbm_used_bytes": 40.0 * GIB} for g in GPUS}
    idle_reading = {g: {"util_gpu_pct": 0.0, "hbm_used_bytes": 40.0 * GIB} for g in GPUS}
    found: list[float] = []
    flagged: list[tuple[float, float]] = []  # each finding, from its window's end to working again

    def idle_until(first_idle: float, until: float) -> None:
        """Idle reports from first_idle to the report before `until` (working again, or the end)."""
        if first_idle >= until:
            return
        clock.note(NODE, GPUS, idle_reading, set(), activity, first_idle, job.start_s)
        since = clock.since[NODE]
        assert since is not None
        due = _grid(job, since + window)
        if due < until:
            w = WorkloadOnNode(key, "", Owner(), GPUS, job.start_s, since, 0)
            if look.persisted(IDLE, due, [w]):
                found.append(due)
                flagged.append((due, min(until, job.end_s)))
                count.gpu_hours_flagged += len(GPUS) * (min(until, job.end_s) - due) / 3600
        look.clear(until)

    first_idle = _grid(job, job.start_s)
    for a, b in job.busy:
        seen = _grid(job, a)
        if seen >= b:
            continue  # over between two reports: NVML never saw it
        idle_until(first_idle, seen)
        clock.note(NODE, GPUS, busy_reading, set(), activity, seen, job.start_s)
        first_idle = _grid(job, b) if _grid(job, b) > b else _grid(job, b) + REPORT_S
    idle_until(first_idle, job.end_s)

    count.findings += len(found)
    count.false += sum(_worked(job, at - window, at) for at in found)
    gaps, t = [], job.start_s
    for a, b in job.busy:
        gaps.append((t, a))
        t = max(t, b)
    gaps.append((t, job.end_s))
    for a, b in gaps:
        if b - a >= window + 2 * REPORT_S:
            count.to_find += 1
            # Found: a finding fired in it, or one already firing went on through it.
            count.missed += not any(s <= b and e >= a + window for s, e in flagged)


def _replay_processes(
    job: Job, policy: Policy, look: _Looker, key: str, counts: dict[str, RuleCount]
) -> None:
    """Its processes at its end (gone after their teardown, or left behind) and while it runs
    (on its GPUs, or one on a GPU it was not given)."""
    cases = (
        (ORPHAN, job.orphan, job.end_s, job.end_s + (6 * 3600 if job.orphan else job.teardown_s)),
        (OUTSIDE, job.outside, job.start_s, job.end_s),
    )
    for code, truth, start, end in cases:
        count = counts[code]
        count.to_find += int(truth)
        window = policy.rules[code].window_s
        if code == ORPHAN:
            claims = [ProcessClaim(key, CLAIM_ENDED, GPUS, (4242,), 20 * GIB, Owner())]
            workloads: list[WorkloadOnNode] = []
        else:
            gpus = (*GPUS, 2) if job.outside else GPUS
            claims = [ProcessClaim(key, CLAIM_RUNNING, gpus, (4242,), 20 * GIB, Owner())]
            workloads = [WorkloadOnNode(key, "", Owner(), GPUS, job.start_s)]
        first = _grid(job, start)
        raised = False
        if first < end:  # a report saw the processes
            look.persisted(code, first, workloads, claims)
            due = _grid(job, first + window)
            raised = due < end and look.persisted(code, due, workloads, claims)
            if raised:
                count.gpu_hours_flagged += len(GPUS) * (end - due) / 3600
        look.clear(end)
        count.findings += int(raised)
        count.false += int(raised and not truth)
        count.missed += int(truth and not raised)


def replay_waste(policy: Policy, jobs: list[Job], state_path: str) -> WasteReplay:
    """The three waste rules over the generated jobs, one after another on one node."""
    state = open_state("sqlite", state_path)
    try:
        look = _Looker(Evaluator(policy, state.kept))
        busy_h = sum(b - a for j in jobs for a, b in j.busy) / 3600
        out = WasteReplay(len(jobs), busy_h, {name: RuleCount() for name in WASTE_RULES})
        for n, job in enumerate(jobs):
            key = f"replay:{n}"
            _replay_idle(job, policy, look, key, out.rules[IDLE])
            _replay_processes(job, policy, look, key, out.rules)
        return out
    finally:
        state.close()
