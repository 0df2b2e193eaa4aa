"""A workload's figures as one history point and back (docs/history.md "Workloads"): the
`workload` measurement, one point per workload at its end. Tags are only the owner dimensions
whose cardinality the site bounds (scheduler, account, partition, namespace, team: each value a
name the scheduler knows, a few hundred at most); the job id, its name, the user and the nodes
are fields, never tags, so 20,000 jobs a day add no series."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from gpufleet.aggregator.store.base import Point
from gpufleet.aggregator.workloads.ledger import GpuFigures, Workload

MEASUREMENT = "workload"
MAX_PER_GPU = 4096  # GPUs whose figures a summary keeps (a job larger than this keeps its totals)
TAGS = ("scheduler", "account", "partition", "namespace", "team")
# The owner dimensions usage is grouped by; `user` reads only for roles that may see users.
USAGE_DIMENSIONS = ("account", "user", "namespace", "team", "partition")
# The owner dimensions history is grouped by (bounded: never the user, never a job): one
# measurement each, `owner_account` ..., one series per owner, a point per scheduler read with
# the owner's running GPUs' mean utilization and SM activity, summed HBM and power, and count.
OWNER_DIMENSIONS = ("account", "namespace", "team", "partition")
OWNER_METRICS = ("util_gpu_pct", "sm_active_pct", "hbm_used_bytes", "power_w", "gpus_allocated")


def owner_measurement(dimension: str) -> str:
    return f"owner_{dimension}"


def owner_points(
    readings_by_owner: dict[str, list[dict[str, float]]], dimension: str, time_ns: int
) -> list[Point]:
    """One point per owner: what its running workloads' GPUs do now."""
    points = []
    for owner, readings in readings_by_owner.items():
        fields: dict[str, float | int | str] = {"gpus_allocated": len(readings)}
        for name, combine in (
            ("util_gpu_pct", "mean"),
            ("sm_active_pct", "mean"),
            ("hbm_used_bytes", "sum"),
            ("power_w", "sum"),
        ):
            values = [r[name] for r in readings if name in r]
            if values:
                fields[name] = float(sum(values) / len(values) if combine == "mean" else sum(values))
        points.append(Point(owner_measurement(dimension), {dimension: owner}, fields, time_ns))
    return points


@dataclass(frozen=True)
class Summary:
    """One workload's figures, live or ended (what every surface shows of it)."""

    scheduler: str
    id: str
    user: str
    account: str
    partition: str
    namespace: str
    team: str
    name: str
    nodes: tuple[str, ...]
    gpus: int
    start_unix_s: float
    end_unix_s: float | None  # None: running
    gpu_hours_allocated: float
    gpu_hours_effective: float | None  # None: no utilization reading yet
    gpu_hours_idle: float
    util_mean_pct: float | None
    util_max_pct: float | None
    sm_mean_pct: float | None
    hbm_peak_bytes: int
    energy_j: float
    model: str = ""
    # Per GPU: (node, index, seconds read, util mean or None, util max, idle seconds, SM mean or
    # None, HBM peak bytes, energy J).
    per_gpu: tuple[tuple[str, int, float, float | None, float, float, float | None, int, float], ...] = ()

    @property
    def efficiency_pct(self) -> float | None:
        if self.gpu_hours_effective is None or not self.gpu_hours_allocated:
            return None
        return 100.0 * self.gpu_hours_effective / self.gpu_hours_allocated

    def owner(self, dimension: str) -> str:
        return str(getattr(self, dimension))


