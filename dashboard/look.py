"""How every dashboard page shows a value, written once: times in UTC, 24-hour and labelled so
(tables print them as the CLI does, client/timeparse.iso); one N/A for a missing value
(client/present.NA, never "None" or "nan"); percentages as 0-100; one colour per node state and
per GPU health (protos/presentation.py, shared with Grafana); the colour-blind-safe palette for
series, and legends that list every series they draw, uncut."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.protos.presentation import (
    NA,
    NODE_STATE_COLOURS,
    OTHERS,
    REDDISH_PURPLE,
    SERIES_PALETTE,
)

# Every character CommonMark, Streamlit's colour and emoji directives (":red[...]", ":x:") or its
# LaTeX ("$...$") could read as more than itself.
_MARKDOWN_SPECIAL = frozenset("\\`*_{}[]()<>#+-.!|~:$&")


def md(text: str) -> str:
    """Text from a node, a scheduler or a person, for a Streamlit caption, warning or markdown:
    each character Markdown could read backslash-escaped, so a pool named "[click](https://x)"
    or "**urgent**" shows as written (docs/security.md "Serving pools and the capacity guard")."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in text)


# A heat map cell's outline for a GPU held and not used (a waste finding): a colour the viridis
# scale under it never takes.
WASTE_OUTLINE = REDDISH_PURPLE

TIME_TITLE = "time (UTC)"
# A chart's time axis by the span it shows: 24-hour clock, seconds only when minutes matter.
_AXIS_FORMATS = ((3600, "%H:%M:%S"), (2 * 86400, "%H:%M"), (math.inf, "%b %d %H:%M"))
TOOLTIP_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
# Vega formats a time in the viewer's zone unless the field is read in UTC.
_UTC_TIME = "utcyearmonthdatehoursminutesseconds"


def time_x(frame: pd.DataFrame, field: str = "time", title: str = TIME_TITLE) -> alt.X:
    """The time axis of a chart of frame: a UTC scale, labelled "(UTC)", 24-hour ticks that fit
    the frame's span (seconds for a few minutes, days for weeks)."""
    times = frame[field] if field in frame else pd.Series(dtype="datetime64[ns, UTC]")
    span_s = (times.max() - times.min()).total_seconds() if len(times.dropna()) else 0
    fmt = next(f for limit, f in _AXIS_FORMATS if span_s <= limit)
    return alt.X(f"{field}:T", scale=alt.Scale(type="utc"), axis=alt.Axis(format=fmt, title=title))


def time_tooltip(field: str = "time", title: str = TIME_TITLE) -> alt.Tooltip:
    """A time in a tooltip, as a person reads it everywhere else: UTC, 24-hour, to the second."""
    return alt.Tooltip(f"{_UTC_TIME}({field}):T", title=title, format=TOOLTIP_TIME_FORMAT)


def _scale(colours: Mapping[str, str]) -> alt.Scale:
    return alt.Scale(domain=list(colours), range=list(colours.values()))


def node_state_colour(field: str = "state", title: str = "state") -> alt.Color:
    """A node's state (protos/presentation.py node_state), in its one colour on every page."""
    return alt.Color(f"{field}:N", scale=_scale(NODE_STATE_COLOURS), title=title, legend=_LEGEND)


# Legends list every entry they have (Vega cuts at 50 by default, and labels at 160 px), so an
# entry is never cut mid-name; charts keep their series few enough for that to read.
_LEGEND = alt.Legend(symbolLimit=0, labelLimit=0, orient="right")


def series_colour(series: list[str], field: str = "series", title: str = "series") -> alt.Color:
    """One palette colour per series in the order given (the first the most important); a
    series named OTHERS_LABEL is drawn in the neutral grey of "the rest"."""
    named = [s for s in series if s != OTHERS_LABEL]
    colours = [SERIES_PALETTE[i % len(SERIES_PALETTE)] for i in range(len(named))]
    if OTHERS_LABEL in series:
        named, colours = [*named, OTHERS_LABEL], [*colours, OTHERS]
    return alt.Color(f"{field}:N", scale=alt.Scale(domain=named, range=colours), title=title, legend=_LEGEND)


def lines(frame: pd.DataFrame, value: str, series_title: str) -> alt.Chart:
    """A line per series of a long frame (time, series, value): the UTC time axis, the value's
    column name (with its unit) as the y title, the series palette, a tooltip with all three."""
    return (
        alt.Chart(frame)
        .mark_line()
        .encode(
            x=time_x(frame),
            y=alt.Y(f"{value}:Q", title=value),
            color=series_colour(sorted(set(frame["series"])), title=series_title),
            tooltip=[time_tooltip(), alt.Tooltip("series:N", title=series_title), f"{value}:Q"],
        )
    )


