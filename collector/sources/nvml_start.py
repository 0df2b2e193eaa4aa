"""NVML's start under the call deadline: nvmlInit and the GPU inventory run on a thread of their
own, and a driver that does not answer them within nvml_deadline_s does not hang the collector's
start (docs/repair.md "Failures the driver hides").

A collector whose NVML never started still reports its node: with no GPUs from NVML beside the
GPUs its PCI bus shows, which is what the aggregator's gpu_missing_from_driver rule takes out of
service (a reboot reloads the driver), and its /ready says where NVML is stuck. If NVML answers
later, that is logged with what to do: the GPUs it lists reach the fleet when the collector is
started again (its hello lists the GPUs once, at the start of its stream).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpufleet.collector.sources.nvml import NvmlSource, _Gpu
from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector.nvml")


class NvmlNotAnswering:
    """What the collector samples while NVML's start has not returned: no GPUs, nothing to
    close (nvmlShutdown would wait on the stuck start too)."""

    errors_total = 0
    driver_version = ""

    def __init__(self) -> None:
        self.gpus: list[_Gpu] = []
        self.since_s = time.monotonic()

    @property
    def waited_s(self) -> float:
        return time.monotonic() - self.since_s

    def inventory(self) -> list[telemetry_pb2.GpuIdentity]:
        return []

    def sample(self) -> list[telemetry_pb2.GpuSample]:
        return []

    def sample_gpu(self, gpu: _Gpu) -> telemetry_pb2.GpuSample:
        raise RuntimeError("NVML has not started: there is no GPU to sample")

    def close(self) -> None:
        """Nothing to shut down: the start never returned."""


def open_nvml(
    deadline_s: float, open_source: Callable[[], NvmlSource] = NvmlSource
) -> NvmlSource | NvmlNotAnswering:
    """NvmlSource, opened on a thread of its own; NvmlNotAnswering if it has not returned within
    deadline_s. An error it raises in time (no driver: NvmlUnavailable) is raised here."""
    opened: list[NvmlSource | BaseException] = []
    answered = threading.Event()
    decided = threading.Lock()  # the start's end and the giving up on it, one before the other
    gave_up = False
    started = time.monotonic()

    def run() -> None:
        try:
            opened.append(open_source())
        except BaseException as exc:  # handed to the caller, or logged if it gave up waiting
            opened.append(exc)
        with decided:
            answered.set()
            late = gave_up
        if late:
            result = opened[0]
            log.error(
                "NVML answered its start after %.1f s (%s); restart the collector to report its GPUs",
                time.monotonic() - started,
                result if isinstance(result, BaseException) else f"{len(result.gpus)} GPU(s)",
                extra={"waited_s": round(time.monotonic() - started, 3)},
            )

    threading.Thread(target=run, name="nvml-start", daemon=True).start()
    answered.wait(deadline_s)
    with decided:
        gave_up = not answered.is_set()
    if not gave_up:
        if isinstance(opened[0], BaseException):
            raise opened[0]
        return opened[0]
    log.error(
        "NVML has not answered its start (nvmlInit, the GPU inventory) after %.1f s: the driver does "
        "not answer. Reporting this node with no GPUs from NVML beside the GPUs on its PCI bus (the "
        "aggregator's gpu_missing_from_driver rule); a reboot reloads the driver",
        deadline_s,
        extra={"nvml_call": "nvmlInit", "waited_s": deadline_s},
    )
    return NvmlNotAnswering()
