"""Workloads at scale and what attribution costs (issue 53), each beside its baseline in the run.

    python bench/workloads_bench.py                  # all three parts
    python bench/workloads_bench.py --repeat 3       # medians of 3 runs of part 1
    python bench/workloads_bench.py --parts 2,3      # skip the ingest part

1. CPU per report: a real aggregator under bench/loadgen.py's paced load (2,000 nodes x 8 GPUs,
   1 s interval, columns), without attribution (workload_scheduler = none, reports without
   workloads) and with it (a site scheduler's 2,000 job records, one per node, each report
   naming its node's job on all 8 GPUs: the ledger checks every claim and adds every GPU's
   reading). Prints the aggregator's CPU per acknowledged report in each and their ratio.
2. Series cardinality in a real influxd: a simulated day of 20,000 jobs (12 accounts, 5 teams,
   3 partitions, 300 users) starting and ending across 2,000 nodes, run through the aggregator's
   ledger (aggregator/workloads/ledger.py) on a simulated clock read once a simulated minute,
   its summaries and owner series written by the InfluxDB store. `SHOW SERIES CARDINALITY`
   before and after: what attribution adds (a per-job tag would add one series per job).
3. `usage --by account` over 30 days on the embedded store: 30 such days of summaries (600,000),
   summed where they are stored (Store.sum_prorated, in SQL) against reading every summary out
   and summing in Python, in the same run; medians of 5.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

from influx_bench import start_influxd  # bench/ is on sys.path when a bench script runs
from ingest_bench import aggregator_argv, stop_server, wait_for_file
from loadgen import CpuSampler, Load, bench_job_id, bench_node, drive, machine

from gpufleet.aggregator.auth.tokens import new_secrets_file
from gpufleet.aggregator.store.base import ProratedSum
from gpufleet.aggregator.store.embedded import EmbeddedStore
from gpufleet.aggregator.store.influx import InfluxStore
from gpufleet.aggregator.workloads.ledger import WorkloadLedger
from gpufleet.aggregator.workloads.schedulers import Job
from gpufleet.aggregator.workloads.summary import (
    MEASUREMENT,
    OWNER_DIMENSIONS,
    Summary,
    UsagePart,
    from_point,
    owner_points,
    summarise,
    summary_parts,
    to_point,
    usage,
)

DAY_S = 86_400
ACCOUNTS = [f"acct-{i:02d}" for i in range(12)]
TEAMS = [f"team-{i}" for i in range(5)]
PARTITIONS = ["gpu", "debug", "long"]


# --- 1: CPU per report -------------------------------------------------------------------
def cpu_per_report(args: argparse.Namespace, tmp: Path, attributed: bool) -> dict[str, float]:
    secrets = tmp / "secrets.toml"
    if not secrets.exists():
        new_secrets_file(secrets, [("viewer", "viewer")])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    extra: tuple[str, ...] = ()
    if attributed:
        jobs = tmp / "jobs"
        jobs.mkdir(exist_ok=True)
        start = time.time() - 600
        for i in range(args.nodes):
            record = {
                "scheduler": "slurm",
                "id": bench_job_id(i),
                "user": f"user{i % 300}",
                "account": ACCOUNTS[i % len(ACCOUNTS)],
                "nodes": {bench_node(i): list(range(args.gpus))},
                "start_unix_s": start,
            }
            (jobs / f"{bench_job_id(i)}.json").write_text(json.dumps(record))
        extra = (
            "--workload-scheduler",
            "site",
            "--workload-site-jobs-dir",
            str(jobs),
            "--workload-poll-s",
            "2",
        )
    ready = tmp / "ready.json"
    ready.unlink(missing_ok=True)
    data = tmp / f"data-{time.monotonic_ns()}"
    with open(tmp / "aggregator.log", "ab") as log:
        server = subprocess.Popen(
            aggregator_argv(data, secrets, ready, "--ingest-workers", "0", *extra), stdout=log, stderr=log
        )
        try:
            bound = wait_for_file(ready, server, 60)
            sampler = CpuSampler([server.pid], children=True)
            sampler.start()
            load = Load(
                address=str(bound["ingest"]),
                secret=secret,
                nodes=args.nodes,
                gpus=args.gpus,
                interval=1.0,
                seconds=args.seconds,
                procs=2,
                columnar=True,
                workloads=attributed,
            )
            result = drive(load)
            sampler.stop.set()
            sampler.join()
            cpu_pct = sampler.cpu_pct(result["window_wall_start"], result["window_wall_end"])
        finally:
            stop_server(server)
    acked = max(1, int(result["acked"]))
    return {
        "reports_per_s": acked / result["seconds"],
        "cpu_pct": cpu_pct,
        "cpu_ms_per_report": cpu_pct / 100 * result["seconds"] / acked * 1000,
    }


# --- 2 and 3: a simulated day of jobs ----------------------------------------------------
def day_of_jobs(rng: random.Random, day_start: float, jobs: int, nodes: int) -> list[Job]:
    """`jobs` jobs starting through the day (2.4 h on average: about 2,000 at once on `nodes`
    nodes), each on one node's 8 GPUs, of 300 users in 12 accounts."""
    out = []
    for k in range(jobs):
        start = day_start + rng.uniform(0, DAY_S)
        user = rng.randrange(300)
        out.append(
            Job(
                scheduler="slurm",
                id=str(k + 1),
                user=f"user{user:03d}",
                account=ACCOUNTS[user % len(ACCOUNTS)],
                partition=PARTITIONS[user % len(PARTITIONS)],
                team=TEAMS[user % len(TEAMS)],
                name="train",
                start_unix_s=start,
                end_unix_s=start + rng.expovariate(1 / (2.4 * 3600)),
                gpus_by_node={f"node-{rng.randrange(nodes):05d}": tuple(range(8))},
            )
        )
    return out


