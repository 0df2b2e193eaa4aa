"""Clients refuse to send a bearer token in clear to another machine, as the daemons do
(docs/security.md "In transit"): the CLI (and so `gpufleet replay`, which dials the Fleet API)
and the dashboard. The address is `fleet.invalid`, a name that never resolves: were the refusal
to go, no packet would leave this machine either."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpufleet.client.fleet import ClientError, ClientSettings, FleetClient
from gpufleet.common.net import dial_host
from harness.dashboard import app
from harness.processes import gpufleet_argv

REMOTE = "fleet.invalid:7711"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    return subprocess.run(
        gpufleet_argv(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "GPUFLEET_CLIENT_CONFIG": "/nonexistent/client.toml", **env},
    )


@pytest.mark.parametrize("command", [["nodes"], ["status"], ["replay", "--since", "1h"]])
def test_the_cli_refuses_to_send_a_token_in_clear_off_loopback(command: list[str]) -> None:
    out = cli(*command, "--fleet", REMOTE, "--token", "gfv1_secret")
    assert out.returncode == 2, out
    assert "would cross the network in clear" in out.stderr and "GPUFLEET_TLS_CA" in out.stderr, out.stderr
    assert "--allow-plaintext" in out.stderr and "gfv1_secret" not in out.stderr


def test_the_refusal_is_lifted_only_when_asked_and_never_for_loopback() -> None:
    # Told the network is trusted: it dials (and finds nothing there: unreachable, exit 3).
    assert cli("nodes", "--fleet", REMOTE, "--token", "t", "--allow-plaintext").returncode == 3
    assert cli("nodes", "--fleet", REMOTE, "--token", "t", GPUFLEET_ALLOW_PLAINTEXT="1").returncode == 3
    # Without a token nothing secret would be sent; on loopback nothing leaves the machine.
    assert cli("nodes", "--fleet", REMOTE).returncode == 3
    assert cli("nodes", "--fleet", "127.0.0.1:1", "--token", "t").returncode == 3
    assert cli("nodes", "--fleet", "[::1]:1", "--token", "t").returncode == 3


@pytest.mark.parametrize(
    "target, host",
    [
        ("127.0.0.1:7711", "127.0.0.1"),
        ("[::1]:7711", "::1"),
        ("localhost:7711", "localhost"),
        ("dns:///fleet.example:7711", "fleet.example"),
        ("ipv4:10.0.0.5:7711", "10.0.0.5"),
        ("fleet.example", "fleet.example"),
        ("unix:/run/gpufleet.sock", "localhost"),
    ],
)
def test_the_host_a_target_dials(target: str, host: str) -> None:
    assert dial_host(target) == host


def test_every_client_of_the_fleet_api_is_refused_the_same_way() -> None:
    with pytest.raises(ClientError, match="in clear"):
        FleetClient(ClientSettings("dns:///fleet.invalid:7711", "t", "", "a test"))
    FleetClient(ClientSettings("dns:///fleet.invalid:7711", "t", "", "a test", allow_plaintext=True))


def test_the_dashboard_says_why_it_will_not_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_ALLOW_PLAINTEXT", raising=False)
    at = app(monkeypatch, REMOTE, "gfo1_secret").run()
    shown = " ".join(e.value for e in at.error)
    assert "would cross the network in clear" in shown and "gfo1_secret" not in shown, shown
