"""The work signals the slowness rule compares (docs/repair.md "Slowness from work, not time"),
read through the real pynvml from both stand-ins (the Python one and the C library): the SM
clock the clocks policy targets, and GPM's SM and tensor activity over the interval between two
samples on GPUs that have GPM (Hopper and later); absent, not zero, on GPUs that do not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install, uninstall
from gpufleet.collector.simnvml.clibrary import install_c
from gpufleet.collector.simnvml.scenario import Fault, apply
from gpufleet.collector.sources.nvml import NvmlSource
from harness.clock import FakeClock

GPM_FIELDS = ("sm_active_pct", "tensor_active_pct")


class Opened:
    def __init__(self, node: SimulatedNode, answers: SimulatedNvmlLibrary, clock: FakeClock) -> None:
        self.node, self.answers, self.clock = node, answers, clock
        self.source = NvmlSource()

    def tick(self, seconds: float = 5.0) -> list:
        self.clock.now += seconds
        return self.source.sample()


@pytest.fixture(params=["python", "c"])
def opened(request: pytest.FixtureRequest, nvml_standin_so: Path) -> Iterator[callable]:
    made: list[Opened] = []

    def open_node(model: str) -> Opened:
        clock = FakeClock()
        node = SimulatedNode(f"work-{model}", 8, model, seed=3, clock=clock)
        node.forced_util_pct = 97
        answers = SimulatedNvmlLibrary(node)
        if request.param == "c":
            install_c(nvml_standin_so, answers)
        else:
            install(answers)
        made.append(Opened(node, answers, clock))
        return made[-1]

    yield open_node
    for o in made:
        o.source.close()
    uninstall()


def test_gpm_gives_sm_and_tensor_activity_between_two_samples(opened: callable) -> None:
    o = opened("H100")
    first = o.tick()
    assert not any(s.HasField(f) for s in first for f in GPM_FIELDS), "one GPM sample averages nothing"
    o.tick(10)
    before = {g.index: g.work_integrals for g in o.node.gpus}
    samples = o.tick(10)
    for s in samples:
        # A steady job at 97 %: most SMs busy, 60 % of their time on tensor cores (a training job).
        assert 80 <= s.sm_active_pct <= 92, s
        assert s.tensor_active_pct == pytest.approx(0.6 * s.sm_active_pct, rel=1e-6)
        # The mean over the interval since the GPU's previous sample, not the value at an instant.
        (t0, sm0, _), (t1, sm1, _) = before[s.index], o.node.gpus[s.index].work_integrals
        assert t1 - t0 == pytest.approx(10) and s.sm_active_pct == pytest.approx((sm1 - sm0) / (t1 - t0))
    assert o.source.errors_total == 0


def test_a_gpu_without_gpm_has_the_fields_absent_and_is_not_asked_again(opened: callable) -> None:
    o = opened("A100")
    for _ in range(3):
        samples = o.tick()
        assert not any(s.HasField(f) for s in samples for f in GPM_FIELDS)
    assert o.answers.calls["nvmlGpmQueryDeviceSupport"] == 8  # once per GPU, at its first sample
    assert "nvmlGpmSampleGet" not in o.answers.calls
    assert o.source.errors_total == 0


def test_the_target_clock_follows_the_operators_application_clock(opened: callable) -> None:
    o = opened("H100")
    assert {s.clock_sm_target_mhz for s in o.tick()} == {1980.0}
    apply(o.node.gpus[4], Fault(0, 4, "app_clock", mhz=1600))
    samples = {s.index: s for s in o.tick()}
    assert samples[4].clock_sm_target_mhz == 1600.0 and samples[4].clock_sm_mhz <= 1600.0
    assert all(samples[i].clock_sm_target_mhz == 1980.0 for i in samples if i != 4)
    apply(o.node.gpus[4], Fault(0, 4, "heal"))
    assert {s.clock_sm_target_mhz for s in o.tick()} == {1980.0}


def test_closing_frees_every_gpm_sample(opened: callable) -> None:
    o = opened("H100")
    o.tick()
    o.tick()
    assert o.answers.work.samples_held() == 16  # two per GPU, filled in turn
    o.source.close()
    assert o.answers.work.samples_held() == 0
    o.source.gpus.clear()  # closed: the fixture's close has nothing left to free
