"""Every dashboard page is addressable by URL: `?page=node&node=gpu-017`,
`?page=repairs&incident=inc-…`, `?page=history&metric=power_w&node=a&node=b&since=6h`. A page
reads its parameters as its widgets' defaults and writes the widgets' values back, so the address
bar always holds a link to what is on screen, to share or to put in an alert (dashboard_url:
repair/alerts/base.py links())."""

from __future__ import annotations

import streamlit as st


def param(name: str, default: str = "") -> str:
    return st.query_params.get(name, default)


def params(name: str) -> list[str]:
    return st.query_params.get_all(name)


def keep(**values: str | list[str] | None) -> None:
    """Write the page's parameters back (an empty value removes its parameter); only what
    changed is written, so a rerun does not loop on its own address."""
    for name, value in values.items():
        current = st.query_params.get_all(name)
        wanted = [] if value in (None, "", []) else (list(value) if isinstance(value, list) else [str(value)])
        if current == wanted:
            continue
        if wanted:
            st.query_params[name] = wanted if len(wanted) > 1 else wanted[0]
        elif name in st.query_params:
            del st.query_params[name]
