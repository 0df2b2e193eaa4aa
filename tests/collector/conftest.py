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


# A driver library whose load never returns: its constructor blocks in C, inside the dlopen that
# pynvml's _LoadNvmlLibrary makes while it holds pynvml's libLoadLock (and glibc its loader lock),
# as a libnvidia-ml stuck loading does.
STUCK_LOAD_SOURCE = """
#include <unistd.h>
__attribute__((constructor)) static void stuck_loading(void) { for (;;) pause(); }
"""


@pytest.fixture(scope="session")
def stuck_nvml_load_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a libnvidia-ml.so.1 whose load never returns (LD_LIBRARY_PATH for a
    collector run with --sim-nvml-real-load), built with the system C compiler."""
    import subprocess

    folder = tmp_path_factory.mktemp("stuck-nvml-load")
    source = folder / "stuck.c"
    source.write_text(STUCK_LOAD_SOURCE)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(folder / "libnvidia-ml.so.1"), str(source)],
        check=True,
        capture_output=True,
    )
    return folder
