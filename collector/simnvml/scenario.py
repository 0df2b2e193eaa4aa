"""Fault scenarios for simulated GPUs: which fault, on which node and GPU, at what second.

A scenario is a TOML file of [[fault]] tables, read by `gpufleet collector run --simulate
--sim-scenario FILE` (and `gpufleet demo --scenario FILE`, which hands it to every node):

    [[fault]]
    at_s = 30          # seconds after the collector starts
    node = "demo-node-02"   # optional: only this node (a demo shares one file)
    gpu = 3
    kind = "xid"       # see KINDS below
    xid = 79

Kinds and their parameters:
    xid             xid = N             an XID through the NVML event set
    ecc_corrected   count = N (1)       corrected (single-bit) ECC errors
    ecc_uncorrected count = N (1)       uncorrected (double-bit) errors: a row remap (or a
                                        retired page before Ampere) then waits for a reset
    remap_failure                       a row could not be remapped
    remap_pending                       a row remap waits for a GPU reset, no uncorrected
                                        error with it (a repair that may wait)
    lost                                every NVML call for the GPU answers GPU_IS_LOST
    recover                             the GPU answers again
    thermal                             cooling lost: held at its slowdown temperature, thermal reasons
    power                               power brake / power cap slowdown
    clear_slowdown                      no forced clock-event reasons any more
    nvlink_down     link = N            one NVLink link goes down
    nvlink_errors   link = N, count = N replay and CRC errors on one link
    pcie_replays    count = N           PCIe replays
    not_supported   symbol = "nvml..."  that NVML call answers NOT_SUPPORTED from now on
  Failures the driver hides (docs/repair.md):
    hang            symbol = "nvml..." ("*": the next call of any), seconds = N (absent: never
                    returns), release_file = PATH (the call returns once PATH exists), lock =
                    true (the C stand-in: blocked holding the driver's lock, so every call waits)
    recovery_action action = N          NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (1 reset, 2 reboot)
    pcie_downtrain  gen = N, width = N  the PCIe link trains to this (0: unchanged)
    fabric_down     state = N (1), status = N (0)   the NVLink fabric (3 = completed)
    gpu_missing     count = N (1)       GPUs on the PCI bus that the driver does not list
    ecc_storm       rate = N            corrected ECC errors per second from now on
    slow            factor = F          SM clock and power x F under load, no throttle reason
    power_limit     watts = N           the operator's power limit (nvidia-smi -pl); work that
                                        would draw more is held to it: power-cap reason, lower clock
    app_clock       mhz = N             the operator's SM application clock (nvidia-smi -ac): the
                                        clock the GPU targets and its SM clock does not pass
    heal                                every fault of this list above gone
    busy            util = N            the whole node runs a steady job at N % from now on
"""

from __future__ import annotations

import logging
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from gpufleet.collector.simnvml.machine import (
    FABRIC_COMPLETED,
    REASON_HW_POWER_BRAKE,
    REASON_SW_POWER_CAP,
    Hang,
    SimulatedGpu,
    SimulatedNode,
)

log = logging.getLogger("gpufleet.collector.scenario")

