"""The stand-in for libnvidia-ml.so.1: an object whose attributes are NVML's C symbols.

pynvml looks every function up by name on `pynvml.nvmlLib` and calls it with ctypes
arguments (`byref(c_uint())`, string buffers, `c_nvmlDevice_t` handles); each function
here fills those arguments the way the C library does and returns an NVML return code.
A symbol that is not defined here raises AttributeError, which pynvml turns into
NVML_ERROR_FUNCTION_NOT_FOUND — exactly what an old driver does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pynvml

from gpufleet.collector.simnvml.args import arg_target, arg_value
from gpufleet.collector.simnvml.devices import Devices
from gpufleet.collector.simnvml.machine import SimulatedNode
from gpufleet.collector.simnvml.symbols_events import EventSymbols
from gpufleet.collector.simnvml.symbols_health import HealthSymbols
from gpufleet.collector.simnvml.symbols_hidden import HiddenFailureSymbols
from gpufleet.collector.simnvml.symbols_work import WorkSymbols

_ERROR_STRINGS = {
    pynvml.NVML_SUCCESS: b"Success",
    pynvml.NVML_ERROR_UNINITIALIZED: b"Uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: b"Invalid Argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: b"Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: b"Insufficient Permissions",
    pynvml.NVML_ERROR_NOT_FOUND: b"Not Found",
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    pynvml.NVML_ERROR_GPU_IS_LOST: b"GPU is lost",
    pynvml.NVML_ERROR_TIMEOUT: b"Timeout",
    pynvml.NVML_ERROR_UNKNOWN: b"Unknown Error",
}

_install_lock = threading.Lock()


def _symbol(method: Callable[..., int]) -> Callable[..., int]:
    """Wrap a bound method in a plain function: pynvml sets attributes such as `restype`
    on the functions it looks up, which bound methods do not allow."""

    def fn(*args: Any) -> int:
        return method(*args)

    fn.__name__ = method.__name__
    return fn


class CoreSymbols:
    """The library itself, the devices' identity, their samples and clocks."""

    def __init__(self, devices: Devices) -> None:
        self._devices = devices
        self.node = devices.node

    # --- library -------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: Any) -> int:
        self.node.wait_if_hung("nvmlInitWithFlags")
        self._devices.initialized += 1
        return pynvml.NVML_SUCCESS

    def nvmlShutdown(self) -> int:
        if not self._devices.initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        self._devices.initialized -= 1
        return pynvml.NVML_SUCCESS

    def nvmlErrorString(self, code: Any) -> bytes:
        return _ERROR_STRINGS.get(arg_value(code), b"Unknown Error")

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        return self._devices.write_string(buffer, size, self.node.driver_version)

    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> int:
        if not self._devices.initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        arg_target(count_ref).value = len(self.node.gpus)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle_ref: Any) -> int:
        if not self._devices.initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        i = arg_value(index)
        if not 0 <= i < len(self._devices.handles):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        arg_target(handle_ref).contents = self._devices.handles[i]
        return pynvml.NVML_SUCCESS

    # --- identity ------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetUUID")
        return rc if gpu is None else self._devices.write_string(buffer, size, gpu.uuid)

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetName")
        return rc if gpu is None else self._devices.write_string(buffer, size, gpu.profile.name)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetPciInfo_v3")
        if gpu is None:
            return rc
        info = arg_target(info_ref)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        info.pciDeviceId = 0x233010DE
        return pynvml.NVML_SUCCESS

    # --- samples -------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Any, util_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu is None:
            return rc
        util = arg_target(util_ref)
        util.gpu = round(gpu.util_gpu_pct)
        util.memory = round(gpu.util_mem_pct)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, mem_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetMemoryInfo")
        if gpu is None:
            return rc
        mem = arg_target(mem_ref)
        mem.total = gpu.profile.hbm_total_bytes
        mem.used = gpu.hbm_used_bytes
        mem.free = gpu.profile.hbm_total_bytes - gpu.hbm_used_bytes
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetTemperature")
        if gpu is None:
            return rc
        if arg_value(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        arg_target(temp_ref).value = round(gpu.temp_gpu_c)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: Any, milliwatts_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetPowerUsage")
        if gpu is None:
            return rc
        arg_target(milliwatts_ref).value = round(gpu.power_w * 1000)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, milliwatts_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")
        if gpu is None:
            return rc
        arg_target(milliwatts_ref).value = round(gpu.enforced_power_limit_w() * 1000)
        return pynvml.NVML_SUCCESS

    # --- clocks and clock-event reasons ---------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, mhz_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetClockInfo")
        if gpu is None:
            return rc
        kind = arg_value(clock_type)
        if kind == pynvml.NVML_CLOCK_SM:
            arg_target(mhz_ref).value = round(gpu.sm_clock_mhz())
        elif kind == pynvml.NVML_CLOCK_MEM:
            arg_target(mhz_ref).value = round(gpu.profile.mem_clock_mhz)
        else:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        if gpu is None:
            return rc
        arg_target(reasons_ref).value = gpu.clock_event_reasons()
        return pynvml.NVML_SUCCESS

    # --- memory errors ---------------------------------------------------------------
    # --- interconnect ----------------------------------------------------------------
    # --- processes -------------------------------------------------------------------
    # --- events ----------------------------------------------------------------------


class SimulatedNvmlLibrary:
    """Answers pynvml's NVML calls from a SimulatedNode: each symbol is one of its groups'
    (the core, health, hidden failures, events, work), each group given the devices."""

    GROUPS = (CoreSymbols, HealthSymbols, HiddenFailureSymbols, EventSymbols, WorkSymbols)

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.devices = Devices(node)
        self.calls = self.devices.calls
        groups = [g(self.devices) for g in self.GROUPS]
        self.work = next(g for g in groups if isinstance(g, WorkSymbols))  # its GPM samples, for tests
        for group in groups:
            for name in dir(group):
                if name.startswith("nvml"):
                    setattr(self, name, _symbol(getattr(group, name)))

    @classmethod
    def symbol_names(cls) -> set[str]:
        """The NVML C symbols the stand-in answers."""
        return {name for g in cls.GROUPS for name in dir(g) if name.startswith("nvml")}


def install(library: SimulatedNvmlLibrary) -> None:
    """Put the stand-in where pynvml keeps its loaded library. Call before nvmlInit()."""
    with _install_lock:
        pynvml.nvmlLib = library
        # pynvml caches looked-up function pointers by name; drop any from another library.
        pynvml._nvmlGetFunctionPointer_cache.clear()


def uninstall() -> None:
    """Forget the stand-in, so the next nvmlInit() loads the real library again."""
    with _install_lock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
