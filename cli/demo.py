"""`gpufleet demo`: an aggregator and N collector processes with simulated GPUs, on
loopback, with the embedded store; optionally the dashboard. Nothing to install or start.

The demo keeps its data, secrets and logs in --data-dir (default
~/.local/share/gpufleet/demo) and, while it runs, writes the client config the CLI reads
by default, so `gpufleet nodes` in another shell finds it. The file is removed on exit.
Each run starts from an empty data dir (a second demo never shows the first one's nodes,
incidents or quarantines) unless --keep-state is given; a dir the demo did not make (no
DEMO_MARKER in it, and not the default) is never emptied: the demo refuses it instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.aggregator.auth.tokens import issue_collector_token, new_secrets_file
from gpufleet.cli.demo_serving import DemoServing, ServingPlan, ServingScenarioError, load_plan
from gpufleet.client.fleet import ClientSettings, FleetClient, client_config_path
from gpufleet.collector.simnvml import GPU_PROFILES
from gpufleet.collector.simnvml.engine_server import MODELS as ENGINE_MODELS
from gpufleet.collector.simnvml.scheduler import ScheduledState
from gpufleet.collector.simnvml.serving import Control
from gpufleet.common.files import write_private
from gpufleet.protos import vocabulary_pb2

DEMO_MODELS = ["H100", "H200", "A100", "B200"]
# Inference replicas on some nodes (KV-cache pressure in the dashboard), training on the rest.
DEMO_ENGINES = ["vllm", "sglang", "", ""]


DEMO_MARKER = ".gpufleet-demo"  # in a data dir the demo made: one it may empty


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpufleet" / "demo"


class DataDirError(Exception):
    pass


def prepare_data_dir(data_dir: Path, keep_state: bool) -> str:
    """The demo's data dir, emptied unless keep_state; what was done, for its first line."""
    holds = data_dir.is_dir() and any(data_dir.iterdir())
    if holds and not keep_state:
        if not (data_dir / DEMO_MARKER).exists() and data_dir != default_data_dir():
            raise DataDirError(
                f"--data-dir {data_dir} holds files the demo did not write (no {DEMO_MARKER} in it): "
                "the demo empties its data dir at each start; name an empty or new folder, or pass "
                "--keep-state to run on what is there"
            )
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / DEMO_MARKER).touch()
    if not holds:
        return "a new data dir"
    return "the last run's state kept (--keep-state)" if keep_state else "the last run's state cleared"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument(
        "--gpu-model",
        default="mixed",
        help=f"{', '.join(GPU_PROFILES)}, or mixed (default: nodes cycle {', '.join(DEMO_MODELS)})",
    )
    p.add_argument("--interval", type=float, default=1.0, help="sampling interval, s (default 1)")
    p.add_argument(
        "--duration", type=float, default=0.0, help="stop after this many seconds (default: run until Ctrl-C)"
    )
    p.add_argument("--data-dir", default=None, help=f"default {default_data_dir()}")
    p.add_argument(
        "--keep-state",
        action="store_true",
        help="run on the last demo's data (nodes, history, incidents) instead of an empty data dir",
    )
    p.add_argument(
        "--scenario", default=None, help="TOML file of GPU faults to inject (e.g. examples/gpu-faults.toml)"
    )
    p.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    p.add_argument("--dashboard-port", type=int, default=8501)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class Demo:
    data_dir: Path
    children: list[Child] = field(default_factory=list)
    client_config: Path | None = None

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log_path = self.data_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc.poll() is None:
                # Each child leads its own process group: signal the group, so nothing it
                # started outlives the demo.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        if self.client_config and self.client_config.exists():
            try:
                if tomllib.loads(self.client_config.read_text()).get("demo_pid") == os.getpid():
                    self.client_config.unlink()
            except (OSError, tomllib.TOMLDecodeError):
                pass


def _gpufleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet.cli.main", *args]


