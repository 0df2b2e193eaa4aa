"""How every dashboard page shows a value, written once: times in UTC, 24-hour and labelled so
(tables print them as the CLI does, client/timeparse.iso); one N/A for a missing value
(client/present.NA, never "None" or "nan"); percentages as 0-100; one colour per node state and
per GPU health (client/colours.py, shared with Grafana); the colour-blind-safe palette for
series, and legends that list every series they draw, uncut."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.client.colours import (
    CLOSED,
    NODE_STATE_COLOURS,
    OTHERS,
    REDDISH_PURPLE,
    SERIES_PALETTE,
)
from gpufleet.client.present import NA

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


def node_state_colour(field: str = "state", title: str = "state", closed: bool = False) -> alt.Color:
    """A node's (folded) state, in its one colour on every page; closed incidents neutral."""
    colours = {**NODE_STATE_COLOURS, **({"closed": CLOSED} if closed else {})}
    return alt.Color(f"{field}:N", scale=_scale(colours), title=title, legend=_LEGEND)


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


def table(
    frame: pd.DataFrame,
    help: Mapping[str, str] | None = None,
    height: int | None = None,
    **columns: Any,
) -> None:
    """A table: a missing value reads N/A, a time reads as the CLI prints it (UTC), every column
    in help explains itself on hover; columns overrides a column's config by name."""
    config: dict[str, Any] = {}
    for name in frame.columns:
        text = (help or {}).get(name)
        if pd.api.types.is_datetime64_any_dtype(frame[name]):
            config[name] = st.column_config.DatetimeColumn(
                help=text, format=TABLE_TIME_FORMAT, timezone="UTC"
            )
        elif text:
            config[name] = st.column_config.Column(help=text)
    config.update(columns)
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        height=height if height is not None else "auto",
        column_config=config or None,
        placeholder=NA,
    )
