"""History explorer: any metric, filtered by node, GPU, cluster, engine and model, over a range,
at a step, with an aggregate; grouped by cluster, model, node or engine at fleet scale. However
many series come back, the chart draws at most MAX_LINES of them, the highest (or lowest) by
their mean over the range, each in its own colour-blind-safe colour with its whole name in the
legend, and folds the rest into one grey min-max band; the table and the CSV hold every series."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpufleet.client.present import AGGREGATES, history_csv
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import parse_duration_ns, parse_time_ns
from gpufleet.dashboard import links, look
from gpufleet.dashboard.data import band_frame, history_frame, top_series
from gpufleet.dashboard.fleet import call, list_nodes
from gpufleet.protos import fleet_pb2
from gpufleet.protos.presentation import SERIES_PALETTE

# Lines a chart draws, each its own colour (the palette's, without reusing one); the rest of
# the series are one band. The legend then lists every line it draws, uncut.
MAX_LINES = len(SERIES_PALETTE) - 1
# Series fetched before "auto" groups on the server instead (one line per node, then per
# cluster): past this the answer is large and the band says little the groups do not.
MAX_SERIES = 128
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
    """Each series while there are at most MAX_SERIES (the chart draws the top ones and bands the
    rest), else one per node while the nodes are that few, else per cluster (per model when
    there is one cluster)."""
    chosen = [n for n in listed if (not nodes or n.node in nodes) and (not clusters or n.cluster in clusters)]
    per_node = (lambda n: len(n.engines)) if measurement == "engine" else (lambda n: len(n.gpus) or 1)
    if sum(per_node(n) for n in chosen) <= MAX_SERIES:
        return ()
    if len(chosen) <= MAX_SERIES:
        return ("node",)
    return ("cluster",) if len({n.cluster for n in chosen}) > 1 else ("model",)


def render() -> None:
    st.header("History explorer")
    metrics = call(FleetRpc.ListMetrics, fleet_pb2.ListMetricsRequest()).metrics
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
    c10, c11, c12, c13 = st.columns([2, 2, 2, 1])
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
    lowest = (
        c12.selectbox("lines drawn", ["highest mean", "lowest mean"], key="history_rank") == "lowest mean"
    )
    band = c13.checkbox("min-max band", value=True, disabled=not group_by)
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
    resp = call(FleetRpc.QueryHistory, request)
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
    why = (
        f" (grouped automatically: more than {MAX_SERIES} series)" if grouping == "auto" and group_by else ""
    )
    st.caption(
        f"{len(resp.series)} {'groups' if group_by else 'series'}{grouped}, step {resp.step_ns / 1e9:g} s, "
        f"{agg} per step, from {source}; unit: {unit}{why}"
    )
    drawn_rows, rest, drawn = top_series(frame, metric, MAX_LINES, lowest)
    names = [*drawn, look.OTHERS_LABEL] if not rest.empty else drawn
    if not rest.empty:
        st.caption(
            f"Drawn: the {len(drawn)} {'groups' if group_by else 'series'} with the "
            f"{'lowest' if lowest else 'highest'} mean over the range, in the legend's order; the other "
            f"{frame['series'].nunique() - len(drawn)} as one grey band from their lowest to their "
            "highest value at each step. The table and the CSV hold them all."
        )
    y_title = f"{metric} ({unit})" if unit else metric
    colour = look.series_colour(names, title=" / ".join(group_by) if group_by else "series")
    lines = (
        alt.Chart(drawn_rows)
        .mark_line()
        .encode(
            x=look.time_x(frame),
            y=alt.Y(f"{metric}:Q", title=y_title),
            color=colour,
            tooltip=[look.time_tooltip(), "series:N", alt.Tooltip(f"{metric}:Q", format=".2f")],
        )
    )
    layers: list[alt.Chart] = [lines]
    if not rest.empty:
        layers.insert(
            0,
            alt.Chart(rest.assign(series=look.OTHERS_LABEL))
            .mark_area(opacity=0.5)
            .encode(x=look.time_x(frame), y="min:Q", y2="max:Q", color=colour),
        )
    if group_by and band:
        # The spread inside each drawn group: its smallest and largest value per step.
        low = call(FleetRpc.QueryHistory, _with_aggregate(request, fleet_pb2.AGGREGATE_MIN))
        high = call(FleetRpc.QueryHistory, _with_aggregate(request, fleet_pb2.AGGREGATE_MAX))
        spread = band_frame(low, high)
        spread = spread[spread["series"].isin(drawn)]
        if not spread.empty:
            layers.insert(
                len(layers) - 1,
                alt.Chart(spread)
                .mark_area(opacity=0.15)
                .encode(x=look.time_x(frame), y="min:Q", y2="max:Q", color=colour),
            )
    st.altair_chart(alt.layer(*layers), width="stretch")
    look.table(frame)
    st.download_button("Download CSV", history_csv(resp), f"{metric}.csv", "text/csv")


def _with_aggregate(request: fleet_pb2.HistoryRequest, aggregate: int) -> fleet_pb2.HistoryRequest:
    other = fleet_pb2.HistoryRequest()
    other.CopyFrom(request)
    other.aggregate = aggregate
    return other
