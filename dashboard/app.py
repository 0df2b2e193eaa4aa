"""The gpufleet dashboard (Streamlit). It reads only the Fleet API, with the address and
token the CLI would use (GPUFLEET_FLEET / GPUFLEET_TOKEN / the client config).

    gpufleet dashboard [--port 8501]

Pages refresh every REFRESH_S seconds in place (Streamlit fragments: no full-page rerun, no
flicker); the history explorer runs when its inputs change.
"""

from __future__ import annotations

import streamlit as st

from gpufleet.dashboard.fleet import client, try_call
from gpufleet.dashboard.views import history, inference, node, overview, repairs
from gpufleet.protos import fleet_pb2

REFRESH_S = 5
PAGES = {
    "Fleet overview": (overview.render, True),
    "Inference": (inference.render, True),
    "Failures and repairs": (repairs.render, True),
    "Node": (node.render, True),
    "History explorer": (history.render, False),
}


def main() -> None:
    st.set_page_config(page_title="gpufleet", layout="wide")
    st.sidebar.title("gpufleet")
    page = st.sidebar.radio("page", list(PAGES))
    me, error = try_call("WhoAmI", fleet_pb2.WhoAmIRequest())
    where = f"Fleet API {client().settings.fleet}"
    if error:
        st.error(error)
        st.sidebar.caption(where)
        return
    st.sidebar.caption(f"{where} · {me.name} ({me.role}) · refresh every {REFRESH_S}s")
    render, live = PAGES[page]
    if live:
        st.fragment(render, run_every=REFRESH_S)()
    else:
        render()


main()
