"""Cordon / uncordon from the dashboard: shown only to operator tokens, with a required reason
and a confirmation; the result or the refusal (permission, unknown node, scheduler error) is
shown in plain words."""

from __future__ import annotations

import streamlit as st

from gpufleet.client.rpcs import FleetRpc
from gpufleet.dashboard.fleet import try_call, whoami
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import OUT_OF_SERVICE_STATES, health_name


def render(node: str, state: str) -> None:
    me = whoami()
    if me.role != "operator":
        st.caption(
            f"Cordon and uncordon need an operator token; this dashboard uses {me.name!r} ({me.role})."
        )
        return
    with st.expander(f"Actions on {node}", expanded=False), st.form(f"actions-{node}", clear_on_submit=True):
        cordoned = state in OUT_OF_SERVICE_STATES
        action = st.radio(
            "action",
            ["uncordon", "cordon"] if cordoned else ["cordon", "uncordon"],
            horizontal=True,
            key=f"action-{node}",
        )
        reason = st.text_input("reason (recorded in the audit log)", key=f"reason-{node}")
        confirmed = st.checkbox(
            f"I confirm: {node} is to be taken {'out of' if action == 'cordon' else 'back into'} service",
            key=f"confirm-{node}",
        )
        if st.form_submit_button("Apply"):
            if not reason.strip():
                st.error("A reason is required.")
            elif not confirmed:
                st.error("Tick the confirmation first.")
            else:
                rpc = FleetRpc.Cordon if action == "cordon" else FleetRpc.Uncordon
                answer, error = try_call(rpc, fleet_pb2.CordonRequest(node=node, reason=reason.strip()))
                if error:
                    st.error(f"{action} refused: {error}")
                else:
                    st.success(f"{node}: {action} done, now {health_name(answer.state)}")
