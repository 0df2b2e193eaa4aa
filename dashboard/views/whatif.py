"""Policy what-if: replay the store's history under the aggregator's policy and a proposed
one (the Fleet API's ReplayPolicy, as `gpufleet replay --since ... --compare`), and plot the
capacity each would have taken out of service over time."""

from __future__ import annotations

import json
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.client.present import NA
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import parse_time_ns
from gpufleet.dashboard import look
from gpufleet.dashboard.fleet import call
from gpufleet.protos import fleet_pb2

EXAMPLE = """# An override over the shipped policy, e.g. what if XID 94 waited 5 minutes?
[xid.94]
severity = "critical"
cordon = true
ladder = ["reset_gpu", "reboot", "ticket"]
window_s = 300
"""
FIGURES = (
    "nodes_taken_out",
    "gpu_hours_out_of_service",
    "false_cordons",
    "precision",
    "recall",
    "breaker_trips",
)


FIGURE_HELP = {
    "figure": 'docs/repair.md, "Policy replay", defines each figure.',
    "current": "Under the aggregator's policy now.",
    "proposed": "Under the current policy with the proposed override applied.",
}


def figure(value: Any) -> str:
    """A report's figure as the table reads it: N/A where the replay had nothing to measure it
    by (precision with no node taken out), ratios to three places."""
    if value is None:
        return NA
    return f"{value:.3f}" if isinstance(value, float) and not value.is_integer() else f"{value:g}"


def out_of_service_frame(reports: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for name, report in reports.items():
        series = report["out_of_service"]
        for t, v in zip(series["time"], series["gpus_out"], strict=True):
            rows.append({"time": pd.Timestamp(t), "GPUs out of service": v, "policy": name})
    return pd.DataFrame(rows, columns=["time", "GPUs out of service", "policy"])


def render() -> None:
    st.header("Policy what-if")
    st.caption(
        "Replays the store's history through the real repair controller on a virtual clock, "
        "with the aggregator's rails and commands (nothing is done to any node), under the "
        'current policy and the proposed one. docs/repair.md, "Policy replay", defines each figure.'
    )
    c1, c2 = st.columns(2)
    since = c1.text_input("from (e.g. 1h, 7d, 2026-11-29T10:00)", "1h")
    until = c2.text_input("to (empty: now)", "")
    proposed = st.text_area("proposed policy (an override file's text)", EXAMPLE, height=160)
    if not st.button("Replay"):
        return
    try:
        request = fleet_pb2.ReplayRequest(
            start_unix_ns=parse_time_ns(since),
            end_unix_ns=parse_time_ns(until) if until else 0,
            compare=True,
            compare_toml=proposed,
            policy_name="current",
            compare_name="proposed",
        )
    except ValueError as exc:
        st.error(str(exc))
        return
    with st.spinner("replaying the store's history ..."):
        reply = call(FleetRpc.ReplayPolicy, request, timeout_s=600.0)
    current, other = json.loads(reply.report_json), json.loads(reply.compare_json)
    difference = json.loads(reply.difference_json)
    frame = out_of_service_frame({"current": current, "proposed": other})
    chart = (
        alt.Chart(frame)
        .mark_line(interpolate="step-after")
        .encode(
            x=look.time_x(frame),
            y="GPUs out of service:Q",
            color=look.series_colour(["current", "proposed"], "policy", "policy"),
            tooltip=[look.time_tooltip(), "policy:N", "GPUs out of service:Q"],
        )
    )
    st.altair_chart(chart, width="stretch")
    look.table(
        pd.DataFrame(
            [{"figure": k, "current": figure(current[k]), "proposed": figure(other[k])} for k in FIGURES],
            columns=["figure", "current", "proposed"],
        ),
        FIGURE_HELP,
    )
    for key, title in (
        ("nodes_taken_out_only_by_a", "taken out only under the current policy"),
        ("nodes_taken_out_only_by_b", "taken out only under the proposed policy"),
        ("faults_caught_only_by_a", "faults caught only by the current policy"),
        ("faults_caught_only_by_b", "faults caught only by the proposed policy"),
    ):
        items = difference[key]
        st.write(f"**{title}**: {len(items)}" + (f" — {', '.join(items[:20])}" if items else ""))
    st.caption(f"{current['source']}; {current['inputs']} inputs, {current['passes']} passes")
