"""The stand-in NVML's work signals: the SM clock the clocks policy targets (nvmlDeviceGetClock's
application-clock target) and GPU Performance Monitoring (GPM: nvmlGpmSampleGet twice, then
nvmlGpmMetricsGet for the mean SM and tensor activity between the two samples), on the GPUs
whose profile has GPM (Hopper and later); elsewhere NOT_SUPPORTED, as the driver answers."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from gpufleet.collector.simnvml.args import arg_target, arg_value
from gpufleet.collector.simnvml.devices import Devices


@dataclass
class _GpmSample:
    """What one GPM sample holds: which GPU and its work integrals when it was taken."""

    struct: Any  # the opaque struct the caller's pointer points at (kept alive here)
    gpu_index: int = -1
    integrals: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


# The metrics the stand-in answers: their index in the work integrals (seconds, SM, tensor).
_GPM_METRICS = {pynvml.NVML_GPM_METRIC_SM_UTIL: 1, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 2}


class WorkSymbols:
    def __init__(self, devices: Devices) -> None:
        self._devices = devices
        self._gpm_samples: dict[int, _GpmSample] = {}

    def samples_held(self) -> int:
        """GPM samples allocated and not yet freed."""
        return len(self._gpm_samples)

    def nvmlDeviceGetClock(self, handle: Any, clock_type: Any, clock_id: Any, mhz_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetClock")
        if gpu is None:
            return rc
        if arg_value(clock_type) != pynvml.NVML_CLOCK_SM:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        which = arg_value(clock_id)
        if which == pynvml.NVML_CLOCK_ID_CURRENT:
            arg_target(mhz_ref).value = round(gpu.sm_clock_mhz())
        elif which == pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET:
            arg_target(mhz_ref).value = round(gpu.target_clock_mhz())
        elif which in (pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT, pynvml.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX):
            arg_target(mhz_ref).value = round(gpu.profile.max_sm_clock_mhz)
        else:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    def nvmlGpmQueryDeviceSupport(self, handle: Any, support_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlGpmQueryDeviceSupport")
        if gpu is None:
            return rc
        support = arg_target(support_ref)
        if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(gpu.profile.gpm)
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleAlloc(self, sample_ref: Any) -> int:
        sample = _GpmSample(pynvml.struct_c_nvmlGpmSample_t())
        self._gpm_samples[ctypes.addressof(sample.struct)] = sample
        arg_target(sample_ref).contents = sample.struct
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleFree(self, pointer: Any) -> int:
        if self._gpm_samples.pop(_address(pointer), None) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleGet(self, handle: Any, pointer: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlGpmSampleGet")
        if gpu is None:
            return rc
        if not gpu.profile.gpm:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        sample = self._gpm_samples.get(_address(pointer))
        if sample is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        sample.gpu_index, sample.integrals = gpu.index, gpu.work_integrals
        return pynvml.NVML_SUCCESS

    def nvmlGpmMetricsGet(self, request_ref: Any) -> int:
        self._devices.calls["nvmlGpmMetricsGet"] = self._devices.calls.get("nvmlGpmMetricsGet", 0) + 1
        request = arg_target(request_ref)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first = self._gpm_samples.get(_address(request.sample1))
        second = self._gpm_samples.get(_address(request.sample2))
        if first is None or second is None or first.gpu_index < 0 or first.gpu_index != second.gpu_index:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        seconds = second.integrals[0] - first.integrals[0]
        for i in range(min(request.numMetrics, pynvml.NVML_GPM_METRIC_MAX)):
            metric = request.metrics[i]
            slot = _GPM_METRICS.get(metric.metricId)
            if slot is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif seconds <= 0:  # no time between the samples: nothing to average
                metric.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            else:
                metric.value = (second.integrals[slot] - first.integrals[slot]) / seconds
                metric.nvmlReturn = pynvml.NVML_SUCCESS
        return pynvml.NVML_SUCCESS
