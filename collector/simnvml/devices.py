"""The simulated node's GPUs as NVML's device handles reach them: what every group of the
stand-in's symbols is given (collector/simnvml/library.py). Resolving a handle counts the call,
and hangs or fails it as the GPU's faults say, as the driver would."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from gpufleet.collector.simnvml.args import arg_value
from gpufleet.collector.simnvml.machine import SimulatedGpu, SimulatedNode


class Devices:
    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.calls: dict[str, int] = {}  # NVML symbol -> calls that reached a GPU
        self.initialized = 0  # nvmlInit less nvmlShutdown calls
        self.handles = [pynvml.struct_c_nvmlDevice_t() for _ in node.gpus]
        self._gpu_by_address = {
            ctypes.addressof(h): gpu for h, gpu in zip(self.handles, node.gpus, strict=True)
        }

    def gpu(self, handle: Any, symbol: str) -> tuple[SimulatedGpu | None, int]:
        """Resolve a device handle; return (gpu, NVML_SUCCESS) or (None, error code)."""
        self.calls[symbol] = self.calls.get(symbol, 0) + 1
        if not self.initialized:
            return None, pynvml.NVML_ERROR_UNINITIALIZED
        try:
            gpu = self._gpu_by_address[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError, AttributeError):
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        gpu.wait_if_hung(symbol)  # a call stuck in the driver, as on a degrading GPU
        if gpu.lost:
            return None, pynvml.NVML_ERROR_GPU_IS_LOST
        if symbol in gpu.fail_symbols:
            return None, gpu.fail_symbols[symbol]
        self.node.advance()
        return gpu, pynvml.NVML_SUCCESS

    def by_address(self, address: int) -> SimulatedGpu | None:
        """The GPU whose handle is at this address (the C stand-in's device pointers)."""
        return self._gpu_by_address.get(address)

    @staticmethod
    def write_string(buffer: Any, size: Any, text: str) -> int:
        data = text.encode()
        if len(data) + 1 > arg_value(size):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        buffer.value = data
        return pynvml.NVML_SUCCESS
