"""Memory a burst leaves behind, given back (docs/security.md "Before authentication").

glibc's malloc serves a request of at least M_MMAP_THRESHOLD with its own mmap, returned to the
system when freed; but by default the threshold moves: freeing such a block raises it to that
block's size (up to 32 MiB), so the next ones of that size come from the heap's arenas, whose
free memory the system gets back only when it is at the top of an arena. A flood of large
messages (one credential's 3.9 MiB Hellos, refused as soon as read; gRPC's receive buffers for
them) then leaves tens of MiB of RSS behind after every byte of it is freed. Fixing the
threshold (mallopt turns the moving off) keeps every block of 256 KiB or more in an mmap of its
own, given back when freed. Written here rather than left to MALLOC_MMAP_THRESHOLD_ in the
environment so that the aggregator is right however it is started; a no-op where the C library
is not glibc."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging

log = logging.getLogger("gpufleet.memory")

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 256 * 1024


@functools.cache
def _libc_function(name: str) -> ctypes._CFuncPtr | None:
    """A function of the C library, None where there is none of that name (not glibc). Looked
    up once: find_library runs `ldconfig -p` in a subprocess, and give_back_free_memory is
    called after every roll-up pass."""
    library = ctypes.util.find_library("c")
    if not library:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None


def fix_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (True when set; False where there is no glibc mallopt)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, threshold_bytes) != 1:
        log.warning(
            "mallopt(M_MMAP_THRESHOLD, %d) was refused: large blocks may stay after a burst", threshold_bytes
        )
        return False
    return True


# Python's cyclic collector by default scans the youngest generation every 700 net container
# allocations. Under ingest (2,000 reports a second) that was 25 collections a second in the
# aggregator's main process, 1.2-1.6 s of its event loop every 30 s and full collections of up to
# 270 ms that found nothing (measured with gc.callbacks, docs/benchmarks.md "Sustained ingest"):
# our objects are freed by reference counting, cycles are rare. With these thresholds: 0.2-0.3 s
# every 30 s. Cycles are still collected, in fewer, larger passes.
GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """After a daemon has started: what it made to start (modules, settings, tables) is moved out
    of the collector's sight (gc.freeze), and the thresholds raised (GC_THRESHOLDS)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def give_back_free_memory() -> bool:
    """Return the free memory inside glibc's heaps to the system (malloc_trim(0)): the pages of
    free chunks between live ones, not only the top of each arena. Called after a burst of
    short-lived allocations in a thread (a roll-up pass: SQLite's statements and chunks of
    statistics, aggregator/loops.py): the threads' arenas otherwise kept ~20 MiB of the main
    process's RSS that nothing used (docs/benchmarks.md "Sustained ingest"). Takes a few
    milliseconds; False where the C library has no malloc_trim."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