def simulate_day(jobs: list[Job], day_start: float, write: object) -> tuple[int, int]:
    """Run the jobs through the ledger on a simulated clock read each simulated minute; write
    its summaries and owner points. (summaries, owner points) written."""
    clock = [day_start]
    ended: list[Summary] = []
    ledger = WorkloadLedger(
        "slurm", on_end=lambda w: ended.append(summarise(w, clock[0], "H100")), now=lambda: clock[0]
    )
    by_start = sorted(jobs, key=lambda j: j.start_unix_s)
    summaries = owners = 0
    for minute in range(DAY_S // 60 + 1):
        clock[0] = day_start + minute * 60
        now = clock[0]
        visible = {}
        for j in by_start:
            if j.start_unix_s > now:
                break
            if j.end_unix_s is not None and j.end_unix_s <= now - 300:
                continue  # slurmctld forgets a job MinJobAge (300 s) after its end
            visible[j.id] = (
                j
                if j.end_unix_s is not None and j.end_unix_s <= now
                else Job(**{**j.__dict__, "end_unix_s": None})
            )
        ledger.refresh(visible)
        points = [to_point(s) for s in ended]
        summaries += len(points)
        ended.clear()
        for dim in OWNER_DIMENSIONS:
            more = owner_points(ledger.owner_readings(dim), dim, int(now * 1e9))
            owners += len(more)
            points += more
        write(points)  # type: ignore[operator]
    return summaries, owners


def cardinality(store: InfluxStore) -> int:
    results = store._query("SHOW SERIES CARDINALITY")
    series = results[0].get("series") or [{"values": [[0]]}]
    return int(series[0]["values"][0][0])


def part_cardinality(args: argparse.Namespace, tmp: Path) -> None:
    proc, url = start_influxd(tmp / "influx")
    try:
        store = InfluxStore(url, "gpufleet")
        before = cardinality(store)
        day_start = time.time() - DAY_S - 3600
        jobs = day_of_jobs(random.Random(53), day_start, args.jobs, args.nodes)
        started = time.perf_counter()
        summaries, owners = simulate_day(jobs, day_start, store.write)
        after = cardinality(store)
        print(
            f"2. a simulated day, {args.jobs:,} jobs on {args.nodes:,} nodes: {summaries:,} summaries "
            f"(the jobs ended within the day) and "
            f"{owners:,} owner points written in {time.perf_counter() - started:.1f} s; series cardinality "
            f"{before} before, {after} after: +{after - before} series (per-job tags would add "
            f"{args.jobs:,}: {args.jobs / max(1, after - before):.0f}x as many)",
            flush=True,
        )
    finally:
        proc.terminate()
        proc.wait(30)


def part_usage(args: argparse.Namespace, tmp: Path) -> None:
    store = EmbeddedStore(tmp / "history.sqlite3", 90 * DAY_S, "NORMAL")
    now = time.time()
    rng = random.Random(30)
    written = 0
    started = time.perf_counter()
    for day in range(30):
        day_start = now - (30 - day) * DAY_S
        points = []
        for job in day_of_jobs(rng, day_start, args.jobs, args.nodes):
            end = min(job.end_unix_s or now, now)
            hours = 8 * (end - job.start_unix_s) / 3600
            points.append(
                to_point(
                    Summary(
                        "slurm",
                        f"{day}-{job.id}",
                        job.user,
                        job.account,
                        job.partition,
                        "",
                        job.team,
                        job.name,
                        tuple(job.gpus_by_node),
                        8,
                        job.start_unix_s,
                        end,
                        hours,
                        hours * rng.uniform(0.05, 0.95),
                        hours * 0.1,
                        50.0,
                        90.0,
                        None,
                        60 << 30,
                        1e6,
                        "H100",
                    )
                )
            )
        store.write(points)
        written += len(points)
    print(f"3. {written:,} summaries (30 days) written in {time.perf_counter() - started:.1f} s", flush=True)
    since = now - 30 * DAY_S

    def in_store() -> list:
        rows = store.sum_prorated(
            ProratedSum(
                MEASUREMENT,
                int(since * 1e9),
                int((now + 1) * 1e9),
                since,
                now,
                "start_unix_s",
                "end_unix_s",
                ("gpu_hours_allocated", "gpu_hours_effective", "gpu_hours_idle"),
                ("model",),
            )
        )
        return usage([UsagePart(r.tags.get("account", ""), r.group[0], r.count, *r.sums) for r in rows], {})

    def read_out() -> list:
        summaries = [
            from_point(p) for p in store.query_points(MEASUREMENT, int(since * 1e9), int((now + 1) * 1e9))
        ]
        return usage(summary_parts(summaries, since, now, "account"), {})

    timings: dict[str, list[float]] = {
        "sum in the store (shipped)": [],
        "read every summary out (baseline)": [],
    }
    answers = {}
    for _ in range(args.usage_runs):
        for name, fn in (
            ("sum in the store (shipped)", in_store),
            ("read every summary out (baseline)", read_out),
        ):
            t = time.perf_counter()
            answers[name] = fn()
            timings[name].append(time.perf_counter() - t)
    a, b = answers.values()
    assert [(r.owner, r.workloads) for r in a] == [(r.owner, r.workloads) for r in b]
    assert all(
        abs(x.gpu_hours_allocated - y.gpu_hours_allocated) <= 1e-6 * y.gpu_hours_allocated
        for x, y in zip(a, b, strict=True)
    )
    med = {k: statistics.median(v) for k, v in timings.items()}
    shipped, baseline = med.values()
    print(
        f"3. usage --by account over 30 days ({len(a)} accounts), median of {args.usage_runs}: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in med.items())
        + f"; {baseline / shipped:.1f}x faster (the same rows)",
        flush=True,
    )
    store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs in a simulated day (parts 2, 3)")
    p.add_argument("--seconds", type=float, default=20.0, help="part 1's measurement window")
    p.add_argument("--repeat", type=int, default=1, help="part 1's runs of each; medians reported")
    p.add_argument("--usage-runs", type=int, default=5)
    p.add_argument("--parts", default="1,2,3")
    args = p.parse_args()
    parts = {int(x) for x in args.parts.split(",")}
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if 1 in parts:
            runs: dict[str, list[dict[str, float]]] = {"without attribution": [], "with attribution": []}
            for i in range(args.repeat):
                for label in runs:
                    r = cpu_per_report(args, tmp, attributed=label == "with attribution")
                    runs[label].append(r)
                    print(
                        f"1. run {i + 1} {label:20s}: {r['reports_per_s']:6.0f} reports/s, "
                        f"CPU {r['cpu_pct']:4.0f}%, "
                        f"{r['cpu_ms_per_report']:.3f} ms CPU per report",
                        flush=True,
                    )
            med = {k: statistics.median(r["cpu_ms_per_report"] for r in v) for k, v in runs.items()}
            print(
                f"1. CPU per report, median of {args.repeat}: without {med['without attribution']:.3f} ms, "
                f"with {med['with attribution']:.3f} ms: "
                f"{med['with attribution'] / med['without attribution']:.3f}x",
                flush=True,
            )
        if 2 in parts:
            part_cardinality(args, tmp)
        if 3 in parts:
            part_usage(args, tmp)


if __name__ == "__main__":
    main()
