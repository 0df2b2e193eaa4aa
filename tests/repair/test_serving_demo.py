"""The demo's serving pool (examples/serving.toml, cli/demo_serving.py), run as a user runs it:
`gpufleet demo --scenario ...` with real collectors scraping the replicas' /metrics, the real
aggregator and its hook backend on the pool's control API. A repair that may wait is held
while three replicas at about 0.8 KV-cache would go to two; a fourth replica joining lets it go
on within one pass; the drain is graceful (the engine leaves rotation, its requests finish, then
the eviction): 0 requests aborted, counted by the replicas themselves."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.paths import REPO
from harness.processes import gpufleet_argv, home_env
from harness.waiting import wait_until

SCENARIO = """
[serving]
nodes = ["demo-node-01", "demo-node-02", "demo-node-03"]
requests_per_s = 12.0
request_s = 2.0
kv_per_request = 0.1

[[serving.join]]
node = "demo-node-04"
after_file = "{join}"

[[fault]]
at_s = 1
node = "demo-node-01"
gpu = 1
kind = "remap_pending"
"""


def _cli(env: dict[str, str], *args: str) -> Any:
    out = subprocess.run(gpufleet_argv(*args, "--json"), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _node(env: dict[str, str], name: str) -> dict[str, Any]:
    return next(n for n in _cli(env, "breaker", "status")["nodes"] if n["node"] == name)


def numbers_follow_the_load(env: dict[str, str]) -> None:
    """Issue 55: a serving node's GPUs are as busy as its replica's batch is full (its KV-cache
    usage, within the simulated GPUs' noise), and hold the engine's HBM (90 % of it, vLLM's
    default); the node whose replica has not joined yet is idle, not running a job of its own."""

    def off() -> list[str]:
        kv = {e["node"]: 100 * e["kv_cache_usage_ratio"] for e in _cli(env, "engines")["engines"]
              if e.get("kv_cache_usage_ratio") is not None}  # fmt: skip
        wrong = []
        for n in _cli(env, "nodes")["nodes"]:
            util, hbm = n["util_gpu_mean_pct"], n["hbm_used_bytes"] / n["hbm_total_bytes"]
            if n["node"] == "demo-node-04":
                if util > 5 or hbm > 0.05:
                    wrong.append(f"{n['node']} (no replica yet) at {util:.0f} % and {hbm:.0%} of HBM")
            elif n["node"] not in kv or abs(util - kv[n["node"]]) > 15 or not 0.85 <= hbm <= 0.95:
                wrong.append(f"{n['node']} at {util:.0f} % and {hbm:.0%} of HBM, KV {kv.get(n['node'])} %")
        return wrong

    wait_until(lambda: not off(), 30, "each node's numbers to follow its replica's load", context=off)


@pytest.mark.slow
def test_the_demo_holds_a_drain_for_capacity_then_drains_gracefully_when_a_replica_joins(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    env = home_env(home)
    join = tmp_path / "join-now"
    scenario = tmp_path / "serving.toml"
    scenario.write_text(SCENARIO.format(join=join))
    data = tmp_path / "demo"
    out = tmp_path / "demo.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            gpufleet_argv(
                "demo", "--no-dashboard", "--nodes", "4", "--gpus-per-node", "2", "--interval", "0.5",
                "--scenario", str(scenario), "--data-dir", str(data),
            ),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
    figures = data / "serving.json"
    try:
        wait_until(lambda: "Ctrl-C stops the demo" in out.read_text(), 90, "the demo to be ready")
        held = wait_until(
            lambda: (n := _node(env, "demo-node-01"))["detail"].startswith("waiting for capacity") and n,
            60,
            "demo-node-01's drain held for capacity",
        )
        assert held["state"] == "cordoned"
        assert "3 → 2 replicas" in held["detail"], held
        # demo-node-04's replica, not up yet, answers no scrape: its model unknown, in no pool
        (pool,) = _cli(env, "pools")["pools"]
        assert pool["nodes_waiting"] == ["demo-node-01"], pool
        numbers_follow_the_load(env)
        serving_before = json.loads(figures.read_text())
        node1 = next(r for r in serving_before["replicas"] if r["node"] == "demo-node-01")
        assert node1["in_rotation"] and node1["accepted"] > 0, "held cordoned, it still serves"

        join.touch()  # the fourth replica comes up (an autoscaler's answer)
        drained = wait_until(
            lambda: (n := _node(env, "demo-node-01"))["state"] not in ("cordoned", "draining") and n,
            60,
            "demo-node-01's drain to go on and finish",
        )
        assert drained["state"] in ("repairing", "validating", "healthy"), drained
        listed = _cli(env, "incidents", "--all")["incidents"]
        incident = next(i for i in listed if i["node"] == "demo-node-01")
        steps = [(a["action"], a["outcome"].split(":")[0]) for a in incident["actions"]]
        assert ("drain", "held") in steps and ("drain_engines", "ok") in steps, steps
        assert steps.index(("drain_engines", "ok")) < steps.index(("drain", "ok")), steps
        after = json.loads(figures.read_text())
        node1 = next(r for r in after["replicas"] if r["node"] == "demo-node-01")
        assert node1["accepted"] > 0 and after["aborted"] == 0, after
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    text = out.read_text()
    assert code == 0, text
    assert "serving:" in text and ", 0 aborted" in text, text


def test_a_bad_serving_table_is_refused_before_anything_starts(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text('[serving]\nnodes = ["demo-node-09"]\n')
    out = subprocess.run(
        gpufleet_argv("demo", "--no-dashboard", "--nodes", "4", "--scenario", str(scenario),
                      "--data-dir", str(tmp_path / "d")),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "demo-node-09 is not a demo node" in out.stderr, out.stderr
    assert not (tmp_path / "d" / "aggregator.ready.json").exists()


def test_the_shipped_serving_scenario_loads() -> None:
    from gpufleet.cli.demo_serving import load_plan

    plan = load_plan(REPO / "examples" / "serving.toml", [f"demo-node-{i:02d}" for i in range(1, 5)])
    assert plan is not None and len(plan.nodes) == 3 and plan.joins[0].node == "demo-node-04"
