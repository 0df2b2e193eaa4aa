"""The opt-in cleanup of an orphaned process (repair/orphan_cleanup.py, issue 54), on a real
control-plane store and real commands (printf prints the argv the site's command would get):

- whatever a node says a workload is called, the command gets the node, the GPU, the pid and the
  workload id as separate arguments, and the id only when it is an id (never an option, a shell
  word or a path outside one): a property over the whole claim;
- each process is cleaned once ever, audited started then done, however many GPUs it holds and
  whether the aggregator restarts between two looks;
- a dry run audits and runs nothing; a tripped breaker runs nothing and finds it again later.

The end-to-end use (a real Slurm job's orphan killed by `kill {pid}`, its alert resolved) is
tests/fleet/test_workloads_slurm.py's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.model import CLAIM_ENDED, CLAIM_NONE, CLAIM_RUNNING, Finding, NodeSnapshot, ProcessClaim
from gpufleet.repair.orphan_cleanup import ACTION, OrphanCleanup, safe_id
from gpufleet.repair.outcome import Outcome
from gpufleet.repair.state import RepairState, open_state

PRINT_ARGV = "printf '%s\\n' {node} {gpu} {pid} {workload} end"


def _state(tmp_path: Path, name: str = "repair.sqlite3") -> RepairState:
    return open_state("sqlite", str(tmp_path / name))


def _orphan(
    node: str, gpu: int, workload: str, claims: tuple[ProcessClaim, ...]
) -> tuple[Finding, NodeSnapshot]:
    snap = NodeSnapshot.reporting(node, [], 1)
    snap.claims = claims
    finding = Finding(
        node, gpu, "orphaned_process", "warning", "notify", False, "held", "its job ended", workload=workload
    )
    return finding, snap


def _cleanup(
    state: RepairState, command: str = PRINT_ARGV, dry_run: bool = False, counted: list[str] | None = None
) -> OrphanCleanup:
    """The cleanup on the repair's own desk (audit, log and the actions counter it feeds)."""
    told = [] if counted is None else counted

    def on_action(node: str, action: str, outcome: Outcome) -> None:
        told.append(f"{action} {outcome.status}")

    desk = IncidentDesk(state, AlertDispatcher([]), on_action, lambda: 1_000)
    return OrphanCleanup(command, 10.0, state, desk, dry_run, lambda: 1_000)


def _runs(state: RepairState) -> list[tuple[str, str, str]]:
    return [
        (r.reason, str(r.outcome.status), r.outcome.detail) for r in state.audit_log() if r.action == ACTION
    ]


workloads = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["slurm:4242", "-rf", "--help", "slurm:1; rm -rf /", "$(reboot)", "../../etc", "a b"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    workload=workloads,
    pids=st.lists(st.integers(1, 4_194_304), min_size=1, max_size=3, unique=True),
    gpu=st.integers(0, 7),
)
def test_the_site_command_gets_each_value_as_one_argument_and_the_id_only_when_it_is_one(
    tmp_path_factory: object, workload: str, pids: list[int], gpu: int
) -> None:
    state = _state(tmp_path_factory.mktemp("orphan"))  # type: ignore[attr-defined]
    claims = (
        ProcessClaim(workload, CLAIM_ENDED, (gpu,), tuple(pids), 4 << 30),
        ProcessClaim("slurm:7", CLAIM_RUNNING, (gpu,), (9_999_999,), 1 << 30),  # a running job's
    )
    cleanup = _cleanup(state)
    cleanup.found(*_orphan("gpu-node-1", gpu, workload, claims))
    asyncio.run(cleanup.act())
    done = [r for r in _runs(state) if r[1] != "started"]
    assert [r[0].split()[1] for r in done] == [str(p) for p in sorted(pids)], (
        "each orphan once, no running job's"
    )
    for _, status, printed in done:
        assert status == "ok", printed
        node, gpu_arg, _pid, *rest = printed.split("\n")
        assert (node, gpu_arg) == ("gpu-node-1", str(gpu))
        assert rest[-1] == "end" and len(rest) == 2, f"one argument per value: {printed!r}"
        assert rest[0] == safe_id(workload) and not rest[0].startswith("-")
        assert rest[0] in ("", workload)


def test_each_process_is_cleaned_once_across_gpus_and_restarts(tmp_path: Path) -> None:
    state = _state(tmp_path)
    marker = tmp_path / "killed"
    command = f"sh -c 'echo $0 >> {marker}' {{pid}}"
    claims = (ProcessClaim("", CLAIM_NONE, (0, 1), (4242,), 2 << 30),)
    counted: list[str] = []
    first = _cleanup(state, command, counted=counted)
    for gpu in (0, 1):  # one process on two GPUs: two findings
        first.found(*_orphan("gpu-node-1", gpu, "", claims))
    asyncio.run(first.act())
    first.found(*_orphan("gpu-node-1", 0, "", claims))  # the next look: still there
    asyncio.run(first.act())
    restarted = _cleanup(_state(tmp_path), command)  # a new process on the same store
    restarted.found(*_orphan("gpu-node-1", 1, "", claims))
    asyncio.run(restarted.act())
    assert marker.read_text().split() == ["4242"]
    assert counted == ["orphan_cleanup started", "orphan_cleanup ok"], "counted as repair actions"
    assert [(r[0], r[1]) for r in _runs(state)] == [
        ("pid 4242 on GPU 0", "started"),
        ("pid 4242 on GPU 0", "ok"),
    ]


def test_a_dry_run_audits_and_a_tripped_breaker_waits(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = f"touch {marker}"
    claims = (ProcessClaim("", CLAIM_NONE, (3,), (77,), 2 << 30),)
    dry_state = _state(tmp_path, "dry.sqlite3")
    dry = _cleanup(dry_state, command, dry_run=True)
    dry.found(*_orphan("gpu-node-2", 3, "", claims))
    asyncio.run(dry.act())
    assert not marker.exists()
    assert [r[1] for r in _runs(dry_state)] == ["started", "dry-run"]

    state = _state(tmp_path)
    held = _cleanup(state, command)
    held.found(*_orphan("gpu-node-2", 3, "", claims))
    asyncio.run(held.act(halted=True))
    assert not marker.exists() and _runs(state) == []
    held.found(*_orphan("gpu-node-2", 3, "", claims))  # found again once the breaker is reset
    asyncio.run(held.act())
    assert marker.exists() and [r[1] for r in _runs(state)] == ["started", "ok"]
