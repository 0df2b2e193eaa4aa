"""`gpufleet replay`: what would automatic repair have done on this fault history?
(docs/architecture.md "Policy replay"; every figure is defined in docs/repair.md.)

Three inputs: the aggregator's own store (--since/--until, through the Fleet API: the
aggregator replays its history with its own rails and commands), a trace file (--trace) or a
generated history (--generate llama3). The last two run here, with the shipped rails
(cap 10 nodes or 10 %, breaker at 5 nodes in 10 minutes) and simulated reboots and tickets.

--generate spread measures the slowness rule (gpu_slow) alone on a generated fleet with the
spread identical GPUs show for good: its findings per 1,000 node-days on GPUs that are not slow,
and how soon it finds GPUs made 15 % slow (docs/repair.md "Slowness from work, not time").

--generate jobs measures the waste findings (idle_allocation, orphaned_process,
gpu_outside_allocation) on generated training, inference and interactive jobs: each rule's
findings, the false ones per 1,000 job-hours of work, what it had to find and missed, and the
GPU-hours flagged (docs/repair.md "Waste findings, replayed")."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.client.fleet import FleetClient, resolve_client
from gpufleet.client.timeparse import parse_time_ns


def add_arguments(sub: Any, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "replay",
        parents=[client],
        help="what automatic repair would have done on a fault history (a policy what-if)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--since", help="replay the store's history from: 2h, 7d ago, or an ISO time")
    src.add_argument(
        "--trace", help="a trace file: JSON lines, one XID or signal each (docs/repair.md: Policy replay)"
    )
    src.add_argument(
        "--generate",
        choices=["llama3", "spread", "jobs"],
        help="a generated history: llama3, the Llama 3 Table 5 mix; spread, gpu_slow on normal GPU "
        "spread; jobs, the waste findings on generated job patterns",
    )
    p.add_argument("--until", default="now", help="with --since: the end (default now)")
    p.add_argument(
        "--policy",
        help="a policy override file to replay (default: the shipped policy; "
        "with --since: the aggregator's own)",
    )
    p.add_argument("--compare", help="a second policy file: both are replayed and what differs is shown")
    p.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="fleet size, when larger than the trace's (generate llama3: 2048, spread: 250)",
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument(
        "--jobs", type=int, default=3000, help="with --generate jobs: how many jobs (default 3000)"
    )
    p.add_argument(
        "--days", type=float, help="with --generate: days of history (default llama3 54, spread 4)"
    )
    p.add_argument("--seed", type=int, default=0, help="with --generate: the random seed (default 0)")
    p.add_argument(
        "--hidden-failures",
        action="store_true",
        help="with --generate: add failures the driver hides (assumed counts: docs/repair.md)",
    )
    p.add_argument(
        "--clock-spread",
        type=float,
        default=0.02,
        help="with --generate spread: s.d. of each GPU's lasting SM-clock offset (default 0.02)",
    )
    p.add_argument(
        "--without-gpm",
        action="store_true",
        help="with --generate spread: samples without GPM activity (GPUs before Hopper)",
    )
    p.add_argument(
        "--technician-h",
        type=float,
        default=48.0,
        help="hours until a person returns a quarantined node (0: never; default 48)",
    )
    p.add_argument(
        "--breaker-reset-min",
        type=float,
        default=60.0,
        help="minutes until a person resets a tripped breaker (0: never; default 60)",
    )
    p.add_argument("--show-nodes", type=int, default=10, help="nodes whose steps the table shows")
    p.add_argument("--json", action="store_true", help="the whole report (and comparison) as JSON")


def _config(args: argparse.Namespace) -> Any:
    from gpufleet.repair.replay.engine import ReplayConfig

    return ReplayConfig(technician_s=args.technician_h * 3600, breaker_reset_s=args.breaker_reset_min * 60)


def _local(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from gpufleet.repair.policy import load_policy
    from gpufleet.repair.replay.engine import replay
    from gpufleet.repair.replay.generate import generate_llama3
    from gpufleet.repair.replay.history import load_trace
    from gpufleet.repair.replay.report import summarize

    started = time.perf_counter()
    if args.trace:
        history = load_trace(args.trace, args.nodes, args.gpus_per_node)
    else:
        history = generate_llama3(
            args.nodes or 2048,
            54.0 if args.days is None else args.days,
            args.seed,
            args.gpus_per_node,
            hidden=args.hidden_failures,
        )
    print(
        f"replaying {len(history.inputs)} inputs on {len(history.nodes)} nodes "
        f"({time.perf_counter() - started:.1f} s to read) ...",
        file=sys.stderr,
    )
    config = _config(args)
    reports = []
    for path in [args.policy, *([args.compare] if args.compare else [])]:
        report = summarize(replay(load_policy(path), history, config))
        print(f"  {', '.join(report['policy'])}: {report['wall_s']:.1f} s", file=sys.stderr)
        reports.append(report)
    return reports[0], reports[1] if len(reports) > 1 else None


def _spread(args: argparse.Namespace) -> int:
    """gpu_slow on the generated spread, for the policy and the one compared with it."""
    from gpufleet.repair.policy import load_policy
    from gpufleet.repair.replay.spread import Spread, measure_slowness

    if not 0 <= args.clock_spread <= 0.2:
        print(
            f"gpufleet replay: --clock-spread {args.clock_spread} must be between 0 and 0.2 "
            "(a fraction: 0.02 is 2 %)",
            file=sys.stderr,
        )
        return 2
    spread = Spread(clock_static=args.clock_spread, gpm=not args.without_gpm)
    nodes, days = args.nodes or 250, 4.0 if args.days is None else args.days
    out = []
    for path in _policy_paths(args):
        print(f"measuring gpu_slow on {nodes} generated nodes for {days:g} day(s) ...", file=sys.stderr)
        report = measure_slowness(load_policy(path), nodes, days, args.seed, spread)
        out.append((path or "shipped policy", report))
    return _print_measured(args, out)


def _policy_paths(args: argparse.Namespace) -> list[str | None]:
    """The policy replayed (None: the shipped one) and the one compared with it, if any."""
    return [args.policy, *([args.compare] if args.compare else [])]


def _print_measured(args: argparse.Namespace, out: list[tuple[str, Any]]) -> int:
    """A generated measurement's reports, one per policy: JSON, or each rendered under its name."""
    if args.json:
        reports = [{"policy": name, **r.as_dict()} for name, r in out]
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    else:
        print("\n\n".join(f"policy: {name}\n{r.render()}" for name, r in out))
    return 0