def summarise(w: Workload, now_s: float, model: str = "") -> Summary:
    job = w.job
    return Summary(
        scheduler=job.scheduler,
        id=job.id,
        user=job.user,
        account=job.account,
        partition=job.partition,
        namespace=job.namespace,
        team=job.team,
        name=job.name,
        nodes=tuple(sorted(job.gpus_by_node)),
        gpus=w.gpu_count,
        start_unix_s=job.start_unix_s,
        end_unix_s=w.ended_unix_s,
        gpu_hours_allocated=w.gpu_hours_allocated(now_s),
        gpu_hours_effective=w.gpu_hours_effective(now_s),
        gpu_hours_idle=w.gpu_hours_idle(),
        util_mean_pct=w.util_mean_pct(),
        util_max_pct=w.util_max_pct(),
        sm_mean_pct=w.sm_mean_pct(),
        hbm_peak_bytes=w.hbm_peak_bytes(),
        energy_j=w.energy_j(),
        model=model,
        per_gpu=tuple(_gpu_row(node, index, g) for (node, index), g in sorted(w.gpus.items())),
    )


def _gpu_row(node: str, index: int, g: GpuFigures) -> tuple:
    return (
        node,
        index,
        g.seconds,
        g.util_mean_pct,
        g.util_max_pct,
        g.idle_seconds,
        g.sm_mean_pct,
        g.hbm_peak_bytes,
        g.energy_j,
    )


def to_point(s: Summary) -> Point:
    fields: dict[str, float | int | str] = {
        "id": s.id,
        "user": s.user,
        "name": s.name,
        "nodes": ",".join(s.nodes),
        "model": s.model,
        "gpus": s.gpus,
        "start_unix_s": s.start_unix_s,
        "gpu_hours_allocated": s.gpu_hours_allocated,
        "gpu_hours_idle": s.gpu_hours_idle,
        "hbm_peak_bytes": s.hbm_peak_bytes,
        "energy_j": s.energy_j,
        "per_gpu": json.dumps(s.per_gpu[:MAX_PER_GPU], separators=(",", ":")),
    }
    for name in ("gpu_hours_effective", "util_mean_pct", "util_max_pct", "sm_mean_pct"):
        value = getattr(s, name)
        if value is not None:
            fields[name] = float(value)
    tags = {t: getattr(s, t) for t in TAGS if getattr(s, t)}
    end = s.end_unix_s if s.end_unix_s is not None else s.start_unix_s
    fields["end_unix_s"] = end
    # A point is its series (these few tags) and its time: two jobs of one account ending in the
    # same second must not be one point. The time is the end's second plus a nanosecond offset
    # fixed by the job's id (the true end is the end_unix_s field).
    offset_ns = zlib.crc32(f"{s.scheduler}:{s.id}".encode()) % 1_000_000_000
    return Point(MEASUREMENT, tags, fields, int(end) * 1_000_000_000 + offset_ns)


def from_point(p: Point) -> Summary:
    f, t = p.fields, p.tags

    def opt(name: str) -> float | None:
        value = f.get(name)
        return None if value is None else float(value)

    return Summary(
        scheduler=t.get("scheduler", ""),
        id=str(f.get("id", "")),
        user=str(f.get("user", "")),
        account=t.get("account", ""),
        partition=t.get("partition", ""),
        namespace=t.get("namespace", ""),
        team=t.get("team", ""),
        name=str(f.get("name", "")),
        nodes=tuple(n for n in str(f.get("nodes", "")).split(",") if n),
        gpus=int(f.get("gpus", 0)),
        start_unix_s=float(f.get("start_unix_s", 0.0)),
        end_unix_s=float(f.get("end_unix_s", p.time_unix_ns / 1e9)),
        gpu_hours_allocated=float(f.get("gpu_hours_allocated", 0.0)),
        gpu_hours_effective=opt("gpu_hours_effective"),
        gpu_hours_idle=float(f.get("gpu_hours_idle", 0.0)),
        util_mean_pct=opt("util_mean_pct"),
        util_max_pct=opt("util_max_pct"),
        sm_mean_pct=opt("sm_mean_pct"),
        hbm_peak_bytes=int(f.get("hbm_peak_bytes", 0)),
        energy_j=float(f.get("energy_j", 0.0)),
        model=str(f.get("model", "")),
        per_gpu=_per_gpu(f.get("per_gpu")),
    )


