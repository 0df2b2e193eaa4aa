"""Listening: the gRPC servers' options and ports (TLS, and plaintext only on loopback unless
allowed: docs/security.md "In transit"), and the addresses as other hosts dial them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.common.net import is_loopback

log = logging.getLogger("gpufleet.aggregator")


def server_options(max_report_bytes: int) -> list[tuple[str, int]]:
    """Our own size check (max_report_bytes) answers with a precise Reject; the transport limit
    only stops what is far beyond it (twice that, at least 4 MiB), before it is decoded."""
    return [
        ("grpc.max_receive_message_length", max(4 << 20, 2 * max_report_bytes)),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


@dataclass
class Bound:
    ingest: str
    fleet: str
    metrics: str


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def add_port(server: grpc.aio.Server, address: str, config: AggregatorConfig, clients: bool = False) -> str:
    """Listen on address: with TLS when tls_cert is set (clients: also require a collector's
    client certificate signed by tls_client_ca, collector_auth = mtls); in plaintext only on
    loopback unless allow_plaintext (docs/security.md "In transit")."""
    host, _ = split_address(address)
    if config.tls_cert:
        creds = grpc.ssl_server_credentials(
            [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
            root_certificates=Path(config.tls_client_ca).read_bytes() if clients else None,
            require_client_auth=clients,
        )
        port = server.add_secure_port(address, creds)
    elif not is_loopback(host) and not config.allow_plaintext:
        raise ValueError(
            f"refusing to listen on {address} without TLS: collector tokens, Fleet API tokens and "
            "GPU-reset commands would cross the network in clear. Set tls_cert and tls_key (see "
            "docs/security.md), listen on 127.0.0.1, or set allow_plaintext = true on a network you trust"
        )
    else:
        if not is_loopback(host):
            log.warning(
                "listening on %s in plaintext (allow_plaintext = true): tokens cross the network in clear",
                address,
            )
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}: is the port in use or the address wrong?")
    host, _ = split_address(address)
    return f"{host or '0.0.0.0'}:{port}"


def reachable(address: str) -> str:
    """A bound address as another host can dial it (0.0.0.0 and [::] name no host)."""
    host, port = split_address(address)
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.gethostname()
    return f"{host}:{port}"
