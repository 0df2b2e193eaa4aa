"""GPU resets through the privileged helper (collector/reset_helper.py; docs/security.md "Deploy
least privilege"): the network-facing collector asks `gpufleet gpu-reset-helper` on a Unix
socket, and the helper takes only a well-formed request for one GPU, at most once per GPU
within its interval, running its own command with nothing but an integer and a checked uuid.
End to end: the aggregator's repair ladder asks for a reset, the collector passes it to the
helper (a real process), the helper runs the reset command and the audit says ok. The
collector, for its part, refuses a command id it has seen and a second reset of one GPU within
reset_min_interval_s."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpufleet.collector.commands import CommandGuard
from gpufleet.protos import ingest_pb2, vocabulary_pb2
from harness.processes import Cluster, gpufleet_argv
from harness.waiting import wait_until


def start_helper(cluster: Cluster, log: Path, min_interval_s: float = 300.0) -> Path:
    sock = cluster.tmp / "gpu-reset.sock"
    command = f"sh -c 'echo \"$0 $1\" >> {log}' {{gpu_index}} {{gpu_uuid}}"
    proc = cluster.spawn(
        "reset-helper",
        gpufleet_argv(
            "gpu-reset-helper",
            "--socket",
            str(sock),
            "--reset-command",
            command,
            "--min-interval-s",
            str(min_interval_s),
        ),
    )
    wait_until(lambda: sock.exists() or not proc.alive(), 20, "the helper's socket")
    assert proc.alive(), proc.log()
    return sock


def ask(sock: Path, line: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(sock))
        s.sendall(line + b"\n")
        return json.loads(s.makefile("rb").readline())


def test_the_helper_takes_only_a_well_formed_request_once_per_gpu(cluster: Cluster) -> None:
    log = cluster.tmp / "resets.log"
    sock = start_helper(cluster, log)
    assert oct(sock.stat().st_mode & 0o777) == "0o660"
    for bad in (
        b"not json",
        b'{"gpu_index": "3; rm -rf /"}',
        b'{"gpu_index": 64}',
        b'{"gpu_index": true}',
        b'{"gpu_index": 3, "gpu_uuid": "GPU-1 --force"}',
        b'["gpu_index", 3]',
    ):
        answer = ask(sock, bad)
        assert answer["ok"] is False and answer["detail"].startswith("refused:"), (bad, answer)
    assert not log.exists(), "a malformed request ran the reset command"
    answer = ask(sock, b'{"gpu_index": 3, "gpu_uuid": "GPU-8f2e-11"}')
    assert answer == {"ok": True, "detail": "exit status 0:"}, answer
    assert log.read_text().split() == ["3", "GPU-8f2e-11"]
    again = ask(sock, b'{"gpu_index": 3, "gpu_uuid": "GPU-8f2e-11"}')
    assert again["ok"] is False and "was reset 0 s ago" in again["detail"], again
    assert ask(sock, b'{"gpu_index": 4, "gpu_uuid": ""}')["ok"] is True
    assert log.read_text().split() == ["3", "GPU-8f2e-11", "4"]


@pytest.mark.slow
def test_a_repair_reset_goes_through_the_helper(cluster: Cluster) -> None:
    log = cluster.tmp / "resets.log"
    sock = start_helper(cluster, log, min_interval_s=0)
    policy = cluster.tmp / "policy.toml"
    policy.write_text("[workflow]\nvalidate_s = 1.0\nreset_timeout_s = 30.0\n")
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--repair-policy-file",
        str(policy),
        "--repair-interval-s",
        "0.2",
        "--repair-max-out-of-service-fraction",
        "1",
    )
    scenario = cluster.tmp / "ecc.toml"
    scenario.write_text('[[fault]]\nat_s = 1.0\ngpu = 5\nkind = "ecc_uncorrected"\n')
    cluster.collector(
        "helped",
        agg.ingest,
        "--interval-s",
        "0.5",
        "--sim-scenario",
        str(scenario),
        "--reset-socket",
        str(sock),
    )
    got = wait_until(lambda: log.exists() and log.read_text().split(), 60, "the helper to run the reset")
    assert got[0] == "5" and got[1].startswith("GPU-"), got
    out_argv = gpufleet_argv(
        "audit",
        "--json",
        "--node",
        "helped",
        "--fleet",
        agg.fleet,
        "--token",
        cluster.secrets.tokens["viewer"],
    )

    def reset_ok() -> bool:
        out = subprocess.run(out_argv, capture_output=True, text=True, timeout=60)
        entries = json.loads(out.stdout)["entries"]
        return any(e["action"] == "reset_gpu" and e["outcome"] == "ok" for e in entries)

    wait_until(reset_ok, 30, "the audit to say the reset went through")


def test_the_collector_refuses_a_repeated_command_and_a_second_reset_too_soon() -> None:
    guard = CommandGuard(reset_min_interval_s=300)

    def reset(command_id: str, gpu: int) -> ingest_pb2.Command:
        return ingest_pb2.Command(id=command_id, reset_gpu=ingest_pb2.ResetGpu(gpu_index=gpu))

    assert guard.refuse(reset("k#3~a", 3)) is None
    repeated = guard.refuse(reset("k#3~a", 3))
    assert repeated is not None and repeated.outcome == vocabulary_pb2.COMMAND_OUTCOME_REFUSED
    assert "was received before" in repeated.detail
    too_soon = guard.refuse(reset("k#3~b", 3))
    assert too_soon is not None and "a second reset within 300 s is refused" in too_soon.detail
    assert guard.refuse(reset("k#4~c", 4)) is None, "another GPU is not held back"
