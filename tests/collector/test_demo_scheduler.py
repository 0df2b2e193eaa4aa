"""The demo behaves like a fleet with a scheduler (the issue: quarantined and drained nodes kept
running at ~90 %, jobs dropped to 0 and restarted with no event). The repair's commands reach
the demo's control API over real HTTP, as the hook backend runs them; the simulated node obeys
the state they set: a drained node's job stops at once, a cordoned node's job runs to its end
and no other starts, and work starts again after uncordon; each change is logged for the node."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.collector.simnvml import SimulatedNode
from gpufleet.collector.simnvml.scheduler import ScheduledState
from gpufleet.collector.simnvml.serving import Control
from harness.clock import FakeClock


@pytest.fixture
def control(tmp_path: Path) -> Iterator[tuple[Control, ScheduledState]]:
    state = ScheduledState(tmp_path / "scheduler" / "n1")
    api = Control({}, {"n1": state})
    try:
        yield api, state
    finally:
        api.close()


def call(api: Control, path: str) -> int:
    with urllib.request.urlopen(f"{api.url}/{path}", timeout=5) as answer:
        return answer.status


def busy(node: SimulatedNode) -> bool:
    return any(g.util_gpu_pct > 20 for g in node.gpus) and any(g.processes for g in node.gpus)


def run_until(node: SimulatedNode, clock: FakeClock, done: object, limit_s: float) -> float:
    """Advance simulated time a second at a time until done(node); the seconds it took."""
    for second in range(int(limit_s)):
        clock.now += 1
        node.advance()
        if done(node):  # type: ignore[operator]
            return float(second + 1)
    raise AssertionError(f"not within {limit_s:g} simulated seconds")


def test_drain_stops_the_job_and_uncordon_starts_work_again(
    control: tuple[Control, ScheduledState], caplog: pytest.LogCaptureFixture
) -> None:
    api, state = control
    clock = FakeClock()
    node = SimulatedNode("n1", 8, "H100", seed=7, clock=clock, scheduled=state)
    run_until(node, clock, busy, 600)
    with caplog.at_level(logging.INFO, logger="gpufleet.collector.sim"):
        assert call(api, "cordon/n1") == 204 and call(api, "evict/n1") == 204
        run_until(node, clock, lambda n: max(g.util_gpu_pct for g in n.gpus) < 2, 30)
        clock.now += 3600  # an hour drained: nothing starts
        node.advance()
        assert not any(g.processes for g in node.gpus) and max(g.util_gpu_pct for g in node.gpus) < 2
        assert call(api, "uncordon/n1") == 204
        run_until(node, clock, busy, 120)  # idle 5-60 s, then a job ramps up
    said = [r.getMessage() for r in caplog.records]
    assert any("node n1: the scheduler has it drained; job" in s and "stopped" in s for s in said), said
    assert any("node n1: the scheduler has it in service again: jobs start" in s for s in said), said
    assert not state.path.exists(), "in service is no file"


def test_a_cordoned_nodes_job_runs_to_its_end_and_no_other_starts(
    control: tuple[Control, ScheduledState],
) -> None:
    api, state = control
    clock = FakeClock()
    node = SimulatedNode("n1", 8, "H100", seed=3, clock=clock, scheduled=state)
    run_until(node, clock, busy, 600)
    call(api, "cordon/n1")
    clock.now += 5
    node.advance()
    assert busy(node), "a cordon stops new work, not the running job"
    run_until(node, clock, lambda n: not busy(n), 1000)  # jobs last 2 to 15 minutes
    clock.now += 3600
    node.advance()
    assert not any(g.processes for g in node.gpus)


def test_a_name_in_a_call_is_only_a_key(control: tuple[Control, ScheduledState], tmp_path: Path) -> None:
    """A node name the demo does not have (a path, another node) sets nothing, anywhere."""
    api, state = control
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for path in ("cordon/n2", "evict/..%2F..%2Fetc", "evict/n1.part", "cordon/"):
        try:
            call(api, path)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert state.read() == ""