OTHERS_LABEL = "the rest (min-max)"
# A time in a table, as the CLI prints it (client/timeparse.iso), in moment.js's words.
TABLE_TIME_FORMAT = "YYYY-MM-DD[T]HH:mm:ss[Z]"


# What a table has across at a 1,600-px window beside the sidebar (measured in Chromium: 1,138 px),
# less a margin for the estimate below: a table wider than this is cut at the right edge, and a
# person never sees its last columns (issue 55; tests/fleet/test_demo_screens.py measures it).
TABLE_WIDTH_PX = 1040
# Glide's grid sizes a column to its widest text: ~7 px a character of Streamlit's 14-px font,
# estimated at 8 (so the estimate errs wide), plus the cell's padding and the header's menu.
_CHAR_PX, _CELL_PX = 8, 28
_TEXT_MIN_PX = 88  # a text column is never narrowed below this: ~8 characters and an ellipsis
_TIME_CHARS = len("2026-12-07T10:31:39Z")


def _content_chars(values: pd.Series) -> int:
    if pd.api.types.is_datetime64_any_dtype(values):
        return _TIME_CHARS
    return int(values.map(lambda v: len(str(v)) if v is not None else 3).max()) if len(values) else 3


def _natural_px(frame: pd.DataFrame, name: str) -> int:
    return _CELL_PX + _CHAR_PX * max(_content_chars(frame[name]), len(str(name)) + 2)


# Streamlit's named column widths, in pixels (its column_config documentation).
_NAMED_PX = {"small": 75, "medium": 200, "large": 400}


def fitted_widths(frame: pd.DataFrame, fixed: Mapping[str, Any]) -> dict[str, int]:
    """Pixel widths for frame's columns so the whole table fits TABLE_WIDTH_PX ({}: it fits as
    the grid sizes it). Over it, every column the page did not configure itself (fixed) gets a
    width: first the widest free-text columns are narrowed to one common width (their text ends
    in an ellipsis; a click on a cell shows all of it); then, if still over, the other columns
    give up the room their header takes beyond their values (a header cut short still names the
    column on hover). A page whose columns do not fit even so must choose fewer (the browser test
    measures every table at 1,600 px)."""
    natural = {name: _natural_px(frame, name) for name in frame.columns}
    for name, config in fixed.items():
        width = config.get("width") if isinstance(config, Mapping) else None
        if name in natural and width:
            natural[name] = _NAMED_PX.get(width, width) if isinstance(width, str) else int(width)
    if sum(natural.values()) <= TABLE_WIDTH_PX:
        return {}
    free = [n for n in frame.columns if n not in fixed]
    widths = {n: natural[n] for n in free}
    text = [
        n
        for n in free
        if (frame[n].dtype == object or pd.api.types.is_string_dtype(frame[n])) and natural[n] > _TEXT_MIN_PX
    ]
    others = sum(w for n, w in natural.items() if n not in text)
    if text:
        # The common width: the largest cap under which the text columns and the rest fit.
        room = max(TABLE_WIDTH_PX - others, _TEXT_MIN_PX * len(text))
        ordered = sorted(natural[n] for n in text)
        cap, left = ordered[-1], len(ordered)
        for i, w in enumerate(ordered):
            share = (room - sum(ordered[:i])) / left
            if w > share:
                cap = max(_TEXT_MIN_PX, int(share))
                break
            left -= 1
        widths.update({n: min(natural[n], cap) for n in text})
    over = sum(widths.values()) + sum(natural[n] for n in fixed if n in natural) - TABLE_WIDTH_PX
    if over > 0:
        floors = {n: _CELL_PX + _CHAR_PX * max(4, _content_chars(frame[n])) for n in free if n not in text}
        slack = {n: max(0, widths[n] - floors[n]) for n in floors}
        total_slack = sum(slack.values())
        if total_slack:
            take = min(1.0, over / total_slack)
            widths.update({n: int(widths[n] - slack[n] * take) for n in slack})
    return widths


def table(
    frame: pd.DataFrame,
    help: Mapping[str, str] | None = None,
    height: int | None = None,
    **columns: Any,
) -> None:
    """A table: a missing value reads N/A, a time reads as the CLI prints it (UTC), every column
    in help explains itself on hover, the whole of it fits a 1,600-px window (fitted_widths);
    columns overrides a column's config by name."""
    config: dict[str, Any] = {}
    widths = fitted_widths(frame, fixed=columns)
    for name in frame.columns:
        text = (help or {}).get(name)
        if pd.api.types.is_datetime64_any_dtype(frame[name]):
            config[name] = st.column_config.DatetimeColumn(
                help=text, format=TABLE_TIME_FORMAT, timezone="UTC", width=widths.get(name)
            )
        elif text or name in widths:
            config[name] = st.column_config.Column(help=text, width=widths.get(name))
    config.update(columns)
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        height=height if height is not None else "auto",
        column_config=config or None,
        placeholder=NA,
    )
