"""The signals for failures the driver hides, read through pynvml over the stand-in NVML (and
sysfs for the PCI bus): present where the GPU has them, absent where it has not, never zero
for "unknown"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install, uninstall
from gpufleet.collector.simnvml.machine import Hang
from gpufleet.collector.sources.deadline import DeadlineSampler
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.collector.sources.pci_bus import count_nvidia_gpus
from harness.clock import FakeClock
from harness.paths import REPO


def test_link_fabric_and_recovery_action_are_read(node: SimulatedNode, clock: FakeClock) -> None:
    source = NvmlSource()
    idle = source.sample()
    assert {(s.pcie_link_gen, s.pcie_link_gen_max, s.pcie_link_width) for s in idle} == {(1, 5, 16)}, (
        "an idle link trains down to Gen1 (its width stays)"
    )
    node.forced_util_pct = 97
    node.gpus[2].pcie_gen, node.gpus[2].pcie_width = 3, 8
    node.gpus[4].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    node.gpus[6].fabric_state, node.gpus[6].fabric_status = 2, 0
    clock.now += 30
    busy = source.sample()
    assert (busy[0].pcie_link_gen, busy[0].pcie_link_width) == (5, 16)
    assert (busy[2].pcie_link_gen, busy[2].pcie_link_width, busy[2].pcie_link_width_max) == (3, 8, 16)
    assert [s.recovery_action for s in busy] == [0, 0, 0, 0, 1, 0, 0, 0]
    assert busy[6].fabric_state == 2 and busy[0].fabric_state == 3
    assert all(s.HasField("recovery_action") and s.HasField("fabric_status") for s in busy)
    source.close()


def test_an_operators_power_limit_holds_the_gpu_with_the_cap_reason_and_a_lower_clock(
    node: SimulatedNode, clock: FakeClock
) -> None:
    """Two of eight GPUs capped at 450 W (nvidia-smi -pl) under a steady job: NVML reads their
    limit, their power at it, the SW power-cap reason and a lower SM clock; the others read
    the board's 700 W, no cap reason, the full clock. Lifting the limit (heal) undoes it."""
    from gpufleet.collector.simnvml.scenario import Fault, apply

    source = NvmlSource()
    node.forced_util_pct = 97
    for gpu in (0, 1):
        apply(node.gpus[gpu], Fault(0, gpu, "power_limit", watts=450))
    clock.now += 30
    samples = source.sample()
    capped, free = samples[:2], samples[2:]
    assert {s.power_limit_w for s in capped} == {450.0} and {s.power_limit_w for s in free} == {700.0}
    assert all(
        s.power_w <= 450.0 and s.clock_event_reasons & pynvml.nvmlClocksEventReasonSwPowerCap for s in capped
    )
    assert all(
        s.power_w > 600 and not s.clock_event_reasons & pynvml.nvmlClocksEventReasonSwPowerCap for s in free
    )
    assert max(s.clock_sm_mhz for s in capped) < 0.93 * min(s.clock_sm_mhz for s in free)
    apply(node.gpus[0], Fault(0, 0, "heal"))
    clock.now += 30
    healed = source.sample()[0]
    assert (
        healed.power_limit_w == 700.0
        and not healed.clock_event_reasons & pynvml.nvmlClocksEventReasonSwPowerCap
    )
    source.close()


def test_a_gpu_reset_clears_the_recovery_action_and_the_storm(node: SimulatedNode, clock: FakeClock) -> None:
    """What a reset clears on a real GPU: the recovery action NVML asked it for, the volatile
    counts, a corrected-error storm from the row it remaps."""
    gpu = node.gpus[3]
    gpu.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    gpu.sbe_rate_per_s = 5000.0
    clock.now += 10
    source = NvmlSource()
    before = source.sample()[3]
    assert before.recovery_action == 1 and before.ecc_sbe_volatile > 0
    gpu.reset()
    clock.now += 10
    after = source.sample()[3]
    assert after.recovery_action == 0 and after.ecc_sbe_volatile == 0
    source.close()


def test_a_gpu_without_a_fabric_leaves_it_absent(clock: FakeClock) -> None:
    sim = SimulatedNode("a100-node", gpu_count=2, model="A100", seed=1, clock=clock)
    install(SimulatedNvmlLibrary(sim))
    try:
        source = NvmlSource()
        samples = source.sample()
        assert not any(s.HasField("fabric_state") for s in samples)
        assert {s.pcie_link_gen_max for s in samples} == {4}
        assert source.errors_total == 0, "no fabric is NOT_SUPPORTED, not an error"
        source.close()
    finally:
        uninstall()


