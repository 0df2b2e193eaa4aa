"""The collector's NVML sampling, through the real pynvml code path over the stand-in
NVML library (pynvml -> ctypes arguments -> SimulatedNvmlLibrary)."""

from __future__ import annotations

import logging

import pynvml
import pytest

from gpufleet.collector.simnvml import (
    GPU_PROFILES,
    SimulatedNode,
    SimulatedNvmlLibrary,
    install,
    uninstall,
)
from gpufleet.collector.simnvml.machine import MIN_STEP_S
from gpufleet.collector.sources.nvml import NvmlSource, NvmlUnavailable
from harness.clock import FakeClock


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


def test_a_tick_reads_one_state_and_the_first_read_is_stepped(clock: FakeClock) -> None:
    """A simulated node steps at most every 50 ms of its clock (MIN_STEP_S), so a tick's reads
    see one state; its very first read is stepped wherever the clock stands, so no GPU reads
    the zeroes it was made with (a demo's first report once showed 0 bytes of HBM in use)."""
    sim = SimulatedNode("gpu-018", gpu_count=8, model="H100", seed=7, clock=clock)
    install(SimulatedNvmlLibrary(sim))
    clock.now += 0.001  # read a millisecond after the node was made
    try:
        source = NvmlSource()
        first = source.sample()
        assert all(s.hbm_used_bytes >= 512 << 20 for s in first), [s.hbm_used_bytes for s in first]
        clock.now += MIN_STEP_S / 2
        assert [(s.util_gpu_pct, s.power_w) for s in source.sample()] == [
            (s.util_gpu_pct, s.power_w) for s in first
        ], "within one step the node reads the same"
        clock.now += MIN_STEP_S
        assert [s.power_w for s in source.sample()] != [s.power_w for s in first], "a step later it moved"
        source.close()
    finally:
        uninstall()


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


# --- full coverage and faults (collector issue) ------------------------------------------

from gpufleet.collector.simnvml import scenario  # noqa: E402
from gpufleet.collector.sources.xid_nvml import NvmlXidWatcher  # noqa: E402
from gpufleet.protos import vocabulary_pb2  # noqa: E402

ALWAYS = {
    "clock_sm_mhz",
    "clock_mem_mhz",
    "clock_event_reasons",
    "throttle_thermal",
    "throttle_power",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "pcie_replay_total",
    "process_count",
}
REMAP = {"remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure"}
RETIRED = {"retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"}
NVLINK = {
    "nvlink_links_active",
    "nvlink_links_inactive",
    "nvlink_replay_total",
    "nvlink_recovery_total",
    "nvlink_crc_total",
}


@pytest.mark.parametrize(
    "model,present,absent",
    [
        ("H100", ALWAYS | REMAP | NVLINK | {"temp_mem_c"}, RETIRED),
        ("V100", ALWAYS | RETIRED | NVLINK | {"temp_mem_c"}, REMAP),
        ("L40S", ALWAYS | REMAP, RETIRED | NVLINK | {"temp_mem_c"}),
    ],
)
def test_every_field_a_gpu_supports_is_read_and_the_rest_is_absent(
    clock: FakeClock, model: str, present: set[str], absent: set[str]
) -> None:
    install(SimulatedNvmlLibrary(SimulatedNode("n", 2, model, seed=3, clock=clock)))
    try:
        source = NvmlSource()
        clock.now += 30
        sample = source.sample()[0]
        assert all(sample.HasField(f) for f in present), [f for f in present if not sample.HasField(f)]
        assert not any(sample.HasField(f) for f in absent)
        assert source.errors_total == 0
        if present >= NVLINK:
            assert sample.nvlink_links_active == GPU_PROFILES[model].nvlink_links
        assert sample.process_count == len(sample.processes) == 1, "the running job's process"
    finally:
        uninstall()


def fault(kind: str, **params: object) -> scenario.Fault:
    return scenario.Fault(at_s=0, gpu=2, kind=kind, **params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "injected,check",
    [
        (fault("ecc_corrected", count=3), lambda s: s.ecc_sbe_volatile == 3 and s.ecc_sbe_aggregate == 3),
        (
            fault("ecc_uncorrected"),
            lambda s: s.ecc_dbe_volatile == 1 and s.remap_uncorrectable == 1 and s.remap_pending,
        ),
        (fault("remap_failure"), lambda s: s.remap_failure and not s.remap_pending),
        (
            fault("thermal"),
            # Thermal slowdown only at the GPU's slowdown temperature (87 °C), never at a cool 46.
            lambda s: (
                s.throttle_thermal
                and not s.throttle_power
                and s.clock_event_reasons & 0x60
                and s.temp_gpu_c >= 87
            ),
        ),
        (fault("power"), lambda s: s.throttle_power and s.clock_event_reasons & 0x84 == 0x84),
        (fault("nvlink_down", link=5), lambda s: (s.nvlink_links_active, s.nvlink_links_inactive) == (17, 1)),
        (
            fault("nvlink_errors", link=1, count=7),
            lambda s: s.nvlink_replay_total == 7 and s.nvlink_crc_total == 7,
        ),
        (fault("pcie_replays", count=12), lambda s: s.pcie_replay_total == 12),
        (
            fault("not_supported", symbol="nvmlDeviceGetPcieReplayCounter"),
            lambda s: not s.HasField("pcie_replay_total"),
        ),
        (fault("lost"), lambda s: s.lost and not s.HasField("ecc_sbe_volatile")),
    ],
    ids=lambda v: v.kind if isinstance(v, scenario.Fault) else "",
)
def test_each_injected_fault_shows_in_the_sample(
    node: SimulatedNode, injected: scenario.Fault, check: object
) -> None:
    source = NvmlSource()
    before = source.sample()[2]
    scenario.apply(node.gpus[2], injected)
    after = source.sample()
    assert check(after[2]), after[2]  # type: ignore[operator]
    assert not check(before), "the fault was not there before"  # type: ignore[operator]
    assert not after[1].lost and after[1].ecc_dbe_volatile == 0, "other GPUs are untouched"


