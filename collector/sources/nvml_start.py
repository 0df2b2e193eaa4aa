"""NVML's start under the call deadline: nvmlInit and the GPU inventory run on a thread of their
own, and a driver that does not answer them within nvml_deadline_s does not hang the collector's
start (docs/repair.md "Failures the driver hides").

NVML's library itself is first loaded in a child process when pynvml has not loaded one yet
(`library_loads`): CPython's ctypes holds the interpreter lock while the C loader runs, so a
libnvidia-ml whose load never returns would freeze this whole process (found by
tests/collector/test_driver_hangs.py with a library whose initialisation blocks in C).

A collector whose NVML never started still reports its node: with no GPUs from NVML beside the
GPUs its PCI bus shows, which is what the aggregator's gpu_missing_from_driver rule takes out of
service (a reboot reloads the driver), and its /ready says where NVML is stuck. If NVML answers
later, that is logged with what to do: the GPUs it lists reach the fleet when the collector is
started again (its hello lists the GPUs once, at the start of its stream).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pynvml

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


NVML_LIBRARY = "libnvidia-ml.so.1"  # what pynvml loads on Linux (pynvml._LoadNvmlLibrary)


def library_loads(deadline_s: float) -> bool:
    """Whether NVML's library loads, when pynvml has not loaded one yet (a stand-in put beneath
    it is loaded already). CPython's ctypes holds the interpreter lock while the C library
    loader runs, so a libnvidia-ml whose load does not return (blocked in its initialisation,
    in C) freezes every thread of this process, its signal handlers included: no deadline in
    this process can end it. So the load is first tried in a child process; one that has not
    loaded it within deadline_s is killed, and this process never loads it. A library that is
    missing or fails to load is left to pynvml, which says so (NvmlUnavailable)."""
    if getattr(pynvml, "nvmlLib", None) is not None or not sys.platform.startswith("linux"):
        return True
    try:
        subprocess.run(
            [sys.executable, "-S", "-c", f"import ctypes; ctypes.CDLL({NVML_LIBRARY!r})"],
            timeout=deadline_s,
            capture_output=True,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return True


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

    if not library_loads(deadline_s):
        log.error(
            "NVML has not answered its start: %s did not finish loading within %.1f s (tried in a "
            "child process: a load stuck in C holds this interpreter's lock and would freeze this "
            "one). Reporting this node with no GPUs from NVML beside the GPUs on its PCI bus (the "
            "aggregator's gpu_missing_from_driver rule); a reboot reloads the driver",
            NVML_LIBRARY,
            deadline_s,
            extra={"nvml_call": "load", "waited_s": deadline_s},
        )
        return NvmlNotAnswering()
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
