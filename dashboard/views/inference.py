"""Inference: the serving pools (one model in one cluster: replicas, KV-cache pressure, what
one replica leaving would do, repairs waiting for capacity), then every engine replica's
KV-cache usage next to its GPUs' utilization, classed KV-bound, compute-bound or idle by the
aggregator's rule, shown on the page (docs/repair.md "Serving-aware repair")."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import parse_time_ns
from gpufleet.dashboard import look
from gpufleet.dashboard.data import (
    REPLICA_COLUMNS,
    history_frame,
    pools_frame,
    replicas_frame,
    waiting_frame,
)
from gpufleet.dashboard.fleet import call
from gpufleet.protos import fleet_pb2
from gpufleet.protos import presentation as colours

CLASSES = ["KV-bound", "compute-bound", "light", "idle", "unknown", "unreadable"]
CLASS_COLOURS = [
    colours.VERMILLION,
    colours.BLUE,
    colours.SKY_BLUE,
    colours.GREY,
    colours.LIGHT_GREY,
    colours.BLACK,
]


def render() -> None:
    st.header("Inference")
    answer = call(FleetRpc.ListPools, fleet_pb2.ListPoolsRequest(replicas=True))
    replicas = replicas_frame(answer)
    st.markdown(answer.load_class_rule)
    if replicas.empty:
        st.info("No inference engines found in the fleet (vLLM, SGLang, TGI, TensorRT-LLM).")
        return
    counts = replicas["class"].value_counts()
    cols = st.columns(5)
    cols[0].metric("replicas", len(replicas))
    for col, name in zip(cols[1:], ["KV-bound", "compute-bound", "light", "idle"], strict=True):
        col.metric(name, int(counts.get(name, 0)))
    st.subheader("Serving pools")
    st.caption(
        f"Floor: KV-cache {answer.floor_kv_cache_usage_ratio:.0%}, at least "
        f"{answer.floor_min_serving_replicas} replica(s); the capacity guard is "
        f"{'on' if answer.guard else 'off'}. {answer.formula}. Headroom: replicas that may leave "
        "within the floor (negative: replicas short of it)."
    )
    look.table(pools_frame(answer))
    waiting = waiting_frame(call(FleetRpc.GetRepairStatus, fleet_pb2.RepairStatusRequest()))
    if waiting.empty:
        st.caption("No repair waits for serving capacity.")
    else:
        st.subheader("Repairs waiting for capacity")
        st.caption(
            "Each drain below waits until its pools stay within the floor (a replica added, pressure "
            "falling) or an operator runs `gpufleet proceed NODE --reason ...`."
        )
        look.table(waiting)
    st.subheader("KV-cache pressure over time")
    since = st.selectbox("range", ["15m", "1h", "6h", "24h"], index=1, key="pools-range")
    pressure = history_frame(
        call(
            FleetRpc.QueryHistory,
            fleet_pb2.HistoryRequest(
                metric="kv_cache_usage_ratio",
                start_unix_ns=parse_time_ns(since),
                aggregate=fleet_pb2.AGGREGATE_MEAN,
                group_by=["cluster", "model"],
            ),
        )
    )
    if pressure.empty:
        st.caption("No KV-cache history in this range.")
    else:
        pressure["KV %"] = (100 * pressure["kv_cache_usage_ratio"]).round(1)
        line = (
            alt.Chart(pressure)
            .mark_line()
            .encode(
                x=look.time_x(pressure),
                y=alt.Y("KV %:Q", scale=alt.Scale(domain=[0, 100])),
                color=look.series_colour(sorted(set(pressure["series"])), title="cluster/model"),
                tooltip=[look.time_tooltip(), "series:N", "KV %:Q"],
            )
        )
        floor = (
            alt.Chart(pd.DataFrame({"floor": [100 * answer.floor_kv_cache_usage_ratio]}))
            .mark_rule(strokeDash=[4, 4])
            .encode(y="floor:Q")
        )
        st.altair_chart(line + floor, width="stretch")
    st.subheader("Replicas")
    chart = (
        alt.Chart(replicas.dropna(subset=["KV %", "GPU util %"]))
        .mark_circle(size=120)
        .encode(
            x=alt.X("GPU util %:Q", scale=alt.Scale(domain=[0, 100])),
            y=alt.Y("KV %:Q", scale=alt.Scale(domain=[0, 100])),
            color=alt.Color("class:N", scale=alt.Scale(domain=CLASSES, range=CLASS_COLOURS)),
            tooltip=[c for c in REPLICA_COLUMNS if c != "status"],
        )
    )
    st.altair_chart(chart, width="stretch")
    # The cluster where the fleet has more than one (the pools above name it): the table fits a
    # 1,600-px window.
    one_cluster = replicas["cluster"].nunique() <= 1
    look.table((replicas.drop(columns=["cluster"]) if one_cluster else replicas).round(1))
