"""What became of an action, typed: a status from the shared vocabulary (vocabulary.proto
OutcomeStatus) and a detail for people. The audit log, the action ledger and the replay's
figures decide on the status, never on the detail text. Stored as text ("failed: no answer
from the collector") so the audit log reads the same in SQL, the CLI and alerts; `parse` is the
one place such text is read back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpufleet.protos.names import OUTCOME_STATUSES


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    REFUSED = "refused"
    SKIPPED = "skipped"
    DRY_RUN = "dry-run"
    STARTED = "started"
    UNKNOWN = "unknown"
    OBSERVED = "observed"
    HELD = "held"

    @property
    def value_pb(self) -> int:
        """The proto's OutcomeStatus number."""
        return OUTCOME_STATUSES[self.value]


if sorted(s.value for s in Status) != sorted(OUTCOME_STATUSES):
    raise RuntimeError(
        f"repair.outcome.Status {sorted(Status)} differs from vocabulary.proto {sorted(OUTCOME_STATUSES)}"
    )


@dataclass(frozen=True)
class Outcome:
    status: Status
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}" if self.detail else str(self.status)

    def trimmed(self, limit: int = 300) -> Outcome:
        """The same outcome, its detail cut to what an audit row keeps."""
        return Outcome(self.status, self.detail[: max(0, limit - len(self.status) - 2)])

    @classmethod
    def parse(cls, text: str) -> Outcome:
        """An outcome from its stored text; text of no known status is kept whole as the detail
        of an UNKNOWN outcome (rows written before statuses were typed)."""
        status, sep, detail = text.partition(": ")
        try:
            return cls(Status(status), detail if sep else "")
        except ValueError:
            return cls(Status.UNKNOWN, text)


OK = Outcome(Status.OK)
STARTED = Outcome(Status.STARTED)


def failed(detail: str) -> Outcome:
    return Outcome(Status.FAILED, detail)


class Closure(StrEnum):
    """How an incident ended."""

    REPAIRED = "repaired"  # a step of its ladder worked (validation passed after it)
    CLEARED = "cleared"  # its findings cleared before a step was needed
    CANCELLED = "cancelled"  # a person returned the node to service
    TAKEN_OVER = "taken over"  # a person took the node out of the automation's hands
    OTHER = "other"  # text of no known form, read back from an older store


@dataclass(frozen=True)
class IncidentOutcome:
    """What became of an incident, typed: how it closed, by what or whom (the step that repaired
    it, the person), and a person's words. Shown (and sent in alerts and the Fleet API) as its
    text, "repaired by reset_gpu", "cancelled by alice: false alarm"; `parse` reads text an
    older store kept back into one."""

    closure: Closure
    by: str = ""
    reason: str = ""

    def __str__(self) -> str:
        if self.closure is Closure.OTHER:
            return self.reason
        head = {
            Closure.REPAIRED: f"repaired by {self.by}",
            Closure.CLEARED: "cleared by itself",
            Closure.CANCELLED: f"cancelled by {self.by}" if self.by else "cancelled",
            Closure.TAKEN_OVER: f"taken over by {self.by or 'a person'}",
        }[self.closure]
        return f"{head}: {self.reason}" if self.reason else head

    def to_json(self) -> dict[str, str]:
        return {"closure": self.closure.value, "by": self.by, "reason": self.reason}

    @classmethod
    def from_json(cls, value: dict[str, str] | str) -> IncidentOutcome:
        """From its JSON form, or from the text an incident kept before outcomes were typed."""
        if isinstance(value, str):
            return cls.parse(value)
        return cls(Closure(value["closure"]), value.get("by", ""), value.get("reason", ""))

    @classmethod
    def parse(cls, text: str) -> IncidentOutcome:
        head, sep, reason = text.partition(": ")
        if head == "cleared by itself" and not sep:
            return cls(Closure.CLEARED)
        for closure, prefix in (
            (Closure.REPAIRED, "repaired by "),
            (Closure.CANCELLED, "cancelled by "),
            (Closure.TAKEN_OVER, "taken over by "),
        ):
            if head.startswith(prefix) and (closure is not Closure.REPAIRED or not sep):
                return cls(closure, head.removeprefix(prefix), reason)
        if head == "cancelled":
            return cls(Closure.CANCELLED, "", reason)
        return cls(Closure.OTHER, "", text)


def repaired(step: str) -> IncidentOutcome:
    return IncidentOutcome(Closure.REPAIRED, step)


def cancelled(reason: str, by: str = "") -> IncidentOutcome:
    return IncidentOutcome(Closure.CANCELLED, by, reason)


def taken_over(reason: str, by: str = "") -> IncidentOutcome:
    return IncidentOutcome(Closure.TAKEN_OVER, by, reason)


CLEARED = IncidentOutcome(Closure.CLEARED)
