"""A real Alertmanager (Debian's prometheus-alertmanager), started by a test on loopback with a
routing tree the test gives, and its v2 API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.processes import free_port, stop_process
from harness.waiting import wait_until


class Alertmanager:
    def __init__(self, home: Path, config: dict[str, Any]) -> None:
        exe = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if exe is None:
            pytest.fail(
                "alertmanager is not installed: scripts/install-test-deps.sh installs Debian's "
                "prometheus-alertmanager"
            )
        home.mkdir(parents=True, exist_ok=True)
        (home / "alertmanager.yml").write_text(yaml.safe_dump(config))
        port, cluster_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = home / "alertmanager.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    exe,
                    f"--config.file={home / 'alertmanager.yml'}",
                    f"--storage.path={home / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--cluster.listen-address=127.0.0.1:{cluster_port}",
                    "--cluster.advertise-address=127.0.0.1:9094",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: self._ready(), 30, "Alertmanager to serve")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        return urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200

    def api(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v2/{path}",
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read() or b"null")

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds (active, silenced, inhibited) with these labels."""
        return [
            a
            for a in self.api("alerts?silenced=true&inhibited=true&active=true&unprocessed=true")
            if all(a["labels"].get(k) == v for k, v in labels.items())
        ]

    def stop(self) -> None:
        stop_process(self.proc)