def _wait_for(what: str, check: object, deadline_s: float, demo: Demo, child: Child) -> object:
    """Poll check() until it returns a truthy value, the child dies, or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise SystemExit(
                f"gpufleet demo: {child.name} exited with status "
                f"{child.proc.returncode} while {what}; see {child.log_path}"
            )
        result = check()  # type: ignore[operator]
        if result:
            return result
        time.sleep(0.1)  # polling a child process that has no other way to signal readiness
    raise SystemExit(f"gpufleet demo: timed out after {deadline_s:.0f}s {what}; see {child.log_path}")


def _check_args(args: argparse.Namespace) -> None:
    if args.nodes < 1 or args.gpus_per_node < 0 or args.interval <= 0:
        raise SystemExit("gpufleet demo: --nodes must be ≥ 1, --gpus-per-node ≥ 0, --interval > 0")
    if args.gpu_model != "mixed" and args.gpu_model not in GPU_PROFILES:
        raise SystemExit(
            f"gpufleet demo: unknown --gpu-model {args.gpu_model!r}; choose "
            f"{', '.join(GPU_PROFILES)} or mixed"
        )
    if args.scenario:
        from gpufleet.collector.simnvml.scenario import ScenarioError, load

        try:
            load(args.scenario)  # refuse a bad file before anything starts
        except ScenarioError as exc:
            raise SystemExit(f"gpufleet demo: {exc}") from None


def _credentials(data_dir: Path) -> tuple[dict[str, str], str]:
    """The demo's people tokens and collector secret, made once and kept in its data dir."""
    secrets_path = data_dir / "secrets.toml"
    tokens_path = data_dir / "demo-tokens.json"
    if not (secrets_path.exists() and tokens_path.exists()):
        issued = new_secrets_file(secrets_path, [("demo-operator", "operator"), ("demo-viewer", "viewer")])
        write_private(tokens_path, json.dumps(issued))
    tokens = json.loads(tokens_path.read_text())
    return tokens, tomllib.loads(secrets_path.read_text())["collector_secret"]


def demo_pools(nodes: list[str], plan: ServingPlan | None) -> dict[str, list[str]]:
    """Which demo nodes serve which model (the demo is its own control plane: it starts them)."""
    if plan is not None:
        return {plan.model: list(plan.every_node)}
    pools: dict[str, list[str]] = {}
    for i, node in enumerate(nodes):
        engine = DEMO_ENGINES[i % len(DEMO_ENGINES)]
        if engine:
            pools.setdefault(ENGINE_MODELS[engine], []).append(node)
    return pools


def write_demo_policy(data_dir: Path, pools: dict[str, list[str]]) -> Path:
    """The demo's repair policy: the shipped one, and the serving pools the demo runs declared
    (repair/placement.py: a replica counts in a pool only where the control plane places it)."""
    path = data_dir / "policy.toml"
    lines = [
        "# written by `gpufleet demo`: which demo nodes serve which model (docs/repair.md), and the",
        "# waste findings' windows in minutes, not the shipped hour (docs/workloads.md): the demo's",
        "# research notebooks hold GPUs idle, and one that ends leaves a process behind",
        "[rules.idle_allocation]",
        "window_s = 120.0",
        "[rules.orphaned_process]",
        "window_s = 60.0",
        "",
    ]
    for model, nodes in sorted(pools.items()):
        table = f"[serving.pools.{json.dumps(model)}]"
        lines += [table, 'cluster = "demo"', f"nodes = {json.dumps(nodes)}", ""]
    path.write_text("\n".join(lines) + "\n")
    return path


