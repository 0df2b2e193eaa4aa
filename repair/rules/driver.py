"""What the driver hides: a GPU whose NVML calls no longer return, a recovery action NVML asks
for while every health check says healthy, and a GPU the PCI bus shows that NVML does not list
(docs/repair.md "Failures the driver hides")."""

from __future__ import annotations

import dataclasses

import pynvml

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.health import Step
from gpufleet.repair.model import LADDER_STEPS, Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import GpuCheck, Rule


class DriverUnresponsive(GpuCheck):
    name = "driver_unresponsive"
    watch_fields = ("driver_unresponsive",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if not (gpu.HasField("driver_unresponsive") and gpu.driver_unresponsive):
            return None
        call = gpu.driver_unresponsive_call or "an NVML call"
        return f"{call} has not returned for {gpu.driver_unresponsive_s:.0f} s"


# nvmlGpuRecoveryAction_t -> (name, the catalog action, where on the ladder the repair starts).
_RESET = LADDER_STEPS
_REBOOT = (Step.REBOOT, Step.TICKET)
RECOVERY_ACTIONS: dict[int, tuple[str, str, tuple[Step, ...]]] = {
    pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET: ("GPU reset", "RESET_GPU", _RESET),
    pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT: ("node reboot", "RESTART_BM", _REBOOT),
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: ("drain peer-to-peer traffic", "DRAIN_AND_RESET", _RESET),
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET: ("drain and reset", "DRAIN_AND_RESET", _RESET),
    pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN: (
        "recover the IMEX domain",
        "CONTACT_SUPPORT",
        (Step.TICKET,),
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET: ("PCIe bus reset", "RESTART_BM", _REBOOT),
    pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT: ("system reboot", "RESTART_BM", _REBOOT),
}


class RecoveryActionPending(GpuCheck):
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION says the GPU needs a reset or a reboot: the repair
    starts where NVML says (a reboot is not tried as a GPU reset first), within the policy's
    ladder."""

    name = "recovery_action"
    watch_fields = ("recovery_action",)

    def check(self, gpu: telemetry_pb2.GpuSample, entry: Entry) -> str | None:
        if not gpu.HasField("recovery_action") or gpu.recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
            return None
        what = RECOVERY_ACTIONS.get(gpu.recovery_action, ("an unknown action",))[0]
        return f"NVML asks for {what} (recovery action {gpu.recovery_action})"

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        found = []
        for finding in super().evaluate(snap, entry, policy, now_ns):
            code = snap.gpus[finding.gpu].recovery_action if finding.gpu is not None else 0
            _, action, starts = RECOVERY_ACTIONS.get(code, ("", "CONTACT_SUPPORT", ("ticket",)))
            # The policy's ladder from the step NVML names (all of it when the policy has not that step).
            ladder = (
                entry.ladder[entry.ladder.index(starts[0]) :] if starts[0] in entry.ladder else entry.ladder
            )
            found.append(dataclasses.replace(finding, action=action, ladder=ladder))
        return found


class GpuMissingFromDriver(Rule):
    """More NVIDIA GPUs on the PCI bus than NVML lists (counted by the collector in sysfs)."""

    name = "gpu_missing_from_driver"
    context_fields = ("gpus_on_pci_bus", "gpu_count")  # the node's, not a GPU's

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        on_bus = snap.gpus_on_pci_bus
        if on_bus is None or on_bus <= snap.gpu_count:
            return []
        evidence = f"{on_bus} NVIDIA GPUs on the PCI bus, NVML lists {snap.gpu_count}"
        if not snap.gpu_count:
            # The collector's NVML never started (collector/sources/nvml_start.py): the driver
            # did not answer its start or its load, so no GPU of the node is visible to NVML.
            evidence = (
                f"{on_bus} NVIDIA GPUs on the PCI bus, NVML lists none: the driver has not answered "
                "NVML's start"
            )
        return [entry.finding(snap.node, None, self.name, evidence, snap.sample_time_ns or now_ns)]
