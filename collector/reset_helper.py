"""The privileged GPU-reset helper: the one part of a node that may reset a GPU.

A GPU reset needs root with CAP_SYS_ADMIN. The collector talks to the network, so it should not
hold that (docs/security.md "Deploy least privilege"). This small process does, and nothing
else: it listens on a Unix socket (mode 0660: its group is the collector's), takes one JSON
line per connection, `{"gpu_index": 3, "gpu_uuid": "GPU-...", "command_id": "..."}`, checks
it (an index 0..63, a uuid of NVML's form, at most one reset of a GPU within min_interval_s,
one reset at a time), runs its own reset command with {gpu_index} and {gpu_uuid} put into
the arguments (no shell) under a timeout, and answers `{"ok": true|false, "detail": "..."}`.
What reaches the command is only ever an integer and a checked uuid.

    gpufleet gpu-reset-helper --socket /run/gpufleet/gpu-reset.sock \\
        --reset-command 'nvidia-smi --gpu-reset -i {gpu_index}'
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import signal
import time
from pathlib import Path

log = logging.getLogger("gpufleet.collector.reset_helper")

UUID_RE = re.compile(r"GPU-[0-9A-Za-z-]{1,64}")
MAX_REQUEST_BYTES = 4096


class ResetHelper:
    def __init__(self, reset_command: str, timeout_s: float = 300.0, min_interval_s: float = 300.0) -> None:
        if not shlex.split(reset_command):
            raise ValueError("the reset helper needs a --reset-command")
        self._template = shlex.split(reset_command)
        self._timeout_s = timeout_s
        self._min_interval_s = min_interval_s
        self._last: dict[int, float] = {}
        self._one_at_a_time = asyncio.Lock()
        self.resets_total = 0
        self.refused_total = 0

    def check(self, request: object) -> tuple[int, str]:
        """(gpu_index, gpu_uuid) of a well-formed request; ValueError saying what is wrong."""
        if not isinstance(request, dict):
            raise ValueError("a request is a JSON object")
        index, uuid = request.get("gpu_index"), request.get("gpu_uuid", "")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= 63:
            raise ValueError(f"gpu_index must be an integer 0..63, not {str(index)[:40]!r}")
        if not isinstance(uuid, str) or (uuid and not UUID_RE.fullmatch(uuid)):
            raise ValueError(f"gpu_uuid must be empty or GPU-..., not {str(uuid)[:80]!r}")
        return index, uuid

    async def answer(self, line: bytes) -> dict[str, object]:
        try:
            index, uuid = self.check(json.loads(line))
        except ValueError as exc:  # json.JSONDecodeError is one
            self.refused_total += 1
            return {"ok": False, "detail": f"refused: {exc}"}
        async with self._one_at_a_time:
            now = time.monotonic()
            last = self._last.get(index)
            if last is not None and now - last < self._min_interval_s:
                self.refused_total += 1
                return {
                    "ok": False,
                    "detail": f"refused: GPU {index} was reset {now - last:.0f} s ago (min interval "
                    f"{self._min_interval_s:g} s)",
                }
            self._last[index] = now
            self.resets_total += 1
            return await self._run(index, uuid)

    async def _run(self, index: int, uuid: str) -> dict[str, object]:
        argv = [a.format(gpu_index=index, gpu_uuid=uuid) for a in self._template]
        log.warning("resetting GPU %d (%s): %s", index, uuid, shlex.join(argv), extra={"gpu": index})
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
        except OSError as exc:
            return {"ok": False, "detail": f"cannot start {argv[0]!r}: {exc}"}
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return {"ok": False, "detail": f"the reset did not finish within {self._timeout_s:g} s"}
        tail = output.decode(errors="replace")[-1500:].strip()
        return {"ok": proc.returncode == 0, "detail": f"exit status {proc.returncode}: {tail}".strip()}

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            if len(line) > MAX_REQUEST_BYTES:
                answer: dict[str, object] = {"ok": False, "detail": "refused: request too long"}
            else:
                answer = await self.answer(line)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("reset helper: a client went away: %r", exc)
        finally:
            writer.close()

    async def serve(self, socket_path: str, stop: asyncio.Event, mode: int = 0o660) -> None:
        path = Path(socket_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket left by an earlier run
        server = await asyncio.start_unix_server(self._client, path=str(path), limit=MAX_REQUEST_BYTES + 2)
        os.chmod(path, mode)
        log.info("GPU-reset helper listening on %s (mode %o)", path, mode)
        async with server:
            await stop.wait()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def run_reset_helper(
    socket_path: str, reset_command: str, timeout_s: float, min_interval_s: float, mode: int = 0o660
) -> None:
    helper = ResetHelper(reset_command, timeout_s, min_interval_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await helper.serve(socket_path, stop, mode)
