"""The slowness rule (gpu_slow) on a generated fleet with the spread identical GPUs show for good:
how often it finds a GPU that is not slow, and whether it finds one that is
(`gpufleet replay --generate spread`; docs/repair.md "Slowness from work, not time").

The fleet (`SpreadFleet`, its assumptions in `Spread` with their sources in docs/repair.md):
nodes of eight H100s; each GPU's SM clock differs from its model's by a static N(0, 2 %) and its
power by a static N(0, 8 %); each sample adds N(0, 1 %) to the clock and N(0, 2 %) to the power;
nodes run jobs of 2-12 h at 92-99 % util (40 % of them power-bound: every GPU at its power limit
with the power-cap reason set, clocks 75-95 % of the maximum) between 0.5-4 h of lighter work
(20-80 % util); one node in ten has two of its eight GPUs capped by its operator at 450 W. With
GPM (the default, as on Hopper) each sample carries the SMs' activity (0.92 x util, its own noise
N(0, 1.5 %)) and the target clock.

`measure_slowness` runs the rule as the controller's full passes do, on every node, for the
days asked (a look every `look_s`), counting each GPU found once, when it is first found; then
every tenth node starts a job, is looked at every `pass_s` for a window (its normal), and one of
its GPUs is made 15 % slow (by default) and looked at for one window and one pass more: the report
says how many were found and how long after they slowed, and whether any other GPU was. The
rule alerts only (its shipped action), so this measures the rule, not a repair."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.policy import Policy
from gpufleet.repair.rules import RULES

DAY_S = 86400.0
MODEL = "NVIDIA H100 80GB HBM3"
MAX_SM_MHZ, LIMIT_W, OPERATOR_CAP_W = 1980.0, 700.0, 450.0
CAP_REASON = 0x4  # nvmlClocksEventReasonSwPowerCap


@dataclass(frozen=True)
class Spread:
    """What the generated fleet assumes (docs/repair.md gives the sources)."""

    clock_static: float = 0.02  # s.d. of each GPU's lasting SM-clock offset from its model's
    power_static: float = 0.08  # s.d. of each GPU's lasting power offset
    clock_noise: float = 0.01  # s.d. of each sample's clock noise
    power_noise: float = 0.02
    util_noise_pct: float = 1.0
    power_bound_share: float = 0.4  # of the busy jobs, those with every GPU at its power limit
    operator_capped_share: float = 0.1  # of the nodes, those with two GPUs capped at 450 W
    gpm: bool = True  # samples carry SM activity and the target clock (Hopper and later)


@dataclass
class _Gpu:
    clock: float  # static factor of the model's clock
    power: float  # static factor of the power
    limit_w: float


class SpreadFleet:
    """Nodes of eight H100s with the spread of `Spread`, stepped through time (seeded)."""

    def __init__(self, nodes: int, seed: int, spread: Spread | None = None) -> None:
        self.spread = spread = spread or Spread()
        self.rng = random.Random(seed)
        self.noise = numpy.random.default_rng(seed)
        self.nodes: dict[str, list[_Gpu]] = {}
        for n in range(nodes):
            capped = self.rng.random() < spread.operator_capped_share
            self.nodes[f"node-{n:04d}"] = [
                _Gpu(
                    1 + self.rng.gauss(0, spread.clock_static),
                    1 + self.rng.gauss(0, spread.power_static),
                    OPERATOR_CAP_W if capped and i < 2 else LIMIT_W,
                )
                for i in range(8)
            ]
        self.samples = {
            name: [telemetry_pb2.GpuSample(index=i, model=MODEL) for i in range(8)] for name in self.nodes
        }
        self._phase: dict[str, tuple[float, float, bool, float]] = {}  # until, util, power-bound, work
        self.slowed: dict[str, tuple[int, float]] = {}  # node -> (GPU, factor)

    def _next_phase(self, name: str, t: float) -> tuple[float, float, bool, float]:
        until, util, bound, work = self._phase.get(name, (-1.0, 0.0, False, 1.0))
        if t < until:
            return until, util, bound, work
        rng = self.rng
        if util >= 90 or (until < 0 and rng.random() < 0.25):  # a job ended: lighter work
            phase = (t + rng.uniform(1800, 4 * 3600), rng.uniform(20, 80), False, 1.0)
        else:
            bound = rng.random() < self.spread.power_bound_share
            work = rng.uniform(0.75, 0.95) if bound else 1.0
            phase = (t + rng.uniform(2 * 3600, 12 * 3600), rng.uniform(92, 99), bound, work)
        self._phase[name] = phase
        return phase

    def step(self, name: str, t: float) -> list[telemetry_pb2.GpuSample]:
        """The node's eight samples at time t (s): the same objects, refilled."""
        _, util, bound, work = self._next_phase(name, t)
        sp = self.spread
        slow_gpu, slow_factor = self.slowed.get(name, (-1, 1.0))
        # Each sample's noise (util, clock, power, SM activity; 8 GPUs) in one draw: numpy's, for speed.
        noise = self.noise.normal(
            0.0, (sp.util_noise_pct, sp.clock_noise, sp.power_noise, 1.5), (8, 4)
        ).tolist()
        for i, (g, s) in enumerate(zip(self.nodes[name], self.samples[name], strict=True)):
            capped = bound or g.limit_w < LIMIT_W
            clock = MAX_SM_MHZ * g.clock * (work if bound else 1.0)
            if g.limit_w < LIMIT_W:
                clock *= 0.88  # the operator's cap holds its clock lower
            power = g.limit_w if capped else min(g.limit_w, 0.85 * LIMIT_W * g.power)
            util_noise, clock_noise, power_noise, active_noise = noise[i]
            s.util_gpu_pct = min(100.0, util + util_noise)
            s.clock_sm_mhz = clock * (1 + clock_noise) * (slow_factor if i == slow_gpu else 1.0)
            s.power_w = power * (1 + power_noise) * (0.98 if capped else 1.0)
            s.power_limit_w = g.limit_w
            s.clock_event_reasons = CAP_REASON if capped else 0
            if sp.gpm:
                s.sm_active_pct = min(100.0, max(0.0, 0.92 * s.util_gpu_pct + active_noise))
                s.tensor_active_pct = 0.6 * s.sm_active_pct
                s.clock_sm_target_mhz = MAX_SM_MHZ
        return self.samples[name]

    def busy(self, name: str, t: float, for_s: float) -> None:
        """Start a job on the node now that runs at least for_s, not power-bound."""
        self._phase[name] = (t + for_s + 1, 97.0, False, 1.0)

    def snapshot(self, name: str, t: float) -> NodeSnapshot:
        """The node as the controller sees it at t: reporting, its GPUs' samples of time t."""
        return NodeSnapshot.reporting(name, self.step(name, t), int(t * 1e9), cluster="generated")


