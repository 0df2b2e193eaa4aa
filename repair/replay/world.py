"""What a replay simulates around the real controller: each fault input applied to its node's
snapshot, what a repair clears, a GPU reset's answer (failing for a lost GPU; from the store, when
the recorded GPU looks clean), and a reboot or ticket hook's; and the replay's settings."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.descriptor import FieldDescriptor

from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.repair.hooks import HookResult
from gpufleet.repair.policy import Policy
from gpufleet.repair.rails import Rails
from gpufleet.repair.replay.history import NVML_GPU_COUNT, ON_PCI_BUS, REPORTING, FaultHistory, FaultInput
from gpufleet.repair.step_runner import Hooks

# What a GPU reset (and a reboot) clears on a GPU: the sampled signals that only last until one.
_BOOL, _DOUBLE = FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_DOUBLE
_FIELDS = telemetry_pb2.GpuSample.DESCRIPTOR.fields_by_name


CLEARED_BY_RESET = (
    "ecc_dbe_volatile",
    "ecc_sbe_volatile",
    "remap_pending",
    "retired_pages_pending",
    "lost",
    "nvlink_links_inactive",
    "ecc_sbe_rate_per_s",  # a corrected-error storm: the reset remaps the failing row (simulated)
)
# Recovery actions (nvmlGpuRecoveryAction_t) a GPU reset answers: 1 reset, 3 drain P2P, 4 drain and
# reset. The others (a reboot, a bus reset) clear only with a reboot.
RESET_RECOVERY_ACTIONS = (1, 3, 4)
# What a reboot also clears on every GPU, beyond a reset: the driver answers again, the recovery
# NVML asked for is done, the fabric comes up (3: completed), the link retrains to its maximum.
FABRIC_COMPLETED = 3
# Why a reset fails, by the GPU's state.
_UNREACHABLE = {
    "lost": "the GPU is lost (fallen off the bus): a reset cannot reach it",
    "driver_unresponsive": "the driver does not answer for this GPU: a reset cannot reach it",
}


@dataclass
class ReplayConfig:
    rails: Rails = field(default_factory=Rails)
    # Reboot and ticket commands: simulated as configured (True), or these (the aggregator's
    # own, replaying its store: an empty one is skipped, as live).
    simulate_hooks: bool = True
    hooks: Hooks = field(default_factory=Hooks)
    from_store: bool = False  # the history is recorded: a repair's effect is in it already
    tick_s: float = 1.0  # the live controller's repair_interval_s
    held_retry_s: float = 3600.0  # a backstop: a held node is woken when the rail lets go
    reset_s: float = 5.0
    reboot_s: float = 300.0
    technician_s: float = 48 * 3600.0
    breaker_reset_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("tick_s", "held_retry_s", "reset_s", "reboot_s"):
            if not 0 < getattr(self, name) <= 86400 * 30:
                raise ValueError(
                    f"replay {name}={getattr(self, name)} must be more than 0 and at most 30 days"
                )
        for name in ("technician_s", "breaker_reset_s"):
            if not 0 <= getattr(self, name) <= 86400 * 365:
                raise ValueError(f"replay {name}={getattr(self, name)} must be 0 (never) to 365 days")


@dataclass
class SimulatedNode:
    gpus: dict[int, telemetry_pb2.GpuSample]
    events: deque[telemetry_pb2.Event] = field(default_factory=lambda: deque(maxlen=100))
    boot: int = 0
    reporting: bool = True
    silent_since_ns: int = 0
    on_pci_bus: int | None = None  # NVIDIA GPUs its PCI bus shows (None: not counted)
    nvml_gpus: int | None = None  # GPUs NVML lists, when a history said (None: every GPU)
    # Its engine replicas: served model -> what the trace says it carries with its pool whole.
    engines: dict[str, dict[str, float]] = field(default_factory=dict)


class SimulatedWorld:
    """The nodes a replay's controller acts on: each fault input applied to its node, and what
    the controller's actions (a reset command, a hook) do to them, as events on the engine's
    timeline (`push`) at the engine's time (`clock`)."""

    def __init__(
        self,
        policy: Policy,
        history: FaultHistory,
        config: ReplayConfig,
        push: Callable[[int, str, object], None],
        clock: Callable[[], int],
    ) -> None:
        self.policy, self.history, self.config = policy, history, config
        self._push, self._clock = push, clock
        self.nodes: dict[str, SimulatedNode] = {}
        # Replaying the store: each GPU's recorded inputs, to see when a reset's effect shows.
        self._by_gpu: dict[tuple[str, int], list[FaultInput]] = {}
        if config.from_store:
            for i in history.inputs:
                if i.gpu is not None and i.signal:
                    self._by_gpu.setdefault((i.node, i.gpu), []).append(i)

    @property
    def now(self) -> int:
        return self._clock()

    def node(self, name: str) -> SimulatedNode:
        node = self.nodes.get(name)
        if node is None:
            count = self.history.gpu_count(name)
            gpus = {i: telemetry_pb2.GpuSample(index=i, uuid=f"GPU-{name}-{i}") for i in range(count)}
            node = self.nodes[name] = SimulatedNode(gpus)
        return node

    def apply(self, i: FaultInput) -> None:
        node = self.node(i.node)
        if i.xid or i.kind:
            event = telemetry_pb2.Event(
                kind=i.kind or vocabulary_pb2.EVENT_KIND_XID,
                source=i.source or vocabulary_pb2.EVENT_SOURCE_KMSG,
                time_unix_ns=i.time_ns,
                xid=i.xid,
                message=i.message,
                count=i.count if i.count > 1 else 0,
            )
            if i.gpu is not None:
                event.gpu_index = i.gpu
            node.events.append(event)
            return
        if i.model:
            node.engines.setdefault(i.model, {})[i.signal] = i.value
            return
        if i.signal == REPORTING:
            if node.reporting and not i.value:
                node.silent_since_ns = i.time_ns
            node.reporting = bool(i.value)
            return
        if i.signal == ON_PCI_BUS:
            node.on_pci_bus = int(i.value)
            return
        if i.signal == NVML_GPU_COUNT:
            node.nvml_gpus = int(i.value)
            return
        if i.gpu is None:
            return
        gpu = node.gpus.get(i.gpu)
        if gpu is None:  # a GPU index past the node's count: the node has more than was said
            gpu = node.gpus[i.gpu] = telemetry_pb2.GpuSample(index=i.gpu, uuid=f"GPU-{i.node}-{i.gpu}")
        kind = _FIELDS[i.signal].type
        setattr(
            gpu,
            i.signal,
            bool(i.value) if kind == _BOOL else float(i.value) if kind == _DOUBLE else int(i.value),
        )

    def clear(self, node: SimulatedNode, gpus: list[int], reboot: bool = False) -> None:
        """What a GPU reset clears on these GPUs, or (reboot) what a reboot clears on them."""
        for index in gpus:
            gpu = node.gpus.get(index)
            if gpu is None:
                continue
            for name in CLEARED_BY_RESET:
                if not _FIELDS[name].has_presence or gpu.HasField(name):
                    setattr(gpu, name, False if _FIELDS[name].type == _BOOL else 0)
            if gpu.recovery_action and (reboot or gpu.recovery_action in RESET_RECOVERY_ACTIONS):
                gpu.recovery_action = 0
            if not reboot:
                continue
            if gpu.HasField("driver_unresponsive"):
                gpu.driver_unresponsive = False
            if gpu.HasField("fabric_state"):
                gpu.fabric_state, gpu.fabric_status = FABRIC_COMPLETED, 0
            if gpu.HasField("pcie_link_gen_max"):
                gpu.pcie_link_gen = gpu.pcie_link_gen_max
            if gpu.HasField("pcie_link_width_max"):
                gpu.pcie_link_width = gpu.pcie_link_width_max
        if reboot:
            node.nvml_gpus = None  # the driver lists every GPU on the bus again

    def send_command(self, node: str, command: ingest_pb2.Command) -> bool:
        gpu = command.reset_gpu.gpu_index
        sim = self.node(node)
        sample = sim.gpus.get(gpu)
        if not sim.reporting:
            return False  # the node's collector is not connected: the controller records that
        unreachable = next((n for n in _UNREACHABLE if sample is not None and getattr(sample, n)), None)
        if unreachable is not None:
            self._push(
                self.now + int(self.config.reset_s * 1e9),
                "reset",
                (node, command.id, gpu, False, _UNREACHABLE[unreachable]),
            )
            return True
        if self.config.from_store:
            answer = self._recorded_answer(node, gpu)
            if answer is None:
                return True  # never answers: the controller's reset_timeout_s fails it, as live
            when, ok = answer
            self._push(when, "reset", (node, command.id, gpu, ok, "" if ok else _UNREACHABLE["lost"]))
        else:
            self._push(self.now + int(self.config.reset_s * 1e9), "reset", (node, command.id, gpu, True, ""))
        return True

    def _recorded_answer(self, node: str, gpu: int) -> tuple[int, bool] | None:
        """A live reset's answer as the recorded history shows it: (when, succeeded), or None if
        it never would have within reset_timeout_s.

        The store holds a GPU's state at its sampling ticks, which lag what the collector saw
        when it ran the reset by up to an interval, while a replay's cordon and drain take no
        time: a GPU recorded lost (fallen off the bus) before the reset could have answered
        (reset_s) was lost when it ran, and the reset failed, as it did live. Otherwise the
        reset answers when the recorded GPU shows clean of what a reset clears."""
        state = {n: bool(getattr(self.nodes[node].gpus[gpu], n)) for n in CLEARED_BY_RESET}
        soonest = self.now + int(min(self.config.reset_s, 1.0) * 1e9)
        horizon = self.now + int(self.config.reset_s * 1e9)
        limit = self.now + int(self.policy.workflow["reset_timeout_s"] * 1e9)
        recorded = self._by_gpu.get((node, gpu), [])
        upcoming = recorded[bisect_right([r.time_ns for r in recorded], self.now) :]
        for i in upcoming:
            if i.time_ns > horizon:
                break
            if i.signal == "lost" and i.value:
                return max(soonest, i.time_ns), False
        if not any(state.values()):
            return soonest, True
        for i in upcoming:
            if i.time_ns > limit:
                return None
            if i.signal in state:
                state[i.signal] = bool(i.value)
                if not any(state.values()):
                    return i.time_ns, True
        return None

    async def run_hook(self, template: str, timeout_s: float, **values: str) -> HookResult:
        node = values.get("node", "")
        if template.split()[0] == "replay-reboot" or template == self.config.hooks.reboot_command:
            self._push(self.now + int(self.config.reboot_s * 1e9), "rebooted", node)
            return HookResult(True, "simulated reboot")
        if template.split()[0] == "replay-ticket":
            return HookResult(True, "simulated ticket")
        # The aggregator's own ticket command, replaying its store: never run; said so.
        return HookResult(True, f"simulated (not run in a replay): {template.split()[0]}")
