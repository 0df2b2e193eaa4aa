"""The repair workflow's vocabulary, typed: node states (the proto's NodeHealth, lower case as
every user-facing place spells them), the automatic steps the rails gate, and which states
mean "out of service". Defined once here; nothing else spells these sets."""

from __future__ import annotations

from enum import StrEnum

from gpufleet.protos.names import HEALTH_STATES, OUT_OF_SERVICE_STATES


class Health(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"  # a finding waits out its persistence window
    CORDONED = "cordoned"  # automation took it out of scheduling
    DRAINING = "draining"
    REPAIRING = "repairing"  # a ladder step (reset_gpu, reboot, ticket) is in progress
    VALIDATING = "validating"  # waiting for clean signals before returning it
    QUARANTINED = "quarantined"  # a person decides
    HUMAN_CORDONED = "human_cordoned"  # a person's: automation keeps its hands off
    WAITING = "waiting"  # needs action, held back by a rail


# The proto is the source of truth: a state added there without one here stops the import.
if sorted(h.value for h in Health) != sorted(HEALTH_STATES):
    raise RuntimeError(f"repair.health.Health {sorted(Health)} differs from vocabulary.proto {HEALTH_STATES}")


class HoldKind(StrEnum):
    """Which safety rail holds a step back (repair/rails.py)."""

    BREAKER = "breaker"
    DRY_RUN = "dry_run"
    SCHEDULER = "scheduler_unreadable"
    CAP = "cap"
    DRAIN_SLOT = "drain_slot"
    CAPACITY = "capacity"  # the drain would take a serving pool below its floor (repair/capacity.py)


class Step(StrEnum):
    """Every automatic action; each passes the rails (repair/rails.py) before it is done."""

    CORDON = "cordon"
    DRAIN_ENGINES = (
        "drain_engines"  # the node's inference engines leave rotation and finish (part of the drain)
    )
    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    TICKET = "ticket"
    VALIDATE = "validate"
    UNCORDON = "uncordon"


# Steps that change the scheduler: done only on a fresh, readable view of the node.
SCHEDULER_STEPS = frozenset({Step.CORDON, Step.DRAIN, Step.UNCORDON})
OUT_OF_SERVICE = frozenset(Health(s) for s in OUT_OF_SERVICE_STATES)  # published in protos/names.py
BY_AUTOMATION = OUT_OF_SERVICE - {Health.HUMAN_CORDONED}
# States whose node the scheduler is asked about on every pass (the rest at the fleet-wide
# observe interval): a workflow under way, or a person's cordon to watch for its release.
WATCHED = OUT_OF_SERVICE | {Health.WAITING, Health.SUSPECT}
