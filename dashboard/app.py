"""The gpufleet dashboard (Streamlit). It reads only the Fleet API, with the address and
token the CLI would use (GPUFLEET_FLEET / GPUFLEET_TOKEN / the client config).

    gpufleet dashboard [--port 8501]
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.cli.client import ClientError, FleetClient, resolve_client
from gpufleet.cli.sre import AGGREGATES
from gpufleet.cli.timeparse import parse_duration_ns, parse_time_ns
from gpufleet.dashboard.data import HEAT_METRICS, engines_frame, gpus_frame, history_frame, nodes_frame
from gpufleet.protos import fleet_pb2

REFRESH_S = 5


@st.cache_resource
def client() -> FleetClient:
    return FleetClient(resolve_client(None, None, None))


def call(method: str, request: object) -> object:
    try:
        return client().call(method, request)
    except ClientError as exc:
        st.error(str(exc))
        st.stop()


def overview() -> None:
    st.header("Fleet overview")
    resp = call("ListNodes", fleet_pb2.ListNodesRequest())
    nodes, gpus = nodes_frame(resp), gpus_frame(resp)
    if nodes.empty:
        st.info("No nodes have reported to this aggregator yet. Start collectors, or `gpufleet demo`.")
        return
    states = nodes["state"].value_counts()
    cols = st.columns(6)
    cols[0].metric("nodes", len(nodes))
    cols[1].metric("reporting", int(states.get("reporting", 0)))
    cols[2].metric("stale / silent", f"{int(states.get('stale', 0))} / {int(states.get('silent', 0))}")
    cols[3].metric("GPUs", int(nodes["GPUs"].sum()))
    cols[4].metric("GPUs lost", int(gpus["lost"].sum()))
    util = gpus["util_gpu_pct"].mean()
    cols[5].metric("fleet mean utilization", "N/A" if pd.isna(util) else f"{util:.0f} %")

    f1, f2, f3 = st.columns(3)
    clusters = f1.multiselect("cluster", sorted(nodes["cluster"].unique()))
    wanted_states = f2.multiselect("state", ["reporting", "stale", "silent"])
    shown = f3.selectbox("heat map shows", list(HEAT_METRICS))
    if clusters:
        gpus = gpus[gpus["cluster"].isin(clusters)]
        nodes = nodes[nodes["cluster"].isin(clusters)]
    if wanted_states:
        gpus = gpus[gpus["state"].isin(wanted_states)]
        nodes = nodes[nodes["state"].isin(wanted_states)]
    column = HEAT_METRICS[shown]
    domain = [0, 100] if column.endswith("_pct") else None
    scale = alt.Scale(scheme="viridis", domain=domain) if domain else alt.Scale(scheme="viridis")
    n_nodes = max(1, gpus["node"].nunique())
    row_px = 26 if n_nodes <= 40 else max(3, 1000 // n_nodes)  # readable labels, or fit a big fleet
    base = alt.Chart(gpus).encode(
        x=alt.X("gpu:O", title="GPU index"),
        y=alt.Y("node:N", title=None, sort="ascending", axis=alt.Axis(labels=row_px >= 10)),
        tooltip=["node", "gpu", "model", "uuid", "state", "lost", alt.Tooltip(f"{column}:Q", format=".1f")],
    )
    # Grey underneath, value on top: a GPU that did not report the value stays grey.
    heat = alt.layer(
        base.mark_rect(color="#d9d9d9"),
        base.mark_rect().encode(color=alt.Color(f"{column}:Q", title=shown, scale=scale)),
    ).properties(height=alt.Step(row_px))
    st.altair_chart(heat, use_container_width=True)
    st.caption("Grey cells: the GPU did not report this value (absent, not zero).")
    st.dataframe(nodes.round(1), hide_index=True, use_container_width=True)


def node_page() -> None:
    st.header("Node")
    names = [n.node for n in call("ListNodes", fleet_pb2.ListNodesRequest()).nodes]
    if not names:
        st.info("No nodes yet.")
        return
    name = st.selectbox("node", names)
    detail = call("GetNode", fleet_pb2.GetNodeRequest(node=name))
    s = detail.summary
    one = pd.DataFrame(
        [
            {
                "node": s.node,
                "cluster": s.cluster,
                "boot": s.boot_id,
                "seq": s.last_seq,
                "interval s": s.interval_s,
                "driver": s.driver_version,
                "simulated": s.simulated,
            }
        ]
    )
    st.dataframe(one, hide_index=True)
    resp = fleet_pb2.ListNodesResponse(nodes=[s])
    st.dataframe(
        gpus_frame(resp).drop(columns=["node", "cluster", "state"]), hide_index=True, use_container_width=True
    )
    if not detail.engines:
        st.caption("No inference engines reported on this node.")
    else:
        st.subheader("Inference engines")
        st.dataframe(engines_frame(detail.engines), hide_index=True, use_container_width=True)
    metric = st.selectbox("metric", ["util_gpu_pct", "hbm_used_bytes", "temp_gpu_c", "power_w"])
    hist = call(
        "QueryHistory",
        fleet_pb2.HistoryRequest(
            metric=metric, nodes=[name], start_unix_ns=parse_time_ns("15m"), step_ns=parse_duration_ns("10s")
        ),
    )
    frame = history_frame(hist)
    if frame.empty:
        st.info("No history for this node in the last 15 minutes.")
    else:
        st.line_chart(frame, x="time", y=metric, color="series")


def history_page() -> None:
    st.header("History explorer")
    metrics = [m.name for m in call("ListMetrics", fleet_pb2.ListMetricsRequest()).metrics]
    names = [n.node for n in call("ListNodes", fleet_pb2.ListNodesRequest()).nodes]
    c1, c2, c3, c4, c5 = st.columns(5)
    metric = c1.selectbox("metric", metrics)
    nodes = c2.multiselect("nodes (all if empty)", names)
    since = c3.text_input("since", "1h")
    step = c4.text_input("step (empty: automatic)", "")
    agg = c5.selectbox("aggregate", list(AGGREGATES))
    try:
        request = fleet_pb2.HistoryRequest(
            metric=metric,
            nodes=nodes,
            start_unix_ns=parse_time_ns(since),
            step_ns=parse_duration_ns(step) if step else 0,
            aggregate=AGGREGATES[agg],
        )
    except ValueError as exc:
        st.error(str(exc))
        return
    frame = history_frame(call("QueryHistory", request))
    if frame.empty:
        st.info("No data for this query.")
        return
    st.line_chart(frame, x="time", y=metric, color="series")
    st.dataframe(frame, hide_index=True, use_container_width=True)
    st.download_button("Download CSV", frame.to_csv(index=False), f"{metric}.csv", "text/csv")


def main() -> None:
    st.set_page_config(page_title="gpufleet", layout="wide")
    st.sidebar.title("gpufleet")
    page = st.sidebar.radio("page", ["Fleet overview", "Node", "History explorer"])
    st.sidebar.caption(f"Fleet API {client().settings.fleet} · refresh every {REFRESH_S}s")
    if page == "Fleet overview":
        st.fragment(overview, run_every=REFRESH_S)()
    elif page == "Node":
        st.fragment(node_page, run_every=REFRESH_S)()
    else:
        history_page()


main()
