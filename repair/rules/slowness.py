"""A GPU that does less than its peers on the same work: a gray failure (docs/repair.md
"Slowness from work, not time").

Utilization is the share of time a kernel ran, not how much work it did, so "busy" only picks
the GPUs worth comparing: where the GPU has GPM (Hopper and later), busy is its SMs' own activity
(`sm_active_pct`: one small kernel keeps utilization at 100 % with most SMs idle, and the driver
then lowers the clock of a GPU that is not slow); elsewhere, utilization. The work is the SM clock
(what a GPU busy on the same work turns into work). Like is compared with like: the same model,
under the same power limit and the same clocks policy (the application clock the GPU targets),
so a GPU capped lower or clocked lower by its operator is never "slow" beside its peers, and GPUs
at their power limit (the power-cap reason set, the common case in training) are compared among
themselves: at the same watts, a lower clock is less work. Power itself is evidence, never the
verdict: a GPU drawing less power at the same clock does the same work; so are SM and tensor
activity.

Each GPU's ratio to the median of its peers is averaged over the rule's window
(repair/rules/windows.py), and judged against the GPU's own baseline: identical GPUs differ by
a few percent for good (manufacturing and power management, Sinha et al., SC'22), and a GPU that
was always 3 % behind its peers has not just become slow. The baseline follows the GPU's ratio
slowly (BASELINE_TAU_S), only while it is not found slow, and is held within one threshold of
the peers' median: it can excuse at most one threshold of lasting shortfall (a GPU further behind
is found however long it has been so), and a GPU that always ran ahead is found when it falls a
threshold under its own normal, not only under its peers'.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import pynvml

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import Rule
from gpufleet.repair.rules.windows import Key, TrailingWindows, WindowMean

SLOW_MIN_UTIL_PCT = 90.0  # only GPUs this busy are compared: the same work (without GPM)
SLOW_MIN_SM_ACTIVE_PCT = 70.0  # with GPM: at least this share of the SMs busy
SLOW_MIN_GROUP = 3  # a GPU and at least two peers: one peer cannot say which of two is slow
LOOKS_PER_WINDOW = 20  # the ratios a window averages at most (one look every window_s / 20)
BASELINE_TAU_S = 24 * 3600.0  # a GPU's own baseline follows its ratio over about a day
POWER_LIMIT_STEP_W = 5.0  # power limits this close are the same limit
TARGET_CLOCK_STEP_MHZ = 15.0  # application clocks this close are the same clocks policy
# Clock-event reasons with rules of their own (thermal_slowdown, power_slowdown's power brake):
# a GPU slowed for one of them is that rule's finding, not a gray failure. The software power
# cap is not here: under the same limit, peers at their cap are compared among themselves.
OWN_RULE_SLOWDOWN = (
    pynvml.nvmlClocksEventReasonSwThermalSlowdown
    | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    | pynvml.nvmlClocksEventReasonHwSlowdown
)


def median_without(ranked: list[float], position: int) -> float:
    """The median of the sorted values less the one at `position` (its peers' median), without
    building the list of the others: the rule takes it for every GPU at every look."""
    n = len(ranked) - 1
    k = n // 2

    def peer(j: int) -> float:  # the j-th smallest of the others
        return ranked[j if j < position else j + 1]

    return peer(k) if n % 2 else (peer(k - 1) + peer(k)) / 2


Group = tuple[str, int | None, int | None]  # model, power limit and target clock (in steps)


def busy(gpu: telemetry_pb2.GpuSample) -> bool:
    """Busy on work worth comparing: its SMs' activity where the GPU has GPM, else utilization."""
    if gpu.HasField("sm_active_pct"):
        return gpu.sm_active_pct >= SLOW_MIN_SM_ACTIVE_PCT
    return gpu.HasField("util_gpu_pct") and gpu.util_gpu_pct >= SLOW_MIN_UTIL_PCT


def _step(gpu: telemetry_pb2.GpuSample, field: str, step: float) -> int | None:
    return round(getattr(gpu, field) / step) if gpu.HasField(field) else None


def _group(gpu: telemetry_pb2.GpuSample) -> Group | None:
    """The GPUs a GPU is compared with: (model, power limit, target clock); None when it is not
    comparable now (lost, not busy, no clock, or slowed for a reason with its own rule)."""
    if gpu.lost or not busy(gpu):
        return None
    if not gpu.HasField("clock_sm_mhz") or gpu.clock_sm_mhz <= 0:
        return None
    if gpu.HasField("clock_event_reasons") and gpu.clock_event_reasons & OWN_RULE_SLOWDOWN:
        return None
    return (
        gpu.model,
        _step(gpu, "power_limit_w", POWER_LIMIT_STEP_W),
        _step(gpu, "clock_sm_target_mhz", TARGET_CLOCK_STEP_MHZ),
    )


def peer_groups(gpus: Iterable[tuple[int, telemetry_pb2.GpuSample]]) -> dict[Group, list[int]]:
    groups: dict[Group, list[int]] = {}
    for index, gpu in gpus:
        key = _group(gpu)
        if key is not None:
            groups.setdefault(key, []).append(index)
    return {k: v for k, v in groups.items() if len(v) >= SLOW_MIN_GROUP}


class GpuSlow(Rule):
    """Among a node's busy GPUs of one model under one power limit and clocks policy, one whose SM clock,
    averaged over the window as a ratio to its peers' median, is `threshold` (a fraction)
    below what it does normally."""

    name = "gpu_slow"
    # Not watched: clocks move at every report, so watching them would evaluate every node at
    # every report; the full passes (repair_observe_interval_s) fill the window.
    watch_fields = ()
    peer_fields = ("clock_sm_mhz", "power_w", "power_limit_w", "clock_sm_target_mhz", "sm_active_pct")
    threshold_max = 1.0  # a fraction of the work: 0.1 = 10 % less than its normal

    def __init__(self) -> None:
        self._ratios = TrailingWindows()
        self._baseline: dict[Key, tuple[float, int]] = {}  # (ratio, when last moved)
        # node -> (when last looked at, its findings then): a node is looked at afresh at most
        # LOOKS_PER_WINDOW times a window, however often it is evaluated (a full pass evaluates
        # every node; at 20,000 nodes every 15 s the rule's cost counts).
        self._looked: dict[str, tuple[int, list[Finding]]] = {}
        self._skipped: set[str] = set()  # nodes evaluated since their last look, not looked at

    def look_again_at_ns(self, node: str, entry: Entry) -> int | None:
        window_ns = int(entry.window_s * 1e9)
        times = [self._ratios.covered_at_ns(node, window_ns, lambda r: r < 1 - entry.threshold)]
        if node in self._skipped:  # what it was given since its last look is still to be seen
            times.append(self._looked[node][0] + window_ns // LOOKS_PER_WINDOW)
        return min((t for t in times if t is not None), default=None)

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        window_ns = int(entry.window_s * 1e9)
        t = snap.sample_time_ns or now_ns
        looked = self._looked.get(snap.node)
        if looked is not None and 0 <= t - looked[0] < window_ns // LOOKS_PER_WINDOW:
            if t != looked[0]:
                self._skipped.add(snap.node)
            return looked[1]
        self._skipped.discard(snap.node)
        found = self._look(snap, entry, window_ns, t)
        self._looked[snap.node] = (t, found)
        return found

    def _look(self, snap: NodeSnapshot, entry: Entry, window_ns: int, t: int) -> list[Finding]:
        groups = peer_groups(sorted(snap.gpus.items()))
        compared = {i for indices in groups.values() for i in indices}
        for index in snap.gpus:
            if index not in compared:
                self._ratios.forget((snap.node, index))  # its window starts again when it is
        found = []
        for indices in groups.values():
            ranked = sorted((snap.gpus[i].clock_sm_mhz, i) for i in indices)
            clocks = [c for c, _ in ranked]
            for position, (clock, index) in enumerate(ranked):
                peers_median = median_without(clocks, position)
                key = (snap.node, index)
                over = self._ratios.observe(key, t, clock / peers_median, window_ns)
                if over is None:
                    continue
                expected = self._expected(key, over, entry.threshold)
                if over.mean < expected * (1 - entry.threshold):
                    peers = [snap.gpus[i] for i in indices if i != index]
                    evidence = _evidence(snap.gpus[index], over, expected, peers_median, peers, entry)
                    found.append(entry.finding(snap.node, index, self.name, evidence, over.start_ns))
        return found

    def _expected(self, key: Key, over: WindowMean, threshold: float) -> float:
        """The GPU's normal ratio to its peers: its baseline, moved towards this window's mean
        unless the window is slow, held within one threshold of its peers' median."""
        baseline, moved_ns = self._baseline.get(key, (1.0, over.end_ns))
        expected = min(1.0 + threshold, max(1.0 - threshold, baseline))
        if over.mean >= expected * (1 - threshold):
            step = min(1.0, (over.end_ns - moved_ns) / 1e9 / BASELINE_TAU_S)
            self._baseline[key] = (baseline + (over.mean - baseline) * step, over.end_ns)
        return expected


def _evidence(
    gpu: telemetry_pb2.GpuSample,
    over: WindowMean,
    expected: float,
    peers_median: float,
    peers: list[telemetry_pb2.GpuSample],
    entry: Entry,
) -> str:
    limit = f"{gpu.power_limit_w:.0f} W" if gpu.HasField("power_limit_w") else "an unknown"
    target = ""
    if gpu.HasField("clock_sm_target_mhz"):
        target = f", {gpu.clock_sm_target_mhz:.0f} MHz target clock"
    gate = (
        f"≥{SLOW_MIN_SM_ACTIVE_PCT:.0f} % SMs active"
        if gpu.HasField("sm_active_pct")
        else f"≥{SLOW_MIN_UTIL_PCT:.0f} % util"
    )
    power = ""
    if gpu.HasField("power_w"):
        share = f" ({gpu.power_w / gpu.power_limit_w:.0%} of its limit)" if gpu.power_limit_w > 0 else ""
        power = f"; power {gpu.power_w:.0f} W{share}"
    work = ""
    for field, name in (("sm_active_pct", "SMs active"), ("tensor_active_pct", "tensor cores active")):
        theirs = [getattr(p, field) for p in peers if p.HasField(field)]
        if gpu.HasField(field) and theirs:
            work += f"; {name} {getattr(gpu, field):.0f} % (peers' median {statistics.median(theirs):.0f} %)"
    reasons = f"; clock-event reasons 0x{gpu.clock_event_reasons:x}" if gpu.clock_event_reasons else ""
    return (
        f"SM clock at {over.mean:.0%} of its peers' median over {entry.window_s:g} s "
        f"(now {gpu.clock_sm_mhz:.0f} MHz vs {peers_median:.0f} MHz; its normal {expected:.0%}, "
        f"threshold {entry.threshold:.0%} below that); {len(peers)} {gpu.model} peers at "
        f"{gate} under the same {limit} power limit{target}{power}{work}{reasons}"
    )