def _start_aggregator(
    demo: Demo, data_dir: Path, control: Control, policy: Path
) -> tuple[Child, dict[str, str]]:
    ready = data_dir / "aggregator.ready.json"
    ready.unlink(missing_ok=True)
    print(f"starting the aggregator (data in {data_dir}) ...", flush=True)
    aggregator = demo.spawn(
        "aggregator",
        _gpufleet(
            "aggregator",
            "run",
            "--data-dir",
            str(data_dir),
            "--ingest-listen",
            "127.0.0.1:0",
            "--fleet-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
            # Repair cordons, drains and returns nodes through the demo's scheduler (the hook
            # backend on its control API: collector/simnvml/scheduler.py), so a drained node's
            # jobs stop and start again on its return; a small fleet would otherwise be capped
            # at one node out of service.
            *control.backend_options(),
            "--repair-max-out-of-service-fraction",
            "0.5",
            "--repair-policy-file",
            str(policy),
            # Whose jobs run where: the demo's scheduler records each simulated job (a user's, in
            # an account) in a folder the aggregator reads as a site's scheduler
            # (collector/simnvml/gpu_users.py, aggregator/workloads/schedulers.py).
            "--workload-scheduler",
            "site",
            "--workload-site-jobs-dir",
            str(demo_jobs_dir(data_dir)),
            "--workload-poll-s",
            "2",
            "--gpu-hour-prices",
            DEMO_GPU_HOUR_PRICES,
        ),
    )
    bound: dict[str, str] = _wait_for(  # type: ignore[assignment]  # the ready file's JSON
        "starting the aggregator",
        lambda: ready.exists() and json.loads(ready.read_text()),
        60,
        demo,
        aggregator,
    )
    return aggregator, bound


# What the demo prices a GPU-hour at, by model (list prices of the order clouds charge; the
# Workloads page and `gpufleet usage` show allocated and effective cost with them).
DEMO_GPU_HOUR_PRICES = "H100=2.50, H200=3.50, A100=1.20, B200=5.00"


def demo_jobs_dir(data_dir: Path) -> Path:
    """The demo scheduler's job records (made before anything starts: the aggregator reads it)."""
    jobs = data_dir / "scheduler" / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    return jobs


def demo_nodes(count: int) -> list[str]:
    return [f"demo-node-{i + 1:02d}" for i in range(count)]


def _start_collectors(
    demo: Demo,
    args: argparse.Namespace,
    ingest: str,
    secret: str,
    data_dir: Path,
    serving: DemoServing | None,
    scheduled: dict[str, ScheduledState],
) -> list[str]:
    nodes = demo_nodes(args.nodes)
    print(f"starting {len(nodes)} collectors with {args.gpus_per_node} simulated GPUs each ...", flush=True)
    for i, node in enumerate(nodes):
        model = DEMO_MODELS[i % len(DEMO_MODELS)] if args.gpu_model == "mixed" else args.gpu_model
        served = serving.engines_option(node, args.gpus_per_node) if serving else []
        sim_engine = DEMO_ENGINES[i % 4] if not served else ""
        demo.spawn(
            node,
            _gpufleet(
                "collector",
                "run",
                "--simulate",
                "--node",
                node,
                "--cluster",
                "demo",
                "--sim-gpus",
                str(args.gpus_per_node),
                "--sim-scheduler-file",
                str(scheduled[node].path),
                "--sim-jobs-dir",
                str(demo_jobs_dir(data_dir)),
                "--sim-model",
                model,
                "--interval-s",
                str(args.interval),
                "--aggregator",
                ingest,
                "--metrics-listen",
                "127.0.0.1:0",
                "--state-dir",
                str(data_dir / "collectors"),
                *(["--sim-engine", sim_engine] if sim_engine else []),
                *served,
                *(["--sim-scenario", str(Path(args.scenario).resolve())] if args.scenario else []),
            ),
            env={"GPUFLEET_COLLECTOR_TOKEN": issue_collector_token(secret, node, days=30)[0]},
        )
    return nodes


def _start_dashboard(demo: Demo, args: argparse.Namespace, fleet: str, token: str) -> str:
    """Starts the dashboard when asked for and installed; the line that says where it is."""
    if args.no_dashboard:
        return "dashboard: off (--no-dashboard)"
    if not (importlib.util.find_spec("streamlit") and importlib.util.find_spec("gpufleet.dashboard.app")):
        return "dashboard: not started (install the dashboard extra: pip install 'gpufleet[dashboard]')"
    demo.spawn(
        "dashboard",
        _gpufleet("dashboard", "--port", str(args.dashboard_port)),
        env={"GPUFLEET_FLEET": fleet, "GPUFLEET_TOKEN": token},
    )
    return f"dashboard: http://127.0.0.1:{args.dashboard_port}"


