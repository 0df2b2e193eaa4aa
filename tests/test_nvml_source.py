"""The collector's NVML sampling, through the real pynvml code path over the stand-in
NVML library (pynvml -> ctypes arguments -> SimulatedNvmlLibrary)."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpufleet.collector.simnvml import (
    GPU_PROFILES,
    SimulatedNode,
    SimulatedNvmlLibrary,
    install,
    uninstall,
)
from gpufleet.collector.sources.nvml import NvmlSource, NvmlUnavailable


class FakeClock:
    """Simulated time for the simulated GPUs (the stand-in advances to the clock it is given)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def node(clock: FakeClock) -> Iterator[SimulatedNode]:
    sim = SimulatedNode("gpu-017", gpu_count=8, model="H100", seed=7, clock=clock)
    install(SimulatedNvmlLibrary(sim))
    yield sim
    uninstall()


def test_inventory_is_read_through_pynvml(node: SimulatedNode) -> None:
    source = NvmlSource()
    inventory = source.inventory()
    assert [g.index for g in inventory] == list(range(8))
    assert all(g.model == "NVIDIA H100 80GB HBM3" for g in inventory)
    assert len({g.uuid for g in inventory}) == 8 and all(g.uuid.startswith("GPU-") for g in inventory)
    assert [g.pci_bus_id for g in inventory] == [g.pci_bus_id for g in node.gpus]
    assert all(g.hbm_total_bytes == GPU_PROFILES["H100"].hbm_total_bytes for g in inventory)
    assert source.driver_version == node.driver_version
    source.close()


def test_values_are_realistic_and_move_over_time(node: SimulatedNode, clock: FakeClock) -> None:
    source = NvmlSource()
    first = source.sample()
    clock.now += 60  # a job starts at t=0 and ramps up within seconds
    later = source.sample()
    for s in later:
        assert 0 <= s.util_gpu_pct <= 100 and 0 <= s.util_mem_pct <= 100
        assert 0 < s.hbm_used_bytes <= s.hbm_total_bytes
        assert 20 <= s.temp_gpu_c <= 95
        assert 0 < s.power_w <= s.power_limit_w == 700.0
    assert [s.util_gpu_pct for s in first] != [s.util_gpu_pct for s in later]
    assert sum(s.util_gpu_pct for s in later) / 8 > 20, "a job is running after a minute"
    hot = sum(s.temp_gpu_c for s in later) / 8
    assert hot > sum(s.temp_gpu_c for s in first) / 8, "temperature follows power"


def test_unsupported_field_is_absent_not_zero(node: SimulatedNode) -> None:
    node.gpus[3].fail_symbols["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource()
    samples = source.sample()
    assert not samples[3].HasField("power_w")
    assert samples[3].HasField("util_gpu_pct") and samples[3].HasField("power_limit_w")
    assert all(s.HasField("power_w") for i, s in enumerate(samples) if i != 3)
    assert source.errors_total == 0, "NOT_SUPPORTED is not an error"
    calls = node_calls(source)
    source.sample()
    # Only the 7 GPUs that support it are asked again; GPU 3 is not.
    assert node_calls(source) == calls + 7, "an unsupported field is not asked for again"


def node_calls(source: NvmlSource) -> int:
    return pynvml.nvmlLib.calls.get("nvmlDeviceGetPowerUsage", 0)


def test_lost_gpu_is_reported_lost_and_others_still_sampled(node: SimulatedNode) -> None:
    source = NvmlSource()
    node.gpus[5].lost = True
    samples = source.sample()
    assert samples[5].lost and not samples[5].HasField("util_gpu_pct")
    assert samples[5].uuid == node.gpus[5].uuid, "a lost GPU keeps its identity"
    assert all(not s.lost and s.HasField("util_gpu_pct") for i, s in enumerate(samples) if i != 5)
    node.gpus[5].lost = False
    assert not source.sample()[5].lost


def test_other_nvml_errors_are_counted_and_leave_only_that_field_absent(node: SimulatedNode) -> None:
    node.gpus[0].fail_symbols["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    source = NvmlSource()
    sample = source.sample()[0]
    assert not sample.HasField("temp_gpu_c") and sample.HasField("power_w")
    assert source.errors_total == 1
    source.sample()
    assert source.errors_total == 2, "a transient error is retried on the next sample"


def test_without_a_driver_nvml_is_unavailable_with_a_way_out() -> None:
    uninstall()
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has a real NVIDIA driver")
    except OSError:
        pass
    with pytest.raises(NvmlUnavailable, match="--simulate"):
        NvmlSource()
