"""The collector area's fixtures: a simulated node of eight H100s on a clock the test moves,
installed as the NVML library pynvml loads (its real ctypes code path over the stand-in)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install, uninstall
from gpufleet.collector.simnvml.clibrary import build
from harness.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def node(clock: FakeClock) -> Iterator[SimulatedNode]:
    sim = SimulatedNode("gpu-017", gpu_count=8, model="H100", seed=7, clock=clock)
    install(SimulatedNvmlLibrary(sim))
    yield sim
    uninstall()


@pytest.fixture(scope="session")
def nvml_standin_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C stand-in NVML library (collector/simnvml/clibrary.py), built once a session with
    the system C compiler."""
    return build(tmp_path_factory.mktemp("nvml-standin"))
