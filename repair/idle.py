"""When an allocation's GPUs are idle (docs/workloads.md "Waste findings"): the one state machine
the aggregator's workload ledger runs on every report (aggregator/workloads/ledger.py) and the
waste replay runs on a generated job history (repair/replay/waste.py), so what the replay
measures is what the aggregator does."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.repair.model import WASTE_RULES
from gpufleet.repair.policy import Policy

IDLE_RULE = WASTE_RULES[0]  # idle_allocation: its threshold is the activity threshold


@dataclass(frozen=True)
class Activity:
    """When an allocated GPU counts as working, from the policy ([rules.idle_allocation]
    threshold and [waste] idle_hbm_exempt_ratio: repair/rules/waste.py)."""

    min_pct: float = 5.0  # SM activity where GPM has it, else utilization
    hbm_exempt_ratio: float = 0.0  # a GPU holding this share of its HBM is working (0: off)

    @classmethod
    def of(cls, policy: Policy) -> Activity:
        idle = policy.rules.get(IDLE_RULE)
        return cls(idle.threshold if idle else 5.0, policy.waste["idle_hbm_exempt_ratio"])

    def working(self, reading: dict[str, float]) -> bool | None:
        """Whether this GPU reading is work; None: the reading says nothing of it."""
        ratio = self.hbm_exempt_ratio
        hbm, total = reading.get("hbm_used_bytes"), reading.get("hbm_total_bytes")
        if ratio > 0 and hbm is not None and total and hbm / total >= ratio:
            return True
        sm = reading.get("sm_active_pct")
        active = sm if sm is not None else reading.get("util_gpu_pct")
        return None if active is None else active >= self.min_pct


@dataclass
class IdleClock:
    """One allocation's idleness, per node it holds GPUs on: since when all its GPUs there read
    idle (None: working at the last report), and the HBM they held then."""

    since: dict[str, float | None] = field(default_factory=dict)
    hbm_bytes: dict[str, int] = field(default_factory=dict)

    def note(
        self,
        node: str,
        indices: tuple[int, ...],
        readings: dict[int, dict[str, float]],
        serving: set[int],
        activity: Activity,
        time_s: float,
        start_s: float,
    ) -> None:
        """One report of the node: any of its GPUs over the activity threshold, or an engine
        request on one, makes it working; all of them read and under it makes it idle (from this
        report, or from the job's start if never seen working: its loading time is within the
        rule's window); a report without its GPUs' readings says nothing."""
        said = [activity.working(readings[i]) for i in indices if i in readings]
        if not said or all(v is None for v in said):
            return
        self.hbm_bytes[node] = int(
            sum(readings[i].get("hbm_used_bytes", 0) for i in indices if i in readings)
        )
        if any(said) or serving.intersection(indices):
            self.since[node] = None
        elif self.since.get(node) is None:
            self.since[node] = start_s if node not in self.since else time_s