def _per_gpu(value: object) -> tuple:
    try:
        rows = json.loads(str(value)) if value else []
        return tuple(tuple(r) for r in rows if isinstance(r, list) and len(r) == 9)
    except ValueError:
        return ()


@dataclass(frozen=True)
class UsageRow:
    owner: str
    workloads: int
    gpu_hours_allocated: float
    gpu_hours_effective: float
    gpu_hours_idle: float
    cost_allocated: float | None
    cost_effective: float | None

    @property
    def efficiency_pct(self) -> float | None:
        if not self.gpu_hours_allocated:
            return None
        return 100.0 * self.gpu_hours_effective / self.gpu_hours_allocated


def parse_prices(text: str) -> dict[str, float]:
    """`gpu_hour_prices` ("H100=2.50, A100=1.10": a GPU model's name, or a part of it, = the
    price of one GPU-hour) → {part: price}; ValueError naming the bad entry."""
    prices: dict[str, float] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        model, sep, price = entry.partition("=")
        try:
            value = float(price)
        except ValueError:
            value = -1.0
        if not sep or not model.strip() or not value >= 0 or value == float("inf"):
            raise ValueError(
                f"gpu_hour_prices entry {entry[:60]!r} is not MODEL=PRICE (a GPU model's name or part "
                "of it, = a price per GPU-hour of 0 or more), e.g. 'H100=2.50, A100=1.10'"
            )
        prices[model.strip()] = value
    return prices


def price_of(model: str, prices: dict[str, float]) -> float | None:
    """The price of a GPU-hour of this model: the longest entry the model's name contains."""
    best = None
    for part, price in prices.items():
        if part in model and (best is None or len(part) > len(best[0])):
            best = (part, price)
    return best[1] if best else None


@dataclass(frozen=True)
class UsagePart:
    """Some workloads' GPU-hours within a usage range, under one owner, on one GPU model."""

    owner: str
    model: str
    workloads: int
    gpu_hours_allocated: float
    gpu_hours_effective: float
    gpu_hours_idle: float


def summary_parts(summaries: list[Summary], since_s: float, until_s: float, by: str) -> list[UsagePart]:
    """Each workload's GPU-hours within [since, until): a workload crossing the range's edges
    counts the share of its time inside, its effective and idle hours in the same proportion
    (the running ones: up to until)."""
    parts = []
    for s in summaries:
        end = s.end_unix_s if s.end_unix_s is not None else until_s
        span = end - s.start_unix_s
        inside = min(end, until_s) - max(s.start_unix_s, since_s)
        if inside <= 0 or span <= 0:
            continue
        share = inside / span
        parts.append(
            UsagePart(
                s.owner(by) or "(none)",
                s.model,
                1,
                s.gpu_hours_allocated * share,
                (s.gpu_hours_effective or 0.0) * share,
                s.gpu_hours_idle * share,
            )
        )
    return parts


def usage(parts: list[UsagePart], prices: dict[str, float]) -> list[UsageRow]:
    """GPU-hours by owner, most allocated first; cost where the model has a price."""
    rows: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    priced: dict[str, bool] = {}
    for part in parts:
        row = rows.setdefault(part.owner, [0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += part.gpu_hours_allocated
        row[1] += part.gpu_hours_effective
        row[2] += part.gpu_hours_idle
        price = price_of(part.model, prices) if prices else None
        if price is not None:
            row[3] += part.gpu_hours_allocated * price
            row[4] += part.gpu_hours_effective * price
        priced[part.owner] = priced.get(part.owner, False) or price is not None
        counts[part.owner] = counts.get(part.owner, 0) + part.workloads
    out = [
        UsageRow(
            owner,
            counts[owner],
            r[0],
            r[1],
            r[2],
            r[3] if priced[owner] else None,
            r[4] if priced[owner] else None,
        )
        for owner, r in rows.items()
    ]
    return sorted(out, key=lambda r: (-r.gpu_hours_allocated, r.owner))
