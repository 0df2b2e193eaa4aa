"""Sample GPUs through pynvml (nvidia-ml-py): the real driver, or the stand-in NVML.

Each field is read with its own call; a call answering NOT_SUPPORTED leaves the field
absent (and is not asked again for that GPU), GPU_IS_LOST marks the GPU lost for this
sample, and any other error is counted and leaves only that field absent. One GPU's
failure never stops the others from being sampled. The call in progress on each GPU is
recorded, so a call that never returns can be named (collector/sources/deadline.py runs
each GPU's sample on a thread of its own, under a deadline).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpufleet.protos import telemetry_pb2
from gpufleet.protos.limits import MAX_PROCESSES_PER_GPU

log = logging.getLogger("gpufleet.collector.nvml")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host (no driver, no library, no permission)."""


@dataclass
class _Gpu:
    index: int
    handle: Any
    identity: telemetry_pb2.GpuIdentity
    unsupported: set[str]
    nvlink_links: int | None = None  # learned on the first sample: links this GPU has
    # The NVML call in progress on this GPU and when it started (time.monotonic()); "" when none.
    # Written by the GPU's sampling thread, read by the deadline watch.
    current_call: str = ""
    call_started_s: float = 0.0
    # The last corrected-ECC count and when it was read: the storm rate is worked out from them.
    last_sbe: tuple[float, int] | None = None
    # GPM (Hopper and later): two samples the driver fills in turn; the previous one filled, and
    # the one the next tick fills. None until the first GPM read (or when this GPU has no GPM).
    gpm_samples: tuple[Any, Any] | None = None
    gpm_filled: bool = False
    # Samples in a row that found the GPU lost: its loss is logged once, when this leaves 0, and
    # its return once, with the count (a lost GPU is not an error line every interval).
    lost_samples: int = 0


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


def _read_clocks(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    sample.clock_sm_mhz = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    sample.clock_mem_mhz = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM))


