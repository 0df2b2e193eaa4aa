"""The stand-in NVML's symbols for what the driver hides behind "healthy": the PCIe link's
generation and width (now and at most) and the NVLink fabric's state."""

from __future__ import annotations

from typing import Any

import pynvml

from gpufleet.collector.simnvml.args import arg_target
from gpufleet.collector.simnvml.devices import Devices


class HiddenFailureSymbols:
    def __init__(self, devices: Devices) -> None:
        self._devices = devices

    def _link_value(self, handle: Any, out_ref: Any, symbol: str, value: Any) -> int:
        gpu, rc = self._devices.gpu(handle, symbol)
        if gpu is None:
            return rc
        arg_target(out_ref).value = value(gpu)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, gen_ref: Any) -> int:
        return self._link_value(
            handle, gen_ref, "nvmlDeviceGetCurrPcieLinkGeneration", lambda g: g.pcie_link()[0]
        )

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, gen_ref: Any) -> int:
        return self._link_value(
            handle, gen_ref, "nvmlDeviceGetMaxPcieLinkGeneration", lambda g: g.profile.pcie_gen_max
        )

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, width_ref: Any) -> int:
        return self._link_value(
            handle, width_ref, "nvmlDeviceGetCurrPcieLinkWidth", lambda g: g.pcie_link()[1]
        )

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, width_ref: Any) -> int:
        return self._link_value(
            handle, width_ref, "nvmlDeviceGetMaxPcieLinkWidth", lambda g: g.profile.pcie_width_max
        )

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> int:
        gpu, rc = self._devices.gpu(handle, "nvmlDeviceGetGpuFabricInfo")
        if gpu is None:
            return rc
        if not gpu.profile.fabric:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        info = arg_target(info_ref)
        info.state = gpu.fabric_state
        info.status = gpu.fabric_status
        info.cliqueId = 1
        return pynvml.NVML_SUCCESS
