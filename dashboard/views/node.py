"""One node: its state, GPUs and engines now; per-GPU time series with the node's stored events
marked (XIDs, health findings, repair actions: from history, so an aggregator restart loses none);
engine series; its incident history; and, for operators, cordon / uncordon."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.client.present import BREAKS_FLOOR, owner_label, owner_of_gpu
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import parse_duration_ns, parse_time_ns
from gpufleet.dashboard import actions, links, look
from gpufleet.dashboard.data import (
    GPU_TABLE_HELP,
    NODE_GPU_GLANCE,
    display_state,
    engines_frame,
    events_frame,
    history_frame,
    if_drained_lines,
    incidents_frame,
    node_gpus_table,
)
from gpufleet.dashboard.fleet import call, list_nodes, try_call
from gpufleet.protos import fleet_pb2
from gpufleet.protos import presentation as colours
from gpufleet.protos.names import health_name
from gpufleet.protos.signals import ENGINE_SIGNALS, GPU_SIGNALS, charted

# The series a node's charts offer: the signal catalog's charted signals, by their chart's label
# (protos/signals.py: title, unit, and what the chart shows per stored unit).
GPU_SERIES = charted(GPU_SIGNALS)
ENGINE_SERIES = charted(ENGINE_SIGNALS)
# How each kind of stored event is marked on the chart (protos/presentation.py).
EVENT_COLOURS = {
    "xid": colours.VERMILLION,
    "gpu_lost": colours.VERMILLION,
    "gpu_recovered": colours.BLUISH_GREEN,
    "engine_unreadable": colours.GREY,
    "health": colours.ORANGE,
    "repair": colours.BLUE,
}


def in_unit(frame: pd.DataFrame, metric: str, factor: float, label: str) -> pd.DataFrame:
    """frame's metric column as its label reads (GiB, %), in a column named by the label."""
    return frame.assign(**{label: (frame[metric] * factor).round(3)}) if not frame.empty else frame


def _notes(detail: fleet_pb2.NodeDetail) -> list[str]:
    """What is said under the node's headline: its scheduler name, its workflow's detail, and
    what was left out of the answer."""
    s = detail.summary
    notes = []
    if s.scheduler_node:
        notes.append(f"In the scheduler: **{look.md(s.scheduler_node)}** (the scheduler_names mapping)")
    if s.health_detail:
        notes.append(look.md(s.health_detail))
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
    linked = links.param("node")
    if linked and linked not in names:
        # An address naming a node this aggregator does not know stays on that name: saying so,
        # not showing another node under it. Choosing one below changes the address.
        st.error(f"Node {linked!r} not found: this aggregator has no node of that name.")
        chosen = st.selectbox("node", names, index=None, placeholder="choose a node", key="node_select")
        if chosen is None:
            return
        name = chosen
    else:
        asked = linked or st.session_state.get("node")
        default = names.index(asked) if asked in names else 0
        name = st.selectbox("node", names, index=default, key="node_select")
    st.session_state["node"] = name
    links.keep(node=name)
    detail = call(FleetRpc.GetNode, fleet_pb2.GetNodeRequest(node=name))
    s = detail.summary
    cols = st.columns(4)
    cols[0].metric("state", display_state(s))
    cols[1].metric("workflow", health_name(s.health))
    cols[2].metric("GPUs", s.gpu_count)
    cols[3].metric("last report", f"{s.seconds_since_report:.1f} s ago")
    for note in _notes(detail):
        st.caption(note)
    actions.render(name, health_name(s.health))

    # Whose work is on each GPU (the scheduler's word: docs/workloads.md); none read: no column.
    on_node, _ = try_call(FleetRpc.ListWorkloads, fleet_pb2.ListWorkloadsRequest(node=name))
    owners = {gpu: owner_label(w) for (_, gpu), w in owner_of_gpu(on_node).items()} if on_node else {}
    gpus = node_gpus_table(s, owners if on_node and on_node.scheduler != "none" else None)
    pinned = {
        "health": st.column_config.TextColumn(help=GPU_TABLE_HELP["health"], width="large", pinned=True),
        "GPU": st.column_config.NumberColumn(width="small", pinned=True),
    }
    look.table(gpus[[c for c in NODE_GPU_GLANCE if c in gpus.columns]], GPU_TABLE_HELP, **pinned)
    with st.expander("Every signal of each GPU, with its UUID and PCI bus"):
        look.table(gpus, GPU_TABLE_HELP, **pinned)
    c1, c2 = st.columns(2)
    label = c1.selectbox("GPU series", list(GPU_SERIES))
    since = c2.selectbox("range", ["15m", "1h", "6h", "24h", "7d"], index=0)
    metric, factor = GPU_SERIES[label].field, GPU_SERIES[label].label_scale
    start = parse_time_ns(since)
    hist = call(
        FleetRpc.QueryHistory, fleet_pb2.HistoryRequest(metric=metric, nodes=[name], start_unix_ns=start)
    )
    frame = in_unit(history_frame(hist), metric, factor, label)
    events = events_frame(
        list(call(FleetRpc.QueryEvents, fleet_pb2.EventsRequest(nodes=[name], start_unix_ns=start)).events)
    )
    if frame.empty:
        st.info(f"No {label} history for this node in the last {since}.")
    else:
        layers = [look.lines(frame, label, "GPU")]
        if not events.empty:
            kinds = sorted(set(events["kind"]))
            layers.append(
                alt.Chart(events)
                .mark_rule(strokeDash=[4, 3])
                .encode(
                    x=look.time_x(events),
                    stroke=alt.Stroke(
                        "kind:N",
                        scale=alt.Scale(domain=kinds, range=[EVENT_COLOURS.get(k, "#000") for k in kinds]),
                        title="event",
                    ),
                    tooltip=[look.time_tooltip(), "kind", "what", "gpu", "summary"],
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
        look.table(events[["time", "kind", "what", "gpu", "source", "outcome", "incident", "summary"]])

    if not detail.engines:
        st.caption("No inference engines found on this node.")
    else:
        st.subheader("Inference engines")
        look.table(engines_frame(detail.engines))
        for line in if_drained_lines(detail):
            (st.warning if BREAKS_FLOOR in line else st.caption)(look.md(line))
        elabel = st.selectbox("engine series", list(ENGINE_SERIES))
        emetric, efactor = ENGINE_SERIES[elabel].field, ENGINE_SERIES[elabel].label_scale
        ehist = history_frame(
            call(
                FleetRpc.QueryHistory,
                fleet_pb2.HistoryRequest(
                    metric=emetric,
                    nodes=[name],
                    start_unix_ns=parse_time_ns(since),
                    step_ns=parse_duration_ns("10s") if since == "15m" else 0,
                ),
            )
        )
        if ehist.empty:
            st.caption("No engine history in this range.")
        else:
            ehist = in_unit(ehist, emetric, efactor, elabel)
            st.altair_chart(look.lines(ehist, elabel, "engine"), width="stretch")

    st.subheader("Incidents")
    incidents = incidents_frame(
        list(call(FleetRpc.ListIncidents, fleet_pb2.ListIncidentsRequest(node=name)).incidents)
    )
    if incidents.empty:
        st.caption("No incidents on this node.")
    else:
        look.table(incidents.drop(columns=["node"]))
