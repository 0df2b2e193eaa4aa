"""One health word per GPU, as a person reads it on every screen (the node page, `gpufleet node`,
GetNode): derived from the findings the aggregator holds about the GPU, the node's open
incident, and the signals its latest sample raises, never from the sample alone. A GPU with an
open finding is never "ok" (docs/architecture.md "GPU health").

  lost     its sample says it fell off the bus
  faulty   a critical finding is open on it
  suspect  a warning finding is open on it, the node's open incident is about it, or its
           sample says it failed (`hard_signals`: a stuck driver call, an uncorrected error)
  watch    an info finding, or another signal the sample raises (see `raised`)
A waste finding (an idle allocation, an orphaned process) is not the GPU's health: it is left out.
  ok       none of these"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.protos import fleet_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.repair.health import Health
from gpufleet.repair.model import WASTE_RULES, Finding
from gpufleet.repair.state import Workflow

OK, WATCH, SUSPECT, FAULTY, LOST = (
    vocabulary_pb2.GPU_HEALTH_OK,
    vocabulary_pb2.GPU_HEALTH_WATCH,
    vocabulary_pb2.GPU_HEALTH_SUSPECT,
    vocabulary_pb2.GPU_HEALTH_FAULTY,
    vocabulary_pb2.GPU_HEALTH_LOST,
)
_BY_SEVERITY = {"info": WATCH, "warning": SUSPECT, "critical": FAULTY}


def hard_signals(g: telemetry_pb2.GpuSample) -> list[str]:
    """What a sample says that is a failure on its own, before any rule's window: suspect."""
    notes = []
    if g.driver_unresponsive_call:
        notes.append(f"driver-unresponsive ({g.driver_unresponsive_call})")
    if g.ecc_dbe_volatile:
        notes.append(f"ecc-dbe={g.ecc_dbe_volatile}")
    if g.remap_failure:
        notes.append("remap-FAILED")
    return notes


def raised(g: telemetry_pb2.GpuSample) -> list[str]:
    """The signals of a sample an SRE looks at first, in a few words each (none: nothing)."""
    notes = hard_signals(g)
    if not g.remap_failure and (g.remap_pending or g.retired_pages_pending):
        notes.append("reset-pending")
    if g.throttle_thermal:
        notes.append("thermal-slowdown")
    if g.throttle_power:
        notes.append("power-slowdown")
    if g.nvlink_links_inactive:
        notes.append(f"nvlink-down={g.nvlink_links_inactive}")
    return notes


def gpu_state(
    g: telemetry_pb2.GpuSample, findings: Iterable[Finding], wf: Workflow | None
) -> fleet_pb2.GpuState:
    """One GPU's state: `findings` are the node's open ones (those on other GPUs, or on the
    whole node, are not this GPU's), `wf` the node's workflow (None: repair off)."""
    # A waste finding (an idle allocation, an orphan: docs/workloads.md) is about whose work is
    # on the GPU, not its health: the Workloads page and the heat map's outline say it.
    mine = sorted(
        (f for f in findings if f.gpu == g.index and f.code not in WASTE_RULES),
        key=lambda f: -f.severity_rank,
    )
    health = max((_BY_SEVERITY.get(f.severity, WATCH) for f in mine), default=OK)
    words = [f.code for f in mine]
    if wf is not None and wf.state is not Health.HEALTHY and g.index in wf.gpus:
        health = max(health, SUSPECT)
        words = words or [f"in the node's incident ({wf.state.value})"]
    notes = raised(g)
    if notes:
        health = max(health, SUSPECT if hard_signals(g) else WATCH)
        # A signal a finding already names is said once (driver_unresponsive, thermal_slowdown).
        notes = [n for n in notes if _signal(n) not in words]
    if g.lost:
        health = LOST
        notes.insert(0, "lost")
    return fleet_pb2.GpuState(
        index=g.index, health=health, findings=[f.code for f in mine], detail=", ".join(words + notes)
    )


def _signal(note: str) -> str:
    """A note's signal as a finding's code spells it: "driver-unresponsive (x)" → driver_unresponsive."""
    return note.split(" ")[0].split("=")[0].replace("-", "_").lower()


def gpu_states(
    gpus: Iterable[telemetry_pb2.GpuSample], findings: Iterable[Finding], wf: Workflow | None
) -> list[fleet_pb2.GpuState]:
    found = list(findings)
    return [gpu_state(g, found, wf) for g in gpus]
