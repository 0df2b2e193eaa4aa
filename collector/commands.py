"""Commands the aggregator sends down the ingest stream, carried out on this node."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections.abc import Callable

from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2

log = logging.getLogger("gpufleet.collector.commands")

CAP_SYS_ADMIN = 21  # linux/capability.h
PRIVILEGE_HINT = (
    "install the opt-in drop-in deploy/systemd/gpufleet-collector.service.d/gpu-reset.conf "
    "(bare metal) or the Kubernetes component deploy/kubernetes/components/gpu-reset"
)


def reset_privilege_problem(status_text: str | None = None, uid: int | None = None) -> str:
    """Why this process cannot reset a GPU (an NVML reset needs root with CAP_SYS_ADMIN), or ""."""
    if status_text is None:
        try:
            with open("/proc/self/status") as f:
                status_text = f.read()
        except OSError:
            return ""
    uid = os.getuid() if uid is None else uid
    effective = next(
        (line.split()[1] for line in status_text.splitlines() if line.startswith("CapEff:")), "0"
    )
    has_sys_admin = bool(int(effective, 16) >> CAP_SYS_ADMIN & 1)
    if uid == 0 and has_sys_admin:
        return ""
    missing = [what for what, ok in (("root", uid == 0), ("CAP_SYS_ADMIN", has_sys_admin)) if not ok]
    return (
        f"a GPU reset needs root with CAP_SYS_ADMIN and this collector lacks {' and '.join(missing)} "
        f"(uid {uid}, effective capabilities {effective}): {PRIVILEGE_HINT}"
    )


async def run_command(
    command: ingest_pb2.Command,
    inventory: list[telemetry_pb2.GpuIdentity],
    reset_command: str,
    timeout_s: float,
    simulated_reset: Callable[[int], str] | None = None,
) -> ingest_pb2.CommandResult:
    """Carry out one command. With simulated GPUs and no reset_command, a reset is done on the
    simulated GPU itself (simulated_reset), so the demo's repairs run end to end."""
    result = ingest_pb2.CommandResult(id=command.id)
    action = command.WhichOneof("action")
    if action != "reset_gpu":
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_REFUSED
        result.detail = f"this collector does not know command {action or '(none)'}; upgrade it"
        return result
    reset = command.reset_gpu
    gpu = next((g for g in inventory if g.index == reset.gpu_index), None)
    if gpu is None or (reset.gpu_uuid and gpu.uuid != reset.gpu_uuid):
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_REFUSED
        result.detail = (
            f"GPU {reset.gpu_index} with uuid {reset.gpu_uuid or '(any)'} is not on this node; "
            "not resetting a GPU other than the one asked for"
        )
        return result
    if not reset_command and simulated_reset is not None:
        try:
            result.detail = simulated_reset(gpu.index)
            result.outcome = vocabulary_pb2.COMMAND_OUTCOME_SUCCEEDED
        except RuntimeError as exc:
            result.outcome = vocabulary_pb2.COMMAND_OUTCOME_FAILED
            result.detail = str(exc)
        log.warning("reset GPU %d (simulated): %s", gpu.index, result.detail, extra={"gpu": gpu.index})
        return result
    if not reset_command:
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_REFUSED
        result.detail = f"no reset_command is configured on this collector: {PRIVILEGE_HINT}"
        return result
    argv = [a.format(gpu_index=gpu.index, gpu_uuid=gpu.uuid) for a in shlex.split(reset_command)]
    log.warning(
        "resetting GPU %d (%s): %s",
        gpu.index,
        gpu.uuid,
        shlex.join(argv),
        extra={"gpu": gpu.index, "uuid": gpu.uuid, "command_id": command.id},
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as exc:
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_FAILED
        result.detail = f"cannot start {argv[0]!r}: {exc}"
        return result
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_FAILED
        result.detail = f"reset command did not finish within {timeout_s:g} s and was killed"
        return result
    tail = output.decode(errors="replace")[-2000:]
    if proc.returncode == 0:
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_SUCCEEDED
        result.detail = f"exit status 0: {tail}".strip()
        return result
    result.outcome = vocabulary_pb2.COMMAND_OUTCOME_FAILED
    # The likeliest cause first: the unit without the gpu-reset drop-in cannot reset a GPU.
    problem = reset_privilege_problem()
    result.detail = (f"{problem}; " if problem else "") + f"exit status {proc.returncode}: {tail}".strip()
    return result
