"""The stand-in NVML as a shared library: a libnvidia-ml.so stand-in in C, loaded by the real
pynvml through ctypes, so the collector's NVML calls are real foreign calls (docs/repair.md
"Failures the driver hides").

The Python stand-in (library.py) answers pynvml from Python objects, and its hang is a Python
wait: neither shows what a stuck driver does. Here every NVML symbol the collector calls is a C
function that

1. asks the simulated machine whether this call is to hang (the scenario's `hang` fault), and
   if so blocks *in C*, in a thread Python cannot interrupt, until the hang's time is up or its
   release file exists;
2. takes the library-wide lock a driver holds around its calls (a hang with `lock = true`
   blocks while holding it, as a driver stuck with its internal lock held does: every other
   call, for every GPU, then waits for it too);
3. answers from the same simulated machine state as the Python stand-in (`dispatch` calls back
   into SimulatedNvmlLibrary with the C arguments turned into the ctypes objects pynvml passes).

The C source is generated from SYMBOLS (each stub has the same shape: up to five pointer-sized
arguments, which is how the x86-64 and AArch64 C calling conventions pass every NVML argument
the collector uses: handles, pointers, 32- and 64-bit integers) and built with the system C
compiler when first asked for (`build`), into a directory the caller gives.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from gpufleet.collector.simnvml.library import SimulatedNvmlLibrary, _install_lock

# Each symbol: (name, argument kinds, whether its first argument is a device handle, whether
# it takes the driver lock). Kinds: "u" 32-bit value, "U" 64-bit value, "h" device handle,
# "e" event set, "g" GPM sample, "r:TYPE" pointer to one TYPE (a byref() argument), "b" char buffer whose size
# is the next argument, "a:TYPE:N" array of TYPE whose length is what argument N points to
# (NULL: None), "A:TYPE:N" array of TYPE whose length is argument N (passed as byref()).
SYMBOLS: list[tuple[str, tuple[str, ...], bool, bool]] = [
    ("nvmlInitWithFlags", ("u",), False, True),
    ("nvmlShutdown", (), False, True),
    ("nvmlSystemGetDriverVersion", ("b", "u"), False, True),
    ("nvmlDeviceGetCount_v2", ("r:c_uint",), False, True),
    ("nvmlDeviceGetHandleByIndex_v2", ("u", "r:c_nvmlDevice_t"), False, True),
    ("nvmlDeviceGetUUID", ("h", "b", "u"), True, True),
    ("nvmlDeviceGetName", ("h", "b", "u"), True, True),
    ("nvmlDeviceGetPciInfo_v3", ("h", "r:nvmlPciInfo_t"), True, True),
    ("nvmlDeviceGetUtilizationRates", ("h", "r:c_nvmlUtilization_t"), True, True),
    ("nvmlDeviceGetMemoryInfo", ("h", "r:c_nvmlMemory_t"), True, True),
    ("nvmlDeviceGetTemperature", ("h", "u", "r:c_uint"), True, True),
    ("nvmlDeviceGetPowerUsage", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetEnforcedPowerLimit", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetClockInfo", ("h", "u", "r:c_uint"), True, True),
    ("nvmlDeviceGetCurrentClocksEventReasons", ("h", "r:c_ulonglong"), True, True),
    ("nvmlDeviceGetComputeRunningProcesses_v3", ("h", "r:c_uint", "a:c_nvmlProcessInfo_v3_t:1"), True, True),
    ("nvmlEventSetCreate", ("r:c_nvmlEventSet_t",), False, True),
    ("nvmlDeviceRegisterEvents", ("h", "U", "e"), True, True),
    # Waiting for an event holds no lock: the driver's event wait does not stop other calls.
    ("nvmlEventSetWait_v2", ("e", "r:c_nvmlEventData_t", "u"), False, False),
    ("nvmlEventSetFree", ("e",), False, True),
    ("nvmlDeviceGetTotalEccErrors", ("h", "u", "u", "r:c_ulonglong"), True, True),
    ("nvmlDeviceGetRetiredPages", ("h", "u", "r:c_uint", "a:c_ulonglong:2"), True, True),
    ("nvmlDeviceGetRetiredPagesPendingStatus", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetRemappedRows", ("h", "r:c_uint", "r:c_uint", "r:c_uint", "r:c_uint"), True, True),
    ("nvmlDeviceGetPcieReplayCounter", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetNvLinkState", ("h", "u", "r:c_uint"), True, True),
    ("nvmlDeviceGetNvLinkErrorCounter", ("h", "u", "u", "r:c_ulonglong"), True, True),
    ("nvmlDeviceGetFieldValues", ("h", "u", "A:c_nvmlFieldValue_t:1"), True, True),
    ("nvmlDeviceGetCurrPcieLinkGeneration", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetMaxPcieLinkGeneration", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetCurrPcieLinkWidth", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetMaxPcieLinkWidth", ("h", "r:c_uint"), True, True),
    ("nvmlDeviceGetGpuFabricInfo", ("h", "r:c_nvmlGpuFabricInfo_t"), True, True),
    ("nvmlDeviceGetClock", ("h", "u", "u", "r:c_uint"), True, True),
    ("nvmlGpmQueryDeviceSupport", ("h", "r:c_nvmlGpmSupport_t"), True, True),
    ("nvmlGpmSampleAlloc", ("r:c_nvmlGpmSample_t",), False, True),
    ("nvmlGpmSampleFree", ("g",), False, True),
    ("nvmlGpmSampleGet", ("h", "g"), True, True),
    ("nvmlGpmMetricsGet", ("r:c_nvmlGpmMetricsGet_t",), False, True),
]
SYMBOL_IDS = {name: i for i, (name, _, _, _) in enumerate(SYMBOLS)}

_PRELUDE = r"""
/* Generated by gpufleet/collector/simnvml/clibrary.py: a libnvidia-ml.so stand-in. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

typedef uintptr_t arg_t;
typedef int (*dispatch_fn)(int symbol, arg_t a0, arg_t a1, arg_t a2, arg_t a3, arg_t a4);
struct hang { int64_t deadline_ns; int holds_lock; char release_path[1024]; };
typedef int (*hang_fn)(int symbol, arg_t device, struct hang *out);

static dispatch_fn dispatch;
static hang_fn hang_for;
static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;  /* a driver's own, around calls */

