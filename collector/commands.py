"""Commands the aggregator sends down the ingest stream, carried out on this node.

What the aggregator asks is checked here too (docs/security.md "Commands bound to their
node"): a command id is carried out once (a repeated id is refused), a GPU is not reset twice
within reset_min_interval_s, and a reset names a GPU of this node by index and uuid. With
reset_socket the reset itself is done by the privileged helper (collector/reset_helper.py), so
the collector that talks to the network holds no CAP_SYS_ADMIN."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import time
from collections import OrderedDict
from collections.abc import Callable

from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2

log = logging.getLogger("gpufleet.collector.commands")

CAP_SYS_ADMIN = 21  # linux/capability.h
PRIVILEGE_HINT = (
    "run the privileged reset helper and point reset_socket at it: deploy/systemd/"
    "gpufleet-gpu-reset.service with the drop-in gpufleet-collector.service.d/gpu-reset.conf "
    "(bare metal), or the Kubernetes component deploy/kubernetes/components/gpu-reset"
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


COMMANDS_REMEMBERED = 1024


def _refused(command: ingest_pb2.Command, detail: str) -> ingest_pb2.CommandResult:
    return ingest_pb2.CommandResult(
        id=command.id, outcome=vocabulary_pb2.COMMAND_OUTCOME_REFUSED, detail=detail
    )


class CommandGuard:
    """Refuses a command id seen before (the last COMMANDS_REMEMBERED ids) and a second reset of
    one GPU within min_interval_s of the first, whoever asks."""

    def __init__(self, reset_min_interval_s: float) -> None:
        self._min_interval_s = reset_min_interval_s
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._last_reset: dict[int, float] = {}  # GPU index -> monotonic time its reset was taken

    def refuse(self, command: ingest_pb2.Command) -> ingest_pb2.CommandResult | None:
        """The refusal to send back, or None: carry the command out (it is recorded as taken)."""
        if command.id in self._seen:
            log.warning("command %s received again: refused", command.id[:80])
            return _refused(command, f"command {command.id[:80]!r} was received before; a command runs once")
        self._seen[command.id] = None
        while len(self._seen) > COMMANDS_REMEMBERED:
            self._seen.popitem(last=False)
        if command.WhichOneof("action") == "reset_gpu":
            gpu = command.reset_gpu.gpu_index
            now = time.monotonic()
            last = self._last_reset.get(gpu)
            if last is not None and now - last < self._min_interval_s:
                log.warning(
                    "a second reset of GPU %d within %.0f s refused", gpu, now - last, extra={"gpu": gpu}
                )
                return _refused(
                    command,
                    f"GPU {gpu} was reset {now - last:.0f} s ago; a second reset within "
                    f"{self._min_interval_s:g} s is refused (reset_min_interval_s)",
                )
            self._last_reset[gpu] = now
        return None


async def run_command(
    command: ingest_pb2.Command,
    inventory: list[telemetry_pb2.GpuIdentity],
    reset_command: str,
    timeout_s: float,
    simulated_reset: Callable[[int], str] | None = None,
    reset_socket: str = "",
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
    if reset_socket:
        return await _reset_by_helper(result, reset_socket, gpu, command.id, timeout_s)
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


async def _reset_by_helper(
    result: ingest_pb2.CommandResult,
    socket_path: str,
    gpu: telemetry_pb2.GpuIdentity,
    command_id: str,
    timeout_s: float,
) -> ingest_pb2.CommandResult:
    """Ask the privileged reset helper on reset_socket to reset one GPU, and say what it did."""
    log.warning(
        "asking the reset helper at %s to reset GPU %d (%s)",
        socket_path,
        gpu.index,
        gpu.uuid,
        extra={"gpu": gpu.index, "uuid": gpu.uuid, "command_id": command_id},
    )
    request = {"gpu_index": gpu.index, "gpu_uuid": gpu.uuid, "command_id": command_id}
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path), 10)
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout_s + 10)
        finally:
            writer.close()
        answer = json.loads(line)
        ok, detail = bool(answer["ok"]), str(answer.get("detail", ""))
    except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        result.outcome = vocabulary_pb2.COMMAND_OUTCOME_FAILED
        result.detail = (
            f"the GPU-reset helper at {socket_path} did not answer ({exc!r}): is gpufleet-gpu-reset "
            "running (deploy/systemd/gpufleet-gpu-reset.service, or the Kubernetes gpu-reset sidecar)?"
        )
        return result
    result.outcome = vocabulary_pb2.COMMAND_OUTCOME_SUCCEEDED if ok else vocabulary_pb2.COMMAND_OUTCOME_FAILED
    result.detail = f"reset helper: {detail}"[:2000]
    return result
