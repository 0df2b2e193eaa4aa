"""The dashboard's one way to the aggregator: the Fleet API client the CLI uses, with errors
shown as plain messages on the page instead of tracebacks."""

from __future__ import annotations

import streamlit as st

from gpufleet.client.fleet import ClientError, FleetClient, resolve_client
from gpufleet.client.rpcs import FleetRpc, Req, Resp, Rpc
from gpufleet.protos import fleet_pb2


@st.cache_resource
def client() -> FleetClient:
    return FleetClient(resolve_client(None, None, None))


def call(rpc: Rpc[Req, Resp], request: Req, timeout_s: float | None = None) -> Resp:
    """Call the Fleet API; on failure show what to do and stop this page's run."""
    answer, error = try_call(rpc, request, timeout_s)
    if answer is None:
        st.error(error)
        st.stop()
        raise RuntimeError(error)  # st.stop() ends the run; this line is for the type checker
    return answer


def try_call(rpc: Rpc[Req, Resp], request: Req, timeout_s: float | None = None) -> tuple[Resp | None, str]:
    """Call the Fleet API; (answer, "") or (None, the error in plain words)."""
    try:
        return client().call(rpc, request, timeout_s), ""
    except ClientError as exc:
        return None, str(exc)


def list_nodes(request: fleet_pb2.ListNodesRequest | None = None) -> fleet_pb2.ListNodesResponse:
    """Every node (the Fleet API's pages, asked for in turn); on failure the page says why."""
    try:
        return client().list_nodes(request)
    except ClientError as exc:
        st.error(str(exc))
        st.stop()
        raise  # st.stop() ends the run; this line is for the type checker


def whoami() -> fleet_pb2.WhoAmIResponse:
    if "whoami" not in st.session_state:
        st.session_state["whoami"] = call(FleetRpc.WhoAmI, fleet_pb2.WhoAmIRequest())
    return st.session_state["whoami"]