def test_a_lost_gpu_is_logged_once_and_its_return_with_the_count(
    node: SimulatedNode, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue: a lost GPU's collector logged an error every second (445 lines in 8 minutes)."""
    source = NvmlSource()
    scenario.apply(node.gpus[4], fault("lost"))
    with caplog.at_level(logging.INFO, logger="gpufleet"):
        lost = [source.sample()[4].lost for _ in range(5)]
        scenario.apply(node.gpus[4], fault("recover"))
        back = source.sample()[4]
    assert lost == [True] * 5 and not back.lost
    said = [r.getMessage() for r in caplog.records if "GPU 4" in r.getMessage()]
    assert len(said) == 2, said
    assert "is lost: NVML answers GPU_IS_LOST" in said[0] and "again after 5 lost samples" in said[1], said


def test_slow_down_lowers_the_sm_clock(node: SimulatedNode, clock: FakeClock) -> None:
    source = NvmlSource()
    clock.now += 30  # under load
    normal = source.sample()[0].clock_sm_mhz
    scenario.apply(node.gpus[0], fault("thermal"))
    assert source.sample()[0].clock_sm_mhz < 0.7 * normal
    clock.now += 120  # the slowdown holds it at its slowdown temperature, not cooling back down
    assert 87 <= source.sample()[0].temp_gpu_c <= 90


def test_xid_from_the_nvml_event_set_is_delivered_at_once(node: SimulatedNode) -> None:
    import queue
    import time as _time

    source = NvmlSource()
    got: queue.Queue[object] = queue.Queue()
    watcher = NvmlXidWatcher(source, got.put)
    assert watcher.start() and watcher.registered == list(range(8))
    try:
        t0 = _time.monotonic()
        node.gpus[6].inject_xid(79)
        event = got.get(timeout=5)
        assert _time.monotonic() - t0 < 1.0
        assert (event.kind, event.source, event.xid, event.gpu_index) == (
            vocabulary_pb2.EVENT_KIND_XID,
            vocabulary_pb2.EVENT_SOURCE_NVML,
            79,
            6,
        )
        assert event.pci_bus_id == node.gpus[6].pci_bus_id
    finally:
        watcher.stop()
    assert not node.gpus[6].xid_listeners, "freeing the event set unregisters it"


@pytest.mark.parametrize(
    "text,message",
    [
        ('[[fault]]\nat_s = 1\ngpu = 0\nkind = "meltdown"\n', "kind 'meltdown' is not one of"),
        ('[[fault]]\nat_s = 1\ngpu = 0\nkind = "xid"\n', "missing xid"),
        ('[[fault]]\nat_s = 1\ngpu = 0\nkind = "lost"\nxid = 3\n', "unknown key(s) xid"),
        ('[[fault]]\ngpu = 0\nkind = "lost"\n', "missing at_s"),
        ("[[fault]\n", "cannot read scenario"),
    ],
)
def test_bad_scenarios_are_refused_with_the_fault_named(tmp_path: object, text: str, message: str) -> None:
    path = tmp_path / "s.toml"  # type: ignore[operator]
    path.write_text(text)
    with pytest.raises(scenario.ScenarioError) as info:
        scenario.load(path)
    assert message in str(info.value)


def test_nvlink_totals_fall_back_to_per_link_counters_without_field_values(node: SimulatedNode) -> None:
    scenario.apply(node.gpus[2], fault("nvlink_errors", link=4, count=5))
    fast = NvmlSource().sample()[2]
    calls_fast = pynvml.nvmlLib.calls.get("nvmlDeviceGetNvLinkErrorCounter", 0)
    assert calls_fast == 0, "the totals came from one field-values call"
    for gpu in node.gpus:
        gpu.fail_symbols["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    slow = NvmlSource().sample()[2]
    assert pynvml.nvmlLib.calls["nvmlDeviceGetNvLinkErrorCounter"] > 0
    for name in ("nvlink_replay_total", "nvlink_crc_total", "nvlink_recovery_total"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert (fast.nvlink_replay_total, fast.nvlink_crc_total) == (5, 5)
    assert fast.HasField("temp_mem_c") and not slow.HasField("temp_mem_c")
