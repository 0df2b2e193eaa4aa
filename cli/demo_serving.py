"""The demo's serving pool (`gpufleet demo --scenario examples/serving.toml`): inference
replicas on some demo nodes serving one request stream behind a router, in the demo's own
process (collector/simnvml/serving.py), and the operator's commands the repair controller runs
to cordon, drain and take engines out of rotation (the hook backend): the capacity guard and
the graceful drain on a fleet you can watch (docs/repair.md "Serving-aware repair").

A scenario's `[serving]` table (every key but `nodes` optional):

    [serving]
    model = "meta-llama/Llama-3.1-70B-Instruct"
    nodes = ["demo-node-01", "demo-node-02", "demo-node-03"]  # replicas from the start
    requests_per_s = 12.0     # the router's stream
    request_s = 4.0           # how long each request runs
    kv_per_request = 0.05     # KV-cache one running request holds (20 fill a replica's cache)

    [[serving.join]]          # a replica added later (the autoscaler's answer)
    node = "demo-node-04"
    at_s = 75                 # seconds after the demo starts; or
    after_file = "/tmp/go"    # when this file exists

Figures (each replica's requests accepted, finished, aborted, in flight; the router's) are
written to DATA_DIR/serving.json every second and printed when the demo stops."""

from __future__ import annotations

import json
import math
import os
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.collector.simnvml.scheduler import ScheduledState, ServedLoad
from gpufleet.collector.simnvml.serving import MODEL, Control, Replica, Router

_KEYS = {"model", "nodes", "requests_per_s", "request_s", "kv_per_request", "join"}
_JOIN_KEYS = {"node", "at_s", "after_file"}


class ServingScenarioError(ValueError):
    """A [serving] table that cannot run; the message names the key and what to give."""


@dataclass(frozen=True)
class Join:
    node: str
    at_s: float | None = None
    after_file: str = ""


@dataclass(frozen=True)
class ServingPlan:
    model: str
    nodes: tuple[str, ...]
    requests_per_s: float = 12.0
    request_s: float = 4.0
    kv_per_request: float = 0.05
    joins: tuple[Join, ...] = field(default_factory=tuple)

    @property
    def every_node(self) -> tuple[str, ...]:
        return (*self.nodes, *(j.node for j in self.joins))


