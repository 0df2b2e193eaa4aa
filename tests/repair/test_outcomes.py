"""Outcomes are records, not free text: an action's (status and detail), an incident's (how it
closed, by what or whom, a person's words) and an alert delivery's. Each is shown as the text
people read in the audit log, the CLI and alerts, and read back from that text to the same
record; an incident a store kept with its outcome as plain text reads back typed."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.repair.outcome import (
    CLEARED,
    Closure,
    IncidentOutcome,
    Outcome,
    Status,
    cancelled,
    repaired,
    taken_over,
)
from gpufleet.repair.state import Incident

# A step, or a person's name: what the product writes there (no ": " in it).
names = st.text(st.characters(codec="utf-8", exclude_characters=":"), min_size=1, max_size=40)
reasons = st.text(max_size=200)


def test_each_closure_reads_as_people_read_it() -> None:
    assert str(repaired("reset_gpu")) == "repaired by reset_gpu"
    assert str(CLEARED) == "cleared by itself"
    assert str(cancelled("a person uncordoned the node")) == "cancelled: a person uncordoned the node"
    assert str(cancelled("false alarm", by="alice")) == "cancelled by alice: false alarm"
    assert str(taken_over("pulling the board")) == "taken over by a person: pulling the board"
    assert str(taken_over("rma", by="bob")) == "taken over by bob: rma"


@given(closure=st.sampled_from([Closure.CANCELLED, Closure.TAKEN_OVER]), by=names, reason=reasons)
def test_an_incident_outcome_reads_back_from_its_text(closure: Closure, by: str, reason: str) -> None:
    outcome = IncidentOutcome(closure, by.strip() or "x", reason)
    again = IncidentOutcome.parse(str(outcome))
    assert str(again) == str(outcome)
    assert again.closure is closure


@given(step=names)
def test_a_repair_reads_back_with_its_step(step: str) -> None:
    assert IncidentOutcome.parse(str(repaired(step))) == repaired(step)


def test_text_of_no_known_form_is_kept_whole() -> None:
    odd = IncidentOutcome.parse("closed by the migration of 2025")
    assert odd.closure is Closure.OTHER and str(odd) == "closed by the migration of 2025"


def test_an_incident_keeps_its_outcome_typed_and_reads_an_older_text_one() -> None:
    incident = Incident("inc-1", "n1", 1, closed_ns=2, outcome=cancelled("false alarm", by="alice"))
    again = Incident.from_body(incident.body())
    assert again.outcome == cancelled("false alarm", by="alice")
    older = json.loads(incident.body())
    older["outcome"] = "repaired by reboot"  # as a store written before outcomes were typed kept it
    assert Incident.from_body(json.dumps(older)).outcome == repaired("reboot")
    older["outcome"] = ""  # an open incident's
    assert Incident.from_body(json.dumps(older)).outcome is None


@given(status=st.sampled_from(list(Status)), detail=reasons)
def test_an_action_outcome_reads_back_from_its_text(status: Status, detail: str) -> None:
    outcome = Outcome(status, detail)
    assert Outcome.parse(str(outcome)) == outcome