def _read_clock_target(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    # The clock the clocks policy targets (nvidia-smi -ac): GPUs are compared for speed only
    # with peers under the same policy. Not the deprecated nvmlDeviceGetApplicationsClock.
    sample.clock_sm_target_mhz = float(
        pynvml.nvmlDeviceGetClock(handle, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET)
    )


_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
_POWER = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


def _read_clock_events(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    # The whole mask is kept; the two booleans name the slowdowns health rules care about.
    # HW slowdown (0x8) can be heat or a power brake, so it stays in the mask only.
    reasons = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    sample.clock_event_reasons = reasons
    sample.throttle_thermal = bool(reasons & _THERMAL)
    sample.throttle_power = bool(reasons & _POWER)


def _read_ecc(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    def count(error_type: int, counter: int) -> int:
        return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, error_type, counter))

    corrected, uncorrected = (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    )
    sample.ecc_sbe_volatile = count(corrected, pynvml.NVML_VOLATILE_ECC)
    sample.ecc_dbe_volatile = count(uncorrected, pynvml.NVML_VOLATILE_ECC)
    sample.ecc_sbe_aggregate = count(corrected, pynvml.NVML_AGGREGATE_ECC)
    sample.ecc_dbe_aggregate = count(uncorrected, pynvml.NVML_AGGREGATE_ECC)


def _read_retired_pages(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    sbe = pynvml.nvmlDeviceGetRetiredPages(
        handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    dbe = pynvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    sample.retired_pages_sbe = len(sbe)
    sample.retired_pages_dbe = len(dbe)
    sample.retired_pages_pending = bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))


def _read_remapped_rows(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    corrected, uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
    sample.remap_correctable = int(corrected)
    sample.remap_uncorrectable = int(uncorrected)
    sample.remap_pending = bool(pending)
    sample.remap_failure = bool(failure)


def _read_pcie(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    sample.pcie_replay_total = int(pynvml.nvmlDeviceGetPcieReplayCounter(handle))


def _read_pcie_link(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    # The most the GPU and its slot can train to (not the GPU's own maximum: a Gen5 GPU in a
    # Gen4 slot is not downtrained). An idle link trains down to save power; the rule knows.
    sample.pcie_link_gen_max = int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    sample.pcie_link_width_max = int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    sample.pcie_link_gen = int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
    sample.pcie_link_width = int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle))


def _read_fabric(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no NVSwitch fabric on this GPU
    sample.fabric_state = int(info.state)
    sample.fabric_status = int(info.status)


def _read_processes(handle: Any, sample: telemetry_pb2.GpuSample) -> None:
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLLibraryMismatchError as exc:
        # A driver without the _v3 symbol: pynvml raises a plain Exception, not NVMLError.
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED) from exc
    sample.process_count = len(procs)
    for proc in procs[:MAX_PROCESSES_PER_GPU]:  # the contract's bound; process_count has them all
        entry = sample.processes.add(pid=int(proc.pid))
        if proc.usedGpuMemory is not None:
            entry.used_memory_bytes = int(proc.usedGpuMemory)


READERS: list[tuple[str, Callable[[Any, telemetry_pb2.GpuSample], None]]] = [
    ("utilization", _read_utilization),
    ("memory", _read_memory),
    ("temperature", _read_temperature),
    ("power", _read_power),
    ("power_limit", _read_power_limit),
    ("clocks", _read_clocks),
    ("clock_target", _read_clock_target),
    ("clock_events", _read_clock_events),
    ("ecc", _read_ecc),
    ("retired_pages", _read_retired_pages),
    ("remapped_rows", _read_remapped_rows),
    ("pcie", _read_pcie),
    ("pcie_link", _read_pcie_link),
    ("fabric", _read_fabric),
    ("processes", _read_processes),
]
# The NVML call behind each group, as a hung one is named in reports and logs.
CALLS = {
    "utilization": "nvmlDeviceGetUtilizationRates",
    "memory": "nvmlDeviceGetMemoryInfo",
    "temperature": "nvmlDeviceGetTemperature",
    "power": "nvmlDeviceGetPowerUsage",
    "power_limit": "nvmlDeviceGetEnforcedPowerLimit",
    "clocks": "nvmlDeviceGetClockInfo",
    "clock_target": "nvmlDeviceGetClock",
    "clock_events": "nvmlDeviceGetCurrentClocksEventReasons",
    "ecc": "nvmlDeviceGetTotalEccErrors",
    "retired_pages": "nvmlDeviceGetRetiredPages",
    "remapped_rows": "nvmlDeviceGetRemappedRows",
    "pcie": "nvmlDeviceGetPcieReplayCounter",
    "pcie_link": "nvmlDeviceGetCurrPcieLinkGeneration",
    "fabric": "nvmlDeviceGetGpuFabricInfo",
    "processes": "nvmlDeviceGetComputeRunningProcesses",
    "field_values": "nvmlDeviceGetFieldValues",
    "nvlink": "nvmlDeviceGetNvLinkState",
    "gpm": "nvmlGpmSampleGet",
}

# Read together in one nvmlDeviceGetFieldValues call per GPU (each value has its own return
# code): HBM temperature and the NVLink error totals over all links, which otherwise take
# four calls per link.
_FIELD_VALUES = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: "temp_mem_c",
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: "recovery_action",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "nvlink_replay_total",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "nvlink_recovery_total",
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "nvlink_crc_flit",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "nvlink_crc_data",
}
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
}


def _read_field_values(handle: Any) -> dict[str, float]:
    """The fields NVML answered (a field it does not support is simply not in the result)."""
    out: dict[str, float] = {}
    for value in pynvml.nvmlDeviceGetFieldValues(handle, list(_FIELD_VALUES)):
        member = _VALUE_MEMBER.get(value.valueType)
        if value.nvmlReturn == pynvml.NVML_SUCCESS and member and value.fieldId in _FIELD_VALUES:
            out[_FIELD_VALUES[value.fieldId]] = getattr(value.value, member)
    return out


