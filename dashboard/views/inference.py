"""Inference: every engine replica's KV-cache usage next to its GPUs' utilization, waiting
requests and preemptions, classed KV-bound, compute-bound or idle by the rule shown."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpufleet.dashboard.data import CLASS_RULE, REPLICA_COLUMNS, replicas_frame
from gpufleet.dashboard.fleet import list_nodes

CLASSES = ["KV-bound", "compute-bound", "idle", "unknown", "unreadable"]
CLASS_COLOURS = ["#b2182b", "#3778bf", "#7f7f7f", "#c7c7c7", "#000000"]


def render() -> None:
    st.header("Inference")
    replicas = replicas_frame(list_nodes())
    st.markdown(CLASS_RULE)
    if replicas.empty:
        st.info("No inference engines found in the fleet (vLLM, SGLang, TGI, TensorRT-LLM).")
        return
    counts = replicas["class"].value_counts()
    cols = st.columns(4)
    cols[0].metric("replicas", len(replicas))
    for col, name in zip(cols[1:], ["KV-bound", "compute-bound", "idle"], strict=True):
        col.metric(name, int(counts.get(name, 0)))
    chart = (
        alt.Chart(replicas.dropna(subset=["KV-cache usage %", "GPU util %"]))
        .mark_circle(size=120)
        .encode(
            x=alt.X("GPU util %:Q", scale=alt.Scale(domain=[0, 100])),
            y=alt.Y("KV-cache usage %:Q", scale=alt.Scale(domain=[0, 100])),
            color=alt.Color("class:N", scale=alt.Scale(domain=CLASSES, range=CLASS_COLOURS)),
            tooltip=[c for c in REPLICA_COLUMNS if c != "status"],
        )
    )
    st.altair_chart(chart, width="stretch")
    st.dataframe(replicas.round(1), hide_index=True, width="stretch")
