"""GPUs judged against their peers on the same node: a storm of corrected ECC errors on one GPU
while the others show none, and a GPU that is up but slower than its peers on the same work
(gray failure). Robust statistics (median and median absolute deviation), so one bad GPU
cannot hide itself by moving the yardstick."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import pynvml

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import Rule

# Corrected errors: a GPU storms when its rate is at least the policy's threshold (errors/s)
# and this many times its peers' median rate.
STORM_PEER_FACTOR = 10.0

# Slowness: only GPUs this busy are compared (the same work), and the yardstick is never
# narrower than this fraction of the median (identical GPUs have near-zero spread): with the
# shipped threshold of 4 deviations, a GPU must be more than 8 % below its peers.
SLOW_MIN_UTIL_PCT = 90.0
SLOW_MIN_SCALE_RATIO = 0.02
SLOW_MIN_PEERS = 3
SLOW_SIGNALS = (("clock_sm_mhz", "SM clock", "MHz"), ("power_w", "power", "W"))
# Clock-event reasons with their own rules (thermal_slowdown, power_slowdown): a GPU slowed for a
# named reason is not a gray failure. Masks as nvmlClocksEventReason*.
NAMED_SLOWDOWN = (
    pynvml.nvmlClocksEventReasonSwPowerCap
    | pynvml.nvmlClocksEventReasonSwThermalSlowdown
    | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
)


class EccCorrectedStorm(Rule):
    name = "ecc_corrected_storm"
    watch_fields = ("ecc_sbe_rate_per_s",)

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        rates = {
            i: g.ecc_sbe_rate_per_s
            for i, g in snap.gpus.items()
            if g.HasField("ecc_sbe_rate_per_s") and not g.lost
        }
        found = []
        for index, rate in sorted(rates.items()):
            if rate < max(entry.threshold, 1e-9):
                continue
            peers = [r for i, r in rates.items() if i != index]
            peer_median = statistics.median(peers) if peers else 0.0
            if peers and rate < STORM_PEER_FACTOR * peer_median:
                continue  # the whole node errs alike: not one GPU's storm
            evidence = (
                f"{rate:.0f} corrected ECC errors/s (threshold {entry.threshold:g}/s; "
                f"median of {len(peers)} peer(s) {peer_median:.0f}/s)"
            )
            found.append(entry.finding(snap.node, index, self.name, evidence, snap.sample_time_ns or now_ns))
        return found


def robust_outliers_below(values: dict[int, float], deviations: float) -> dict[int, tuple[float, float]]:
    """The keys whose value is more than `deviations` robust deviations below the median:
    key -> (median, how many deviations below). The deviation is 1.4826 x the median absolute
    deviation, never less than SLOW_MIN_SCALE_RATIO of the median."""
    if len(values) < SLOW_MIN_PEERS:
        return {}
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    scale = max(1.4826 * mad, SLOW_MIN_SCALE_RATIO * abs(median), 1e-9)
    out = {}
    for key, value in values.items():
        below = (median - value) / scale
        if below > deviations:
            out[key] = (median, below)
    return out


def _comparable(gpus: Iterable[tuple[int, telemetry_pb2.GpuSample]]) -> dict[str, list[int]]:
    """Busy GPUs without a named slowdown, by model."""
    groups: dict[str, list[int]] = {}
    for index, g in gpus:
        if g.lost or not g.HasField("util_gpu_pct") or g.util_gpu_pct < SLOW_MIN_UTIL_PCT:
            continue
        if g.HasField("clock_event_reasons") and g.clock_event_reasons & NAMED_SLOWDOWN:
            continue
        groups.setdefault(g.model, []).append(index)
    return groups


class GpuSlow(Rule):
    """Among a node's busy GPUs of one model, one whose SM clock or power is `threshold` robust
    deviations below its peers'."""

    name = "gpu_slow"
    # Not watched: clocks and power move at every report, so watching them would evaluate every
    # node at every report; the full passes (repair_observe_interval_s) are enough for a
    # finding that must hold for window_s (600 s shipped) anyway.
    watch_fields = ()
    peer_fields = tuple(name for name, _, _ in SLOW_SIGNALS)

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        flagged: dict[int, list[str]] = {}
        for model, indices in _comparable(sorted(snap.gpus.items())).items():
            for field, label, unit in SLOW_SIGNALS:
                values = {
                    i: float(getattr(snap.gpus[i], field)) for i in indices if snap.gpus[i].HasField(field)
                }
                for index, (median, below) in robust_outliers_below(values, entry.threshold).items():
                    flagged.setdefault(index, []).append(
                        f"{label} {values[index]:.0f} {unit} vs peers' median {median:.0f} {unit} "
                        f"({below:.1f} deviations below; {len(values) - 1} {model} peers "
                        f"at ≥{SLOW_MIN_UTIL_PCT:.0f} % util)"
                    )
        found = []
        for index, why in sorted(flagged.items()):
            reasons = snap.gpus[index].clock_event_reasons
            if reasons:
                why.append(f"clock-event reasons 0x{reasons:x}")
            found.append(
                entry.finding(snap.node, index, self.name, "; ".join(why), snap.sample_time_ns or now_ns)
            )
        return found
