"""What the repair library reads (a snapshot of each node) and what its rules produce (findings).

The aggregator builds NodeSnapshots from its live view; repair/ never imports aggregator/."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpufleet.protos import fleet_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import action_value
from gpufleet.repair.health import Step

SEVERITIES = {
    "info": vocabulary_pb2.SEVERITY_INFO,
    "warning": vocabulary_pb2.SEVERITY_WARNING,
    "critical": vocabulary_pb2.SEVERITY_CRITICAL,
}
LADDER_STEPS = (Step.RESET_GPU, Step.REBOOT, Step.TICKET)  # the steps a ladder may hold, in order
DEFAULT_LADDER = LADDER_STEPS  # a cordoning table's ladder when it names none


# The waste findings' codes (repair/rules/waste.py): about whose GPUs are held and not used, not
# a fault of the GPU: on a GPU's health word they read "watch" at most (repair/gpu_health.py).
WASTE_RULES = ("idle_allocation", "orphaned_process", "gpu_outside_allocation")


@dataclass(frozen=True)
class Owner:
    """Whose a workload is, as its scheduler says (empty where it does not say)."""

    user: str = ""
    account: str = ""
    namespace: str = ""
    team: str = ""

    def label(self) -> str:
        """One line: user, then account or namespace, then team, where known."""
        return ", ".join(p for p in (self.user, self.group()) if p) or "owner unknown"

    def group(self) -> str:
        """Account or namespace, then team: what a finding's evidence says (it reaches every
        screen, and a user name is for the roles that may see it: docs/workloads.md)."""
        parts = [self.account or self.namespace, f"team {self.team}" if self.team else ""]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class WorkloadOnNode:
    """One scheduler allocation on one node, as the aggregator's workload ledger keeps it
    (aggregator/workloads/ledger.py): the scheduler's word for whose and which GPUs; the node's
    own GPU readings for whether they work."""

    key: str  # scheduler:id, e.g. slurm:4242
    name: str
    owner: Owner
    gpus: tuple[int, ...]  # its GPUs on this node
    start_unix_s: float
    # Since when every one of its GPUs here read under the policy's activity threshold, with no
    # engine request on them (None: active at the last report, or not read yet).
    idle_since_unix_s: float | None = None
    hbm_used_bytes: int = 0  # what its GPUs here hold, at the last report


# What the scheduler says of the workload a node's processes name (ProcessClaim.status).
CLAIM_RUNNING = "running"  # the scheduler runs it on this node
CLAIM_ENDED = "ended"  # it ran on this node and has ended
CLAIM_UNKNOWN = "unknown"  # the scheduler never placed it on this node (the node's word only)
CLAIM_NONE = "none"  # the processes belong to no workload (no job's cgroup or environment)


@dataclass(frozen=True)
class ProcessClaim:
    """Processes a node says hold some of its GPUs, one workload's (NodeReport.workloads), and
    what the scheduler says of that workload."""

    workload: str  # scheduler:id as the node named it ("" for none)
    status: str  # CLAIM_*
    gpus: tuple[int, ...]
    pids: tuple[int, ...]
    hbm_used_bytes: int
    owner: Owner = Owner()  # its job's owner where the scheduler placed it here (running, ended)


@dataclass
class NodeSnapshot:
    """One node as the aggregator sees it now."""

    node: str
    cluster: str
    liveness: int  # vocabulary_pb2.Liveness
    seconds_since_report: float
    boot_id: str
    connected: bool
    gpu_count: int  # GPUs the collector announced in its hello
    gpus: dict[int, telemetry_pb2.GpuSample] = field(default_factory=dict)
    events: list[telemetry_pb2.Event] = field(default_factory=list)  # recent, oldest first
    sample_time_ns: int = 0  # the newest report's time
    gpus_on_pci_bus: int | None = None  # NVIDIA GPUs the node's PCI bus shows (None: not counted)
    # Whose work is on it (docs/workloads.md): the allocations the scheduler places here, and the
    # processes the node's last report named; empty where no scheduler is read.
    workloads: tuple[WorkloadOnNode, ...] = ()
    claims: tuple[ProcessClaim, ...] = ()

    @classmethod
    def reporting(
        cls, node: str, gpus: list[telemetry_pb2.GpuSample], sample_time_ns: int, cluster: str = "c"
    ) -> NodeSnapshot:
        """A node reporting now, connected, with these GPU samples of one time (a generated
        fleet's input to a rule: repair/replay/spread.py, and the rule tests')."""
        return cls(
            node,
            cluster,
            vocabulary_pb2.LIVENESS_REPORTING,
            0.5,
            "boot",
            True,
            len(gpus),
            gpus={g.index: g for g in gpus},
            sample_time_ns=sample_time_ns,
        )


@dataclass(frozen=True)
class Finding:
    node: str
    gpu: int | None
    code: str  # xid_79, ecc_uncorrected, ...
    severity: str  # info | warning | critical
    action: str  # an ACTIONS name
    cordon: bool
    reason: str
    evidence: str
    window_s: float = 0.0
    ladder: tuple[Step, ...] = ()
    seen_ns: int = 0  # when the signal was observed (event time; sample time)
    # The drain for it may wait for serving capacity (docs/repair.md "Serving-aware repair");
    # false (urgent): it drains at once whatever the node serves.
    may_wait: bool = False
    workload: str = ""  # the workload it is about (scheduler:id): the waste findings' owner
    # When gpufleet first raised it (the evaluator's pass that found it): what every surface shows
    # as its time. seen_ns is when its evidence starts (a windowed rule's window start), earlier.
    detected_ns: int = 0

    @property
    def key(self) -> tuple[str, int | None, str]:
        return (self.node, self.gpu, self.code)

    @property
    def severity_rank(self) -> int:
        return SEVERITIES[self.severity]

    def to_proto(self, first_seen_ns: int = 0) -> fleet_pb2.Finding:
        msg = fleet_pb2.Finding(
            node=self.node,
            code=self.code,
            severity=SEVERITIES[self.severity],
            action=action_value(self.action),
            cordon=self.cordon,
            reason=self.reason,
            evidence=self.evidence,
            first_seen_unix_ns=first_seen_ns or self.seen_ns,
            window_s=self.window_s,
            detected_unix_ns=self.detected_ns or first_seen_ns or self.seen_ns,
        )
        if self.gpu is not None:
            msg.gpu_index = self.gpu
        return msg

    def to_json(self) -> dict[str, object]:
        return asdict(self)  # the ladder tuple is written as a JSON list

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Finding:
        ladder = tuple(Step(s) for s in d.get("ladder", ()))  # type: ignore[attr-defined]
        return cls(**{**d, "ladder": ladder})  # type: ignore[arg-type]
