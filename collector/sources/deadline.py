"""NVML calls under a deadline: a driver call that never returns cannot stop the collector.

On a degrading GPU an NVML call can block in the kernel for a minute or for ever (docs/repair.md
"Failures the driver hides"). Each GPU is therefore sampled on a worker thread of its own; a
sampling tick hands every GPU whose worker is free its next sample and waits at most `wait_s`
(never past the call deadline). A GPU whose current call has run past the deadline is reported
`driver_unresponsive` (which call, for how long), its worker left to its call; the others are
reported as usual. When the call returns, the GPU is sampled again at the next tick: no restart.

The workers are daemon threads of our own rather than a ThreadPoolExecutor: the executor's
threads are joined at interpreter exit, so a call stuck in the driver would keep the collector
from ever exiting.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from gpufleet.collector.sources.nvml import NvmlSource, _Gpu
from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector.nvml")


class _Worker:
    """One daemon thread running one GPU's samples, one at a time."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], telemetry_pb2.GpuSample], Future]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, job: Callable[[], telemetry_pb2.GpuSample]) -> Future:
        future: Future = Future()
        self._jobs.put((job, future))
        return future

    def _run(self) -> None:
        while True:
            job, future = self._jobs.get()
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the tick that reads it; the worker goes on
                future.set_exception(exc)


def returns_within(call: Callable[[], object], timeout_s: float, what: str) -> bool:
    """Run an NVML call that may never return (a cleanup at shutdown: freeing an event set,
    nvmlShutdown) on a daemon thread, waiting at most timeout_s; True if it returned. A driver
    stuck with its lock held blocks every call, these too: the collector still stops, and the
    call is left to the process exit (logged)."""
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except Exception as exc:  # the cleanup's own error: logged, nothing else to do at exit
            log.warning("%s failed: %s", what, exc, extra={"nvml_call": what, "error": str(exc)})
        finally:
            done.set()

    threading.Thread(target=run, name=f"nvml-{what}", daemon=True).start()
    if done.wait(timeout_s):
        return True
    log.warning(
        "%s has not returned after %.1f s: the driver does not answer; left to the process exit",
        what,
        timeout_s,
        extra={"nvml_call": what, "waited_s": timeout_s},
    )
    return False


@dataclass(frozen=True)
class Unresponsive:
    """A GPU whose NVML call has outlived the deadline."""

    index: int
    call: str
    waited_s: float


class DeadlineSampler:
    def __init__(self, source: NvmlSource, deadline_s: float) -> None:
        self.source = source
        self.deadline_s = deadline_s
        self.hung_total = 0  # calls that outlived the deadline (each counted once)
        self.failed_total = 0  # samples that raised something other than an NVML error
        self._workers = {gpu.index: _Worker(f"nvml-gpu{gpu.index}") for gpu in source.gpus}
        self._pending: dict[int, Future] = {}
        self._unresponsive: dict[int, Unresponsive] = {}

    @property
    def unresponsive(self) -> list[Unresponsive]:
        """The GPUs reported driver_unresponsive at the last tick (for /ready and logs)."""
        return sorted(self._unresponsive.values(), key=lambda u: u.index)

    def sample(self, wait_s: float) -> list[telemetry_pb2.GpuSample]:
        """One tick: every GPU's sample that is ready within wait_s (at most the deadline), a
        driver_unresponsive sample for each GPU stuck past the deadline. A GPU whose call is
        slow but not yet past the deadline is left out of this tick (absent, not zero)."""
        for gpu in self.source.gpus:
            if gpu.index not in self._pending:
                self._pending[gpu.index] = self._workers[gpu.index].submit(
                    lambda g=gpu: self.source.sample_gpu(g)
                )
        # A GPU already reported stuck is not waited on again: each tick costs it nothing.
        waiting = [f for i, f in self._pending.items() if i not in self._unresponsive]
        if waiting:
            wait_futures(waiting, timeout=max(0.0, min(wait_s, self.deadline_s)))
        out = []
        for gpu in self.source.gpus:
            sample = self._collect(gpu)
            if sample is not None:
                out.append(sample)
        return out

    def _collect(self, gpu: _Gpu) -> telemetry_pb2.GpuSample | None:
        future = self._pending[gpu.index]
        if future.done():
            del self._pending[gpu.index]
            was = self._unresponsive.pop(gpu.index, None)
            if was is not None:
                # What the stuck sample read is from before the hang: sampled afresh next tick.
                log.warning(
                    "GPU %d answers NVML again (%s returned after more than %.1f s)",
                    gpu.index,
                    was.call,
                    was.waited_s,
                    extra={"gpu": gpu.index, "nvml_call": was.call, "waited_s": was.waited_s},
                )
                return None
            try:
                return future.result()
            except Exception as exc:
                self.failed_total += 1
                log.error(
                    "sampling GPU %d failed: %s", gpu.index, exc, extra={"gpu": gpu.index, "error": str(exc)}
                )
                return None
        call, started = gpu.current_call, gpu.call_started_s
        waited = time.monotonic() - started
        if not call or waited < self.deadline_s:
            return None  # slow, not past the deadline yet: absent from this tick
        if gpu.index not in self._unresponsive:
            self.hung_total += 1
            log.error(
                "GPU %d: NVML call %s has not returned after %.1f s (deadline %.3g s): reported "
                "driver_unresponsive; the other GPUs are sampled as usual",
                gpu.index,
                call,
                waited,
                self.deadline_s,
                extra={"gpu": gpu.index, "nvml_call": call, "waited_s": round(waited, 3)},
            )
        self._unresponsive[gpu.index] = Unresponsive(gpu.index, call, waited)
        ident = gpu.identity
        return telemetry_pb2.GpuSample(
            index=gpu.index,
            uuid=ident.uuid,
            model=ident.model,
            pci_bus_id=ident.pci_bus_id,
            driver_unresponsive=True,
            driver_unresponsive_call=call,
            driver_unresponsive_s=round(waited, 3),
        )
