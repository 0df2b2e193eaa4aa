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


def dial_host(address: str) -> str:
    """The host a gRPC target dials: "10.0.0.5:7711" -> "10.0.0.5", "[::1]:7711" -> "::1",
    "dns:///fleet.example:7711" -> "fleet.example", a host with no port -> itself."""
    target = address.split("///", 1)[1] if "///" in address else address
    for scheme in ("ipv4:", "ipv6:", "unix:", "unix-abstract:"):
        if target.startswith(scheme):
            if scheme.startswith("unix"):
                return "localhost"  # a Unix socket is this machine
            target = target[len(scheme) :]
    if target.startswith("["):
        return target[1:].split("]", 1)[0]
    host, sep, port = target.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else target
