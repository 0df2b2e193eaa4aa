"""Addresses."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether a listen or dial host is this machine only (127.0.0.0/8, ::1, localhost). A host
    name, 0.0.0.0 or "" is reachable from elsewhere."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
