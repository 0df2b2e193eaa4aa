"""One colour per thing a person reads by colour, for every screen: the dashboard's charts and
Grafana's value mappings (scripts/gen_grafana.py) take them from here, so "quarantined" is the
same red on the overview, on Failures and repairs and in Grafana.

The colours are Okabe and Ito's colour-blind-safe set ("Color Universal Design", 2008): the eight
stay apart for the common red-green deficiencies, and no pair a person must tell apart relies
on red against green alone (healthy is bluish green, quarantined vermillion).
"""

from __future__ import annotations

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

# A node's state as the screens fold it (dashboard/data.py display_state), worst last.
NODE_STATE_COLOURS = {
    "healthy": BLUISH_GREEN,
    "suspect": YELLOW,
    "cordoned": ORANGE,
    "in repair": BLUE,
    "quarantined": VERMILLION,
    "silent": GREY,
    "no data": REDDISH_PURPLE,  # no report accepted yet: nothing to judge it by
}
# An incident that has ended is not a node state: drawn neutral, never as a state's colour.
CLOSED = LIGHT_GREY

# A GPU's health word (repair/gpu_health.py), in order of severity. A word that is also a node
# state ("suspect") has that state's colour: one word, one colour, whatever it describes.
GPU_HEALTH_COLOURS = {
    "ok": BLUISH_GREEN,
    "watch": SKY_BLUE,
    "suspect": NODE_STATE_COLOURS["suspect"],
    "faulty": VERMILLION,
    "lost": GREY,
}
