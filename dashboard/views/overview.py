"""Fleet overview: headline counts, a heat map of every GPU by node and index coloured by the
chosen metric, each node's health state beside it, filters, and the node table."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.client.present import owner_label, owner_of_gpu, waste_by_gpu
from gpufleet.client.rpcs import FleetRpc
from gpufleet.dashboard import look
from gpufleet.dashboard.data import (
    HEADLINE_HELP,
    HEAT_METRICS,
    NODE_COLUMNS,
    STATES,
    gpus_frame,
    headline,
    nodes_frame,
)
from gpufleet.dashboard.fleet import list_nodes, try_call
from gpufleet.protos import fleet_pb2


def render() -> None:
    st.header("Fleet overview")
    resp = list_nodes()
    nodes, gpus = nodes_frame(resp), gpus_frame(resp)
    # Whose job each cell is (docs/workloads.md): the running workloads' GPUs, in the tooltip.
    on_gpus, _ = try_call(FleetRpc.ListWorkloads, fleet_pb2.ListWorkloadsRequest())
    owners = {key: owner_label(w) for key, w in owner_of_gpu(on_gpus).items()} if on_gpus else {}
    wasted = waste_by_gpu(on_gpus) if on_gpus else {}
    keys = [(n, int(g)) for n, g in zip(gpus["node"], gpus["gpu"], strict=True)]
    gpus = gpus.assign(workload=[owners.get(k) for k in keys], waste=[wasted.get(k) for k in keys])
    if nodes.empty:
        st.info("No nodes have reported to this aggregator yet. Start collectors, or `gpufleet demo`.")
        return
    f1, f2, f3, f4 = st.columns(4)
    clusters = f1.multiselect("cluster", sorted(nodes["cluster"].unique()))
    models = f2.multiselect("model", sorted(m for m in gpus["model"].unique() if m))
    wanted = f3.multiselect("state", STATES)
    shown = f4.selectbox("heat map shows", list(HEAT_METRICS))
    if clusters:
        gpus, nodes = gpus[gpus["cluster"].isin(clusters)], nodes[nodes["cluster"].isin(clusters)]
    if models:
        gpus = gpus[gpus["model"].isin(models)]
        nodes = nodes[nodes["node"].isin(gpus["node"])]
    if wanted:
        gpus, nodes = gpus[gpus["state"].isin(wanted)], nodes[nodes["state"].isin(wanted)]

    counts = headline(nodes, gpus)
    # Six tiles fit a 1,500-px window with their labels whole; those in repair are said under
    # the GPUs out of service (a part of them), not in a seventh.
    cols = st.columns(6)
    tiles = ["nodes", "nodes out of service", "GPUs in service", "GPUs out of service", "GPUs silent"]
    for col, label in zip(cols[:5], tiles, strict=True):
        in_repair = f"{counts['GPUs in repair']} in repair" if label == "GPUs out of service" else None
        said = HEADLINE_HELP.get(label)
        col.metric(label, counts[label], delta=in_repair, delta_color="off", delta_arrow="off", help=said)
    util = counts["fleet mean utilization"]
    cols[5].metric("fleet mean utilization", "N/A" if util is None else f"{util:.0f} %")
    lemons = nodes[nodes["lemon"] != ""]
    if not lemons.empty:
        st.warning(
            f"{len(lemons)} lemon node(s), their incidents recurring (the next one quarantines "
            "instead of repairing again; see the lemon column's tooltip): "
            + ", ".join(look.md(f"{r.node} ({r.lemon})") for r in lemons.head(10).itertuples())
            + (" ..." if len(lemons) > 10 else "")
        )
    if gpus.empty:
        st.info("No GPU matches these filters.")
        return
    drawn = heat_map_nodes(nodes)
    if len(drawn) < len(nodes):
        st.caption(
            f"The heat map shows {len(drawn):,} of {len(nodes):,} nodes: every node out of the healthy "
            "state first, then by name. Filter by cluster, model or state to see the others; the table "
            "below lists them all."
        )
    st.altair_chart(heat_map(gpus[gpus["node"].isin(drawn)], shown), width="stretch")
    st.caption(
        "Left column: the node's state (silent: its collector is not heard from). Grey cells: the GPU "
        "did not report this value (absent, not zero). Outlined cells: GPUs held and not used (an "
        "idle allocation, an orphaned process, a GPU used outside its allocation: the Workloads page)."
    )
    # Columns that say nothing here are left out, so the table fits a 1,600-px window: the
    # cluster in a one-cluster fleet, lost GPUs and lemons where there are none.
    said = {
        "cluster": nodes["cluster"].nunique() > 1,
        "GPUs lost": (nodes["GPUs lost"] > 0).any(),
        "lemon": (nodes["lemon"] != "").any(),
    }
    shown_columns = [c for c in NODE_COLUMNS if said.get(c, True)]
    look.table(
        nodes[shown_columns],
        NODE_COLUMNS,
        height=min(TABLE_ROWS_SHOWN, len(nodes) + 1) * 35 + 3,
        node=st.column_config.TextColumn(help=NODE_COLUMNS["node"], pinned=True),
        detail=st.column_config.TextColumn(help=NODE_COLUMNS["detail"], width="medium"),
        **{name: st.column_config.Column(help=NODE_COLUMNS[name], width="small") for name in NARROW_COLUMNS},
    )


TABLE_ROWS_SHOWN = 25  # rows the node table shows before it scrolls
# Short values: narrow columns, so the whole table fits a laptop's width beside the sidebar.
NARROW_COLUMNS = ("cluster", "GPUs", "GPUs lost", "util %", "HBM used %", "max temp °C", "power W")

HEAT_MAP_NODES = 1000  # rows a heat map draws: past that a browser draws slowly and no one reads it


def heat_map_nodes(nodes: pd.DataFrame, limit: int = HEAT_MAP_NODES) -> list[str]:
    """The nodes the heat map draws: all of them up to limit; past it, every node that is not
    healthy first (what an SRE looks for), then the healthy ones by name."""
    if len(nodes) <= limit:
        return list(nodes["node"])
    ranked = nodes.assign(_healthy=nodes["state"] == "healthy").sort_values(["_healthy", "node"])
    return list(ranked["node"].head(limit))


def heat_map(gpus: pd.DataFrame, shown: str) -> alt.HConcatChart:
    column = HEAT_METRICS[shown]
    domain = [0, 100] if column.endswith("_pct") else None
    scale = alt.Scale(scheme="viridis", domain=domain) if domain else alt.Scale(scheme="viridis")
    n_nodes = max(1, gpus["node"].nunique())
    row_px = 26 if n_nodes <= 40 else max(2, 1200 // n_nodes)  # readable labels, or fit a big fleet
    y = alt.Y("node:N", title=None, sort="ascending", axis=alt.Axis(labels=row_px >= 10))
    state_strip = (
        alt.Chart(gpus.drop_duplicates("node"))
        .mark_rect()
        .encode(
            x=alt.X("label:N", title=None, axis=alt.Axis(labelAngle=0)),
            y=y,
            color=look.node_state_colour(),
            tooltip=["node", "state", "liveness"],
        )
        .transform_calculate(label="'state'")
        .properties(width=40, height=alt.Step(row_px))
    )
    base = alt.Chart(gpus).encode(
        x=alt.X("gpu:O", title="GPU index"),
        y=alt.Y("node:N", title=None, sort="ascending", axis=None),
        tooltip=[
            "node",
            "gpu",
            "workload",
            "waste",
            "model",
            "uuid",
            "state",
            "lost",
            alt.Tooltip(f"{column}:Q", format=".1f"),
        ],
    )
    # Grey underneath, value on top: a GPU that did not report the value stays grey.
    # A GPU held and not used (a waste finding: docs/workloads.md) is outlined.
    layers = [
        base.mark_rect(color="#d9d9d9"),
        base.mark_rect().encode(color=alt.Color(f"{column}:Q", title=shown, scale=scale)),
    ]
    if "waste" in gpus and gpus["waste"].notna().any():
        layers.append(
            base.transform_filter("isValid(datum.waste)").mark_rect(
                fill=None, stroke=look.WASTE_OUTLINE, strokeWidth=3
            )
        )
    heat = alt.layer(*layers).properties(height=alt.Step(row_px), width=alt.Step(56))
    return alt.hconcat(state_strip, heat, spacing=4).resolve_scale(color="independent")
