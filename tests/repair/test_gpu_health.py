"""One GPU's health word (repair/gpu_health.py), property-tested over whole GPU samples (any
subset of fields, at any valid value), any findings the controller may hold for the node, and
any workflow state: a GPU with an open finding is never "ok", the word is at least what the
worst of its findings says, a finding on another GPU or on the whole node is not its own, a
lost GPU reads lost, and "ok" comes with nothing to explain."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import gpu_health_name
from gpufleet.repair.gpu_health import gpu_state, hard_signals, raised
from gpufleet.repair.health import Health
from gpufleet.repair.model import Finding
from gpufleet.repair.state import Workflow
from harness.wire_strategies import message

GPU = 3
FLOOR = {"info": "watch", "warning": "suspect", "critical": "faulty"}
RANK = ["ok", "watch", "suspect", "faulty", "lost"]

findings = st.builds(
    Finding,
    node=st.just("n"),
    gpu=st.one_of(st.none(), st.integers(0, 7)),
    code=st.sampled_from(["xid_79", "driver_unresponsive", "ecc_storm", "thermal_slowdown", "gpu_slow"]),
    severity=st.sampled_from(["info", "warning", "critical"]),
    action=st.just("RESTART_BM"),
    cordon=st.booleans(),
    reason=st.just("r"),
    evidence=st.just("e"),
)
workflows = st.one_of(
    st.none(),
    st.builds(
        Workflow,
        node=st.just("n"),
        state=st.sampled_from(list(Health)),
        incident_id=st.sampled_from(["", "inc-1"]),
        gpus=st.lists(st.integers(0, 7), max_size=3),
    ),
)


@settings(max_examples=300, deadline=None)
@given(message(telemetry_pb2.GpuSample.DESCRIPTOR, valid=True), st.lists(findings, max_size=6), workflows)
def test_a_gpu_with_an_open_finding_never_reads_ok(
    sample: telemetry_pb2.GpuSample, found: list[Finding], wf: Workflow | None
) -> None:
    sample.index = GPU
    state = gpu_state(sample, found, wf)
    word = gpu_health_name(state.health)
    mine = [f for f in found if f.gpu == GPU]
    assert state.index == GPU and list(state.findings) == [
        f.code for f in sorted(mine, key=lambda f: -f.severity_rank)
    ]
    if sample.lost:
        assert word == "lost"
        return
    for f in mine:
        assert RANK.index(word) >= RANK.index(FLOOR[f.severity]), (word, f)
    in_incident = wf is not None and wf.state is not Health.HEALTHY and GPU in wf.gpus
    if in_incident:
        assert RANK.index(word) >= RANK.index("suspect")
    if raised(sample):
        assert word != "ok"
    if hard_signals(sample):
        assert RANK.index(word) >= RANK.index("suspect")
    if not mine and not in_incident and not raised(sample):
        assert word == "ok", "another GPU's finding, or the whole node's, is not this GPU's"
    assert (word == "ok") == (state.detail == ""), "ok, and only ok, has nothing to explain"


def test_what_a_person_reads_for_a_stuck_gpu() -> None:
    sample = telemetry_pb2.GpuSample(index=2, driver_unresponsive_call="nvmlDeviceGetPowerUsage")
    stuck = Finding("n", 2, "driver_unresponsive", "critical", "RESTART_BM", True, "r", "e")
    storm = Finding("n", 2, "ecc_storm", "warning", "RESTART_BM", False, "r", "e")
    state = gpu_state(sample, [storm, stuck], None)
    assert (gpu_health_name(state.health), state.detail) == ("faulty", "driver_unresponsive, ecc_storm")
    alone = gpu_state(sample, [], None)
    assert (alone.health, alone.detail) == (
        vocabulary_pb2.GPU_HEALTH_SUSPECT,
        "driver-unresponsive (nvmlDeviceGetPowerUsage)",
    )
