"""Workloads: whose work is on the GPUs (docs/workloads.md). Top owners by GPU-hours and
efficiency over a chosen range and their idle GPU-hours, the GPUs held and not used now (the waste
findings), the running workloads with their efficiency, and one workload's report (per node and
GPU). Every figure is the aggregator's (`gpufleet usage`, `jobs`, `job ID`
print the same); user names only for the roles that may see them."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpufleet.client.present import fmt, workload_name, workload_row
from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import parse_time_ns
from gpufleet.dashboard import look
from gpufleet.dashboard.data import WORKLOAD_DETAIL_ONLY, usage_frame, waste_frame, workloads_frame
from gpufleet.dashboard.fleet import call, try_call
from gpufleet.protos import fleet_pb2

RANGES = {"last 24 hours": "24h", "last 7 days": "7d", "last 30 days": "30d", "last hour": "1h"}
BY = ["account", "team", "namespace", "partition", "user"]


def render() -> None:
    st.header("Workloads")
    listed = call(FleetRpc.ListWorkloads, fleet_pb2.ListWorkloadsRequest(ended=True))
    if listed.scheduler == "none":
        st.info(
            "No scheduler is read (workload_scheduler = none): no workload is attributed. Set "
            "workload_scheduler = slurm or site on the aggregator (docs/workloads.md)."
        )
        return
    age = f", read {listed.scheduler_read_age_s:.0f} s ago" if listed.HasField("scheduler_read_age_s") else ""
    st.caption(f"Owners from the {listed.scheduler} scheduler{age}; a node's own word is checked against it.")

    st.subheader("Top owners")
    cols = st.columns(2)
    range_label = cols[0].selectbox("range", list(RANGES), key="workloads_range")
    by = cols[1].selectbox("by", BY, key="workloads_by")
    usage, error = try_call(
        FleetRpc.QueryUsage,
        fleet_pb2.UsageRequest(start_unix_ns=parse_time_ns(RANGES[range_label]), by=by),
    )
    if error:
        st.warning(error)
    elif usage is not None:
        frame = usage_frame(usage)
        if frame.empty:
            st.caption(f"No workload held a GPU in the {range_label}.")
        else:
            st.caption(
                "GPU-hours allocated (the scheduler's times x GPUs), effective (x utilization), idle "
                "(intervals under 5 % utilization); efficiency = effective / allocated."
            )
            look.table(frame)
            idle = frame[frame["GPU-h idle"] > 0].sort_values("GPU-h idle", ascending=False)
            st.subheader(f"Waste in the {range_label}")
            if idle.empty:
                st.caption(f"No GPU-hour was idle in the {range_label}.")
            else:
                st.caption(f"Idle GPU-hours by {by}, most first (`gpufleet waste --by {by}`).")
                look.table(idle[[by, "workloads", "GPU-h idle", "GPU-h allocated"]])

    waste = waste_frame(listed.waste)
    st.subheader(f"Held and not used now ({len(waste)})")
    if waste.empty:
        st.caption("No idle allocation, orphaned process or GPU used outside its allocation is found now.")
    else:
        st.caption(
            "Each finding has waited out its window (the policy's [rules.idle_allocation], "
            "[rules.orphaned_process], [rules.gpu_outside_allocation]) and its owner was alerted; "
            "`gpufleet waste` lists the same."
        )
        look.table(waste)

    running = workloads_frame(listed.running)
    st.subheader(f"Running ({len(running)})")
    if running.empty:
        st.caption("No workload holds a GPU now.")
    else:
        look.table(running.drop(columns=["end", *WORKLOAD_DETAIL_ONLY]))

    ended = workloads_frame(listed.ended)
    st.subheader(f"Ended in the last 24 hours ({len(ended)})")
    if not ended.empty:
        look.table(ended.drop(columns=WORKLOAD_DETAIL_ONLY))

    names = [workload_name(w) for w in [*listed.running, *listed.ended]]
    if names:
        st.subheader("A workload's report")
        chosen = st.selectbox("workload", names, key="workload_report")
        scheduler, _, wid = chosen.partition(":")
        detail = call(FleetRpc.GetWorkload, fleet_pb2.GetWorkloadRequest(scheduler=scheduler, id=wid))
        report(detail)


def report(detail: fleet_pb2.WorkloadDetail) -> None:
    w = detail.summary
    owner = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("user", "(hidden)" if w.user_hidden else w.user),
            ("account", w.account),
            ("namespace", w.namespace),
            ("team", w.team),
            ("partition", w.partition),
        )
        if v
    )
    st.markdown(look.md(f"{workload_name(w)} — {w.name or 'unnamed'}: {owner}"))
    row = workload_row(w)
    st.caption(
        f"GPU-hours allocated {fmt(row['gpu_hours_allocated'], '.2f')}, effective "
        f"{fmt(row['gpu_hours_effective'], '.2f')} (efficiency {fmt(row['efficiency_pct'])} %); "
        f"mean GPU utilization {fmt(row['util_mean_pct'])} %"
    )
    gpus = pd.DataFrame(
        [
            {
                "node": g.node,
                "GPU": g.gpu,
                "util mean %": round(g.util_mean_pct) if g.HasField("util_mean_pct") else None,
                "util max %": round(g.util_max_pct),
                "SM mean %": round(g.sm_mean_pct) if g.HasField("sm_mean_pct") else None,
                "HBM peak GiB": round(g.hbm_peak_bytes / (1 << 30), 1),
                "energy kWh": round(g.energy_j / 3.6e6, 3),
                "idle min": round(g.idle_seconds / 60, 1),
            }
            for g in detail.gpus
        ],
        columns=[
            "node",
            "GPU",
            "util mean %",
            "util max %",
            "SM mean %",
            "HBM peak GiB",
            "energy kWh",
            "idle min",
        ],
    )
    if gpus.empty:
        st.caption("No GPU readings yet.")
    else:
        look.table(gpus)
