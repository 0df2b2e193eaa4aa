"""Inference: the serving pools (one model in one cluster: replicas, KV-cache pressure, what
one replica leaving would do, repairs waiting for capacity), then every engine replica's
KV-cache usage next to its GPUs' utilization, classed KV-bound, compute-bound or idle by the
aggregator's rule, shown on the page (docs/repair.md "Serving-aware repair")."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpufleet.dashboard.data import REPLICA_COLUMNS, pools_frame, replicas_frame
from gpufleet.dashboard.fleet import call
from gpufleet.protos import fleet_pb2

CLASSES = ["KV-bound", "compute-bound", "idle", "unknown", "unreadable"]
CLASS_COLOURS = ["#b2182b", "#3778bf", "#7f7f7f", "#c7c7c7", "#000000"]


def render() -> None:
    st.header("Inference")
    answer = call("ListPools", fleet_pb2.ListPoolsRequest(replicas=True))
    replicas = replicas_frame(answer)
    st.markdown(answer.load_class_rule)
    if replicas.empty:
        st.info("No inference engines found in the fleet (vLLM, SGLang, TGI, TensorRT-LLM).")
        return
    counts = replicas["class"].value_counts()
    cols = st.columns(4)
    cols[0].metric("replicas", len(replicas))
    for col, name in zip(cols[1:], ["KV-bound", "compute-bound", "idle"], strict=True):
        col.metric(name, int(counts.get(name, 0)))
    st.subheader("Serving pools")
    st.caption(
        f"Floor: KV-cache {answer.floor_kv_cache_usage_ratio:.0%}, at least "
        f"{answer.floor_min_serving_replicas} replica(s); the capacity guard is "
        f"{'on' if answer.guard else 'off'}. {answer.formula}. Headroom: replicas that may leave "
        "within the floor (negative: replicas short of it)."
    )
    st.dataframe(pools_frame(answer), hide_index=True, width="stretch")
    st.subheader("Replicas")
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
