"""Carrying out the ladder's non-idempotent steps: a GPU reset (a command down the node's
ingest stream, done by its collector), a reboot and a hardware ticket (operator hooks).

Each goes through the action ledger in RepairState: recorded before it is carried out, so a
restart never repeats one; an outcome a dead process never learned is "unknown", and the
workflow validates instead of trying again."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.protos import ingest_pb2, vocabulary_pb2
from gpufleet.repair.health import Step
from gpufleet.repair.hooks import HookRunner, run_hook
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.outcome import OK, STARTED, Outcome, Status, failed
from gpufleet.repair.policy import Policy
from gpufleet.repair.state import RepairState, StateError, Workflow

log = logging.getLogger("gpufleet.repair")


@dataclass
class Hooks:
    reboot_command: str = ""
    ticket_command: str = ""
    timeout_s: float = 600.0
    orphan_command: str = ""  # the opt-in cleanup of an orphaned process (repair/orphan_cleanup.py)


def reset_target(wf: Workflow) -> str:
    """What a GPU reset step is about, as the audit log says it ("GPU(s) 2, 6")."""
    return f"GPU(s) {', '.join(map(str, wf.gpus))}"


@dataclass
class _Pending:
    """A reset command in flight: GPU index → outcome (None until the collector answers)."""

    results: dict[int, Outcome | None] = field(default_factory=dict)


# A collector's answer to a command, as the audit log says it.
_COMMAND_STATUS = {
    vocabulary_pb2.COMMAND_OUTCOME_FAILED: Status.FAILED,
    vocabulary_pb2.COMMAND_OUTCOME_REFUSED: Status.REFUSED,
}


@dataclass(frozen=True)
class _SentReset:
    """What one command id was: the reset of this GPU of this node, for this ledger entry. Ids
    carry a random nonce (docs/security.md "Commands bound to their node"): one cannot be
    guessed, and an answer is matched by lookup, never by parsing the id."""

    key: str
    node: str
    gpu: int


class StepRunner:
    def __init__(
        self,
        policy: Policy,
        state: RepairState,
        hooks: Hooks,
        desk: IncidentDesk,
        send_command: Callable[[str, ingest_pb2.Command], bool],
        poke: Callable[[str], None],
        clock: Callable[[], int] = time.time_ns,
        hook_runner: HookRunner = run_hook,
    ) -> None:
        self._policy, self._state, self._hooks, self._desk = policy, state, hooks, desk
        self._clock, self._run_hook = clock, hook_runner
        self._send_command = send_command
        self._poke = poke
        self._pending: dict[str, _Pending] = {}  # ledger key → reset results
        self._sent: dict[str, _SentReset] = {}  # command id → what it asked
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.unrecorded_total = 0  # hook steps that finished but the store refused their outcome

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    async def settle(self) -> None:
        """Wait for every reboot or ticket command under way (a replay's finish at once)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    def on_command_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        sent = self._sent.get(result.id)
        pending = self._pending.get(sent.key) if sent is not None else None
        if sent is None or pending is None or sent.node != node:
            log.warning(
                "result of a command not sent to this node ignored: %s",
                result.id[:80],
                extra={"node": node, "command_id": result.id[:80]},
            )
            return
        del self._sent[result.id]
        pending.results[sent.gpu] = (
            OK
            if result.outcome == vocabulary_pb2.COMMAND_OUTCOME_SUCCEEDED
            else Outcome(_COMMAND_STATUS.get(result.outcome, Status.FAILED), result.detail[:300])
        )
        self._poke(node)

    def begin(self, wf: Workflow, step: Step, key: str, snap: NodeSnapshot | None, now: int) -> None:
        wf.step_key, wf.step_started_ns = key, now
        wf.boot_id_at_step = snap.boot_id if snap else ""
        if step is Step.RESET_GPU:
            self._begin_reset(wf, key, snap, now)
            return
        template = self._hooks.reboot_command if step is Step.REBOOT else self._hooks.ticket_command
        self._state.begin_action(key)
        if not template:
            self._state.finish_action(key, Outcome(Status.SKIPPED, f"no {step} command configured"))
            self._desk.audit(wf, step, f"no repair_{step}_command configured", Outcome(Status.SKIPPED), now)
            return
        summary = self._desk.summary(wf)
        self._desk.audit(wf, step, summary or step, STARTED, now)
        wf.detail = f"{step} in progress"
        node, incident, gpus = wf.node, wf.incident_id, ",".join(map(str, wf.gpus))

        async def run() -> None:
            try:
                result = await self._run_hook(
                    template, self._hooks.timeout_s, node=node, reason=summary, incident=incident, gpus=gpus
                )
                outcome = Outcome(Status.OK if result.ok else Status.FAILED, result.detail)
                self._state.finish_action(key, outcome)
                self._desk.audit(wf, step, summary or step, outcome, self._clock())
            except StateError as exc:
                # Fenced (a newer leader) or the store down or hung: the entry stays begun, so
                # the command is never run again for this step; the step runs into its timeout
                # (or the next leader validates), as after a crash. Said once, no traceback.
                self.unrecorded_total += 1
                log.error(
                    "%s finished but its outcome is not in the ledger: %s",
                    step,
                    exc,
                    extra={"node": node, "incident": incident},
                )
            finally:
                self._tasks.pop(key, None)
            self._poke(node)

        self._tasks[key] = asyncio.create_task(run())

    def _begin_reset(self, wf: Workflow, key: str, snap: NodeSnapshot | None, now: int) -> None:
        if not wf.gpus:
            self._state.begin_action(key)
            self._state.finish_action(key, Outcome(Status.SKIPPED, "the finding is not about one GPU"))
            return
        uuids = {i: g.uuid for i, g in (snap.gpus.items() if snap else [])}
        self._state.begin_action(key)  # before sending: a restart must not send it again
        self._desk.audit(wf, Step.RESET_GPU, reset_target(wf), STARTED, now)
        pending = self._pending[key] = _Pending()
        for gpu in wf.gpus:
            command_id = f"{key}#{gpu}~{secrets.token_hex(8)}"
            self._sent[command_id] = _SentReset(key, wf.node, gpu)
            command = ingest_pb2.Command(
                id=command_id,
                reason=f"gpufleet {wf.incident_id}",
                reset_gpu=ingest_pb2.ResetGpu(gpu_index=gpu, gpu_uuid=uuids.get(gpu, "")),
            )
            sent = self._send_command(wf.node, command)
            pending.results[gpu] = None if sent else failed("the node's collector is not connected")
        wf.detail = f"resetting {reset_target(wf)}"
        self.check_running(wf, Step.RESET_GPU, key, now)

    def check_running(self, wf: Workflow, step: Step, key: str, now: int) -> None:
        """Record the outcome of a step begun earlier, once it is known."""
        if key in self._tasks:
            return  # the hook is still running
        pending = self._pending.get(key)
        if step is not Step.RESET_GPU or pending is None:
            # Begun by an aggregator process that died before it learned the outcome. Not
            # repeated: validation will show whether it worked.
            self._state.finish_action(
                key, Outcome(Status.OK, "outcome unknown (the aggregator restarted); validating")
            )
            self._desk.audit(wf, step, "resumed after a restart; not repeated", Outcome(Status.UNKNOWN), now)
            return
        results = pending.results
        if None in results.values():
            if now - wf.step_started_ns > self._policy.workflow["reset_timeout_s"] * 1e9:
                outcome = failed("no answer from the collector in time")
            else:
                return
        else:
            bad = [f"GPU {g}: {r}" for g, r in results.items() if r is not None and not r.ok]
            outcome = failed("; ".join(bad)) if bad else OK
        self._state.finish_action(key, outcome)
        self._desk.audit(wf, Step.RESET_GPU, reset_target(wf), outcome, now)
        self._pending.pop(key, None)
        for command_id in [c for c, sent in self._sent.items() if sent.key == key]:
            del self._sent[command_id]  # a late answer to a step already decided is ignored