def _jobs(args: argparse.Namespace) -> int:
    """The waste findings on generated jobs, for the policy and the one compared with it."""
    import tempfile

    from gpufleet.repair.policy import load_policy
    from gpufleet.repair.replay.waste import generate_jobs, replay_waste

    if not 1 <= args.jobs <= 1_000_000:
        print(f"gpufleet replay: --jobs {args.jobs} must be from 1 to 1000000", file=sys.stderr)
        return 2
    jobs = generate_jobs(args.jobs, args.seed)
    out = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-replay-") as scratch:
        for n, path in enumerate(_policy_paths(args)):
            print(f"replaying the waste findings on {args.jobs:,} generated jobs ...", file=sys.stderr)
            report = replay_waste(load_policy(path), jobs, str(Path(scratch) / f"state-{n}.sqlite3"))
            out.append((path or "shipped policy", report))
    return _print_measured(args, out)


def _remote(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from gpufleet.client.rpcs import FleetRpc
    from gpufleet.protos import fleet_pb2

    now = time.time_ns()
    request = fleet_pb2.ReplayRequest(
        start_unix_ns=parse_time_ns(args.since, now), end_unix_ns=parse_time_ns(args.until, now)
    )
    if args.policy:
        request.policy_toml, request.policy_name = _read(args.policy), args.policy
    if args.compare:
        request.compare, request.compare_toml, request.compare_name = True, _read(args.compare), args.compare
    client = FleetClient(
        resolve_client(args.fleet, args.token, args.token_file, allow_plaintext=args.allow_plaintext)
    )
    try:
        print("replaying the store's history on the aggregator ...", file=sys.stderr)
        reply = client.call(FleetRpc.ReplayPolicy, request, timeout_s=600.0)
    finally:
        client.close()
    other = json.loads(reply.compare_json) if reply.compare_json else None
    return json.loads(reply.report_json), other


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read policy file {path}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from gpufleet.repair.policy import PolicyError
    from gpufleet.repair.replay.history import TraceError
    from gpufleet.repair.replay.report import compare, render

    if args.hidden_failures and args.generate != "llama3":
        print("gpufleet replay: --hidden-failures goes with --generate llama3", file=sys.stderr)
        return 2
    try:
        if args.generate == "spread":
            return _spread(args)
        if args.generate == "jobs":
            return _jobs(args)
        report, other = _remote(args) if args.since else _local(args)
    except (TraceError, PolicyError) as exc:
        print(f"gpufleet replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out: dict[str, Any] = {"a": report}
        if other is not None:
            out.update(b=other, difference=compare(report, other))
        print(json.dumps(out if other is not None else report, indent=2))
    else:
        print(render(report, other, args.show_nodes))
    return 0
