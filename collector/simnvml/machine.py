"""Simulated GPUs whose values move like a real node's: jobs start and stop, utilization
follows the job with per-GPU noise, HBM follows the job's footprint, power follows
utilization and temperature lags behind power.

Everything is deterministic for a given seed and sequence of query times, so tests can
reproduce a run. Fault hooks (`SimulatedGpu.lost`, `SimulatedGpu.fail_symbols`,
`SimulatedGpu.hangs`, ...) are plain attributes that tests and the scenario files
(collector/simnvml/scenario.py) set directly.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.collector.simnvml.gpu_users import LEAVES_BEHIND, MADE_UP_PID_BASE, DemoJobs, ProcGpuUsers
from gpufleet.collector.simnvml.scheduler import (
    DRAINED,
    IN_SERVICE,
    OUT_OF_ROTATION,
    ScheduledState,
    ServedLoad,
)

log = logging.getLogger("gpufleet.collector.sim")

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuProfile:
    """What a GPU model looks like through NVML."""

    name: str
    hbm_total_bytes: int
    power_limit_w: float
    idle_power_w: float
    # Steady-state GPU temperature at idle and at full power (air/liquid cooled SXM).
    idle_temp_c: float
    full_temp_c: float
    max_sm_clock_mhz: float = 1980.0
    mem_clock_mhz: float = 2619.0
    nvlink_links: int = 18  # 0: no NVLink (NOT_SUPPORTED)
    row_remapping: bool = True  # Ampere and later remap rows; older GPUs retire pages
    hbm: bool = True  # HBM reports its own temperature; GDDR boards do not
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    fabric: bool = True  # an NVSwitch fabric (nvmlDeviceGetGpuFabricInfo): Hopper and later HGX
    # Where the driver starts pulling clocks down to cool the GPU (NVML's
    # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN; `nvidia-smi -q` "GPU Slowdown Temp", 87 °C on H100 SXM).
    slowdown_temp_c: float = 87.0
    # GPU Performance Monitoring (nvmlGpmMetricsGet: SM and tensor activity): Hopper and later.
    gpm: bool = False


# Names and memory sizes as NVML reports them on real boards.
GPU_PROFILES: dict[str, GpuProfile] = {
    "H100": GpuProfile(
        "NVIDIA H100 80GB HBM3", 81559 * MIB, 700.0, 72.0, 31.0, 68.0, 1980, 2619, 18, gpm=True
    ),
    "H200": GpuProfile("NVIDIA H200", 143771 * MIB, 700.0, 78.0, 32.0, 70.0, 1980, 3201, 18, gpm=True),
    "A100": GpuProfile(
        "NVIDIA A100-SXM4-80GB",
        81920 * MIB,
        400.0,
        55.0,
        30.0,
        66.0,
        1410,
        1593,
        12,
        pcie_gen_max=4,
        fabric=False,
    ),
    "B200": GpuProfile("NVIDIA B200", 183359 * MIB, 1000.0, 140.0, 33.0, 72.0, 1965, 3996, 18, gpm=True),
    "L40S": GpuProfile(
        "NVIDIA L40S",
        46068 * MIB,
        350.0,
        36.0,
        29.0,
        74.0,
        2520,
        9001,
        0,
        hbm=False,
        pcie_gen_max=4,
        fabric=False,
    ),
    "V100": GpuProfile(
        "Tesla V100-SXM2-32GB",
        32768 * MIB,
        300.0,
        40.0,
        30.0,
        70.0,
        1530,
        877,
        6,
        False,
        pcie_gen_max=3,
        fabric=False,
    ),
}

# A PCIe link at idle trains down to save power (as real GPUs do): its generation then reads 1.
IDLE_PCIE_GEN = 1
FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED


@dataclass
class Hang:
    """An NVML call that does not return: until `until_s` (time.monotonic()), or, with neither
    that nor a release file, never; a release file that appears ends it at once (how a test
    lets a call "blocked forever" return)."""

    until_s: float | None = None
    release_file: str = ""
    # Blocked while holding the driver's library-wide lock, as a driver stuck with its internal
    # lock held: every other call, for every GPU, then waits too (the C stand-in, clibrary.py).
    holds_driver_lock: bool = False

    def over(self) -> bool:
        if self.until_s is not None and time.monotonic() >= self.until_s:
            return True
        return bool(self.release_file) and Path(self.release_file).exists()

    def wait(self) -> None:
        # Polls: the call is stuck as a kernel call is, and nothing else of the stand-in waits on it.
        while not self.over():
            time.sleep(0.05)


# NVML clock-event reason bits (nvmlClocksEventReason*), as the stand-in sets them.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80


@dataclass
class _Job:
    """The work a node is running: all its GPUs share it, as in a real training or
    tensor-parallel inference job."""

    util_target_pct: float
    hbm_fraction: float
    ends_at_s: float
    pid: int = 0
    tensor_share: float = 0.6  # of the SMs' busy time, the share on tensor cores (GPM)
    # A program's exact load (gpu_users.py: a process on this machine that said what it runs):
    # utilization and HBM are exactly what it asks, no noise; its processes as (pid, bytes).
    exact: bool = False
    processes: tuple[tuple[int, int], ...] = ()
    # The demo scheduler's job this is (gpu_users.py DemoJobs), for its cgroup and its record.
    workload: object = None
    serving: bool = False  # the demo's inference replica (scheduler.py ServedLoad): its load, as given


@dataclass
class SimulatedGpu:
    index: int
    profile: GpuProfile
    uuid: str
    pci_bus_id: str
    rng: random.Random
    util_gpu_pct: float = 0.0
    util_mem_pct: float = 0.0
    hbm_used_bytes: int = 0
    temp_gpu_c: float = 30.0
    power_w: float = 0.0
    # Fault hooks. lost: every call for this GPU returns NVML_ERROR_GPU_IS_LOST.
    # fail_symbols: C symbol name -> NVML return code to answer instead of data
    # (e.g. {"nvmlDeviceGetPowerUsage": NVML_ERROR_NOT_SUPPORTED}).
    lost: bool = False
    fail_symbols: dict[str, int] = field(default_factory=dict)
    # hangs: C symbol name ("*": every call for this GPU) -> a call that blocks (Hang above).
    hangs: dict[str, Hang] = field(default_factory=dict)
    # Failures the driver hides (docs/repair.md): what NVML says the GPU needs, a PCIe link
    # trained below its maximum (None: as the profile, at full speed under load), the fabric,
    # a storm of corrected ECC errors, and a GPU slower than its peers (SM clock and power
    # scaled by slow_factor under load, no throttle reason set).
    recovery_action: int = 0
    pcie_gen: int | None = None
    pcie_width: int | None = None
    fabric_state: int = FABRIC_COMPLETED
    fabric_status: int = 0
    sbe_rate_per_s: float = 0.0
    slow_factor: float = 1.0
    _sbe_carry: float = 0.0
    # The power limit an operator set (nvidia-smi -pl; None: the board's). Under it a GPU whose
    # work would draw more is held at the limit with the SW power-cap reason raised and its SM
    # clock lowered, as the driver does (capped_by below).
    power_limit_w: float | None = None
    _demand_w: float = 0.0  # what the work would draw without the limit
    # The SM application clock an operator set (nvidia-smi -ac; None: the board's maximum): the
    # clock the GPU's clocks policy targets, which its SM clock does not pass.
    app_clock_mhz: float | None = None
    # Work, not time (GPM): the share of SMs busy and of time on tensor cores now, and their
    # integrals over the GPU's life (%·s), from which a GPM sample pair gives the mean between.
    sm_active_pct: float = 0.0
    tensor_active_pct: float = 0.0
    work_integrals: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (seconds, SM %·s, tensor %·s)
    # Counters and states that faults move (read through the matching NVML symbols).
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    retired_pages_sbe: list[int] = field(default_factory=list)
    retired_pages_dbe: list[int] = field(default_factory=list)
    retired_pages_pending: bool = False
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    pcie_replay_total: int = 0
    nvlink_down: set[int] = field(default_factory=set)
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter)
    forced_reasons: int = 0  # clock-event reason bits a fault holds on
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    # Where XID events go: callbacks registered by the stand-in library's event sets.
    xid_listeners: list[object] = field(default_factory=list)

    # --- fault injection ---------------------------------------------------------------
    # A process the demo's ended job left on this GPU: (pid, HBM bytes it holds), or None.
    leftover: tuple[int, int] | None = None

    def inject_xid(self, xid: int) -> None:
        """Deliver an XID through every NVML event set registered for this GPU."""
        for deliver in list(self.xid_listeners):
            deliver(self, xid)  # type: ignore[operator]

    def reset(self) -> str:
        """What `nvidia-smi -r` does to this GPU: volatile ECC counts cleared, a pending row
        remap or page retirement applied, NVLinks retrained. A GPU that fell off the bus cannot
        be reset (raises RuntimeError, as the real reset fails)."""
        if self.lost:
            raise RuntimeError(f"GPU {self.index} ({self.pci_bus_id}) is lost: it cannot be reset")
        self.ecc_sbe_volatile = self.ecc_dbe_volatile = 0
        self.remap_pending = self.retired_pages_pending = False
        self.nvlink_down.clear()
        # What the driver asked a reset for is done; a storm from a row the reset remapped ends.
        self.recovery_action = 0
        self.sbe_rate_per_s = self._sbe_carry = 0.0
        return f"GPU {self.index} reset (simulated)"

    def target_clock_mhz(self) -> float:
        """The SM clock the clocks policy targets (NVML's application-clock target)."""
        top = self.profile.max_sm_clock_mhz
        return min(top, self.app_clock_mhz) if self.app_clock_mhz is not None else top

    def enforced_power_limit_w(self) -> float:
        return self.power_limit_w if self.power_limit_w is not None else self.profile.power_limit_w

    def capped_by(self) -> float:
        """How far the power limit holds the GPU's work back: 1.0 when it draws what its work
        asks, else the SM clock's factor. Near the top of the voltage-frequency curve dynamic
        power grows about with the cube of the clock (the voltage rises with it), so a GPU held
        to 80 % of the power its work wants runs at about 0.8^(1/3) = 93 % of the clock."""
        limit = self.enforced_power_limit_w()
        if self._demand_w <= limit or self.util_gpu_pct < 1:
            return 1.0
        return (limit / self._demand_w) ** (1 / 3)

    def inject_ecc(self, uncorrected: bool, count: int = 1) -> None:
        if uncorrected:
            self.ecc_dbe_volatile += count
            self.ecc_dbe_aggregate += count
            if self.profile.row_remapping:
                self.remap_uncorrectable += count
                self.remap_pending = True
            else:
                self.retired_pages_dbe.extend(
                    0x1000 * (len(self.retired_pages_dbe) + i) for i in range(count)
                )
                self.retired_pages_pending = True
        else:
            self.ecc_sbe_volatile += count
            self.ecc_sbe_aggregate += count

    def wait_if_hung(self, symbol: str) -> None:
        """Block the calling thread while a hang holds this symbol (or every symbol)."""
        _wait_if_hung(self.hangs, symbol)

    def take_hang(self, symbol: str) -> Hang | None:
        """The hang this call meets, taken (it is one call's), for the C stand-in to block on."""
        return _take_hang(self.hangs, symbol)

    def pcie_link(self) -> tuple[int, int]:
        """(generation, width) the link runs at now."""
        gen = self.pcie_gen or self.profile.pcie_gen_max
        if self.util_gpu_pct < 1:
            gen = IDLE_PCIE_GEN
        return gen, self.pcie_width or self.profile.pcie_width_max

    def thermal_slowdown(self) -> bool:
        return bool(self.forced_reasons & (REASON_SW_THERMAL | REASON_HW_THERMAL))

    def overheat(self) -> None:
        """Cooling lost: the GPU at its slowdown temperature, the thermal reasons raised (the
        scenario's `thermal` fault). Never a slowdown reported at a normal temperature."""
        self.forced_reasons |= REASON_SW_THERMAL | REASON_HW_THERMAL
        self.temp_gpu_c = max(self.temp_gpu_c, self.profile.slowdown_temp_c + 1.0)

    def clock_event_reasons(self) -> int:
        reasons = self.forced_reasons
        if self.util_gpu_pct < 1:
            reasons |= REASON_GPU_IDLE
        elif self.capped_by() < 1.0:
            reasons |= REASON_SW_POWER_CAP
        return reasons

    def sm_clock_mhz(self) -> float:
        if self.util_gpu_pct < 1:
            return 345.0
        slowed = self.forced_reasons & (
            REASON_HW_SLOWDOWN
            | REASON_SW_THERMAL
            | REASON_HW_THERMAL
            | REASON_SW_POWER_CAP
            | REASON_HW_POWER_BRAKE
        )
        return self.target_clock_mhz() * (0.55 if slowed else 1.0) * self._slowness() * self.capped_by()

    def _slowness(self) -> float:
        return self.slow_factor if self.util_gpu_pct >= 50 else 1.0

    def step(self, dt_s: float, job: _Job | None) -> None:
        """Advance this GPU by dt_s seconds towards what the job asks of it."""
        target = job.util_target_pct if job else 0.0
        exact = job is not None and job.exact
        if job and not exact:
            # Noise in proportion, up to 4 points: a GPU that barely works reads barely working,
            # not a random 0-9 % (what the idle_allocation rule's threshold is about).
            target += self.rng.gauss(0.0, min(4.0, 0.25 * target))
        # Mean-reverting walk: fast enough to follow a job start within a few seconds.
        alpha = 1.0 if exact else min(1.0, dt_s / 3.0)
        self.util_gpu_pct = _clamp(self.util_gpu_pct + alpha * (target - self.util_gpu_pct), 0, 100)
        self.util_mem_pct = _clamp(self.util_gpu_pct * 0.55 + self.rng.gauss(0, 2), 0, 100)
        total = self.profile.hbm_total_bytes
        want_hbm = (job.hbm_fraction if job else 0.0) * total + 512 * MIB
        if job is not None and job.exact:
            want_hbm = sum(used for _, used in job.processes) + 512 * MIB
            self.hbm_used_bytes = int(_clamp(want_hbm, 0, total))
        else:
            self.hbm_used_bytes = int(_clamp(want_hbm + self.rng.gauss(0, 64 * MIB), 0, total))
        p = self.profile
        self.power_w = (
            p.idle_power_w
            + (p.power_limit_w * 0.95 - p.idle_power_w) * (self.util_gpu_pct / 100.0)
            + self.rng.gauss(0, 3)
        )
        self._demand_w = self.power_w * self._slowness()
        self.power_w = _clamp(self._demand_w, p.idle_power_w * 0.8, self.enforced_power_limit_w())
        if self.sbe_rate_per_s:
            self._sbe_carry += self.sbe_rate_per_s * dt_s
            storm, self._sbe_carry = int(self._sbe_carry), self._sbe_carry % 1
            self.ecc_sbe_volatile += storm
            self.ecc_sbe_aggregate += storm
        # Temperature: first-order lag (time constant ~20 s) towards the power's equilibrium. A
        # GPU in thermal slowdown (its cooling failing) sits at its slowdown temperature: that is
        # what the driver's clock pull-down holds it to.
        load = (self.power_w - p.idle_power_w) / max(1.0, p.power_limit_w - p.idle_power_w)
        t_eq = p.idle_temp_c + (p.full_temp_c - p.idle_temp_c) * load
        if self.thermal_slowdown():
            t_eq = p.slowdown_temp_c + 1.0
        self.temp_gpu_c += min(1.0, dt_s / 20.0) * (t_eq - self.temp_gpu_c)
        if job is not None and job.processes:
            self.processes = list(job.processes)
        else:
            self.processes = [(job.pid, max(0, self.hbm_used_bytes - 512 * MIB))] if job else []
        if self.leftover is not None:  # a process an ended job left behind, still holding HBM
            pid, held = self.leftover
            self.processes.append((pid, held))
            self.hbm_used_bytes = int(_clamp(self.hbm_used_bytes + held, 0, total))
        self._step_work(dt_s, job)

    def _step_work(self, dt_s: float, job: _Job | None) -> None:
        """SM and tensor activity follow utilization: a kernel keeps most SMs busy under a real
        job, and the job decides how much of that is tensor-core work."""
        self.sm_active_pct = self.util_gpu_pct * 0.92  # util (0-100) carries the noise
        self.tensor_active_pct = self.sm_active_pct * (job.tensor_share if job else 0.0)
        seconds, sm, tensor = self.work_integrals
        self.work_integrals = (
            seconds + dt_s,
            sm + self.sm_active_pct * dt_s,
            tensor + self.tensor_active_pct * dt_s,
        )


MIN_STEP_S = 0.05  # the least clock time a simulated node moves by (SimulatedNode.advance)


def _take_hang(hangs: dict[str, Hang], symbol: str) -> Hang | None:
    for key in (symbol, "*"):
        hang = hangs.pop(key, None)
        if hang is not None:
            return hang
    return None


def _wait_if_hung(hangs: dict[str, Hang], symbol: str) -> None:
    for key in (symbol, "*"):
        hang = hangs.get(key)
        if hang is not None:
            hang.wait()
            hangs.pop(key, None)


class SimulatedNode:
    """One machine's worth of simulated GPUs, advanced lazily to the time it is asked about."""

    def __init__(
        self,
        node_name: str,
        gpu_count: int = 8,
        model: str = "H100",
        seed: int | None = None,
        clock: callable = time.monotonic,  # type: ignore[valid-type]
        scheduled: ScheduledState | None = None,
        gpu_users: ProcGpuUsers | None = None,
        demo_jobs: DemoJobs | None = None,
        served: ServedLoad | None = None,
    ) -> None:
        if model not in GPU_PROFILES:
            raise ValueError(
                f"unknown simulated GPU model {model!r}; choose one of {', '.join(GPU_PROFILES)}"
            )
        if not 0 <= gpu_count <= 64:
            raise ValueError(f"simulated GPU count {gpu_count} must be between 0 and 64")
        self.node_name = node_name
        self.driver_version = "570.133.20"
        if seed is None:
            seed = int.from_bytes(hashlib.sha256(node_name.encode()).digest()[:8], "big")
        self._rng = random.Random(seed)
        self._clock = clock
        self._lock = threading.Lock()
        profile = GPU_PROFILES[model]
        self.gpus = [
            SimulatedGpu(
                index=i,
                profile=profile,
                uuid=f"GPU-{uuid.UUID(int=self._rng.getrandbits(128))}",
                # SXM boards sit on separate PCIe switches; bus numbers as on an HGX board.
                pci_bus_id=f"00000000:{(0x18 + 0x11 * i) & 0xFF:02X}:00.0",
                rng=random.Random(self._rng.getrandbits(64)),
                temp_gpu_c=profile.idle_temp_c,
                power_w=profile.idle_power_w,
            )
            for i in range(gpu_count)
        ]
        # GPUs the PCI bus shows that the driver does not list (a GPU missing from NVML).
        self.bus_only_gpus = 0
        # Calls that are not a GPU's (nvmlInitWithFlags, ...) -> a hang (as SimulatedGpu.hangs).
        self.hangs: dict[str, Hang] = {}
        # A steady job at this utilization from now on (None: jobs come and go at random).
        self.forced_util_pct: float | None = None
        self._job: _Job | None = None
        self._leftover_until_s = 0.0
        self._idle_until_s = 0.0
        self._last_s = self._clock()
        self._t_s = 0.0  # simulated seconds since start
        # The demo scheduler's state file (None: no scheduler; jobs come and go on their own).
        self.scheduled = scheduled
        self._scheduled_state = IN_SERVICE
        # Real processes that run on these GPUs (gpu_users.py): with them, the node runs no job
        # of its own; its GPUs do exactly what those processes ask.
        self.gpu_users = gpu_users
        # The demo scheduler's owners of the node's own jobs (None: jobs belong to no one).
        self.demo_jobs = demo_jobs
        # The demo's inference replica on this node, when it has one: its load is the node's job.
        self.served = served

    def wait_if_hung(self, symbol: str) -> None:
        _wait_if_hung(self.hangs, symbol)

    def take_hang(self, symbol: str) -> Hang | None:
        return _take_hang(self.hangs, symbol)

    def pci_gpu_count(self) -> int:
        """NVIDIA GPUs on this node's PCI bus, as sysfs would count them."""
        return len(self.gpus) + self.bus_only_gpus

    def advance(self) -> None:
        """Bring every GPU up to the current clock (called before each NVML read). The node
        moves in steps of at least MIN_STEP_S: a collector's tick makes some 300 NVML calls
        within milliseconds, and stepping all eight GPUs before each was most of a simulated
        collector's CPU (a real GPU's counters do not change between calls microseconds apart
        either: NVML's utilization is an average over its own sample period)."""
        with self._lock:
            now = self._clock()
            dt = now - self._last_s
            if dt < MIN_STEP_S and self._t_s > 0:
                return  # (the first read always steps: no GPU is read before its first step)
            self._last_s = now
            # Step in slices of at most 1 s so a long gap still evolves smoothly.
            while dt > 0:
                step = min(dt, 1.0)
                dt -= step
                self._t_s += step
                if self.gpu_users is not None:
                    jobs = self._jobs_of_gpu_users()
                    for gpu in self.gpus:
                        gpu.step(step, jobs.get(gpu.index))
                    continue
                self._schedule_jobs()
                self._end_leftover()
                for gpu in self.gpus:
                    gpu.step(step, self._job)

    def _jobs_of_gpu_users(self) -> dict[int, _Job]:
        assert self.gpu_users is not None
        jobs = {}
        for index, uses in self.gpu_users.uses().items():
            jobs[index] = _Job(
                min(100.0, sum(u.util_pct for u in uses)),
                0.0,
                float("inf"),
                pid=uses[0].pid,
                exact=True,
                processes=tuple((u.pid, u.hbm_bytes) for u in uses),
            )
        return jobs

    def _set_job(self, job: _Job | None) -> None:
        """The node's own job from now on: its owner told (the demo scheduler's record)."""
        old = self._job
        if old is not None and old is not job and old.workload is not None and self.demo_jobs:
            left = LEAVES_BEHIND.get(old.workload.account)  # type: ignore[attr-defined]
            if left is not None and self.gpus and self.gpus[0].leftover is None:
                # The demo's orphan: the job ends, one of its processes does not.
                self.gpus[0].leftover = (old.pid, left[0])
                self._leftover_until_s = self._t_s + left[1]
            self.demo_jobs.ended(old.workload, old.pid, keep_process=left is not None)  # type: ignore[arg-type]
        if job is not None and job is not old and self.demo_jobs is not None:
            owner = self.demo_jobs.pick(self._rng.random())
            if job.util_target_pct > 0 and not job.exact and not job.serving and self.forced_util_pct is None:
                low, high = owner.util_range
                job.util_target_pct = self._rng.uniform(low, high)
            job.workload = owner
            self.demo_jobs.started(owner, job.pid, job.ends_at_s - self._t_s)
        self._job = job

    @property
    def engines_in_rotation(self) -> bool:
        """False once the demo scheduler took the node's engines out of rotation (or drained it):
        its simulated engines then get no new request (engine_server.py)."""
        return self._scheduled_state not in (OUT_OF_ROTATION, DRAINED)

    def _obey_scheduler(self) -> bool:
        """The demo scheduler's word on this node (scheduler.py): True while no job may start.
        A drained node's job is stopped; each change is logged, as a scheduler's event is."""
        state = self.scheduled.read() if self.scheduled else IN_SERVICE
        if state != self._scheduled_state:
            log.info(
                "node %s: the scheduler has it %s%s",
                self.node_name,
                state or "in service again: jobs start",
                f"; job {self._job.pid} stopped" if state == DRAINED and self._job else "",
                extra={"node": self.node_name, "scheduler_state": state or "in_service"},
            )
            self._scheduled_state = state
        if state == DRAINED:
            self._set_job(None)
        return state != IN_SERVICE

    def _serve(self) -> bool:
        """With a replica of the demo's serving pool on this node: its GPUs follow its load (the
        job's target moves with the batch; HBM is what the engine holds). False: no replica."""
        load = self.served.read() if self.served is not None else None
        if load is None:
            return False
        util, hbm = load
        if util == 0 and hbm == 0:  # its replica is down (not joined yet, or drained): idle GPUs
            if self._job is not None:
                self._set_job(None)
            return True
        if self._job is None or not self._job.serving:
            self._set_job(
                _Job(util, hbm, float("inf"), pid=self._made_up_pid(), tensor_share=0.35, serving=True)
            )
        self._job.util_target_pct, self._job.hbm_fraction = util, hbm
        return True

    def _schedule_jobs(self) -> None:
        stopped = self._obey_scheduler()
        if self._serve():
            return
        if stopped:
            if self._job and self._t_s >= self._job.ends_at_s:
                self._set_job(None)  # a cordoned node's job runs to its end; no other starts
            return
        if self.forced_util_pct is not None:
            if self._job is None or self._job.util_target_pct != self.forced_util_pct:
                self._set_job(_Job(self.forced_util_pct, 0.8, float("inf"), pid=self._made_up_pid()))
            return
        if self._job and self._t_s >= self._job.ends_at_s:
            self._set_job(None)
            self._idle_until_s = self._t_s + self._rng.uniform(5, 60)
        if self._job is None and self._t_s >= self._idle_until_s:
            training = self._rng.random() < 0.6
            if training:  # high, steady, mostly matrix work
                util, hbm = self._rng.uniform(85, 99), self._rng.uniform(0.7, 0.95)
            else:  # inference: moderate, KV cache holds most of HBM, decode is memory-bound
                util, hbm = self._rng.uniform(25, 70), self._rng.uniform(0.85, 0.92)
            self._set_job(
                _Job(
                    util,
                    hbm,
                    self._t_s + self._rng.uniform(120, 900),
                    pid=self._made_up_pid(),
                    tensor_share=0.6 if training else 0.35,
                )
            )

    def _end_leftover(self) -> None:
        """The process an ended demo job left behind exits at its time (its cgroup goes too)."""
        gpu = self.gpus[0] if self.gpus else None
        if gpu is None or gpu.leftover is None or self._t_s < self._leftover_until_s:
            return
        if self.demo_jobs is not None:
            self.demo_jobs.forget(gpu.leftover[0])
        gpu.leftover = None

    def _made_up_pid(self) -> int:
        """A simulated job's process id: above any real pid (gpu_users.py MADE_UP_PID_BASE), so
        the collector never reads a real process's cgroup for it."""
        return self._rng.randint(MADE_UP_PID_BASE + 1, 2**31 - 1)


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
