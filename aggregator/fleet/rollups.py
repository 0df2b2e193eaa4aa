"""Downsampled roll-ups, so a 30-day query reads hundreds of points, not millions.

Tiers: `1m` and `1h`. For every GPU and engine series, each tier holds one point per bucket in
measurement `<measurement>_<tier>` (gpu_1m, gpu_1h, engine_1m, engine_1h) with, per numeric
field, `<field>_mean`, `<field>_max`, `<field>_min` and `<field>_count`.

They are computed by the aggregator from the store's own history queries and written back as
ordinary points, so the same code serves the embedded store and InfluxDB 1.x, 2.x and 3.x
(continuous queries exist only in 1.x, tasks only in 2.x). Each pass recomputes a trailing
window (`lookback`), overwriting what it wrote before (a point's identity is measurement +
tags + time), so data that arrives late — replays after an outage, a spool draining — is
included as long as it lands within the window (within FULL_PASS_EVERY passes: the passes
between recompute only the buckets that can have changed, pass_lookbacks). Each tier keeps its
own retention.

A history query is answered from a roll-up when its step is at least the tier's and the range
is longer than ROUTE_AFTER[tier]; mean then is the mean of the bucket means (exact when the
buckets hold equal sample counts, as with a steady collector), max and min are exact; p95,
last and count always read raw data.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from gpufleet.aggregator.ingest.schema import METRICS
from gpufleet.aggregator.store import Point, Store

log = logging.getLogger("gpufleet.aggregator.fleet.rollups")

S = 1_000_000_000
ROLLED = ("gpu", "engine")


@dataclass(frozen=True)
class Tier:
    name: str
    step_s: int
    lookback_s: int  # recomputed on every pass
    route_after_s: int  # ranges longer than this read this tier


TIERS = (
    Tier("1m", 60, 15 * 60, 6 * 3600),
    Tier("1h", 3600, 3 * 3600, 3 * 86400),
)
ROUTABLE = {"mean", "max", "min"}


def rolled_fields(measurement: str) -> list[str]:
    return [m.name for m in METRICS.values() if m.measurement == measurement and m.unit != "bool"]


def compute(store: Store, tier: Tier, start_ns: int, end_ns: int) -> int:
    """Write tier's roll-ups for complete buckets in [start, end); return points written."""
    step = tier.step_s * S
    start_ns, end_ns = start_ns // step * step, end_ns // step * step
    if end_ns <= start_ns:
        return 0
    written = 0
    for measurement in ROLLED:
        fields = rolled_fields(measurement)
        # A chunk of statistics at a time, each written before the next is read (the store
        # sizes the chunks: Store.bucket_stats): the statistics of a whole window at once (15
        # minutes of 16,000 GPUs: 240,000 dicts of 28 values) stepped the aggregator's memory up
        # at every pass, and the allocator kept it (docs/benchmarks.md "Sustained ingest"). One
        # call for the whole window, not one per bucket: a store that answers by history queries
        # (InfluxDB) then asks each field's statistics once, not once a bucket (3,360 queries at
        # every start instead of 448).
        for chunk in store.bucket_stats(measurement, fields, start_ns, end_ns, step):
            store.write(
                [
                    Point(f"{measurement}_{tier.name}", dict(tags), values, t)
                    for (tags, t), values in chunk.items()
                ]
            )
            written += len(chunk)
    return written


def route(
    measurement: str, field: str, aggregate: str, start_ns: int, end_ns: int, step_ns: int
) -> tuple[str, str]:
    """(measurement, field) to answer a history query from: a roll-up when one fits."""
    if measurement not in ROLLED or aggregate not in ROUTABLE:
        return measurement, field
    for tier in reversed(TIERS):  # the coarsest tier that fits
        if step_ns >= tier.step_s * S and end_ns - start_ns > tier.route_after_s * S:
            return f"{measurement}_{tier.name}", f"{field}_{aggregate}"
    return measurement, field


def read_as_stored(measurement: str, step_ns: int) -> bool:
    """True when a routed query reads a roll-up at the tier's own step: one point per bucket."""
    return any(measurement.endswith(f"_{t.name}") and step_ns == t.step_s * S for t in TIERS)


# Every FULL_PASS_EVERY passes recompute each tier's whole trailing window (what late data, a
# replay or a spool draining, lands in); the passes between recompute only what can have changed
# since the last: the 1-minute tier's last few minutes, and the hourly tier only once an hour
# completes. A pass over the whole windows reads 15 min and 3 h of every series' raw rows: done
# every minute, that read grew with the hours of history kept and, at 2,000 nodes x 8 GPUs, was
# the aggregator's CPU climbing minute after minute under a steady load (docs/benchmarks.md).
FULL_PASS_EVERY = 10
RECENT_1M_S = 3 * 60  # the 1-minute tier's window between full passes


def pass_lookbacks(pass_number: int, now_ns: int, last_now_ns: int | None) -> dict[str, int]:
    """The trailing window, in seconds, of each tier for roll-up pass pass_number (0, 1, ...) at
    now_ns, the previous pass having run at last_now_ns: every tier's whole window on the first
    pass and every FULL_PASS_EVERY-th; between them the last RECENT_1M_S of the 1-minute tier,
    and of the hourly tier the hours completed since the previous pass (0: none)."""
    if pass_number % FULL_PASS_EVERY == 0 or last_now_ns is None:
        return {t.name: t.lookback_s for t in TIERS}
    hour = TIERS[1].step_s * S
    completed = now_ns // hour - last_now_ns // hour
    return {TIERS[0].name: RECENT_1M_S, TIERS[1].name: (completed + 1) * TIERS[1].step_s if completed else 0}


def run_once(store: Store, now_ns: int | None = None, lookback_s: dict[str, int] | None = None) -> int:
    now_ns = now_ns or time.time_ns()
    total = 0
    for tier in TIERS:
        back = (lookback_s or {}).get(tier.name, tier.lookback_s)
        total += compute(store, tier, now_ns - back * S, now_ns)
    return total
