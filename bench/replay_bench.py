"""Policy replay at the Llama 3 paper's scale: 2,048 nodes x 8 GPUs over 54 days of the
Table 5 interruption mix (repair/replay/generate.py), through the real controller.

    python bench/replay_bench.py                     # seeds 0, 1, 2; the shipped policy and the strict one
    python bench/replay_bench.py --seeds 0 --policy examples/policy-strict.toml

For each seed: the time to generate the history, then each policy's replay wall time (CPU
bound, one core), passes and the headline figures. The baseline, in the same run, is a replay
of the same history with every rule off (each input still evaluated by the controller: the
cost of reading the history, without any repair flow); the ratio says what the repair flows
cost on top. Prints medians over the seeds; the issue's bar is under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from loadgen import machine  # bench/ is on sys.path when a bench script runs

from gpufleet.repair.policy import load_policy, load_policy_text
from gpufleet.repair.replay.engine import replay
from gpufleet.repair.replay.generate import generate_llama3
from gpufleet.repair.replay.report import summarize
from gpufleet.repair.rules import RULES

QUIET = (
    "".join(f"[rules.{name}]\nenabled = false\n" for name in RULES if name != "xid")
    + "\n".join(
        f'[buckets.{b}]\ncordon = false\nladder = []\nseverity = "info"\n'
        for b in (
            "RESET_GPU",
            "WORKFLOW_XID_48",
            "RESTART_BM",
            "RESTART_VM",
            "WORKFLOW_NVLINK_ERR",
            "WORKFLOW_NVLINK5_ERR",
            "CONTACT_SUPPORT",
            "CHECK_MECHANICALS",
            "UPDATE_SWFW",
        )
    )
    + '[[xid_workflow]]\nxid = 48\nwith_xids = [63, 64]\ncordon = false\nseverity = "info"\n'
)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--days", type=float, default=54.0)
    here = Path(__file__).resolve().parent.parent
    p.add_argument("--policy", action="append", help="policy files besides the shipped one")
    args = p.parse_args()
    policies = {"shipped": load_policy(), "no rules (baseline)": load_policy_text(QUIET, "no rules")}
    for path in args.policy or [str(here / "examples" / "policy-strict.toml")]:
        policies[Path(path).name] = load_policy(path)
    print(f"machine: {machine()}; {args.nodes} nodes x 8 GPUs, {args.days:g} days, seeds {args.seeds}")
    walls: dict[str, list[float]] = {name: [] for name in policies}
    gen_s: list[float] = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        t0 = time.perf_counter()
        history = generate_llama3(args.nodes, args.days, seed)
        gen_s.append(time.perf_counter() - t0)
        for name, policy in policies.items():
            r = summarize(replay(policy, history))
            walls[name].append(r["wall_s"])
            lat = r["detect_latency_s"]
            print(
                f"seed {seed} {name:<22} {r['wall_s']:6.1f} s  {r['passes']:>6} passes  "
                f"out {r['nodes_taken_out']:>4} nodes  {r['gpu_hours_out_of_service']:>9,.0f} GPU-h  "
                f"precision {r['precision']}  recall {r['recall']} / {r['recall_all']}  "
                f"false {r['false_cordons']}  p50/p99 {_s(lat['p50'])}/{_s(lat['p99'])} s  "
                f"breaker {r['breaker_trips']}  lemons {len(r['lemon_nodes'])}",
                flush=True,
            )
    base = statistics.median(walls["no rules (baseline)"])
    print(f"\ngenerate: median {statistics.median(gen_s):.2f} s ({len(history.inputs)} inputs, last seed)")
    for name, w in walls.items():
        med = statistics.median(w)
        print(f"{name:<22} replay median {med:6.1f} s  ({med / base:4.1f} x the baseline; bar: < 60 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
