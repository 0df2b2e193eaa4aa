"""The C stand-in NVML (collector/simnvml/clibrary.py): a shared library the real pynvml loads
through ctypes, so the collector's NVML calls are real foreign calls. It answers exactly what
the Python stand-in answers from the same machine; a call that hangs is blocked in C, where
Python cannot interrupt it; a hang that holds the driver's lock stalls every GPU's calls, as a
driver stuck with its internal lock held does, and the deadline sampler still reports every GPU
(driver_unresponsive) instead of going silent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest

from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install, uninstall
from gpufleet.collector.simnvml.clibrary import SYMBOLS, install_c
from gpufleet.collector.simnvml.machine import Hang
from gpufleet.collector.sources.deadline import DeadlineSampler
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.protos import telemetry_pb2
from harness.clock import FakeClock


def _samples(source: NvmlSource, clock: FakeClock, node: SimulatedNode) -> list[bytes]:
    node.forced_util_pct = 97
    out = []
    for _ in range(3):
        clock.now += 7
        node.gpus[2].inject_ecc(uncorrected=True)
        node.gpus[6].nvlink_down.add(4)
        out += [s.SerializeToString(deterministic=True) for s in source.sample()]
    return out


def test_the_c_library_answers_what_the_python_one_does_from_the_same_machine(nvml_standin_so: Path) -> None:
    """The same seed and clock through either stand-in: the same inventory and samples, every
    field (ECC, remaps, NVLink, processes, PCIe, fabric...), so every test of the Python one
    holds for the library."""
    read = {}
    for kind in ("python", "c"):
        clock = FakeClock()
        node = SimulatedNode("parity-node", 8, "H100", seed=11, clock=clock)
        if kind == "c":
            install_c(nvml_standin_so, SimulatedNvmlLibrary(node))
        else:
            install(SimulatedNvmlLibrary(node))
        try:
            source = NvmlSource()
            read[kind] = (
                [g.identity.SerializeToString() for g in source.gpus],
                _samples(source, clock, node),
            )
            assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
            source.close()
        finally:
            uninstall()
    assert read["c"] == read["python"]
    assert len(read["c"][1]) == 24
    last = telemetry_pb2.GpuSample.FromString(read["c"][1][-1])
    assert last.HasField("sm_active_pct") and last.HasField("clock_sm_target_mhz"), "GPM and clocks too"


@dataclass
class Stuck:
    """A node on the C stand-in, its NVML opened and sampled under a 0.3 s deadline."""

    node: SimulatedNode
    answers: SimulatedNvmlLibrary
    sampler: DeadlineSampler
    release: Path  # a hang with this release file ends when the file exists


@pytest.fixture
def c_node(nvml_standin_so: Path, tmp_path: Path) -> Iterator[Stuck]:
    node = SimulatedNode("c-node", 8, "H100", seed=5)
    answers = SimulatedNvmlLibrary(node)
    install_c(nvml_standin_so, answers)
    source = NvmlSource()
    yield Stuck(node, answers, DeadlineSampler(source, deadline_s=0.3), tmp_path / "release")
    source.close()
    uninstall()


def _tick_until(sampler: DeadlineSampler, done: object, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tick = sampler.sample(wait_s=0.3)
        if done(tick):  # type: ignore[operator]
            return tick
    raise AssertionError(
        f"not within {timeout_s} s: last tick {[(s.index, s.driver_unresponsive) for s in tick]}"
    )


def test_a_call_blocked_in_c_stops_only_its_gpu(c_node: Stuck) -> None:
    node, answers, sampler, release = c_node.node, c_node.answers, c_node.sampler, c_node.release
    node.gpus[5].hangs["nvmlDeviceGetMemoryInfo"] = Hang(release_file=str(release))
    calls_before = answers.calls.get("nvmlDeviceGetMemoryInfo", 0)
    tick = _tick_until(sampler, lambda t: any(s.driver_unresponsive for s in t), 10)
    assert {s.index for s in tick} == set(range(8))
    assert [s.index for s in tick if s.driver_unresponsive] == [5]
    assert next(s for s in tick if s.index == 5).driver_unresponsive_call == "nvmlDeviceGetMemoryInfo"
    # The stuck call is in C: it has not reached the Python answers (it blocks before them).
    stuck_calls = answers.calls.get("nvmlDeviceGetMemoryInfo", 0) - calls_before
    others = [s for s in sampler.sample(wait_s=0.3) if s.index != 5]
    assert len(others) == 7 and all(s.HasField("hbm_used_bytes") for s in others)
    assert answers.calls["nvmlDeviceGetMemoryInfo"] - calls_before > stuck_calls, "the others still answer"
    release.touch()
    _tick_until(sampler, lambda t: {s.index for s in t if s.HasField("hbm_used_bytes")} == set(range(8)), 10)


def test_a_hang_that_holds_the_driver_lock_makes_every_gpu_unresponsive_not_silent(c_node: Stuck) -> None:
    node, sampler, release = c_node.node, c_node.sampler, c_node.release
    node.gpus[2].hangs["nvmlDeviceGetPowerUsage"] = Hang(release_file=str(release), holds_driver_lock=True)
    tick = _tick_until(sampler, lambda t: len(t) == 8 and all(s.driver_unresponsive for s in t), 10)
    assert next(s for s in tick if s.index == 2).driver_unresponsive_call == "nvmlDeviceGetPowerUsage"
    release.touch()
    _tick_until(sampler, lambda t: len(t) == 8 and not any(s.driver_unresponsive for s in t), 10)


def test_every_symbol_the_collector_calls_is_in_the_library() -> None:
    """A symbol the collector calls that the library lacks would answer FUNCTION_NOT_FOUND and
    hide a field: the library's table names every symbol the Python stand-in answers."""
    python_symbols = SimulatedNvmlLibrary.symbol_names()
    assert python_symbols - {"nvmlErrorString"} == {name for name, *_ in SYMBOLS}
