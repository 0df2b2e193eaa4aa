"""The stand-in for libnvidia-ml.so.1: an object whose attributes are NVML's C symbols.

pynvml looks every function up by name on `pynvml.nvmlLib` and calls it with ctypes
arguments (`byref(c_uint())`, string buffers, `c_nvmlDevice_t` handles); each function
here fills those arguments the way the C library does and returns an NVML return code.
A symbol that is not defined here raises AttributeError, which pynvml turns into
NVML_ERROR_FUNCTION_NOT_FOUND — exactly what an old driver does.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpufleet.collector.simnvml.machine import SimulatedGpu, SimulatedNode

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


def _value(arg: Any) -> Any:
    """The Python value of a ctypes scalar argument (c_uint(3) -> 3)."""
    return arg.value if hasattr(arg, "value") else arg


def _target(ref: Any) -> Any:
    """The object behind a byref() argument."""
    return ref._obj


def _symbol(method: Callable[..., int]) -> Callable[..., int]:
    """Wrap a bound method in a plain function: pynvml sets attributes such as `restype`
    on the functions it looks up, which bound methods do not allow."""

    def fn(*args: Any) -> int:
        return method(*args)

    fn.__name__ = method.__name__
    return fn


class SimulatedNvmlLibrary:
    """Answers pynvml's NVML calls from a SimulatedNode."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.calls: dict[str, int] = {}
        self._initialized = 0
        self._handles = [pynvml.struct_c_nvmlDevice_t() for _ in node.gpus]
        self._event_sets: dict[int, _EventSet] = {}
        self._gpu_by_address = {
            ctypes.addressof(h): gpu for h, gpu in zip(self._handles, node.gpus, strict=True)
        }
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(self, name, _symbol(getattr(self, name)))

    # --- helpers -------------------------------------------------------------------
    def _gpu(self, handle: Any, symbol: str) -> tuple[SimulatedGpu | None, int]:
        """Resolve a device handle; return (gpu, NVML_SUCCESS) or (None, error code)."""
        self.calls[symbol] = self.calls.get(symbol, 0) + 1
        if not self._initialized:
            return None, pynvml.NVML_ERROR_UNINITIALIZED
        try:
            gpu = self._gpu_by_address[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError, AttributeError):
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        if gpu.lost:
            return None, pynvml.NVML_ERROR_GPU_IS_LOST
        if symbol in gpu.fail_symbols:
            return None, gpu.fail_symbols[symbol]
        self.node.advance()
        return gpu, pynvml.NVML_SUCCESS

    @staticmethod
    def _write_string(buffer: Any, size: Any, text: str) -> int:
        data = text.encode()
        if len(data) + 1 > _value(size):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        buffer.value = data
        return pynvml.NVML_SUCCESS

    # --- library -------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: Any) -> int:
        self._initialized += 1
        return pynvml.NVML_SUCCESS

    def nvmlShutdown(self) -> int:
        if not self._initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        self._initialized -= 1
        return pynvml.NVML_SUCCESS

    def nvmlErrorString(self, code: Any) -> bytes:
        return _ERROR_STRINGS.get(_value(code), b"Unknown Error")

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        return self._write_string(buffer, size, self.node.driver_version)

    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> int:
        if not self._initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        _target(count_ref).value = len(self.node.gpus)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle_ref: Any) -> int:
        if not self._initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        i = _value(index)
        if not 0 <= i < len(self._handles):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(handle_ref).contents = self._handles[i]
        return pynvml.NVML_SUCCESS

    # --- identity ------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetUUID")
        return rc if gpu is None else self._write_string(buffer, size, gpu.uuid)

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetName")
        return rc if gpu is None else self._write_string(buffer, size, gpu.profile.name)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetPciInfo_v3")
        if gpu is None:
            return rc
        info = _target(info_ref)
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
        gpu, rc = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu is None:
            return rc
        util = _target(util_ref)
        util.gpu = round(gpu.util_gpu_pct)
        util.memory = round(gpu.util_mem_pct)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, mem_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if gpu is None:
            return rc
        mem = _target(mem_ref)
        mem.total = gpu.profile.hbm_total_bytes
        mem.used = gpu.hbm_used_bytes
        mem.free = gpu.profile.hbm_total_bytes - gpu.hbm_used_bytes
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetTemperature")
        if gpu is None:
            return rc
        if _value(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(temp_ref).value = round(gpu.temp_gpu_c)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: Any, milliwatts_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        if gpu is None:
            return rc
        _target(milliwatts_ref).value = round(gpu.power_w * 1000)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, milliwatts_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")
        if gpu is None:
            return rc
        _target(milliwatts_ref).value = round(gpu.profile.power_limit_w * 1000)
        return pynvml.NVML_SUCCESS

    # --- clocks and clock-event reasons ---------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, mhz_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if gpu is None:
            return rc
        kind = _value(clock_type)
        if kind == pynvml.NVML_CLOCK_SM:
            _target(mhz_ref).value = round(gpu.sm_clock_mhz())
        elif kind == pynvml.NVML_CLOCK_MEM:
            _target(mhz_ref).value = round(gpu.profile.mem_clock_mhz)
        else:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        if gpu is None:
            return rc
        _target(reasons_ref).value = gpu.clock_event_reasons()
        return pynvml.NVML_SUCCESS

    # --- memory errors ---------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, count_ref: Any
    ) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if gpu is None:
            return rc
        uncorrected = _value(error_type) == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        aggregate = _value(counter_type) == pynvml.NVML_AGGREGATE_ECC
        _target(count_ref).value = {
            (False, False): gpu.ecc_sbe_volatile,
            (True, False): gpu.ecc_dbe_volatile,
            (False, True): gpu.ecc_sbe_aggregate,
            (True, True): gpu.ecc_dbe_aggregate,
        }[(uncorrected, aggregate)]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count_ref: Any, pages: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        if gpu is None:
            return rc
        if gpu.profile.row_remapping:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        retired = gpu.retired_pages_dbe if _value(cause) == 1 else gpu.retired_pages_sbe
        count = _target(count_ref)
        if pages is None or count.value < len(retired):
            # The first call passes a zero count and no buffer: say how many, write nothing.
            count.value = len(retired)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if retired else pynvml.NVML_SUCCESS
        for i, address in enumerate(retired):
            pages[i] = address
        count.value = len(retired)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, pending_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        if gpu is None:
            return rc
        if gpu.profile.row_remapping:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _target(pending_ref).value = int(gpu.retired_pages_pending)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        if gpu is None:
            return rc
        if not gpu.profile.row_remapping:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _target(corr).value = gpu.remap_correctable
        _target(unc).value = gpu.remap_uncorrectable
        _target(pending).value = int(gpu.remap_pending)
        _target(failure).value = int(gpu.remap_failure)
        return pynvml.NVML_SUCCESS

    # --- interconnect ----------------------------------------------------------------
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any, count_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetPcieReplayCounter")
        if gpu is None:
            return rc
        _target(count_ref).value = gpu.pcie_replay_total
        return pynvml.NVML_SUCCESS

    def _link(self, handle: Any, link: Any, symbol: str) -> tuple[SimulatedGpu | None, int]:
        gpu, rc = self._gpu(handle, symbol)
        if gpu is None:
            return None, rc
        if not gpu.profile.nvlink_links:
            return None, pynvml.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= _value(link) < gpu.profile.nvlink_links:
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        return gpu, pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active_ref: Any) -> int:
        gpu, rc = self._link(handle, link, "nvmlDeviceGetNvLinkState")
        if gpu is None:
            return rc
        _target(active_ref).value = int(_value(link) not in gpu.nvlink_down)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any, value_ref: Any) -> int:
        gpu, rc = self._link(handle, link, "nvmlDeviceGetNvLinkErrorCounter")
        if gpu is None:
            return rc
        _target(value_ref).value = gpu.nvlink_errors.get((_value(link), _value(counter)), 0)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetFieldValues")
        if gpu is None:
            return rc
        values = _target(values_ref)
        for i in range(_value(count)):
            entry = values[i]
            entry.timestamp = time.time_ns() // 1000
            result = self._field_value(gpu, entry.fieldId)
            if result is None:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            entry.nvmlReturn = pynvml.NVML_SUCCESS
            if isinstance(result, float):
                entry.valueType = pynvml.NVML_VALUE_TYPE_DOUBLE
                entry.value.dVal = result
            else:
                entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                entry.value.ullVal = result
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _field_value(gpu: SimulatedGpu, field_id: int) -> int | float | None:
        """A field's value, or None for NOT_SUPPORTED (answered per field, as NVML does)."""
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return round(gpu.temp_gpu_c + 6) if gpu.profile.hbm else None
        counters = {
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
            pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        }
        if field_id in counters:
            if not gpu.profile.nvlink_links:
                return None
            return sum(v for (_, c), v in gpu.nvlink_errors.items() if c == counters[field_id])
        return None

    # --- processes -------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count_ref: Any, infos: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses_v3")
        if gpu is None:
            return rc
        count = _target(count_ref)
        procs = gpu.processes
        if not procs:
            count.value = 0
            return pynvml.NVML_SUCCESS
        if infos is None or count.value < len(procs):
            count.value = len(procs)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(procs):
            infos[i].pid = pid
            infos[i].usedGpuMemory = used
        count.value = len(procs)
        return pynvml.NVML_SUCCESS

    # --- events ----------------------------------------------------------------------
    def nvmlEventSetCreate(self, set_ref: Any) -> int:
        event_set = _EventSet(pynvml.struct_c_nvmlEventSet_t())
        self._event_sets[ctypes.addressof(event_set.struct)] = event_set
        _target(set_ref).contents = event_set.struct
        return pynvml.NVML_SUCCESS

    def _event_set(self, pointer: Any) -> _EventSet | None:
        try:
            return self._event_sets.get(ctypes.addressof(pointer.contents))
        except ValueError:
            return None

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, set_ptr: Any) -> int:
        gpu, rc = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if gpu is None:
            return rc
        event_set = self._event_set(set_ptr)
        if event_set is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if not _value(types) & pynvml.nvmlEventTypeXidCriticalError:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        gpu.xid_listeners.append(event_set.deliver)
        event_set.gpus.append(gpu)
        return pynvml.NVML_SUCCESS

    def nvmlEventSetWait_v2(self, set_ptr: Any, data_ref: Any, timeout_ms: Any) -> int:
        event_set = self._event_set(set_ptr)
        if event_set is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        try:
            # Blocks without the GIL, as the C call does, so the sampler keeps running.
            gpu, xid = event_set.queue.get(timeout=_value(timeout_ms) / 1000)
        except queue.Empty:
            return pynvml.NVML_ERROR_TIMEOUT
        data = _target(data_ref)
        data.device = ctypes.pointer(self._handles[gpu.index])
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return pynvml.NVML_SUCCESS

    def nvmlEventSetFree(self, set_ptr: Any) -> int:
        event_set = self._event_set(set_ptr)
        if event_set is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        for gpu in event_set.gpus:
            if event_set.deliver in gpu.xid_listeners:
                gpu.xid_listeners.remove(event_set.deliver)
        del self._event_sets[ctypes.addressof(event_set.struct)]
        return pynvml.NVML_SUCCESS


class _EventSet:
    """One nvmlEventSet_t: XIDs delivered to it wait in a queue for nvmlEventSetWait."""

    def __init__(self, struct: Any) -> None:
        self.struct = struct
        self.queue: queue.Queue[tuple[SimulatedGpu, int]] = queue.Queue()
        self.gpus: list[SimulatedGpu] = []

    def deliver(self, gpu: SimulatedGpu, xid: int) -> None:
        self.queue.put((gpu, xid))


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