@dataclass
class SlownessReport:
    nodes: int
    days: float
    seed: int
    spread: Spread
    window_s: float
    threshold: float
    findings: list[tuple[str, int | None, float]] = field(default_factory=list)  # node, GPU, at s
    planted: list[tuple[str, int]] = field(default_factory=list)
    slow_factor: float = 0.85
    found_after_s: dict[tuple[str, int], float] = field(default_factory=dict)
    wrong_gpus: list[tuple[str, int | None]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def node_days(self) -> float:
        return self.nodes * self.days

    @property
    def findings_per_1000_node_days(self) -> float:
        return 1000 * len(self.findings) / self.node_days if self.node_days else 0.0

    def as_dict(self) -> dict[str, Any]:
        after = sorted(self.found_after_s.values())
        return {
            "nodes": self.nodes,
            "days": self.days,
            "node_days": self.node_days,
            "seed": self.seed,
            "spread": self.spread.__dict__,
            "window_s": self.window_s,
            "threshold": self.threshold,
            "false_findings": len(self.findings),
            "false_findings_per_1000_node_days": round(self.findings_per_1000_node_days, 3),
            "false_finding_list": [{"node": n, "gpu": g, "at_s": round(t, 1)} for n, g, t in self.findings],
            "slow_factor": self.slow_factor,
            "slow_gpus_planted": len(self.planted),
            "slow_gpus_found": len(self.found_after_s),
            "found_after_s_median": statistics.median(after) if after else None,
            "found_after_s_max": after[-1] if after else None,
            "other_gpus_found_while_slow": [{"node": n, "gpu": g} for n, g in self.wrong_gpus],
            "wall_s": round(self.wall_s, 1),
        }

    def render(self) -> str:
        d = self.as_dict()
        gpm = "with GPM activity" if self.spread.gpm else "without GPM (utilization only)"
        lines = [
            f"gpu_slow on a generated fleet: {self.nodes} nodes x {self.days:g} "
            f"day{'' if self.days == 1 else 's'} = "
            f"{self.node_days:g} node-days (seed {self.seed}; {gpm}; window {self.window_s:g} s, "
            f"threshold {self.threshold:.0%})",
            f"  spread assumed: SM clock N(0, {self.spread.clock_static:.0%}) per GPU, power "
            f"N(0, {self.spread.power_static:.0%}); per sample clock N(0, {self.spread.clock_noise:.0%}), "
            f"power N(0, {self.spread.power_noise:.0%}) (docs/repair.md)",
            f"  findings on GPUs that are not slow: {d['false_findings']} "
            f"({d['false_findings_per_1000_node_days']:g} per 1,000 node-days; target ≤ 1)",
        ]
        lines += [f"    {n} GPU {g} at {t / 3600:.1f} h" for n, g, t in self.findings[:10]]
        found = f"{d['slow_gpus_found']} of {d['slow_gpus_planted']}"
        if d["found_after_s_median"] is not None:
            found += (
                f", after {d['found_after_s_median']:.0f} s (median), {d['found_after_s_max']:.0f} s "
                f"at most (window {self.window_s:g} s)"
            )
        lines.append(f"  GPUs made {1 - self.slow_factor:.0%} slow, found: {found}")
        lines.append(f"  other GPUs found while they were slow: {len(self.wrong_gpus)}")
        return "\n".join(lines)


def measure_slowness(
    policy: Policy,
    nodes: int = 250,
    days: float = 4.0,
    seed: int = 0,
    spread: Spread | None = None,
    look_s: float | None = None,
    pass_s: float = 15.0,
    slow_factor: float = 0.85,
) -> SlownessReport:
    """The rule's findings on the generated fleet (look every look_s: default half its window),
    then one GPU made slow in every tenth node, looked at every pass_s for a window and a pass."""
    entry = policy.rules["gpu_slow"]
    started = time.perf_counter()
    fleet, rule = SpreadFleet(nodes, seed, spread), RULES["gpu_slow"]()
    report = SlownessReport(nodes, days, seed, fleet.spread, entry.window_s, entry.threshold)
    report.slow_factor = slow_factor
    look_s = look_s or entry.window_s / 2
    seen: set[tuple[str, int | None]] = set()
    t = 0.0
    while t < days * DAY_S:
        for name in fleet.nodes:
            for f in rule.evaluate(fleet.snapshot(name, t), entry, policy, 0):
                if (name, f.gpu) not in seen:
                    seen.add((name, f.gpu))
                    report.findings.append((name, f.gpu, t))
        t += look_s
    # Every tenth node starts a job and is looked at as the controller does (every pass_s) for a
    # window, so its window holds that job's normal; then one of its GPUs is made slow, and it is
    # looked at for one window and one pass more.
    chosen = list(fleet.nodes)[::10]
    for k, name in enumerate(chosen):
        fleet.busy(name, t, 2 * entry.window_s + pass_s)
        report.planted.append((name, 2 + k % 6))  # one of the GPUs at the node's full limit
    start = t + entry.window_s
    while t <= start + entry.window_s + pass_s:
        if t >= start:
            fleet.slowed.update((name, (gpu, slow_factor)) for name, gpu in report.planted)
        for name in chosen:
            for f in rule.evaluate(fleet.snapshot(name, t), entry, policy, 0):
                if t >= start and (name, f.gpu) in report.planted:
                    report.found_after_s.setdefault((name, f.gpu), t - start)  # type: ignore[index]
                elif (name, f.gpu) not in report.wrong_gpus:
                    report.wrong_gpus.append((name, f.gpu))
        t += pass_s
    report.wall_s = time.perf_counter() - started
    return report
