"""One node: its state, GPUs and engines now; per-GPU time series with the node's stored events
marked (XIDs, health findings, repair actions: from history, so an aggregator restart loses none);
engine series; its incident history; and, for operators, cordon / uncordon."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpufleet.client.timeparse import parse_duration_ns, parse_time_ns
from gpufleet.dashboard import actions, links
from gpufleet.dashboard.data import (
    display_state,
    engines_frame,
    events_frame,
    history_frame,
    if_drained_lines,
    incidents_frame,
    node_gpus_table,
    time_x,
)
from gpufleet.dashboard.fleet import call, list_nodes
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import health_name

GPU_SERIES = {
    "GPU utilization %": "util_gpu_pct",
    "HBM used (bytes)": "hbm_used_bytes",
    "GPU temperature °C": "temp_gpu_c",
    "power W": "power_w",
    "uncorrected ECC errors (volatile)": "ecc_dbe_volatile",
    "corrected ECC errors (volatile)": "ecc_sbe_volatile",
    "remapped rows (uncorrectable)": "remap_uncorrectable",
}
# How each kind of stored event is marked on the chart.
EVENT_COLOURS = {
    "xid": "#b2182b",
    "gpu_lost": "#b2182b",
    "gpu_recovered": "#4c9a2a",
    "engine_unreadable": "#7f7f7f",
    "health": "#e07000",
    "repair": "#3778bf",
}
ENGINE_SERIES = {
    "KV-cache usage (0-1)": "kv_cache_usage_ratio",
    "requests waiting": "requests_waiting",
    "requests running": "requests_running",
    "preemptions": "preemptions_total",
}


def _notes(detail: fleet_pb2.NodeDetail) -> list[str]:
    """What is said under the node's headline: its scheduler name, its workflow's detail, and
    what was left out of the answer."""
    s = detail.summary
    notes = []
    if s.scheduler_node:
        notes.append(f"In the scheduler: **{s.scheduler_node}** (the scheduler_names mapping)")
    if s.health_detail:
        notes.append(s.health_detail)
    if detail.clipped_bytes:
        notes.append(
            f"{detail.clipped_bytes:,} bytes of this node's answer were left out to keep it under the "
            "per-node cap (the oldest recent events first); its stored events are below."
        )
    return notes


def render() -> None:
    st.header("Node")
    names = [n.node for n in list_nodes().nodes]
    if not names:
        st.info("No nodes have reported to this aggregator yet.")
        return
    asked = links.param("node") or st.session_state.get("node")
    if links.param("node") and links.param("node") not in names:
        st.warning(f"Node {links.param('node')!r} is not known to this aggregator.")
    default = names.index(asked) if asked in names else 0
    name = st.selectbox("node", names, index=default, key="node_select")
    st.session_state["node"] = name
    links.keep(node=name)
    detail = call("GetNode", fleet_pb2.GetNodeRequest(node=name))
    s = detail.summary
    cols = st.columns(4)
    cols[0].metric("state", display_state(s))
    cols[1].metric("workflow", health_name(s.health))
    cols[2].metric("GPUs", s.gpu_count)
    cols[3].metric("last report", f"{s.seconds_since_report:.1f} s ago")
    for note in _notes(detail):
        st.caption(note)
    actions.render(name, health_name(s.health))

    st.dataframe(node_gpus_table(s), hide_index=True, width="stretch")
    c1, c2 = st.columns(2)
    label = c1.selectbox("GPU series", list(GPU_SERIES))
    since = c2.selectbox("range", ["15m", "1h", "6h", "24h", "7d"], index=0)
    metric = GPU_SERIES[label]
    start = parse_time_ns(since)
    hist = call("QueryHistory", fleet_pb2.HistoryRequest(metric=metric, nodes=[name], start_unix_ns=start))
    frame = history_frame(hist)
    events = events_frame(
        list(call("QueryEvents", fleet_pb2.EventsRequest(nodes=[name], start_unix_ns=start)).events)
    )
    if frame.empty:
        st.info(f"No {label} history for this node in the last {since}.")
    else:
        lines = (
            alt.Chart(frame)
            .mark_line()
            .encode(
                x=time_x(frame),
                y=alt.Y(f"{metric}:Q", title=label),
                color=alt.Color("series:N", title="GPU"),
            )
        )
        layers = [lines]
        if not events.empty:
            kinds = sorted(set(events["kind"]))
            layers.append(
                alt.Chart(events)
                .mark_rule(strokeDash=[4, 3])
                .encode(
                    x="time:T",
                    stroke=alt.Stroke(
                        "kind:N",
                        scale=alt.Scale(domain=kinds, range=[EVENT_COLOURS.get(k, "#000") for k in kinds]),
                        title="event",
                    ),
                    tooltip=["time", "kind", "what", "gpu", "summary"],
                )
            )
        st.altair_chart(alt.layer(*layers).resolve_scale(color="independent"), width="stretch")
        st.caption(
            "Dashed lines: this node's stored events in the range — XIDs and lost GPUs (red), health "
            "findings (orange), repair actions (blue)."
        )
    st.subheader("Events")
    if events.empty:
        st.caption(f"No stored events for this node in the last {since}.")
    else:
        st.dataframe(
            events[["time", "kind", "what", "gpu", "source", "outcome", "incident", "summary"]],
            hide_index=True,
            width="stretch",
        )

    if not detail.engines:
        st.caption("No inference engines found on this node.")
    else:
        st.subheader("Inference engines")
        st.dataframe(engines_frame(detail.engines), hide_index=True, width="stretch")
        for line in if_drained_lines(detail):
            (st.warning if "below the floor" in line else st.caption)(line)
        elabel = st.selectbox("engine series", list(ENGINE_SERIES))
        ehist = history_frame(
            call(
                "QueryHistory",
                fleet_pb2.HistoryRequest(
                    metric=ENGINE_SERIES[elabel],
                    nodes=[name],
                    start_unix_ns=parse_time_ns(since),
                    step_ns=parse_duration_ns("10s") if since == "15m" else 0,
                ),
            )
        )
        if ehist.empty:
            st.caption("No engine history in this range.")
        else:
            st.line_chart(ehist, x="time", y=ENGINE_SERIES[elabel], color="series")

    st.subheader("Incidents")
    incidents = incidents_frame(
        list(call("ListIncidents", fleet_pb2.ListIncidentsRequest(node=name)).incidents)
    )
    if incidents.empty:
        st.caption("No incidents on this node.")
    else:
        st.dataframe(incidents.drop(columns=["node"]), hide_index=True, width="stretch")