def _number(table: dict[str, Any], key: str, default: float, low: float, high: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        raise ServingScenarioError(
            f"{where}: {key} = {value!r}; give a number above {low:g}, at most {high:g}"
        )
    return float(value)


def _join(raw: object, at: str) -> Join:
    if not isinstance(raw, dict) or set(raw) - _JOIN_KEYS or "node" not in raw:
        raise ServingScenarioError(
            f"{at}: give node and at_s (or after_file); known keys: {', '.join(sorted(_JOIN_KEYS))}"
        )
    if ("at_s" in raw) == ("after_file" in raw):
        raise ServingScenarioError(f"{at}: give at_s or after_file, one of them")
    at_s = _number(raw, "at_s", 0, -1e-9, 86400, at) if "at_s" in raw else None
    after_file = raw.get("after_file", "")
    if not isinstance(after_file, str):
        raise ServingScenarioError(f"{at}: after_file = {after_file!r}; give a path")
    return Join(str(raw["node"]), at_s, after_file)


def load_plan(path: str | Path, demo_nodes: list[str]) -> ServingPlan | None:
    """The scenario's [serving] table (None: it has none); ServingScenarioError names what is wrong."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ServingScenarioError(f"cannot read scenario {path}: {exc}") from exc
    table = data.get("serving")
    if table is None:
        return None
    where = f"scenario {path}: [serving]"
    if not isinstance(table, dict):
        raise ServingScenarioError(f"{where} must be a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise ServingScenarioError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}"
        )
    model = table.get("model", MODEL)
    if not isinstance(model, str) or not 0 < len(model) <= 253 or not model.isprintable() or '"' in model:
        raise ServingScenarioError(f"{where}: model = {model!r}; give the served model's name")
    nodes = table.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
        raise ServingScenarioError(
            f'{where}: nodes = {nodes!r}; give the nodes serving from the start, e.g. ["demo-node-01"]'
        )
    joins = [_join(raw, f"{where} join {i + 1}") for i, raw in enumerate(table.get("join", []))]
    plan = ServingPlan(
        model,
        tuple(nodes),
        _number(table, "requests_per_s", 12.0, 0, 1000, where),
        _number(table, "request_s", 4.0, 0, 3600, where),
        _number(table, "kv_per_request", 0.05, 0, 1, where),
        tuple(joins),
    )
    named = plan.every_node
    stray = [n for n in named if n not in demo_nodes]
    if stray:
        raise ServingScenarioError(
            f"{where}: {', '.join(stray)} is not a demo node (this demo has {demo_nodes[0]} .. "
            f"{demo_nodes[-1]}; --nodes gives more)"
        )
    if len(set(named)) != len(named):
        raise ServingScenarioError(f"{where}: a node serves one replica: each node once in nodes and join")
    return plan


class DemoServing:
    """The pool running: replicas (those that join later answer no scrape until then), the
    router, the control API, the joins and the figures file."""

    def __init__(
        self, plan: ServingPlan, data_dir: Path, scheduled: dict[str, ScheduledState] | None = None
    ) -> None:
        self.plan = plan
        self.replicas = {
            node: Replica(node, plan.model, plan.request_s, plan.kv_per_request, started=node in plan.nodes)
            for node in plan.every_node
        }
        self.control = Control(self.replicas, scheduled)
        # Each replica's load, for its node's simulated GPUs (their utilization and HBM follow it).
        self._loads = {node: ServedLoad(data_dir / "scheduler" / node) for node in self.replicas}
        self._loads_written: dict[str, tuple[float, float]] = {}
        self.router = Router(
            list(self.replicas.values()),
            lambda r: not r.left_rotation,
            interval_s=1 / plan.requests_per_s,
            max_requests=None,
            max_s=None,
        )
        self._figures_path = data_dir / "serving.json"
        self.failures = 0  # iterations of the loop that failed (said once per kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-serving", daemon=True)
        self._thread.start()

    def engines_option(self, node: str, gpus: int) -> list[str]:
        """The collector's --engines for a serving node (none for the others)."""
        replica = self.replicas.get(node)
        if replica is None:
            return []
        return ["--engines", f"{replica.url} gpus={','.join(str(i) for i in range(gpus))}"]

    def _run(self) -> None:
        """Joins when due, and the figures file, every 0.2 s until stop(). A failure (a full
        disk under the data dir) is counted and said once per kind, and the loop goes on."""
        started = time.monotonic()
        pending = list(self.plan.joins)
        said: set[str] = set()
        while not self._stop.wait(0.2):
            try:
                for join in list(pending):
                    due = join.at_s is not None and time.monotonic() - started >= join.at_s
                    if due or (join.after_file and os.path.exists(join.after_file)):
                        self.replicas[join.node].start()
                        pending.remove(join)
                        print(f"serving: a replica of {self.plan.model} joined on {join.node}", flush=True)
                self._write_figures()
                self._write_loads()
            except OSError as exc:
                self.failures += 1
                if type(exc).__name__ not in said:
                    said.add(type(exc).__name__)
                    where = self._figures_path
                    print(f"gpufleet demo: serving figures not written to {where}: {exc}", flush=True)

    def _write_loads(self) -> None:
        """Each replica's GPU load where its node reads it (scheduler.py ServedLoad), on change."""
        for node, replica in self.replicas.items():
            load = replica.gpu_load()
            if self._loads_written.get(node) != load:
                self._loads[node].write(*load)
                self._loads_written[node] = load

    def figures(self) -> dict[str, Any]:
        replicas = [r.figures() for r in self.replicas.values()]
        return {
            "model": self.plan.model,
            "time_unix_s": math.floor(time.time()),
            "sent": self.router.sent,
            "unrouted": self.router.unrouted,
            "figures_failures": self.failures,
            "aborted": sum(r["aborted"] for r in replicas),
            "finished": sum(r["finished"] for r in replicas),
            "replicas": replicas,
        }

    def _write_figures(self) -> None:
        tmp = self._figures_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.figures(), indent=2))
        os.replace(tmp, self._figures_path)

    def summary(self) -> str:
        f = self.figures()
        return (
            f"serving: {f['sent']} requests sent to {self.plan.model}, {f['finished']} finished, "
            f"{f['aborted']} aborted, {f['unrouted']} found no replica in rotation"
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.router.stop()
        self._write_figures()
        self.control.close()
        for r in self.replicas.values():
            r.close()
