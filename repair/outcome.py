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