KINDS = {
    "xid": {"xid"},
    "ecc_corrected": {"count"},
    "ecc_uncorrected": {"count"},
    "remap_failure": set(),
    "remap_pending": set(),
    "lost": set(),
    "recover": set(),
    "thermal": set(),
    "power": set(),
    "clear_slowdown": set(),
    "nvlink_down": {"link"},
    "nvlink_errors": {"link", "count"},
    "pcie_replays": {"count"},
    "not_supported": {"symbol"},
    "hang": {"symbol", "seconds", "release_file", "lock"},
    "recovery_action": {"action"},
    "pcie_downtrain": {"gen", "width"},
    "fabric_down": {"state", "status"},
    "gpu_missing": {"count"},
    "ecc_storm": {"rate"},
    "slow": {"factor"},
    "power_limit": {"watts"},
    "app_clock": {"mhz"},
    "heal": set(),
    "busy": {"util"},
}
_REQUIRED = {
    "xid": {"xid"},
    "nvlink_down": {"link"},
    "nvlink_errors": {"link"},
    "not_supported": {"symbol"},
    "recovery_action": {"action"},
    "ecc_storm": {"rate"},
    "slow": {"factor"},
    "power_limit": {"watts"},
    "app_clock": {"mhz"},
    "busy": {"util"},
}
# Each parameter's type (what the TOML value is converted with); absent ones take Fault's default.
_TYPES: dict[str, type] = {
    "xid": int,
    "count": int,
    "link": int,
    "symbol": str,
    "seconds": float,
    "release_file": str,
    "lock": bool,
    "action": int,
    "gen": int,
    "width": int,
    "state": int,
    "status": int,
    "rate": float,
    "factor": float,
    "util": float,
    "watts": float,
    "mhz": float,
}


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the fault and the problem."""


@dataclass(frozen=True)
class Fault:
    at_s: float
    gpu: int
    kind: str
    node: str = ""
    xid: int = 0
    count: int = 1
    link: int = 0
    symbol: str = ""
    seconds: float | None = None
    release_file: str = ""
    lock: bool = False
    action: int = 0
    gen: int = 0
    width: int = 0
    state: int = 1
    status: int = 0
    rate: float = 0.0
    factor: float = 1.0
    util: float = 0.0
    watts: float = 0.0
    mhz: float = 0.0


def load(path: str | Path) -> list[Fault]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    faults = []
    for i, raw in enumerate(data.get("fault", [])):
        where = f"scenario {path}: fault {i + 1}"
        kind = raw.get("kind")
        if kind not in KINDS:
            raise ScenarioError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
        allowed = {"at_s", "gpu", "kind", "node"} | KINDS[kind]
        unknown = set(raw) - allowed
        if unknown:
            raise ScenarioError(
                f"{where} ({kind}): unknown key(s) {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        missing = _REQUIRED.get(kind, set()) - set(raw)
        if missing or "at_s" not in raw or "gpu" not in raw:
            need = sorted(missing | ({"at_s", "gpu"} - set(raw)))
            raise ScenarioError(f"{where} ({kind}): missing {', '.join(need)}")
        try:
            params = {k: _TYPES[k](v) for k, v in raw.items() if k in _TYPES}
            fault = Fault(float(raw["at_s"]), int(raw["gpu"]), kind, str(raw.get("node", "")), **params)
        except (TypeError, ValueError) as exc:
            raise ScenarioError(f"{where} ({kind}): {exc}") from exc
        if fault.at_s < 0 or fault.gpu < 0 or fault.count < 1:
            raise ScenarioError(f"{where} ({kind}): at_s and gpu must be ≥ 0, count ≥ 1")
        if not (0 < fault.factor <= 1 and fault.rate >= 0 and (fault.seconds is None or fault.seconds >= 0)):
            raise ScenarioError(f"{where} ({kind}): factor must be in (0, 1], rate and seconds ≥ 0")
        if kind == "power_limit" and not 50 <= fault.watts <= 2000:
            raise ScenarioError(f"{where} ({kind}): watts = {fault.watts:g} must be between 50 and 2000")
        if kind == "app_clock" and not 100 <= fault.mhz <= 5000:
            raise ScenarioError(f"{where} ({kind}): mhz = {fault.mhz:g} must be between 100 and 5000")
        faults.append(fault)
    return sorted(faults, key=lambda f: f.at_s)


def _nvlink_errors(gpu: SimulatedGpu, fault: Fault) -> None:
    for counter in (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT):
        key = (fault.link, counter)
        gpu.nvlink_errors[key] = gpu.nvlink_errors.get(key, 0) + fault.count


def _set(**values: Any) -> Callable[[SimulatedGpu, Fault], None]:
    def apply(gpu: SimulatedGpu, fault: Fault) -> None:
        for name, value in values.items():
            setattr(gpu, name, value)

    return apply


def _hang(gpu: SimulatedGpu, fault: Fault) -> None:
    until = None if fault.seconds is None else time.monotonic() + fault.seconds
    gpu.hangs[fault.symbol or "*"] = Hang(until, fault.release_file, fault.lock)


def _pcie_downtrain(gpu: SimulatedGpu, fault: Fault) -> None:
    gpu.pcie_gen = fault.gen or gpu.pcie_gen
    gpu.pcie_width = fault.width or gpu.pcie_width


_HEALED = {
    "recovery_action": 0,
    "pcie_gen": None,
    "pcie_width": None,
    "fabric_state": FABRIC_COMPLETED,
    "fabric_status": 0,
    "sbe_rate_per_s": 0.0,
    "slow_factor": 1.0,
    "power_limit_w": None,
    "app_clock_mhz": None,
}


# How each kind is applied to its GPU (the kinds and their parameters: KINDS above).
APPLY: dict[str, Callable[[SimulatedGpu, Fault], None]] = {
    "xid": lambda gpu, f: gpu.inject_xid(f.xid),
    "ecc_corrected": lambda gpu, f: gpu.inject_ecc(uncorrected=False, count=f.count),
    "ecc_uncorrected": lambda gpu, f: gpu.inject_ecc(uncorrected=True, count=f.count),
    "remap_failure": _set(remap_failure=True),
    "remap_pending": _set(remap_pending=True),
    "lost": _set(lost=True),
    "recover": _set(lost=False),
    "thermal": lambda gpu, f: gpu.overheat(),
    "power": lambda gpu, f: setattr(
        gpu, "forced_reasons", gpu.forced_reasons | REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE
    ),
    "clear_slowdown": _set(forced_reasons=0),
    "nvlink_down": lambda gpu, f: gpu.nvlink_down.add(f.link),
    "nvlink_errors": _nvlink_errors,
    "pcie_replays": lambda gpu, f: setattr(gpu, "pcie_replay_total", gpu.pcie_replay_total + f.count),
    "not_supported": lambda gpu, f: gpu.fail_symbols.__setitem__(f.symbol, pynvml.NVML_ERROR_NOT_SUPPORTED),
    "hang": _hang,
    "recovery_action": lambda gpu, f: setattr(gpu, "recovery_action", f.action),
    "pcie_downtrain": _pcie_downtrain,
    "fabric_down": lambda gpu, f: (
        setattr(gpu, "fabric_state", f.state),
        setattr(gpu, "fabric_status", f.status),
    ),
    "gpu_missing": lambda gpu, f: None,  # the node's, not the GPU's: NODE_APPLY
    "ecc_storm": lambda gpu, f: setattr(gpu, "sbe_rate_per_s", f.rate),
    "slow": lambda gpu, f: setattr(gpu, "slow_factor", f.factor),
    "power_limit": lambda gpu, f: setattr(gpu, "power_limit_w", f.watts),
    "app_clock": lambda gpu, f: setattr(gpu, "app_clock_mhz", f.mhz),
    "heal": _set(**_HEALED),
    "busy": lambda gpu, f: None,  # the node's: NODE_APPLY
}
# Kinds that change the node rather than one GPU.
NODE_APPLY: dict[str, Callable[[SimulatedNode, Fault], None]] = {
    "gpu_missing": lambda node, f: setattr(node, "bus_only_gpus", node.bus_only_gpus + f.count),
    "busy": lambda node, f: setattr(node, "forced_util_pct", f.util),
}
if set(APPLY) != set(KINDS):
    raise RuntimeError(f"scenario kinds {sorted(KINDS)} and their appliers {sorted(APPLY)} differ")


def apply(gpu: SimulatedGpu, fault: Fault) -> None:
    APPLY[fault.kind](gpu, fault)


class ScenarioRunner:
    """Applies a node's faults at their times, on a thread of its own."""

    def __init__(self, node: SimulatedNode, faults: list[Fault]) -> None:
        self._node = node
        self._faults = [f for f in faults if not f.node or f.node == node.node_name]
        for f in self._faults:
            if f.gpu >= len(node.gpus):
                raise ScenarioError(
                    f"fault {f.kind} at {f.at_s:g}s names GPU {f.gpu}; node "
                    f"{node.node_name} has {len(node.gpus)}"
                )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-scenario", daemon=True)

    def start(self) -> None:
        if self._faults:
            self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        for fault in self._faults:
            if self._stop.wait(max(0.0, started + fault.at_s - time.monotonic())):
                return
            log.warning(
                "scenario: %s on GPU %d",
                fault.kind,
                fault.gpu,
                extra={"gpu": fault.gpu, "fault": fault.kind, **_params(fault)},
            )
            apply(self._node.gpus[fault.gpu], fault)
            if fault.kind in NODE_APPLY:
                NODE_APPLY[fault.kind](self._node, fault)

    def stop(self) -> None:
        self._stop.set()


def _params(fault: Fault) -> dict[str, Any]:
    return {k: getattr(fault, k) for k in KINDS[fault.kind]}
