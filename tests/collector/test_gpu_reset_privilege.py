"""The collector's GPU reset without the privilege it needs: the reset fails with a message
naming what is missing and how to grant it (the opt-in drop-in / component), so the repair
ladder moves on with a reason a person can act on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gpufleet.collector.commands import reset_privilege_problem

RESET_ONCE = """
import asyncio, json
from gpufleet.collector.commands import run_command
from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2
gpu = telemetry_pb2.GpuIdentity(index=0, uuid="GPU-0")
command = ingest_pb2.Command(id="k#0", reset_gpu=ingest_pb2.ResetGpu(gpu_index=0, gpu_uuid="GPU-0"))
# What nvidia-smi --gpu-reset does without root's CAP_SYS_ADMIN: it refuses, exit 4.
reset = "sh -c 'echo Insufficient Permissions; exit 4'"
result = asyncio.run(run_command(command, [gpu], reset, 10.0))
print(json.dumps({"outcome": vocabulary_pb2.CommandOutcome.Name(result.outcome), "detail": result.detail}))
"""


def test_the_reset_names_the_missing_capability_when_run_without_it() -> None:
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.fail("this test drops CAP_SYS_ADMIN with setpriv, as root (util-linux; CI runs as root)")
    # A real process without CAP_SYS_ADMIN (dropped from its bounding set), as under the unit.
    out = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-all", sys.executable, "-c", RESET_ONCE],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["outcome"] == "COMMAND_OUTCOME_FAILED"
    assert "needs root with CAP_SYS_ADMIN" in result["detail"] and "lacks CAP_SYS_ADMIN" in result["detail"]
    assert "gpufleet-collector.service.d/gpu-reset.conf" in result["detail"]
    assert "components/gpu-reset" in result["detail"] and "exit status 4" in result["detail"]
    # With the privilege (this root test process), a failing reset is just its own error.
    full = subprocess.run([sys.executable, "-c", RESET_ONCE], capture_output=True, text=True, timeout=60)
    assert "CAP_SYS_ADMIN" not in json.loads(full.stdout)["detail"]


def test_the_privilege_check_reads_uid_and_effective_capabilities() -> None:
    no_caps = "Name:\tgpufleet\nCapEff:\t0000000000000000\n"
    assert "lacks root and CAP_SYS_ADMIN (uid 998" in reset_privilege_problem(no_caps, uid=998)
    syslog_only = "CapEff:\t0000000400000000\n"  # CAP_SYSLOG (34): the shipped unit
    assert "lacks CAP_SYS_ADMIN" in reset_privilege_problem(syslog_only, uid=0)
    with_admin = "CapEff:\t0000000400200000\n"  # CAP_SYSLOG and CAP_SYS_ADMIN: the drop-in
    assert reset_privilege_problem(with_admin, uid=0) == ""