# GPM metrics read (each with its own return code), and the sample field each fills.
_GPM_METRICS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active_pct",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active_pct",
}


def _read_gpm(gpu: _Gpu, sample: telemetry_pb2.GpuSample) -> None:
    """SM and tensor activity over the interval since this GPU's previous sample (GPM: work, not
    the share of time a kernel ran). The first read takes the first GPM sample and reports
    nothing; a GPU without GPM answers NOT_SUPPORTED and is not asked again."""
    if gpu.gpm_samples is None:
        if not pynvml.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu.gpm_samples = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
    previous, current = gpu.gpm_samples
    pynvml.nvmlGpmSampleGet(gpu.handle, current)
    filled, gpu.gpm_filled = gpu.gpm_filled, True
    gpu.gpm_samples = (current, previous)  # this one is the next read's previous
    if not filled:
        return
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(_GPM_METRICS)
    request.sample1, request.sample2 = previous, current
    for i, metric_id in enumerate(_GPM_METRICS):
        request.metrics[i].metricId = metric_id
    pynvml.nvmlGpmMetricsGet(request)
    for i in range(len(_GPM_METRICS)):
        metric = request.metrics[i]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS and metric.metricId in _GPM_METRICS:
            setattr(sample, _GPM_METRICS[metric.metricId], float(metric.value))


