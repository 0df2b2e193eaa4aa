"""Sample GPUs through pynvml (nvidia-ml-py): the real driver, or the stand-in NVML.

Each field is read with its own call; a call answering NOT_SUPPORTED leaves the field
absent (and is not asked again for that GPU), GPU_IS_LOST marks the GPU lost for this
sample, and any other error is counted and leaves only that field absent. One GPU's
failure never stops the others from being sampled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector.nvml")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host (no driver, no library, no permission)."""


@dataclass
class _Gpu:
    index: int
    handle: Any
    identity: telemetry_pb2.GpuIdentity
    unsupported: set[str]


def _decode(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# (field group, reader) pairs. A reader fills the sample from one NVML call; the group
# name is what NOT_SUPPORTED is remembered under.
def _read_utilization(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    sample.util_gpu_pct = float(util.gpu)
    sample.util_mem_pct = float(util.memory)


def _read_memory(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    sample.hbm_used_bytes = int(mem.used)
    sample.hbm_total_bytes = int(mem.total)


def _read_temperature(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    sample.temp_gpu_c = float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))


def _read_power(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    sample.power_w = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0


def _read_power_limit(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    sample.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0


READERS: list[tuple[str, Callable[[Any, telemetry_pb2.GpuSample], None]]] = [
    ("utilization", _read_utilization),
    ("memory", _read_memory),
    ("temperature", _read_temperature),
    ("power", _read_power),
    ("power_limit", _read_power_limit),
]


class NvmlSource:
    """Opens NVML once and samples every GPU on demand (blocking: call from a thread)."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise NvmlUnavailable(
                "NVML is not available on this host: libnvidia-ml.so.1 could not be loaded "
                f"({exc}). Install the NVIDIA driver (in a container: enable the NVIDIA "
                "runtime), or run with --simulate for simulated GPUs."
            ) from exc
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML failed to initialise: {exc}. Check that the NVIDIA driver is loaded "
                "(nvidia-smi should work), or run with --simulate for simulated GPUs."
            ) from exc
        self.errors_total = 0
        self.driver_version = _decode(pynvml.nvmlSystemGetDriverVersion())
        self.gpus: list[_Gpu] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            identity = telemetry_pb2.GpuIdentity(index=index)
            try:
                identity.uuid = _decode(pynvml.nvmlDeviceGetUUID(handle))
                identity.model = _decode(pynvml.nvmlDeviceGetName(handle))
                identity.pci_bus_id = _decode(pynvml.nvmlDeviceGetPciInfo(handle).busId)
                identity.hbm_total_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except pynvml.NVMLError as exc:
                # A GPU that is already lost at start-up is still listed, so its index is
                # known and its absence is visible, not silent.
                log.error(
                    "cannot read identity of GPU %d: %s",
                    index,
                    exc,
                    extra={"gpu": index, "error": str(exc)},
                )
                self.errors_total += 1
            self.gpus.append(_Gpu(index, handle, identity, set()))

    def inventory(self) -> list[telemetry_pb2.GpuIdentity]:
        return [g.identity for g in self.gpus]

    def sample(self) -> list[telemetry_pb2.GpuSample]:
        return [self._sample_gpu(gpu) for gpu in self.gpus]

    def _sample_gpu(self, gpu: _Gpu) -> telemetry_pb2.GpuSample:
        ident = gpu.identity
        sample = telemetry_pb2.GpuSample(
            index=gpu.index, uuid=ident.uuid, model=ident.model, pci_bus_id=ident.pci_bus_id
        )
        for group, reader in READERS:
            if group in gpu.unsupported:
                continue
            try:
                reader(gpu.handle, sample)
            except pynvml.NVMLError_NotSupported:
                gpu.unsupported.add(group)
            except pynvml.NVMLError_GpuIsLost:
                if not sample.lost:
                    log.error(
                        "GPU %d (%s) is lost: NVML answers GPU_IS_LOST",
                        gpu.index,
                        ident.uuid,
                        extra={"gpu": gpu.index, "uuid": ident.uuid},
                    )
                sample.lost = True
                # Keep what was read before the loss: those values were real.
                break
            except pynvml.NVMLError as exc:
                self.errors_total += 1
                log.warning(
                    "GPU %d: reading %s failed: %s",
                    gpu.index,
                    group,
                    exc,
                    extra={"gpu": gpu.index, "field_group": group, "error": str(exc)},
                )
        return sample

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("nvmlShutdown failed: %s", exc)
