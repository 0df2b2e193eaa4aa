"""Shared fixtures: real aggregator and collector processes on loopback, and helpers to
wait on conditions with deadlines (never on fixed sleeps)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from gpufleet.aggregator.auth.tokens import issue_collector_token, new_secrets_file
from gpufleet.protos import fleet_pb2_grpc

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.05) -> T:
    """Return check()'s first truthy result; fail the test if none comes within timeout_s."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # the condition may not be checkable yet
            last_error = exc
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last error: {last_error}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        if self.alive():
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


@dataclass
class Secrets:
    path: Path
    secret: str
    tokens: dict[str, str]

    def collector_token(self, node: str, days: float = 30) -> str:
        """A fresh credential for node, as `gpufleet auth collector-token` issues it."""
        return issue_collector_token(self.secret, node, days)[0]


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
        return proc

    def aggregator(
        self,
        name: str = "aggregator",
        ingest_port: int = 0,
        fleet_port: int = 0,
        data_dir: Path | None = None,
        *extra: str,
    ) -> AggregatorHandle:
        data_dir = data_dir or self.tmp / "data"
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
        )

        def is_ready() -> dict[str, Any] | None:
            assert proc.alive(), f"aggregator exited: {proc.log()}"
            return json.loads(ready.read_text()) if ready.exists() else None

        bound = wait_until(is_ready, 30, "the aggregator to serve")
        return AggregatorHandle(proc, bound["ingest"], bound["fleet"], bound["metrics"], data_dir)

    def collector(self, node: str, ingest: str, *extra: str, token: str | None = None) -> Proc:
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
                "GPUFLEET_COLLECTOR_TOKEN": token if token is not None else self.secrets.collector_token(node)
            },
        )

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(signal.SIGTERM, timeout_s=15)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def fleet_metadata() -> Callable[[str], tuple[tuple[str, str], ...]]:
    return lambda token: (("authorization", f"Bearer {token}"),)


