"""The stand-in NVML's health symbols: ECC counters, retired pages, remapped rows, PCIe replays,
NVLink state and error counters, and field values."""

from __future__ import annotations

import time
from typing import Any

import pynvml

from gpufleet.collector.simnvml.args import arg_target, arg_value
from gpufleet.collector.simnvml.devices import Devices
from gpufleet.collector.simnvml.machine import SimulatedGpu


class HealthSymbols:
    def __init__(self, devices: Devices) -> None:
        self._devices = devices

    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, count_ref: Any
    ) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if gpu is None:
            return rc
        uncorrected = arg_value(error_type) == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        aggregate = arg_value(counter_type) == pynvml.NVML_AGGREGATE_ECC
        arg_target(count_ref).value = {
            (False, False): gpu.ecc_sbe_volatile,
            (True, False): gpu.ecc_dbe_volatile,
            (False, True): gpu.ecc_sbe_aggregate,
            (True, True): gpu.ecc_dbe_aggregate,
        }[(uncorrected, aggregate)]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count_ref: Any, pages: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetRetiredPages")
        if gpu is None:
            return rc
        if gpu.profile.row_remapping:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        retired = gpu.retired_pages_dbe if arg_value(cause) == 1 else gpu.retired_pages_sbe
        count = arg_target(count_ref)
        if pages is None or count.value < len(retired):
            # The first call passes a zero count and no buffer: say how many, write nothing.
            count.value = len(retired)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if retired else pynvml.NVML_SUCCESS
        for i, address in enumerate(retired):
            pages[i] = address
        count.value = len(retired)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, pending_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        if gpu is None:
            return rc
        if gpu.profile.row_remapping:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        arg_target(pending_ref).value = int(gpu.retired_pages_pending)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetRemappedRows")
        if gpu is None:
            return rc
        if not gpu.profile.row_remapping:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        arg_target(corr).value = gpu.remap_correctable
        arg_target(unc).value = gpu.remap_uncorrectable
        arg_target(pending).value = int(gpu.remap_pending)
        arg_target(failure).value = int(gpu.remap_failure)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any, count_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetPcieReplayCounter")
        if gpu is None:
            return rc
        arg_target(count_ref).value = gpu.pcie_replay_total
        return pynvml.NVML_SUCCESS

    def _link(self, handle: Any, link: Any, symbol: str) -> tuple[SimulatedGpu | None, int]:
        gpu, rc = self._devices.gpu(handle, symbol)
        if gpu is None:
            return None, rc
        if not gpu.profile.nvlink_links:
            return None, pynvml.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= arg_value(link) < gpu.profile.nvlink_links:
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        return gpu, pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active_ref: Any) -> int:
        gpu, rc = self._link(handle, link, "nvmlDeviceGetNvLinkState")
        if gpu is None:
            return rc
        arg_target(active_ref).value = int(arg_value(link) not in gpu.nvlink_down)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any, value_ref: Any) -> int:
        gpu, rc = self._link(handle, link, "nvmlDeviceGetNvLinkErrorCounter")
        if gpu is None:
            return rc
        arg_target(value_ref).value = gpu.nvlink_errors.get((arg_value(link), arg_value(counter)), 0)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetFieldValues")
        if gpu is None:
            return rc
        values = arg_target(values_ref)
        for i in range(arg_value(count)):
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
        if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return gpu.recovery_action
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