void gpufleet_standin_register(dispatch_fn d, hang_fn h) { dispatch = d; hang_for = h; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A call stuck in the driver: blocked here, in C, without Python's lock, until its time is up
   (deadline 0: never) or its release file exists. */
static void block(const struct hang *h) {
    struct timespec step = {0, 20 * 1000 * 1000};
    for (;;) {
        if (h->deadline_ns > 0 && now_ns() >= h->deadline_ns) return;
        if (h->release_path[0] && access(h->release_path, F_OK) == 0) return;
        nanosleep(&step, 0);
    }
}

static arg_t call(int symbol, int device_first, int locks, arg_t a0, arg_t a1, arg_t a2, arg_t a3, arg_t a4) {
    struct hang h = {0, 0, {0}};
    int hung = hang_for ? hang_for(symbol, device_first ? a0 : 0, &h) : 0;
    if (hung && !(locks && h.holds_lock)) block(&h);
    if (locks) pthread_mutex_lock(&driver_lock);
    if (hung && locks && h.holds_lock) block(&h);
    int rc = dispatch ? dispatch(symbol, a0, a1, a2, a3, a4) : 1; /* 1: NVML_ERROR_UNINITIALIZED */
    if (locks) pthread_mutex_unlock(&driver_lock);
    return (arg_t)(unsigned int)rc;
}

const char *nvmlErrorString(arg_t code) {
    switch ((unsigned int)code) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 10: return "Timeout";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
    }
}
"""


def c_source() -> str:
    stubs = [
        f"arg_t {name}(arg_t a0, arg_t a1, arg_t a2, arg_t a3, arg_t a4) "
        f"{{ return call({i}, {int(device)}, {int(locks)}, a0, a1, a2, a3, a4); }}"
        for i, (name, _, device, locks) in enumerate(SYMBOLS)
    ]
    return _PRELUDE + "\n".join(stubs) + "\n"


class BuildError(RuntimeError):
    """The C stand-in could not be built (no C compiler, or it failed)."""


def build(directory: Path) -> Path:
    """Compile the stand-in into directory (once per source: the file name carries its hash)."""
    source = c_source()
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    so = directory / f"libnvidia-ml-standin-{digest}.so"
    if so.exists():
        return so
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError("no C compiler (cc) to build the NVML stand-in library: install gcc")
    directory.mkdir(parents=True, exist_ok=True)
    c_file = directory / f"libnvidia-ml-standin-{digest}.c"
    c_file.write_text(source)
    partial = so.with_suffix(".so.partial")
    done = subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-o", str(partial), str(c_file), "-lpthread"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise BuildError(f"building the NVML stand-in library failed ({compiler}): {done.stderr.strip()}")
    partial.replace(so)  # whole or absent: another process may be building the same
    return so


class _Ref:
    """What byref(obj) looks like to the stand-in's symbols (args.arg_target reads `_obj`)."""

    __slots__ = ("_obj",)

    def __init__(self, obj: Any) -> None:
        self._obj = obj