class RawStream:
    """A hand-driven collector stream, able to send anything (including raw bytes)."""

    def __init__(
        self,
        address: str,
        token: str | None,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        import queue
        import threading

        from gpufleet.protos import ingest_pb2

        self._outgoing: queue.Queue[object] = queue.Queue()
        self._incoming: queue.Queue[object] = queue.Queue()
        self._channel = (
            grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
        )
        method = self._channel.stream_stream(
            "/gpufleet.v1.Ingest/Stream",
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=ingest_pb2.AggregatorMessage.FromString,
        )
        auth = (("authorization", f"Bearer {token}"),) if token is not None else ()
        self._responses = method(iter(self._outgoing.get, None), metadata=auth + metadata)

        def pump() -> None:
            try:
                for msg in self._responses:
                    self._incoming.put(msg)
                self._incoming.put(EOFError("stream closed by the aggregator"))
            except grpc.RpcError as exc:
                self._incoming.put(exc)

        threading.Thread(target=pump, daemon=True).start()

    def send(self, msg: object) -> None:
        self._outgoing.put(msg)

    def recv(self, timeout_s: float = 10) -> Any:
        """The next message; raises the stream's grpc.RpcError if it ended with one."""
        item = self._incoming.get(timeout=timeout_s)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self._outgoing.put(None)
        self._channel.close()


def hello(node: str, gpus: int = 8, boot_id: str = "boot-1", protocol_version: int = 1) -> Any:
    from gpufleet.protos import ingest_pb2, telemetry_pb2

    return ingest_pb2.CollectorMessage(
        hello=ingest_pb2.Hello(
            protocol_version=protocol_version,
            node=node,
            cluster="test",
            boot_id=boot_id,
            collector_version="test",
            interval_s=1.0,
            gpus=[
                telemetry_pb2.GpuIdentity(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA H100 80GB HBM3")
                for i in range(gpus)
            ],
        )
    )


def report(node: str, seq: int, boot_id: str = "boot-1", gpus: int = 8, **gpu0: Any) -> Any:
    """A valid report of `gpus` GPUs; keyword arguments override fields of GPU 0."""
    from gpufleet.protos import ingest_pb2, telemetry_pb2

    r = telemetry_pb2.NodeReport(
        node=node, cluster="test", boot_id=boot_id, seq=seq, time_unix_ns=time.time_ns()
    )
    for i in range(gpus):
        r.gpus.add(
            index=i,
            uuid=f"GPU-{node}-{i}",
            model="NVIDIA H100 80GB HBM3",
            util_gpu_pct=50.0,
            hbm_used_bytes=10 << 30,
            hbm_total_bytes=80 << 30,
            temp_gpu_c=55.0,
            power_w=400.0,
        )
    for name, value in gpu0.items():
        setattr(r.gpus[0], name, value)
    return ingest_pb2.CollectorMessage(report=r)


class InfluxServer:
    """A real influxd (Debian's influxdb package) on free loopback ports with its own data
    directory; it can be killed and started again on the same ports and data."""

    def __init__(self, home: Path) -> None:
        import shutil

        exe = shutil.which("influxd")
        if exe is None:
            pytest.fail("influxd is not installed: scripts/install-test-deps.sh installs Debian's influxdb")
        self.exe = exe
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        http_port, rpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{http_port}"
        self.config = home / "influxdb.conf"
        self.config.write_text(f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{home}/meta"
[data]
  dir = "{home}/data"
  wal-dir = "{home}/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
""")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import urllib.request

        with open(self.home / "influxd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.exe, "-config", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )

        def ping() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (
                self.home / "influxd.log"
            ).read_text()[-2000:]
            return urllib.request.urlopen(f"{self.url}/ping", timeout=2).status == 204

        wait_until(ping, 60, "influxd to answer /ping")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real influxd for the session."""
    server = InfluxServer(tmp_path_factory.mktemp("influxd"))
    server.start()
    try:
        yield server.url
    finally:
        server.kill()


SLURM_NODES = [f"gpu-node-{i:02d}" for i in range(1, 21)]


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real slurmctld with twenty slurmd nodes (gpu-node-01..20) for the session."""
    from slurm_harness import SlurmCluster

    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), SLURM_NODES)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: Any) -> Any:
    """The session's Slurm with every node resumed: each test starts from an idle cluster."""
    slurm_cluster.cancel_all()
    slurm_cluster.resume_all()
    return slurm_cluster


class InProcessAggregator:
    """A real Aggregator (real gRPC servers on loopback, real store) run on its own event loop in
    a thread of the test process, so a test can add a faulty plug-in of its own (a listener that
    raises) before it starts. Everything else is what `gpufleet aggregator run` runs."""

    def __init__(self, tmp: Path, prepare: Callable[[Any], None] | None = None, **settings: Any) -> None:
        import asyncio
        import threading

        from gpufleet.aggregator.config import AggregatorConfig
        from gpufleet.aggregator.server import Aggregator

        self.secrets_path = tmp / "secrets.toml"
        tokens = new_secrets_file(self.secrets_path, [("ops", "operator"), ("viewer", "viewer")])
        secret = tomllib.loads(self.secrets_path.read_text())["collector_secret"]
        self.secrets = Secrets(self.secrets_path, secret, tokens)
        config = AggregatorConfig(
            data_dir=str(tmp / "data"),
            secrets_file=str(self.secrets_path),
            ingest_listen="127.0.0.1:0",
            fleet_listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            **settings,
        )
        self.loop = asyncio.new_event_loop()
        started: dict[str, Any] = {}
        ready = threading.Event()

        async def main() -> None:
            try:
                agg = Aggregator(config)
                if prepare is not None:
                    prepare(agg)
                started["bound"] = await agg.start()
                started["aggregator"] = agg
                stop = started["stop"] = asyncio.Event()
                agg.run_background(stop)
            except BaseException as exc:
                started["error"] = exc
                raise
            finally:
                ready.set()
            await stop.wait()
            await agg.wait_loops()
            await agg.stop()

        self._thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self._thread.start()
        if not ready.wait(30) or "error" in started:
            raise AssertionError(f"the in-process aggregator did not start: {started.get('error')}")
        self.aggregator = started["aggregator"]
        self._stop = started["stop"]
        bound = started["bound"]
        self.ingest, self.fleet, self.metrics = bound.ingest, bound.fleet, bound.metrics
        self.data_dir = tmp / "data"

    def metric_value(self, name: str, **labels: str) -> float:
        return AggregatorHandle.metric_value(self, name, **labels)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


class HealthyNode:
    """A node that keeps streaming alongside a test's bad input: one report every interval_s on
    its own stream, each ack's latency recorded. `worst_ack_s` is what the test asserts on."""

    def __init__(self, address: str, token: str, node: str = "healthy-node", interval_s: float = 0.2) -> None:
        import threading

        self.node = node
        self.latencies_s: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._stream = RawStream(address, token)
        self._stream.send(hello(node))
        assert self._stream.recv().WhichOneof("body") == "welcome"
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            sent = time.monotonic()
            self._stream.send(report(self.node, seq))
            try:
                msg = self._stream.recv(timeout_s=10)
            except Exception as exc:  # recorded for the test to fail on
                self.errors.append(f"seq {seq}: {exc!r}")
                return
            if msg.WhichOneof("body") != "ack" or list(msg.ack.seqs) != [seq]:
                self.errors.append(f"seq {seq}: answered {msg}")
                return
            self.latencies_s.append(time.monotonic() - sent)
            self._stop.wait(self._interval_s)

    @property
    def worst_ack_s(self) -> float:
        return max(self.latencies_s, default=0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self._stream.close()


def read_points(
    db_path: Path, measurement: str, start_ns: int = 0, end_ns: int = 2**63 - 1
) -> list[tuple[dict[str, str], dict[str, Any], int]]:
    """(tags, fields, time) of an embedded store's points, read-only while the aggregator
    writes (SQLite WAL: a reader never blocks the writer)."""
    import sqlite3

    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (f"m_{measurement}",)).fetchone():
            return []
        cur = db.execute(
            f'SELECT s.tags, t.* FROM "m_{measurement}" t JOIN series s ON s.id = t.series_id '
            "WHERE t.ts >= ? AND t.ts < ?",
            (start_ns, end_ns),
        )
        names = [d[0] for d in cur.description]
        return [
            (
                dict(tuple(pair) for pair in json.loads(row[0])),
                {n: v for n, v in zip(names[3:], row[3:], strict=True) if v is not None},
                row[2],
            )
            for row in cur.fetchall()
        ]
    finally:
        db.close()


def influx_flags(url: str, database: str = "") -> tuple[str, ...]:
    """`gpufleet aggregator run` flags for the InfluxDB store (a fresh database per caller)."""
    return (
        "--store",
        "influxdb",
        "--influx-url",
        url,
        "--influx-database",
        database or f"db_{time.time_ns()}",
    )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL for the session (tests/pg_harness.py)."""
    from pg_harness import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def pg_url(postgres_server: Any) -> Iterator[str]:
    """A fresh database of the session's PostgreSQL, for one test (dropped after it)."""
    url = str(postgres_server.new_database())
    yield url
    postgres_server.drop_database(url)
