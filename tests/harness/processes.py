"""Real gpufleet processes for one test: an aggregator and collectors started as `gpufleet`
starts them, their logs kept, and every one stopped afterwards."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpufleet.aggregator.auth.tokens import issue_collector_token, new_secrets_file
from gpufleet.protos import fleet_pb2_grpc
from harness.fleet_api import bearer
from harness.waiting import wait_until


def _port_slice() -> range:
    """This test process's own ports: below the kernel's ephemeral range (from which a bind to
    port 0 and every outgoing connection take theirs), one slice of it per pytest-xdist worker."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = 10_000 if low > 12_000 else 1_024
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    size = (low - first) // workers
    return range(first + worker * size, first + (worker + 1) * size)


_next_port = [0]


def free_port() -> int:
    """A port for a server a test starts, stops and starts again on the same address. A port
    from a bind to 0 is the kernel's to hand out again the moment it is closed: in four workers
    an aggregator restarted on its port once found it taken by another process's connection
    ('Address already in use'). Ports here come from this worker's slice below the ephemeral
    range, in turn, each checked free when it is given."""
    ports = _port_slice()
    if not _next_port[0]:
        _next_port[0] = ports.start + os.getpid() % len(ports)
    for _ in range(len(ports)):
        port = ports.start + (_next_port[0] - ports.start) % len(ports)
        _next_port[0] = port + 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def home_env(home: Path) -> dict[str, str]:
    """This environment with HOME (and the XDG folders) in `home` and no Fleet API settings of
    the user's: what a demo and the CLI beside it see on a fresh account."""
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
    }
    for key in ("GPUFLEET_FLEET", "GPUFLEET_TOKEN", "GPUFLEET_CLIENT_CONFIG"):
        env.pop(key, None)
    return env


def gpufleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet.cli.main", *args]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        return stop_process(self.popen, sig, timeout_s)


def stop_process(popen: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
    """Signal a process (if still running), wait for it, and SIGKILL it past timeout_s."""
    if popen.poll() is None:
        popen.send_signal(sig)
    try:
        return popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        return popen.wait()


@dataclass
class Secrets:
    path: Path
    secret: str
    tokens: dict[str, str]

    def collector_token(self, node: str, days: float = 30) -> str:
        """A fresh credential for node, as `gpufleet auth collector-token` issues it."""
        return issue_collector_token(self.secret, node, days)[0]

    def metadata(self, role: str = "viewer") -> tuple[tuple[str, str], ...]:
        """Fleet API call metadata carrying the token of `role` (ops or viewer)."""
        return bearer(self.tokens[role])


@dataclass
class AggregatorHandle:
    proc: Proc
    ingest: str
    fleet: str
    metrics: str
    data_dir: Path

    def fleet_stub(self) -> fleet_pb2_grpc.FleetStub:
        return fleet_pb2_grpc.FleetStub(grpc.insecure_channel(self.fleet))

    def metric_value(self, name: str, **labels: str) -> float:
        """Read one sample from the aggregator's own /metrics endpoint over real HTTP."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5).read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total


# Every process a Cluster started in this pytest process: what a fixture whose set-up failed
# before its teardown was armed would leave running is stopped at the session's end
# (tests/conftest.py pytest_sessionfinish), and named.
STARTED: list[Proc] = []


def stop_left_running() -> list[str]:
    """Stop every started process still running; their names."""
    left = [p for p in STARTED if p.alive()]
    for proc in left:
        proc.stop(signal.SIGTERM, timeout_s=10)
    return [p.name for p in left]


class Cluster:
    """Starts real gpufleet processes for one test and stops them afterwards."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.secrets_path = tmp / "secrets.toml"
        tokens = new_secrets_file(self.secrets_path, [("ops", "operator"), ("viewer", "viewer")])
        secret = tomllib.loads(self.secrets_path.read_text())["collector_secret"]
        self.secrets = Secrets(self.secrets_path, secret, tokens)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        STARTED.append(proc)
        return proc

    def aggregator(
        self,
        name: str = "aggregator",
        ingest_port: int = 0,
        fleet_port: int = 0,
        data_dir: Path | None = None,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> AggregatorHandle:
        data_dir = data_dir or self.tmp / "data"
        if "--ingest-workers" not in extra:
            # Ingest in the aggregator's own process unless the test says otherwise: two worker
            # processes (the default on two cores) cost 0.6 s of CPU each start, ~165 starts a
            # run, on a suite bound by two cores. The worker path is what tests/ingest
            # (test_ingest_workers, test_columns, the fuzz) and the kill and outage tests
            # (tests/ingest/test_end_to_end.py, tests/store/test_store_outage.py) ask for.
            extra = (*extra, "--ingest-workers", "0")
        if "--metrics-snapshot-s" not in extra:
            # Tests read counters as they change, polling: /metrics computed for each scrape, and
            # unpaced, unless the test is about that (tests/security/test_serving_pools_trust.py).
            extra = (*extra, "--metrics-snapshot-s", "0", "--metrics-max-scrapes-per-s", "0")
        ready = self.tmp / f"{name}.ready.json"
        ready.unlink(missing_ok=True)
        proc = self.spawn(
            name,
            gpufleet_argv(
                "aggregator",
                "run",
                "--data-dir",
                str(data_dir),
                "--secrets-file",
                str(self.secrets_path),
                "--ingest-listen",
                f"127.0.0.1:{ingest_port}",
                "--fleet-listen",
                f"127.0.0.1:{fleet_port}",
                "--metrics-listen",
                "127.0.0.1:0",
                "--ready-file",
                str(ready),
                *extra,
            ),
            env,
        )

        def is_ready() -> dict[str, Any] | None:
            assert proc.alive(), f"aggregator exited: {proc.log()}"
            return json.loads(ready.read_text()) if ready.exists() else None

        try:
            bound = wait_until(
                is_ready,
                30,
                "the aggregator to serve",
                context=lambda: f"the aggregator's log (its end):\n{proc.log()[-4000:]}",
            )
        except AssertionError:
            proc.stop()  # not left running when its caller's teardown never comes (a fixture's set-up)
            raise
        return AggregatorHandle(proc, bound["ingest"], bound["fleet"], bound["metrics"], data_dir)

    def collector(
        self, node: str, ingest: str, *extra: str, token: str | None = None, env: dict[str, str] | None = None
    ) -> Proc:
        return self.spawn(
            node,
            gpufleet_argv(
                "collector",
                "run",
                "--simulate",
                "--node",
                node,
                "--cluster",
                "test",
                "--aggregator",
                ingest,
                "--metrics-listen",
                "127.0.0.1:0",
                *extra,
            ),
            env={
                "GPUFLEET_COLLECTOR_TOKEN": self.secrets.collector_token(node) if token is None else token,
                **(env or {}),
            },
        )

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(signal.SIGTERM, timeout_s=15)
