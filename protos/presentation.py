"""How every surface says a fact, written once (issue 55): the CLI, the dashboard, the alerts and
Grafana's value mappings (scripts/gen_grafana.py) take their words, colours and marks from here,
beside the signal catalog (protos/signals.py) that says each signal's label, unit and rounding.

- A node's state is one word of NODE_STATES, folded from its workflow state (repair/health.py)
  and whether its collector is heard from (node_state); the workflow's own word is said beside it.
- "Out of service" is one set of workflow states (protos/names.py OUT_OF_SERVICE_STATES), counted
  in nodes, and in GPUs where it says "GPUs" (OUT_OF_SERVICE_MEANING).
- A missing value is NA on every surface, never "None", "nan", "-" or a blank that could be 0.
- Ratios are shown as percentages 0-100; times as UTC ISO 8601 (common/timefmt.py iso) or on an
  axis labelled UTC.

The colours are Okabe and Ito's colour-blind-safe set ("Color Universal Design", 2008): the eight
stay apart for the common red-green deficiencies, and no pair a person must tell apart relies
on red against green alone (healthy is bluish green, quarantined vermillion).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.protos.names import OUT_OF_SERVICE_STATES

# Okabe-Ito, in their published order after black: for series drawn one colour each.
ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
BLUISH_GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
REDDISH_PURPLE = "#CC79A7"
BLACK = "#000000"
GREY = "#7F7F7F"
LIGHT_GREY = "#C7C7C7"

# Series in a chart, in the order they are given out (yellow last: thin lines of it are faint).
SERIES_PALETTE = [BLUE, ORANGE, BLUISH_GREEN, VERMILLION, REDDISH_PURPLE, SKY_BLUE, BLACK, YELLOW]
# What a chart folds its other series into (the band of "the rest").
OTHERS = LIGHT_GREY

NA = "N/A"  # a value that is missing: never "None", "nan", "-" or a blank


@dataclass(frozen=True)
class NodeState:
    word: str
    colour: str
    meaning: str


# A node's state as every surface says and colours it, worst last but for the two of no data.
NODE_STATES = {
    s.word: s
    for s in (
        NodeState("healthy", BLUISH_GREEN, "nothing is wrong with it that the aggregator knows"),
        NodeState("suspect", YELLOW, "a finding is open or waits to drain"),
        NodeState("cordoned", ORANGE, "out of scheduling, by the repair workflow or a person"),
        NodeState("in repair", BLUE, "draining, resetting or rebooting, or validating"),
        NodeState("quarantined", VERMILLION, "out until a person looks"),
        NodeState("silent", GREY, "its collector is not heard from"),
        NodeState("no data", REDDISH_PURPLE, "no report of it accepted yet: nothing to judge it by"),
    )
}
NODE_STATE_COLOURS = {word: s.colour for word, s in NODE_STATES.items()}
NODE_STATE_MEANING = "; ".join(f"{word}: {s.meaning}" for word, s in NODE_STATES.items())

# The repair workflow's states (repair/health.py) folded into those words.
_WORKFLOW_FOLD = {
    "healthy": "healthy",
    "suspect": "suspect",
    "waiting": "suspect",
    "cordoned": "cordoned",
    "human_cordoned": "cordoned",
    "draining": "in repair",
    "repairing": "in repair",
    "validating": "in repair",
    "quarantined": "quarantined",
    "no_data": "no data",
    "unspecified": "healthy",
}
# Every state the workflow counts as out of service is shown as such: a state added there
# without a word here stops the import.
if any(_WORKFLOW_FOLD.get(state, "healthy") in ("healthy", "suspect") for state in OUT_OF_SERVICE_STATES):
    raise RuntimeError("protos/presentation.py folds an out-of-service state as in service")


def node_state(workflow_state: str, silent: bool = False) -> str:
    """The one word for a node's state: silent when its collector is not heard from (whatever its
    workflow), else its workflow state folded (draining, repairing, validating: in repair)."""
    return "silent" if silent else _WORKFLOW_FOLD[workflow_state]


# What each repair step, once started, puts the node in: an incident's timeline is coloured by
# these from its audited steps (a wait for serving capacity stays "cordoned", not "in repair").
STEP_STATES = {
    "cordon": "cordoned",
    "drain_engines": "in repair",
    "drain": "in repair",
    "reset_gpu": "in repair",
    "reboot": "in repair",
    "ticket": "in repair",
    "validate": "in repair",
    "quarantine": "quarantined",
    "uncordon": "healthy",
}

OUT_OF_SERVICE_MEANING = (
    "Nodes out of service: cordoned by the automation or a person, draining, in repair, validating "
    "or quarantined (the repair cap counts these; `gpufleet breaker status` and `gpufleet status` "
    "say the same)."
)

# A GPU's health word (repair/gpu_health.py), in order of severity. A word that is also a node
# state ("suspect") has that state's colour: one word, one colour, whatever it describes.
GPU_HEALTH_COLOURS = {
    "ok": BLUISH_GREEN,
    "watch": SKY_BLUE,
    "suspect": NODE_STATE_COLOURS["suspect"],
    "faulty": VERMILLION,
    "lost": GREY,
}
