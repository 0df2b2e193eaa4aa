"""The stand-in NVML's compute processes and its XID event sets (nvmlEventSetCreate, Wait, Free)."""

from __future__ import annotations

import ctypes
import queue
from typing import Any

import pynvml

from gpufleet.collector.simnvml.args import arg_target, arg_value
from gpufleet.collector.simnvml.devices import Devices
from gpufleet.collector.simnvml.machine import SimulatedGpu


class EventSymbols:
    def __init__(self, devices: Devices) -> None:
        self._devices = devices
        self._event_sets: dict[int, _EventSet] = {}

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count_ref: Any, infos: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetComputeRunningProcesses_v3")
        if gpu is None:
            return rc
        count = arg_target(count_ref)
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

    def nvmlEventSetCreate(self, set_ref: Any) -> int:
        event_set = _EventSet(pynvml.struct_c_nvmlEventSet_t())
        self._event_sets[ctypes.addressof(event_set.struct)] = event_set
        arg_target(set_ref).contents = event_set.struct
        return pynvml.NVML_SUCCESS

    def _event_set(self, pointer: Any) -> _EventSet | None:
        try:
            return self._event_sets.get(ctypes.addressof(pointer.contents))
        except ValueError:
            return None

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, set_ptr: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceRegisterEvents")
        if gpu is None:
            return rc
        event_set = self._event_set(set_ptr)
        if event_set is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if not arg_value(types) & pynvml.nvmlEventTypeXidCriticalError:
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
            gpu, xid = event_set.queue.get(timeout=arg_value(timeout_ms) / 1000)
        except queue.Empty:
            return pynvml.NVML_ERROR_TIMEOUT
        data = arg_target(data_ref)
        data.device = ctypes.pointer(self._devices.handles[gpu.index])
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
