"""Failures and repairs: the breaker, the repair queue, the incident timeline with each
incident's findings, actions and outcome, and the audit log."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpufleet.client.rpcs import FleetRpc
from gpufleet.client.timeparse import iso
from gpufleet.dashboard import links, look
from gpufleet.dashboard.data import (
    HEADLINE_HELP,
    audit_frame,
    incident_segments,
    incidents_frame,
    queue_frame,
)
from gpufleet.dashboard.fleet import call
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import action_name, severity_name


def render() -> None:
    st.header("Failures and repairs")
    status = call(FleetRpc.GetRepairStatus, fleet_pb2.RepairStatusRequest())
    if status.breaker_tripped:
        st.error(
            f"Repair breaker TRIPPED at {iso(status.breaker_tripped_unix_ns)}: {status.breaker_reason}. "
            "All automatic action is halted until an operator runs `gpufleet breaker reset --reason ...`."
        )
    else:
        st.success(f"Repair breaker ok · backend {status.backend}" + (" · DRY RUN" if status.dry_run else ""))
    cols = st.columns(3)
    cols[0].metric("nodes out of service", status.out_of_service, help=HEADLINE_HELP["nodes out of service"])
    cols[1].metric("cap (nodes)", status.out_of_service_cap)
    incidents = call(FleetRpc.ListIncidents, fleet_pb2.ListIncidentsRequest(limit=500)).incidents
    frame = incidents_frame(list(incidents))
    cols[2].metric("open incidents", int((frame["workflow"] != "closed").sum()) if not frame.empty else 0)

    st.subheader("Repair queue")
    queue = queue_frame(status)
    if queue.empty:
        st.caption("No node is out of service or in repair.")
    else:
        look.table(queue)

    st.subheader("Incidents")
    if frame.empty:
        st.caption("No incidents yet.")
    else:
        # Each incident as the states its node went through (its audited steps), in each state's
        # colour as on every page: a wait for capacity reads cordoned, a drain in repair.
        timeline = incident_segments(list(incidents), pd.Timestamp.now(tz="UTC"))
        chart = (
            alt.Chart(timeline)
            .mark_bar(height=12)
            .encode(
                x=look.time_x(timeline, "from"),
                x2="until:T",
                y=alt.Y("node:N", title=None),
                color=look.node_state_colour("node state", title="node state"),
                opacity=alt.Opacity("open:N", scale=alt.Scale(domain=["open", "closed"], range=[1.0, 0.45])),
                tooltip=[
                    "incident",
                    "node",
                    "node state",
                    look.time_tooltip("from", "from (UTC)"),
                    look.time_tooltip("until", "until (UTC)"),
                    alt.Tooltip("open:N", title="incident"),
                ],
            )
        )
        st.altair_chart(chart, width="stretch")
        # Severity and action are the chosen incident's findings' (the table below): left out
        # here so the list fits a 1,600-px window.
        look.table(frame.drop(columns=["severity", "action"]))
        ids = list(frame["incident"])
        asked = links.param("incident")
        if asked and asked not in ids:
            st.warning(f"Incident {asked!r} is not among the {len(ids)} listed here.")
        chosen = st.selectbox("incident", ids, index=ids.index(asked) if asked in ids else 0)
        links.keep(incident=chosen)
        incident = next(i for i in incidents if i.id == chosen)
        outcome = look.md(incident.outcome or "open")
        st.markdown(f"**{look.md(incident.id)}** on **{look.md(incident.node)}** — {outcome}")
        look.table(
            pd.DataFrame(
                [
                    {
                        "GPU": f.gpu_index if f.HasField("gpu_index") else None,
                        "code": f.code,
                        "severity": severity_name(f.severity),
                        "action": action_name(f.action),
                        "cordon": f.cordon,
                        "evidence": f.evidence,
                        "reason": f.reason,
                    }
                    for f in incident.findings
                ],
                columns=["GPU", "code", "severity", "action", "cordon", "evidence", "reason"],
            )
        )
        look.table(audit_frame(list(incident.actions)))

    st.subheader("Audit log")
    audit = audit_frame(list(call(FleetRpc.ListAudit, fleet_pb2.ListAuditRequest(limit=200)).entries))
    if audit.empty:
        st.caption("Nothing has been done yet.")
    else:
        look.table(audit.iloc[::-1])