_NVLINK_COUNTERS = {
    "nvlink_replay_total": (pynvml.NVML_NVLINK_ERROR_DL_REPLAY,),
    "nvlink_recovery_total": (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,),
    "nvlink_crc_total": (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
}


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
        """Every GPU, one after another, on the calling thread (no deadline: the collector
        samples through collector/sources/deadline.py)."""
        return [self.sample_gpu(gpu) for gpu in self.gpus]

    def sample_gpu(self, gpu: _Gpu) -> telemetry_pb2.GpuSample:
        ident = gpu.identity
        sample = telemetry_pb2.GpuSample(
            index=gpu.index, uuid=ident.uuid, model=ident.model, pci_bus_id=ident.pci_bus_id
        )
        for group, reader in READERS:
            # Once lost, the rest is not asked: what was read before the loss was real and stays.
            if not self._query(gpu, sample, group, lambda r=reader: r(gpu.handle, sample)):
                break
        fields: dict[str, float] = {}

        def read_fields() -> None:
            fields.update(_read_field_values(gpu.handle))

        self._query(gpu, sample, "field_values", read_fields)
        if "temp_mem_c" in fields:
            sample.temp_mem_c = float(fields["temp_mem_c"])
        if "recovery_action" in fields:
            sample.recovery_action = int(fields["recovery_action"])
        self._query(gpu, sample, "nvlink", lambda: self._read_nvlink(gpu, sample, fields))
        self._query(gpu, sample, "gpm", lambda: _read_gpm(gpu, sample))
        self._sbe_rate(gpu, sample)
        self._note_loss(gpu, sample.lost)
        return sample

    def _note_loss(self, gpu: _Gpu, lost: bool) -> None:
        """Log a GPU's loss once, when it starts, and once when it answers again; count the
        samples in between (each sample itself says lost: gpufleet_gpu_lost on /metrics)."""
        if lost:
            if not gpu.lost_samples:
                log.error(
                    "GPU %d (%s) is lost: NVML answers GPU_IS_LOST; said once, its samples say "
                    "lost until it answers again",
                    gpu.index,
                    gpu.identity.uuid,
                    extra={"gpu": gpu.index, "uuid": gpu.identity.uuid},
                )
            gpu.lost_samples += 1
        elif gpu.lost_samples:
            log.warning(
                "GPU %d (%s) answers NVML again after %d lost samples",
                gpu.index,
                gpu.identity.uuid,
                gpu.lost_samples,
                extra={"gpu": gpu.index, "uuid": gpu.identity.uuid, "lost_samples": gpu.lost_samples},
            )
            gpu.lost_samples = 0

    @staticmethod
    def _sbe_rate(gpu: _Gpu, sample: telemetry_pb2.GpuSample) -> None:
        """Corrected ECC errors per second since the previous sample (a storm of them never
        shows as an uncorrected error). A count that went down (driver reload) starts again."""
        if not sample.HasField("ecc_sbe_volatile"):
            return
        now, count = time.monotonic(), sample.ecc_sbe_volatile
        if gpu.last_sbe is not None and count >= gpu.last_sbe[1] and now > gpu.last_sbe[0]:
            sample.ecc_sbe_rate_per_s = (count - gpu.last_sbe[1]) / (now - gpu.last_sbe[0])
        gpu.last_sbe = (now, count)

    def _query(
        self, gpu: _Gpu, sample: telemetry_pb2.GpuSample, group: str, read: Callable[[], None]
    ) -> bool:
        """Run one group's NVML read for a GPU, turning NVML errors into absent values (as
        nvitop's nvmlQuery does), in one place:
        NOT_SUPPORTED or a function this driver lacks: the group's fields stay absent and the
        group is not asked again for this GPU; GPU_IS_LOST: the sample is marked lost (logged
        once); any other NVML error: counted and logged, only this group's fields absent.
        False once the GPU is lost (nothing more is asked of it this sample)."""
        if sample.lost:
            return False
        if group in gpu.unsupported:
            return True
        gpu.current_call, gpu.call_started_s = CALLS.get(group, group), time.monotonic()
        try:
            read()
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            gpu.unsupported.add(group)
        except pynvml.NVMLError_GpuIsLost:
            sample.lost = True  # logged once per loss (_note_loss), not once per sample
            return False
        except pynvml.NVMLError as exc:
            self._count_error(gpu, group, exc)
        finally:
            gpu.current_call = ""
        return True

    def _count_error(self, gpu: _Gpu, group: str, exc: Exception) -> None:
        self.errors_total += 1
        log.warning(
            "GPU %d: reading %s failed: %s",
            gpu.index,
            group,
            exc,
            extra={"gpu": gpu.index, "field_group": group, "error": str(exc)},
        )

    @staticmethod
    def _read_nvlink(gpu: _Gpu, sample: telemetry_pb2.GpuSample, fields: dict[str, float]) -> None:
        if gpu.nvlink_links is None:
            # Links are numbered from 0; the first that NVML refuses is past the last one.
            links = 0
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
                except (pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported):
                    if link == 0:
                        raise
                    break
                links = link + 1
            gpu.nvlink_links = links
        active = 0
        from_fields = {"nvlink_replay_total", "nvlink_recovery_total", "nvlink_crc_flit", "nvlink_crc_data"}
        if from_fields <= set(fields):
            # The totals came in the field-values call: only the link states are asked per link.
            totals = {
                "nvlink_replay_total": fields["nvlink_replay_total"],
                "nvlink_recovery_total": fields["nvlink_recovery_total"],
                "nvlink_crc_total": fields["nvlink_crc_flit"] + fields["nvlink_crc_data"],
            }
        else:
            totals = dict.fromkeys(_NVLINK_COUNTERS, 0)
        for link in range(gpu.nvlink_links):
            active += pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link) == pynvml.NVML_FEATURE_ENABLED
            if not from_fields <= set(fields):
                for name, counters in _NVLINK_COUNTERS.items():
                    for counter in counters:
                        totals[name] += pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link, counter)
        sample.nvlink_links_active = active
        sample.nvlink_links_inactive = gpu.nvlink_links - active
        for name, value in totals.items():
            setattr(sample, name, int(value))

    def close(self) -> None:
        for gpu in self.gpus:
            for gpm_sample in gpu.gpm_samples or ():
                try:
                    pynvml.nvmlGpmSampleFree(gpm_sample)
                except pynvml.NVMLError as exc:
                    log.warning("GPU %d: nvmlGpmSampleFree failed: %s", gpu.index, exc)
            gpu.gpm_samples = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("nvmlShutdown failed: %s", exc)
