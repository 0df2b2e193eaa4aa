"""History explorer: any metric, filtered by node, GPU, cluster, engine and model, over a range,
at a step, with an aggregate; grouped by cluster, model, node or engine at fleet scale (one line
per group, with its min-max band); a chart, the table and a CSV download."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpufleet.client.present import AGGREGATES, history_csv
from gpufleet.client.timeparse import parse_duration_ns, parse_time_ns
from gpufleet.dashboard import links
from gpufleet.dashboard.data import band_frame, history_frame, time_x
from gpufleet.dashboard.fleet import call, list_nodes
from gpufleet.protos import fleet_pb2

# More lines than this and a chart is a tangle: "auto" groups instead of drawing each series.
MAX_LINES = 16
GROUPINGS = {
    "auto": None,
    "none (each GPU / engine replica)": (),
    "node": ("node",),
    "cluster": ("cluster",),
    "model": ("model",),
    "engine": ("engine",),
    "cluster and model": ("cluster", "model"),
    "GPU index": ("gpu",),
}


def auto_grouping(
    listed: list[fleet_pb2.NodeSummary], measurement: str, nodes: list[str], clusters: list[str]
) -> tuple[str, ...]:
    """Each series when they are few, else one line per node while the nodes are few, else per
    cluster (per model when there is one cluster)."""
    chosen = [n for n in listed if (not nodes or n.node in nodes) and (not clusters or n.cluster in clusters)]
    per_node = (lambda n: len(n.engines)) if measurement == "engine" else (lambda n: len(n.gpus) or 1)
    if sum(per_node(n) for n in chosen) <= MAX_LINES:
        return ()
    if len(chosen) <= MAX_LINES:
        return ("node",)
    return ("cluster",) if len({n.cluster for n in chosen}) > 1 else ("model",)


def render() -> None:
    st.header("History explorer")
    metrics = call("ListMetrics", fleet_pb2.ListMetricsRequest()).metrics
    listed = list(list_nodes().nodes)
    names = [n.node for n in listed]
    c1, c2, c3, c4 = st.columns(4)
    metric_names = [m.name for m in metrics]
    asked_metric = links.param("metric")
    metric = c1.selectbox(
        "metric", metric_names, index=metric_names.index(asked_metric) if asked_metric in metric_names else 0
    )
    info = next((m for m in metrics if m.name == metric), None)
    unit = info.unit if info else ""
    nodes = c2.multiselect(
        "nodes (all if empty)", names, default=[n for n in links.params("node") if n in names]
    )
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
    since = c7.text_input("from (e.g. 1h, 7d, 2026-11-29T10:00)", links.param("since", "1h"))
    until = c8.text_input("to (empty: now)", links.param("until"))
    step = c9.text_input("step (empty: automatic)", links.param("step"))
    c10, c11, c12 = st.columns([2, 2, 1])
    aggregates, groupings = list(AGGREGATES), list(GROUPINGS)
    agg = c10.selectbox(
        "aggregate",
        aggregates,
        index=aggregates.index(links.param("agg")) if links.param("agg") in aggregates else 0,
        key="history_aggregate",
    )
    grouping = c11.selectbox(
        "group by",
        groupings,
        index=groupings.index(links.param("group")) if links.param("group") in groupings else 0,
        key="history_group_by",
    )
    links.keep(metric=metric, node=nodes, since=since, until=until, step=step, agg=agg, group=grouping)
    group_by = GROUPINGS[grouping]
    if group_by is None:
        group_by = auto_grouping(listed, info.measurement if info else "gpu", nodes, clusters)
    band = c12.checkbox("min-max band", value=True, disabled=not group_by)
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
            group_by=group_by,
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
    grouped = f", {agg} across each {' and '.join(group_by)}" if group_by else ""
    why = f" (grouped automatically: more than {MAX_LINES} lines)" if grouping == "auto" and group_by else ""
    st.caption(
        f"{len(resp.series)} {'groups' if group_by else 'series'}{grouped}, step {resp.step_ns / 1e9:g} s, "
        f"{agg} per step, from {source}; unit: {unit}{why}"
    )
    lines = (
        alt.Chart(frame)
        .mark_line()
        .encode(
            x=time_x(frame),
            y=alt.Y(f"{metric}:Q", title=f"{metric} ({unit})" if unit else metric),
            color=alt.Color("series:N", title=" / ".join(group_by) if group_by else "series"),
            tooltip=["time:T", "series:N", alt.Tooltip(f"{metric}:Q", format=".2f")],
        )
    )
    layers: list[alt.Chart] = [lines]
    if group_by and band:
        # The spread inside each group: its smallest and largest value per step.
        low = call("QueryHistory", _with_aggregate(request, fleet_pb2.AGGREGATE_MIN))
        high = call("QueryHistory", _with_aggregate(request, fleet_pb2.AGGREGATE_MAX))
        spread = band_frame(low, high)
        if not spread.empty:
            layers.insert(
                0,
                alt.Chart(spread)
                .mark_area(opacity=0.15)
                .encode(x="time:T", y="min:Q", y2="max:Q", color="series:N"),
            )
    st.altair_chart(alt.layer(*layers), width="stretch")
    st.dataframe(frame, hide_index=True, width="stretch")
    st.download_button("Download CSV", history_csv(resp), f"{metric}.csv", "text/csv")


def _with_aggregate(request: fleet_pb2.HistoryRequest, aggregate: int) -> fleet_pb2.HistoryRequest:
    other = fleet_pb2.HistoryRequest()
    other.CopyFrom(request)
    other.aggregate = aggregate
    return other
