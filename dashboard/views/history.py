"""History explorer: any metric, filtered by node, GPU, cluster, engine and model, over a range,
at a step, with an aggregate; a chart, the table and a CSV download."""

from __future__ import annotations

import streamlit as st

from gpufleet.cli.sre import AGGREGATES
from gpufleet.cli.timeparse import parse_duration_ns, parse_time_ns
from gpufleet.dashboard.data import history_frame
from gpufleet.dashboard.fleet import call
from gpufleet.protos import fleet_pb2


def render() -> None:
    st.header("History explorer")
    metrics = call("ListMetrics", fleet_pb2.ListMetricsRequest()).metrics
    listed = call("ListNodes", fleet_pb2.ListNodesRequest()).nodes
    names = [n.node for n in listed]
    c1, c2, c3, c4 = st.columns(4)
    metric = c1.selectbox("metric", [m.name for m in metrics])
    unit = next((m.unit for m in metrics if m.name == metric), "")
    nodes = c2.multiselect("nodes (all if empty)", names)
    gpus = c3.multiselect("GPUs (all if empty)", sorted({g.index for n in listed for g in n.gpus}))
    clusters = c4.multiselect("clusters (all if empty)", sorted({n.cluster for n in listed}))
    c5, c6, c7, c8, c9 = st.columns(5)
    engines = c5.multiselect("engines", sorted({e.engine for n in listed for e in n.engines}))
    models = c6.multiselect(
        "models",
        sorted(
            {g.model for n in listed for g in n.gpus if g.model}
            | {e.model for n in listed for e in n.engines if e.model}
        ),
    )
    since = c7.text_input("from (e.g. 1h, 7d, 2026-11-29T10:00)", "1h")
    until = c8.text_input("to (empty: now)", "")
    step = c9.text_input("step (empty: automatic)", "")
    agg = st.selectbox("aggregate", list(AGGREGATES))
    try:
        request = fleet_pb2.HistoryRequest(
            metric=metric,
            nodes=nodes,
            gpus=gpus,
            clusters=clusters,
            engines=engines,
            models=models,
            start_unix_ns=parse_time_ns(since),
            end_unix_ns=parse_time_ns(until) if until else 0,
            step_ns=parse_duration_ns(step) if step else 0,
            aggregate=AGGREGATES[agg],
        )
    except ValueError as exc:
        st.error(str(exc))
        return
    resp = call("QueryHistory", request)
    frame = history_frame(resp)
    if frame.empty:
        st.info("No data for this query: widen the range or drop a filter.")
        return
    source = (
        "raw data"
        if resp.measurement in ("gpu", "engine", "collector")
        else f"the {resp.measurement} roll-up"
    )
    st.caption(
        f"{len(resp.series)} series, step {resp.step_ns / 1e9:g} s, {agg}, from {source}; unit: {unit}"
    )
    st.line_chart(frame, x="time", y=metric, color="series")
    st.dataframe(frame, hide_index=True, width="stretch")
    st.download_button("Download CSV", frame.to_csv(index=False), f"{metric}.csv", "text/csv")