def _supervise(demo: Demo, stop_requested: threading.Event, duration_s: float) -> int:
    """Until Ctrl-C/SIGTERM (at once) or the duration: 1 as soon as any child has died."""
    deadline = time.monotonic() + duration_s if duration_s else float("inf")
    while not stop_requested.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            break
        dead = [c for c in demo.children if c.proc.poll() is not None]
        for child in dead:
            print(
                f"gpufleet demo: {child.name} exited with status {child.proc.returncode}; "
                f"see {child.log_path}",
                file=sys.stderr,
            )
        if dead:
            return 1
    return 0


def run_demo(args: argparse.Namespace) -> int:
    _check_args(args)
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    try:
        plan = load_plan(args.scenario, demo_nodes(args.nodes)) if args.scenario else None
        start = prepare_data_dir(data_dir, args.keep_state)
    except (ServingScenarioError, DataDirError) as exc:
        print(f"gpufleet demo: {exc}", file=sys.stderr)
        return 2
    print(f"data dir {data_dir}: {start}", flush=True)
    demo = Demo(data_dir)
    tokens, secret = _credentials(data_dir)
    serving: DemoServing | None = None
    control: Control | None = None
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        # The demo's scheduler: one state per node, set by the repair's cordon, drain and
        # uncordon and obeyed by the node's simulated jobs.
        scheduled = {node: ScheduledState(data_dir / "scheduler" / node) for node in demo_nodes(args.nodes)}
        if plan is not None:
            serving = DemoServing(plan, data_dir, scheduled)
        control = serving.control if serving is not None else Control({}, scheduled)
        policy = write_demo_policy(data_dir, demo_pools(demo_nodes(args.nodes), plan))
        aggregator, bound = _start_aggregator(demo, data_dir, control, policy)
        nodes = _start_collectors(demo, args, bound["ingest"], secret, data_dir, serving, scheduled)
        client_cfg = client_config_path()
        write_private(
            client_cfg,
            f"# written by `gpufleet demo` (pid {os.getpid()}); removed when it stops\n"
            f'fleet = "{bound["fleet"]}"\ntoken = "{tokens["demo-operator"]}"\n'
            f"demo_pid = {os.getpid()}\n",
        )
        demo.client_config = client_cfg
        client = FleetClient(ClientSettings(bound["fleet"], tokens["demo-viewer"], "", "demo"))

        def all_reporting() -> bool:
            resp = client.list_nodes()
            live = [
                n for n in resp.nodes if n.node in nodes and n.liveness == vocabulary_pb2.LIVENESS_REPORTING
            ]
            return len(live) == len(nodes)

        print("waiting for every node to report ...", flush=True)
        _wait_for(f"waiting for {len(nodes)} nodes to report", all_reporting, 60, demo, aggregator)
        dashboard_line = _start_dashboard(demo, args, bound["fleet"], tokens["demo-operator"])
        serving_lines = (
            f"\n  gpufleet pools                 # the serving pool: replicas, KV-cache, headroom\n"
            f"  serving figures:      {data_dir / 'serving.json'} (requests sent, finished, aborted)"
            if serving
            else ""
        )
        print(
            f"""gpufleet demo is running: {len(nodes)} nodes x {args.gpus_per_node} simulated GPUs, \
{args.interval:g}s interval
  ingest (collectors):  {bound["ingest"]}
  Fleet API:            {bound["fleet"]}
  aggregator metrics:   http://{bound["metrics"]}/metrics
  {dashboard_line}
  data, secrets, logs:  {data_dir}
  client config:        {client_cfg} (the CLI finds the demo through it)

Try, in another shell:
  gpufleet nodes
  gpufleet node {nodes[0]}
  gpufleet history util_gpu_pct --node {nodes[0]} --since 10m --step 1m{serving_lines}
Ctrl-C stops the demo.""",
            flush=True,
        )
        return _supervise(demo, stop_requested, args.duration)
    finally:
        print("stopping the demo ...", flush=True)
        demo.stop()
        if serving is not None:
            serving.stop()
            print(serving.summary(), flush=True)
        elif control is not None:
            control.close()
