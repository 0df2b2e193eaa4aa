"""The README's promise: `gpufleet demo` brings up a simulated fleet, and the CLI typed in
another shell finds it without flags and answers 'what is every GPU doing?' and 'what did
node X do?'."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.demo import running_demo
from harness.paths import REPO
from harness.processes import free_port, gpufleet_argv, home_env
from harness.waiting import wait_until


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    home = tmp_path_factory.mktemp("home")
    args = ("--no-dashboard", "--nodes", "4", "--gpus-per-node", "8", "--interval", "0.5")
    with running_demo(home, *args) as env:
        yield env, home
    assert not (home / ".config" / "gpufleet" / "client.toml").exists(), (
        "the demo removes the client config it wrote"
    )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpufleet_argv(*args), env=env, capture_output=True, text=True, timeout=60)


def test_nodes_lists_every_node_with_live_utilization_and_hbm(demo: tuple[dict[str, str], Path]) -> None:
    env, _ = demo
    result = cli(env, "nodes", "--json")
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    assert [n["node"] for n in nodes] == [f"demo-node-{i:02d}" for i in range(1, 5)]
    for n in nodes:
        assert n["liveness"] == "reporting" and n["gpu_count"] == 8 and len(n["gpus"]) == 8
        assert 0 <= n["util_gpu_mean_pct"] <= 100
        assert 0 < n["hbm_used_bytes"] <= n["hbm_total_bytes"]
        for g in n["gpus"]:
            assert {"util_gpu_pct", "hbm_used_bytes", "temp_gpu_c", "power_w"} <= set(g)
    table = cli(env, "nodes")
    assert table.returncode == 0 and "demo-node-04" in table.stdout and "UTIL %" in table.stdout
    assert "4 nodes (4 healthy), 0 nodes out of service (0 GPUs); 32 GPUs" in table.stdout, table.stdout


def test_node_shows_every_gpu(demo: tuple[dict[str, str], Path]) -> None:
    env, _ = demo
    detail = json.loads(cli(env, "node", "demo-node-02", "--json").stdout)
    assert detail["node"] == "demo-node-02" and detail["connected"] is True
    assert [g["index"] for g in detail["gpus"]] == list(range(8))
    assert all(g["model"] == "NVIDIA H200" for g in detail["gpus"])
    text = cli(env, "node", "demo-node-02").stdout
    assert "GPU-" in text and "sglang" in text and "Qwen/Qwen2.5-72B-Instruct" in text
    assert [e["engine"] for e in detail["engines"]] == ["sglang"] and detail["engines"][0]["readable"]
    training = cli(env, "node", "demo-node-03").stdout
    assert "no inference engines reported on this node" in training
    missing = cli(env, "node", "no-such-node")
    assert missing.returncode == 5 and "not known to this aggregator" in missing.stderr


def history_json(env: dict[str, str], step: str) -> dict[str, object]:
    r = cli(
        env, "history", "util_gpu_pct", "--node", "demo-node-01", "--since", "10m", "--step", step, "--json"
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_history_returns_a_time_series(demo: tuple[dict[str, str], Path]) -> None:
    env, _ = demo

    def series() -> list[dict[str, object]]:
        got = history_json(env, "1s")["series"]
        return got if got and all(len(s["points"]) >= 3 for s in got) else []

    got = wait_until(series, 30, "three 1-second buckets of history")
    assert len(got) == 8 and {s["tags"]["node"] for s in got} == {"demo-node-01"}
    assert all(0 <= p["value"] <= 100 for s in got for p in s["points"])
    minute = history_json(env, "1m")
    assert minute["step_s"] == 60 and len(minute["series"]) == 8
    rows = list(
        csv.DictReader(
            io.StringIO(
                cli(env, "history", "power_w", "--gpu", "3", "--since", "5m", "--agg", "max", "--csv").stdout
            )
        )
    )
    assert rows and {r["gpu"] for r in rows} == {"3"} and all(float(r["power_w"]) > 0 for r in rows)


def test_read_commands_refuse_a_bad_token_and_bad_arguments(demo: tuple[dict[str, str], Path]) -> None:
    env, _ = demo
    bad = cli(env, "nodes", "--token", "gfv1_not-a-real-token")
    assert bad.returncode == 4 and "rejected the credential" in bad.stderr
    unknown = cli(env, "history", "util_gpu_percent")
    assert unknown.returncode == 2 and "unknown metric 'util_gpu_percent'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    since = cli(env, "history", "util_gpu_pct", "--since", "yesterday-ish")
    assert since.returncode == 2 and "is not a time" in since.stderr
    buckets = cli(env, "history", "util_gpu_pct", "--since", "30d", "--step", "1s")
    assert buckets.returncode == 2 and "Use a larger step" in buckets.stderr


def test_cli_without_a_running_aggregator_says_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop("GPUFLEET_FLEET", None)
    port = free_port()
    r = subprocess.run(
        gpufleet_argv("nodes", "--fleet", f"127.0.0.1:{port}"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3
    assert "cannot reach the Fleet API" in r.stderr and "gpufleet demo" in r.stderr
    # The address came from --fleet: the advice is about --fleet, not GPUFLEET_FLEET.
    assert "address from --fleet" in r.stderr and "Check the address given with --fleet" in r.stderr
    assert "GPUFLEET_FLEET" not in r.stderr, r.stderr
    from_env = subprocess.run(
        gpufleet_argv("nodes"), env={**env, "GPUFLEET_FLEET": f"127.0.0.1:{port}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert from_env.returncode == 3 and "Check GPUFLEET_FLEET in the environment" in from_env.stderr


def test_the_cli_says_what_a_newcomer_meant(demo: tuple[dict[str, str], Path]) -> None:
    """What the issue's newcomer typed: `engines --json` (the fleet's engines, not a usage
    error), `history --node` with a node that does not exist (not found, exit 5, not "no data")."""
    env, _ = demo

    def engines() -> list[dict[str, object]]:
        out = cli(env, "engines", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["engines"]

    # The demo serves a simulated vLLM on its first node and SGLang on its second (cli/demo.py).
    listed = wait_until(lambda: len(engines()) == 2 and engines(), 30, "both demo engines listed")
    assert {(e["node"], e["engine"]) for e in listed} == {
        ("demo-node-01", "vllm"),
        ("demo-node-02", "sglang"),
    }
    table = cli(env, "engines")
    assert table.returncode == 0 and "NODE" in table.stdout and "demo-node-01" in table.stdout
    missing = cli(env, "history", "util_gpu_pct", "--node", "demo-node-99")
    assert missing.returncode == 5, (missing.returncode, missing.stdout, missing.stderr)
    assert "no node named demo-node-99 is known to this aggregator" in missing.stderr


def test_nothing_found_says_what_it_looked_for_with_the_readmes_exit_codes(
    demo: tuple[dict[str, str], Path],
) -> None:
    """Issue 55: a filter that matches nothing is 0 with the filter named; an unknown node is 5
    on every command that takes one; a reversed range is 2 in the words typed, never
    nanoseconds; every --json answer is an object with the time the aggregator answered."""
    env, _ = demo
    cluster = cli(env, "nodes", "--cluster", "nosuch")
    assert cluster.returncode == 0, cluster.stderr
    assert cluster.stdout.startswith("no node is in cluster nosuch"), cluster.stdout
    for command in (("history", "util_gpu_pct"), ("events",)):
        missing = cli(env, *command, "--node", "demo-node-99")
        assert missing.returncode == 5, (command, missing.returncode, missing.stdout, missing.stderr)
        assert "no node named demo-node-99 is known to this aggregator" in missing.stderr
    quiet = cli(env, "events", "--node", "demo-node-01", "--kind", "xid", "--since", "10s")
    assert quiet.returncode == 0 and "(node demo-node-01; kind xid)" in quiet.stdout, quiet.stdout
    for command in (("history", "util_gpu_pct"), ("events",)):
        reversed_range = cli(env, *command, "--since", "1h", "--until", "2h")
        assert reversed_range.returncode == 2, reversed_range.stderr
        said = reversed_range.stderr
        assert "--since 1h (" in said and "must be before --until 2h (" in said, said
        assert not re.search(r"\d{15,}", said), f"nanoseconds shown: {said}"
    for command, rows in (("incidents", "incidents"), ("audit", "entries"), ("nodes", "nodes")):
        answer = json.loads(cli(env, command, "--json").stdout)
        assert isinstance(answer, dict) and answer["server_time"].endswith("Z") and rows in answer, answer


def test_config_check_says_what_each_example_is_and_checks_it(tmp_path: Path) -> None:
    """The issue: `gpufleet config check` failed on every file in examples/ (none is a settings
    file). Each is named as what it is and checked by its own loader; a broken one still fails."""
    kinds = {"policy-": "a repair policy override", "": "a demo fault scenario"}
    for example in sorted((REPO / "examples").glob("*.toml")):
        out = subprocess.run(gpufleet_argv("config", "check", str(example)), capture_output=True, text=True)
        kind = next(k for prefix, k in kinds.items() if example.name.startswith(prefix))
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"is {kind}, not a settings file" in out.stdout and ": valid: " in out.stdout, out.stdout
    bad_policy = tmp_path / "policy.toml"
    bad_policy.write_text('[xid.31]\nseverity = "catastrophic"\n')
    out = subprocess.run(gpufleet_argv("config", "check", str(bad_policy)), capture_output=True, text=True)
    assert out.returncode == 2 and "NOT valid" in out.stdout and "catastrophic" in out.stdout, out.stdout
    bad_scenario = tmp_path / "scenario.toml"
    bad_scenario.write_text('[[fault]]\nat_s = 1\ngpu = 0\nkind = "melt"\n')
    out = subprocess.run(gpufleet_argv("config", "check", str(bad_scenario)), capture_output=True, text=True)
    assert out.returncode == 2 and "melt" in out.stdout, out.stdout
    settings_file = tmp_path / "gpufleet.toml"
    settings_file.write_text("[collector]\ninterval_s = 2.0\n")
    out = subprocess.run(gpufleet_argv("config", "check", str(settings_file)), capture_output=True, text=True)
    assert out.returncode == 0 and "[collector] ok" in out.stdout, out.stdout


def test_collector_without_a_gpu_exits_with_a_clear_message(tmp_path: Path) -> None:
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has a real NVIDIA driver")
    except OSError:
        pass
    r = subprocess.run(
        gpufleet_argv("collector", "run", "--node", "n1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "NVML is not available" in r.stderr and "--simulate" in r.stderr


def test_bad_settings_are_named_with_their_source(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFLEET_COLLECTOR_INTERVAL_S": "fast"}
    r = subprocess.run(
        gpufleet_argv("collector", "run", "--simulate"), env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "GPUFLEET_COLLECTOR_INTERVAL_S='fast' is not a valid float" in r.stderr
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text("[aggregator]\nretension_s = 3600\n")
    r = subprocess.run(
        gpufleet_argv("--config", str(cfg), "aggregator", "run"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "unknown setting(s) retension_s in [aggregator]" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "collector", "run", "--simulate", "--interval-s", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "interval_s=0.0 must be between 0.05 and 3600" in r.stderr


def test_collector_probe_prints_one_sample_in_our_schema(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        '[[fault]]\nat_s = 0\ngpu = 1\nkind = "not_supported"\nsymbol = "nvmlDeviceGetPowerUsage"\n'
    )
    r = subprocess.run(
        gpufleet_argv(
            "collector",
            "probe",
            "--simulate",
            "--sim-gpus",
            "2",
            "--sim-model",
            "A100",
            "--node",
            "probe-node",
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    probe = json.loads(r.stdout)
    assert probe["node"] == "probe-node" and probe["simulated"] is True and probe["nvml_errors"] == 0
    assert [g["index"] for g in probe["gpus"]] == [0, 1]
    gpu = probe["gpus"][0]
    assert gpu["model"] == "NVIDIA A100-SXM4-80GB" and gpu["nvlink_links_active"] == 12
    assert "retired_pages_pending" not in gpu, "an Ampere GPU remaps rows; retired pages are absent"
    table = subprocess.run(
        gpufleet_argv("collector", "probe", "--simulate", "--sim-gpus", "1"),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "GPU 0  NVIDIA H100 80GB HBM3" in table and "not reported" in table


def test_history_groups_across_series(demo: tuple[dict[str, str], Path]) -> None:
    """--group-by: one series per group, its count the sum of its members' counts (every sample
    of the group, not a mean of means); the CSV names the group's tags, not the GPUs'."""
    import time
    from datetime import UTC, datetime

    env, _ = demo
    span: list[str] = []

    def read(*extra: str) -> dict[str, object]:
        r = cli(env, "history", "util_gpu_pct", *span, "--agg", "count", "--json", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def settled() -> tuple[list, list] | None:
        end = int(time.time()) - 5  # a closed range in the past: what is in it is settled
        since, until = (datetime.fromtimestamp(t, UTC).isoformat() for t in (end - 30, end))
        span[:] = ["--since", since, "--until", until, "--step", "10s"]
        # A report still in flight could land between two reads: read until two agree.
        before, grouped, after = read()["series"], read("--group-by", "node")["series"], read()["series"]
        # ... and one in which every node has reported (the demo's collectors start one after
        # another: on a busy machine the first seconds after it is ready hold only some nodes).
        every = {s["tags"]["node"] for s in before} == {f"demo-node-{i:02d}" for i in range(1, 5)}
        return (before, grouped) if every and before == after else None

    per_gpu, per_node = wait_until(settled, 60, "a settled range in which every demo node reported")
    assert sorted(s["tags"]["node"] for s in per_node) == [f"demo-node-{i:02d}" for i in range(1, 5)]
    assert all(set(s["tags"]) == {"node"} for s in per_node)
    for group in per_node:
        members = [s for s in per_gpu if s["tags"]["node"] == group["tags"]["node"]]
        assert len(members) == 8
        for p in group["points"]:
            want = sum(
                q["value"] for s in members for q in s["points"] if q["time_unix_ns"] == p["time_unix_ns"]
            )
            assert p["value"] == want
    rows = list(
        csv.DictReader(
            io.StringIO(
                cli(env, "history", "util_gpu_pct", *span, "--group-by", "cluster,model", "--csv").stdout
            )
        )
    )
    assert rows and set(rows[0]) == {"time", "cluster", "model", "util_gpu_pct"}
    table = cli(env, "history", "util_gpu_pct", *span, "--group-by", "model")
    assert table.returncode == 0 and "NVIDIA H200" in table.stdout
    bad = cli(env, "history", "util_gpu_pct", "--group-by", "pid")
    assert bad.returncode == 2 and "cannot group util_gpu_pct by 'pid'" in bad.stderr
    assert "gpu_count" in cli(env, "history", "gpu_count", "--group-by", "cluster", "--csv").stdout


def test_a_second_demo_shows_none_of_the_first_ones_nodes(tmp_path: Path) -> None:
    """Each demo starts from an empty data dir (the issue: a second demo showed 12 ghost nodes
    and a quarantine of the first run's scenario); --keep-state is the way to keep them."""
    home = tmp_path / "home"
    home.mkdir()
    env = home_env(home)
    first = subprocess.run(
        gpufleet_argv("demo", "--no-dashboard", "--nodes", "3", "--interval", "0.5", "--duration", "4"),
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert "data dir" in first.stdout and ": a new data dir" in first.stdout
    with running_demo(home, "--no-dashboard", "--nodes", "1", "--interval", "0.5", name="second"):
        assert ": the last run's state cleared" in (home / "second.out").read_text()
        listed = cli(env, "nodes", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [n["node"] for n in json.loads(listed.stdout)["nodes"]] == ["demo-node-01"]


def test_the_demo_empties_only_a_data_dir_it_made(tmp_path: Path) -> None:
    from gpufleet.cli.demo import DEMO_MARKER, DataDirError, prepare_data_dir

    mine = tmp_path / "demo"
    assert prepare_data_dir(mine, keep_state=False) == "a new data dir"
    (mine / "store.db").write_text("last run")
    assert prepare_data_dir(mine, keep_state=True) == "the last run's state kept (--keep-state)"
    assert (mine / "store.db").read_text() == "last run"
    assert prepare_data_dir(mine, keep_state=False) == "the last run's state cleared"
    assert sorted(p.name for p in mine.iterdir()) == [DEMO_MARKER]
    theirs = tmp_path / "photos"
    theirs.mkdir()
    (theirs / "cat.jpg").write_text("keep me")
    with pytest.raises(DataDirError, match="holds files the demo did not write"):
        prepare_data_dir(theirs, keep_state=False)
    assert (theirs / "cat.jpg").read_text() == "keep me"
