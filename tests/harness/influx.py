"""A real influxd (Debian's influxdb package) for the tests, and the aggregator flags for it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from harness.processes import free_port
from harness.waiting import wait_until


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
