"""One NVML call of one GPU made to hang in C, on the real driver: a tiny shared library whose
nvmlDeviceGetPowerUsage blocks (in C, in a thread Python cannot interrupt, as a call stuck in
the driver does) for one device handle until a release file exists, and otherwise calls the
real library's function. pynvml is given an object that answers that one symbol from the shim
and every other from the real library, so the collector's every other call is the driver's own.
Used by bench/real_gpu_hidden.py; on the stand-in (--simulate) the "real" library is the C
stand-in (collector/simnvml/clibrary.py), so the dry run takes the same path.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pynvml

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*power_fn)(void *device, unsigned int *milliwatts);
static power_fn real_power;
static void *blocked_device;
static char release_path[1024];

void gpufleet_interpose(power_fn real, void *device, const char *release) {
    real_power = real;
    blocked_device = device;
    strncpy(release_path, release, sizeof release_path - 1);
}

int nvmlDeviceGetPowerUsage(void *device, unsigned int *milliwatts) {
    struct timespec step = {0, 20 * 1000 * 1000};
    if (device == blocked_device)
        while (access(release_path, F_OK) != 0) nanosleep(&step, 0);
    return real_power(device, milliwatts);
}
"""
SHIMMED = frozenset({"nvmlDeviceGetPowerUsage"})


class Interposed:
    """What pynvml looks its functions up on: the shim's for SHIMMED, the real library's else."""

    def __init__(self, real: Any, shim: ctypes.CDLL) -> None:
        self._real, self._shim = real, shim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shim if name in SHIMMED else self._real, name)


def block_power_call(device: Any, release: Path, directory: Path) -> Any:
    """Make `device`'s power call hang in C until `release` exists; return the library pynvml
    used before (put it back with restore())."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) to build the NVML interposer: install gcc")
    c_file, so = directory / "nvml_interpose.c", directory / "nvml_interpose.so"
    c_file.write_text(SOURCE)
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(so), str(c_file)], check=True, timeout=120)
    real = pynvml.nvmlLib
    shim = ctypes.CDLL(str(so))
    real_power = ctypes.cast(real.nvmlDeviceGetPowerUsage, ctypes.c_void_p)
    shim.gpufleet_interpose(real_power, ctypes.cast(device, ctypes.c_void_p), str(release).encode())
    restore(Interposed(real, shim))
    return real


def restore(library: Any) -> None:
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
