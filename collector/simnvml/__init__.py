"""A stand-in NVML library that answers pynvml's calls with simulated GPUs.

It sits *beneath* pynvml (in `pynvml.nvmlLib`), so the collector runs its real NVML code
path — symbol names, ctypes structs, error codes — on machines without a GPU.
"""

from gpufleet.collector.simnvml.library import SimulatedNvmlLibrary, install, uninstall
from gpufleet.collector.simnvml.machine import GPU_PROFILES, GpuProfile, SimulatedGpu, SimulatedNode

__all__ = [
    "GPU_PROFILES",
    "GpuProfile",
    "SimulatedGpu",
    "SimulatedNode",
    "SimulatedNvmlLibrary",
    "install",
    "uninstall",
]