def _converter(kind: str) -> Callable[[int, tuple[int, ...]], Any]:
    """How one raw argument becomes what pynvml would have passed the Python stand-in."""
    if kind == "u":
        return lambda raw, _: raw & 0xFFFFFFFF
    if kind == "U":
        return lambda raw, _: raw
    if kind == "h":
        return lambda raw, _: ctypes.cast(raw, pynvml.c_nvmlDevice_t)
    if kind == "e":
        return lambda raw, _: ctypes.cast(raw, pynvml.c_nvmlEventSet_t)
    if kind == "g":
        return lambda raw, _: ctypes.cast(raw, pynvml.c_nvmlGpmSample_t)
    if kind == "b":
        return lambda raw, _: raw  # with its size: _arguments
    parts = kind.split(":")
    ctype = getattr(ctypes, parts[1], None) or getattr(pynvml, parts[1])
    if parts[0] == "r":
        return lambda raw, _: _Ref(ctype.from_address(raw)) if raw else None
    n = int(parts[2])
    if parts[0] == "a":  # length: what argument n points to
        return lambda raw, raws: (
            (ctype * ctypes.c_uint.from_address(raws[n]).value).from_address(raw) if raw else None
        )
    return lambda raw, raws: _Ref((ctype * (raws[n] & 0xFFFFFFFF)).from_address(raw)) if raw else None


_DISPATCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.c_size_t,
)


class _Hang(ctypes.Structure):
    _fields_ = [
        ("deadline_ns", ctypes.c_int64),
        ("holds_lock", ctypes.c_int),
        ("release_path", ctypes.c_char * 1024),
    ]


_HANG_FOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(_Hang))


class CNvmlLibrary:
    """The built stand-in, loaded and answering from one SimulatedNvmlLibrary (the same
    machine state, fault hooks and call counts as the Python stand-in)."""

    def __init__(self, so_path: Path, answers: SimulatedNvmlLibrary) -> None:
        self.answers = answers
        self.lib = ctypes.CDLL(str(so_path))
        self._converters = [[_converter(k) for k in kinds] for _, kinds, _, _ in SYMBOLS]
        self._methods = [getattr(answers, name) for name, _, _, _ in SYMBOLS]
        self._devices = answers.devices
        # Kept referenced: the C library holds only their addresses.
        self._dispatch = _DISPATCH(self._answer)
        self._hang_for = _HANG_FOR(self._hang)
        self.lib.gpufleet_standin_register(self._dispatch, self._hang_for)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        # The C library holds only the callbacks' addresses: they live as long as the library
        # object pynvml keeps.
        self.lib.gpufleet_answers = self

    def _answer(self, symbol: int, *raws: int) -> int:
        _, kinds, _, _ = SYMBOLS[symbol]
        raws = tuple(r or 0 for r in raws)
        args: list[Any] = []
        for i, kind in enumerate(kinds):
            if kind == "b":
                size = raws[i + 1] & 0xFFFFFFFF
                args.append((ctypes.c_char * size).from_address(raws[i]))
            else:
                args.append(self._converters[symbol][i](raws[i], raws))
        try:
            return int(self._methods[symbol](*args))
        except Exception:  # an answer that raises is the driver's unknown error, not a crash in C
            return pynvml.NVML_ERROR_UNKNOWN

    def _hang(self, symbol: int, device: int, out: Any) -> int:
        """Whether this call hangs (taken off the machine's hangs: a hang is one call), and how."""
        name = SYMBOLS[symbol][0]
        if device:
            gpu = self._devices.by_address(device)
            hang = gpu.take_hang(name) if gpu is not None else None
        else:
            hang = self.answers.node.take_hang(name)
        if hang is None:
            return 0
        h = out.contents
        h.deadline_ns = int(hang.until_s * 1e9) if hang.until_s is not None else 0
        h.holds_lock = int(hang.holds_driver_lock)
        h.release_path = hang.release_file.encode()[:1023]
        return 1


def install_c(so_path: Path, answers: SimulatedNvmlLibrary) -> CNvmlLibrary:
    """Put the C stand-in beneath pynvml (as install() does the Python one)."""
    library = CNvmlLibrary(so_path, answers)
    with _install_lock:
        pynvml.nvmlLib = library.lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return library
