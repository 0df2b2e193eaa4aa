"""The gpufleet dashboard (Streamlit). It reads only the Fleet API, with the address and
token the CLI would use (GPUFLEET_FLEET / GPUFLEET_TOKEN / the client config).

    gpufleet dashboard [--port 8501]

Pages refresh every REFRESH_S seconds in place (Streamlit fragments: no full-page rerun, no
flicker); the history explorer runs when its inputs change.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from gpufleet.client.rpcs import FleetRpc
from gpufleet.dashboard import links
from gpufleet.dashboard.fleet import client, try_call
from gpufleet.dashboard.views import history, inference, node, overview, repairs, whatif, workloads
from gpufleet.protos import fleet_pb2

REFRESH_S = 5
# page (its `?page=` in the address) -> (its label in the sidebar, render, refreshed in place)
PAGES = {
    "overview": ("Fleet overview", overview.render, True),
    "inference": ("Inference", inference.render, True),
    "workloads": ("Workloads", workloads.render, True),
    "repairs": ("Failures and repairs", repairs.render, True),
    "node": ("Node", node.render, True),
    "history": ("History explorer", history.render, False),
    "whatif": ("Policy what-if", whatif.render, False),
}
_BY_LABEL = {label: slug for slug, (label, _, _) in PAGES.items()}


def health_banner() -> None:
    """The aggregator's watchdog, on every page: why it is unhealthy (e.g. not acknowledging)."""
    status, error = try_call(FleetRpc.GetStatus, fleet_pb2.StatusRequest())
    if error or status is None:
        return
    if status.replica_id and not status.leader:
        st.warning(
            "No repair leader among the aggregator replicas right now: automatic repair is paused "
            "until one takes the lease (within leader_lease_s). Cordon and uncordon wait for it too."
        )
    if status.healthy:
        return
    st.error("Aggregator UNHEALTHY: " + "; ".join(status.unhealthy_reasons))
    if status.spool.quarantined_batches:
        st.warning(
            f"{status.spool.quarantined_batches} spooled batch(es) quarantined in "
            f"{status.spool.quarantine_dir}"
        )


def page(render: Callable[[], None]) -> Callable[[], None]:
    def with_banner() -> None:
        health_banner()
        render()

    return with_banner


def main() -> None:
    st.set_page_config(page_title="gpufleet", layout="wide")
    st.sidebar.title("gpufleet")
    asked = links.param("page", "overview")
    asked = asked if asked in PAGES else "overview"
    labels = [label for label, _, _ in PAGES.values()]
    chosen = _BY_LABEL[st.sidebar.radio("page", labels, index=list(PAGES).index(asked), key="page")]
    if chosen != links.param("page"):
        # Another page chosen in the sidebar: its address, without the last page's parameters.
        st.query_params.clear()
        st.query_params["page"] = chosen
    me, error = try_call(FleetRpc.WhoAmI, fleet_pb2.WhoAmIRequest())
    if error:
        st.error(error)
        return
    where = f"Fleet API {client().settings.fleet}"
    st.sidebar.caption(f"{where} · {me.name} ({me.role}) · refresh every {REFRESH_S}s")
    _, render, live = PAGES[chosen]
    if live:
        st.fragment(page(render), run_every=REFRESH_S)()
    else:
        page(render)()


main()