def test_the_corrected_error_rate_is_per_second_between_samples(node: SimulatedNode) -> None:
    source = NvmlSource()
    first = source.sample()
    assert not any(s.HasField("ecc_sbe_rate_per_s") for s in first), "no rate from one sample"
    # The rate is over the collector's own (monotonic) time, which this fixture's clock does not
    # move: 400 errors land, and at least 0.2 s passes before the next sample.
    node.gpus[1].ecc_sbe_volatile += 400
    time.sleep(0.2)
    later = source.sample()
    assert 0 < later[1].ecc_sbe_rate_per_s <= 2000
    assert all(s.ecc_sbe_rate_per_s == 0 for i, s in enumerate(later) if i != 1)
    source.close()


def test_a_deadline_sampler_reports_only_the_stuck_gpu_and_recovers(
    node: SimulatedNode, tmp_path: Path
) -> None:
    source = NvmlSource()
    sampler = DeadlineSampler(source, deadline_s=0.3)
    release = tmp_path / "release"
    node.gpus[5].hangs["nvmlDeviceGetMemoryInfo"] = Hang(release_file=str(release))
    ticks = []
    for _ in range(4):
        started = time.monotonic()
        ticks.append(sampler.sample(wait_s=0.3))
        assert time.monotonic() - started < 1.0, "a tick never waits (much) past the deadline"
    for tick in ticks:
        assert {s.index for s in tick} >= set(range(8)) - {5}
    stuck = next(s for s in ticks[-1] if s.index == 5)
    assert stuck.driver_unresponsive and stuck.driver_unresponsive_call == "nvmlDeviceGetMemoryInfo"
    assert not stuck.HasField("util_gpu_pct") and stuck.driver_unresponsive_s >= 0.3
    assert sampler.hung_total == 1 and [u.index for u in sampler.unresponsive] == [5]
    release.touch()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tick = sampler.sample(wait_s=0.3)
        five = [s for s in tick if s.index == 5]
        if five and not five[0].driver_unresponsive:
            break
    assert five and five[0].HasField("util_gpu_pct"), "GPU 5 samples again once its call returns"
    assert sampler.unresponsive == []


def _device(root: Path, name: str, vendor: str, pci_class: str, driver: str | None = None) -> None:
    dev = root / name
    dev.mkdir()
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(pci_class + "\n")
    if driver:
        (root.parent / driver).mkdir(exist_ok=True)
        os.symlink(root.parent / driver, dev / "driver")


def test_gpus_on_the_pci_bus_are_counted_from_sysfs(tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    devices.mkdir()
    _device(devices, "0000:18:00.0", "0x10de", "0x030200", "nvidia")  # an H100 (3D controller)
    _device(devices, "0000:29:00.0", "0x10de", "0x030200")  # on the bus, no driver bound
    _device(devices, "0000:3a:00.0", "0x10de", "0x030000", "nvidia")  # a VGA-class GPU
    _device(devices, "0000:4b:00.0", "0x10de", "0x068000", "nvidia")  # an NVSwitch (bridge)
    _device(devices, "0000:4b:00.1", "0x10de", "0x040300")  # a GPU's audio function
    _device(devices, "0000:5c:00.0", "0x10de", "0x030200", "vfio-pci")  # passed through to a VM
    _device(devices, "0000:00:1f.0", "0x8086", "0x030000", "i915")  # not NVIDIA
    (devices / "0000:6d:00.0").mkdir()  # a device without the attributes (going away)
    assert count_nvidia_gpus(devices) == 3
    assert count_nvidia_gpus(tmp_path / "absent") is None


@pytest.mark.skipif(not Path("/sys/bus/pci/devices").is_dir(), reason="no sysfs PCI tree here")
def test_this_hosts_pci_bus_is_readable() -> None:
    count = count_nvidia_gpus("/sys/bus/pci/devices")
    assert count is not None and count >= 0


def test_the_real_gpu_check_of_hidden_signals_runs_on_the_stand_in() -> None:
    """bench/real_gpu_hidden.py is what a lent GPU runs (bench/real_gpu.sh): dry-run here on the
    C stand-in NVML, every new field is read, the bus count is compared with NVML's, and GPU 0's
    call blocked in C (the interposer a real driver gets) is flagged and recovered while the
    other GPUs are sampled."""
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "real_gpu_hidden.py"),
            "--simulate",
            "--deadline-s",
            "0.3",
            "--gap-s",
            "0.2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["gpus_nvml_lists"] == 4 and report["bus_matches_nvml"] is True
    for row in report["fields"]:
        assert "absent" not in row.values(), row
    path = report["deadline_path"]
    assert path["ok"] and path["gpu0_stuck_call"] == "nvmlDeviceGetPowerUsage", path
    assert path["other_gpus_sampled_while_stuck"] == [1, 2, 3] and path["hung_calls_counted"] == 1
