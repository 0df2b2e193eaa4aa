"""Commands the aggregator sends down the ingest stream, carried out on this node."""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Callable

from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2

log = logging.getLogger("gpufleet.collector.commands")


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
        result.detail = "no reset_command is configured on this collector"
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
    else:
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_FAILED
    result.detail = f"exit status {proc.returncode}: {tail}".strip()
    return result
