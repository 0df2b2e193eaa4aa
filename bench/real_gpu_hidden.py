"""On a real NVIDIA GPU: what the driver answers for each signal of the failures it hides, and
the call-deadline path (docs/repair.md "Failures the driver hides"). Prints one JSON document.

- each new field per GPU: recovery action, PCIe link gen/width now and max, NVLink fabric
  state/status, the corrected-ECC rate (two samples, `--gap-s` apart): present, or absent;
- the GPUs on the PCI bus (sysfs) against the GPUs NVML lists;
- the deadline path on the real driver: GPU 0's power call made to block in C (a shim library
  in front of the real one, for that symbol and GPU 0 only: bench/nvml_interpose.py) while the
  real calls of every GPU go on; the sampler must report GPU 0 driver_unresponsive within the
  deadline, sample every other GPU (on one GPU: every tick back within the deadline), and
  recover once the call is let go.

    python bench/real_gpu_hidden.py [--deadline-s 1.0] [--gap-s 2.0]
    python bench/real_gpu_hidden.py --simulate   # the same on the C stand-in NVML (no GPU)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from nvml_interpose import block_power_call, restore  # bench/nvml_interpose.py

from gpufleet.collector.sources.deadline import DeadlineSampler
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.collector.sources.pci_bus import count_nvidia_gpus

HIDDEN_FIELDS = (
    "recovery_action",
    "pcie_link_gen",
    "pcie_link_gen_max",
    "pcie_link_width",
    "pcie_link_width_max",
    "fabric_state",
    "fabric_status",
    "ecc_sbe_rate_per_s",
    # The slowness rule's work signals: GPM (Hopper and later; needs two samples) and the target clock.
    "clock_sm_target_mhz",
    "sm_active_pct",
    "tensor_active_pct",
)


def fields(source: NvmlSource, gap_s: float) -> list[dict[str, Any]]:
    source.sample()  # the first corrected-ECC count and GPM sample: the rate and GPM need two
    time.sleep(gap_s)  # a benchmark's pause between two real samples, not synchronisation
    out = []
    for sample in source.sample():
        row: dict[str, Any] = {"gpu": sample.index, "model": sample.model}
        for name in HIDDEN_FIELDS:
            row[name] = getattr(sample, name) if sample.HasField(name) else "absent"
        out.append(row)
    return out


def deadline_path(source: NvmlSource, deadline_s: float, workdir: Path) -> dict[str, Any]:
    # GPU 0's power call blocked in C (bench/nvml_interpose.py): a foreign call that does not
    # return, as a call stuck in the driver; every other call is the driver's own.
    release = workdir / "release-gpu0"
    before = block_power_call(source.gpus[0].handle, release, workdir)
    sampler = DeadlineSampler(source, deadline_s)
    started = time.monotonic()
    flagged_after_s = None
    ticks = []
    tick_s: list[float] = []
    try:
        while time.monotonic() - started < deadline_s * 4 + 5:
            tick_started = time.monotonic()
            samples = sampler.sample(wait_s=deadline_s)
            tick_s.append(time.monotonic() - tick_started)
            by_gpu = {s.index: s for s in samples}
            ticks.append(sorted(by_gpu))
            if by_gpu.get(0) is not None and by_gpu[0].driver_unresponsive:
                flagged_after_s = round(time.monotonic() - started, 3)
                call = by_gpu[0].driver_unresponsive_call
                others = [i for i in by_gpu if i != 0 and not by_gpu[i].driver_unresponsive]
                break
        else:
            call, others = "", []
        release.touch()
        recovered_after_s = None
        for _ in range(20):
            samples = sampler.sample(wait_s=deadline_s)
            first = next((s for s in samples if s.index == 0), None)
            if first is not None and not first.driver_unresponsive and first.HasField("power_w"):
                recovered_after_s = round(time.monotonic() - started, 3)
                break
    finally:
        release.touch()
        restore(before)
    # On one GPU there is no other GPU to keep sampling: what still tells is that every tick
    # came back within the deadline (plus a margin) while the call was stuck.
    others_ok: bool | str = len(others) == len(source.gpus) - 1 if len(source.gpus) > 1 else "n/a: one GPU"
    return {
        "deadline_s": deadline_s,
        "gpu0_flagged_after_s": flagged_after_s,
        "gpu0_stuck_call": call,
        "other_gpus_sampled_while_stuck": others,
        "others_kept_sampling": others_ok,
        "gpus_in_total": len(source.gpus),
        "longest_tick_while_stuck_s": round(max(tick_s), 3) if tick_s else None,
        "hung_calls_counted": sampler.hung_total,
        "gpu0_recovered_after_s": recovered_after_s,
        "ok": flagged_after_s is not None
        and flagged_after_s <= deadline_s * 2 + 1
        and recovered_after_s is not None
        and others_ok is not False
        and bool(tick_s)
        and max(tick_s) <= deadline_s + 0.5,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deadline-s", type=float, default=1.0)
    ap.add_argument("--gap-s", type=float, default=2.0)
    ap.add_argument("--simulate", action="store_true", help="the stand-in NVML (4 GPUs), for a dry run")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="real-gpu-hidden-"))
    if args.simulate:
        from gpufleet.collector.simnvml.clibrary import build, install_c
        from gpufleet.collector.simnvml.library import SimulatedNvmlLibrary
        from gpufleet.collector.simnvml.machine import SimulatedNode

        node = SimulatedNode("dry-run", 4, "H100")
        install_c(build(workdir), SimulatedNvmlLibrary(node))
    on_bus = lambda: count_nvidia_gpus("/sys/bus/pci/devices")  # noqa: E731
    if args.simulate:
        on_bus = node.pci_gpu_count  # the simulated bus, not this host's
    source = NvmlSource()
    try:
        bus = on_bus()
        report = {
            "driver_version": source.driver_version,
            "gpus_nvml_lists": len(source.gpus),
            "gpus_on_pci_bus": bus,
            # A GPU on the bus that NVML does not list is the fault gpu_missing_from_driver finds.
            "bus_matches_nvml": bus == len(source.gpus) if bus is not None else "bus not readable",
            "fields": fields(source, args.gap_s),
            "deadline_path": deadline_path(source, args.deadline_s, workdir),
        }
    finally:
        source.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
