"""NVIDIA GPUs on the PCI bus, counted in sysfs: a GPU the bus shows and NVML does not list is
missing from the driver (it failed to initialise, or fell off before the driver loaded), which
NVML alone can never report."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("gpufleet.collector.pci")

NVIDIA_VENDOR = "0x10de"
# PCI class codes (class, subclass) of a GPU: VGA-compatible (0x0300) and 3D controller (0x0302).
# NVSwitches (bridge class 0x0680) and the GPU's audio function (0x0403) are not GPUs; nor is
# a GPU bound to vfio-pci (passed through to a VM).
GPU_CLASSES = ("0x0300", "0x0302")


def count_nvidia_gpus(devices_dir: str | Path) -> int | None:
    """NVIDIA GPUs under devices_dir (/sys/bus/pci/devices); None when it cannot be read."""
    try:
        entries = list(Path(devices_dir).iterdir())
    except OSError as exc:
        log.warning("cannot count GPUs on the PCI bus in %s: %s", devices_dir, exc)
        return None
    count = 0
    for device in entries:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            pci_class = (device / "class").read_text().strip().lower()
        except OSError:
            continue  # a device that went away while it was read, or no such attributes
        if vendor != NVIDIA_VENDOR or pci_class[:6] not in GPU_CLASSES:
            continue
        if (device / "driver").resolve().name == "vfio-pci":
            continue  # handed to a VM on purpose: not the host driver's to list
        count += 1
    return count
