"""Serving: where the aggregator listens, with what TLS, and who may connect (collector
credentials; docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.settings import require, setting

COLLECTOR_AUTH_MODES = ("hmac", "kubernetes", "mtls")


@dataclass
class ServingSettings:
    ingest_listen: str = setting("0.0.0.0:7710", "collector ingest gRPC address (port 0: pick a free one)")
    fleet_listen: str = setting("0.0.0.0:7711", "Fleet API gRPC address for the dashboard and CLI")
    metrics_listen: str = setting(
        "127.0.0.1:7712",
        "the aggregator's own Prometheus /metrics address (unauthenticated: loopback unless set, "
        "e.g. 0.0.0.0:7712 behind a NetworkPolicy or firewall); empty disables",
    )
    metrics_snapshot_s: float = setting(
        5.0,
        "/metrics answers from a snapshot at most this old: computed by one scrape at a time, off "
        "the event loop that acknowledges reports, and shared by every scrape meanwhile (its age is "
        "gpufleet_metrics_snapshot_age_seconds); 0: computed for every scrape",
    )
    metrics_max_scrapes_per_s: float = setting(
        10.0,
        "/metrics answers at most this many scrapes a second, all scrapers together (one over waits "
        "its turn, or is answered 503 when that is over 10 s away): unauthenticated scrapers in a "
        "loop cannot take the cores ingest runs on; 0: unpaced",
    )
    data_dir: str = setting("/var/lib/gpufleet", "where the embedded store and state live")
    secrets_file: str = setting(
        "",
        "TOML with the collector secret and fleet tokens (default: DATA_DIR/secrets.toml)",
    )
    tls_cert: str = setting(
        "",
        "PEM certificate: serve both gRPC ports with TLS (needed to listen on any address but "
        "loopback, unless allow_plaintext)",
    )
    tls_key: str = setting("", "PEM private key for tls_cert")
    tls_client_ca: str = setting(
        "",
        "PEM CA bundle that signs collector client certificates (collector_auth = mtls): the ingest "
        "port then requires one, and its CN or DNS name is the node",
    )
    tls_server_name: str = setting(
        "",
        "the name in the replicas' certificate that one replica checks when it forwards a repair call "
        "to the leader at its pod address (e.g. gpufleet-aggregator.gpufleet.svc); empty: the address",
    )
    allow_plaintext: bool = setting(
        False,
        "listen on a non-loopback address without TLS (bearer tokens and GPU-reset commands then "
        "cross the network in clear): only on a network you trust",
    )
    collector_auth: str = setting(
        "hmac",
        "how collectors prove their node: hmac (per-node tokens from `gpufleet auth collector-token`), "
        "kubernetes (a projected ServiceAccount token checked with TokenReview and its pod's node), "
        "mtls (a client certificate whose CN or DNS name is the node; needs tls_client_ca), or "
        "several, comma-separated",
    )
    collector_k8s_audience: str = setting(
        "gpufleet-aggregator", "kubernetes collector auth: the audience the projected token must carry"
    )
    collector_k8s_service_account: str = setting(
        "system:serviceaccount:gpufleet:gpufleet-collector",
        "kubernetes collector auth: the only ServiceAccount whose tokens are accepted",
    )
    collector_k8s_kubeconfig: str = setting(
        "", "kubernetes collector auth: kubeconfig for TokenReview (empty: the in-cluster account)"
    )
    ack_watchdog_s: float = setting(
        30.0,
        "an accepted report waiting longer than this for its ack makes the aggregator unhealthy "
        "(/ready fails)",
    )
    ready_file: str = setting(
        "",
        "write the bound addresses as JSON here once serving (for supervisors and tests)",
    )

    @property
    def collector_auth_modes(self) -> set[str]:
        return {m.strip() for m in self.collector_auth.split(",") if m.strip()}

    def check_serving(self) -> None:
        for name in ("ingest_listen", "fleet_listen"):
            require(":" in getattr(self, name), f"{name}={getattr(self, name)!r} must be host:port")
        require(
            not self.metrics_listen or ":" in self.metrics_listen,
            f"metrics_listen={self.metrics_listen!r} must be host:port or empty",
        )
        require(
            0 <= self.metrics_snapshot_s <= 300,
            f"metrics_snapshot_s={self.metrics_snapshot_s:g} must be from 0 to 300 seconds",
        )
        require(
            0 <= self.metrics_max_scrapes_per_s <= 10_000,
            f"metrics_max_scrapes_per_s={self.metrics_max_scrapes_per_s:g} must be from 0 to 10000",
        )
        require(bool(self.tls_cert) == bool(self.tls_key), "tls_cert and tls_key must be given together")
        require(
            1 <= self.ack_watchdog_s <= 3600,
            f"ack_watchdog_s={self.ack_watchdog_s:g} must be between 1 and 3600",
        )
        modes = self.collector_auth_modes
        require(
            bool(modes) and modes <= set(COLLECTOR_AUTH_MODES),
            f"collector_auth={self.collector_auth!r}: use {', '.join(COLLECTOR_AUTH_MODES)} or several, "
            "comma-separated",
        )
        require(
            ("mtls" in modes) == bool(self.tls_client_ca) and ("mtls" not in modes or bool(self.tls_cert)),
            "collector_auth = mtls needs tls_cert, tls_key and tls_client_ca (the CA that signs the "
            "collectors' certificates), and tls_client_ca is only for collector_auth = mtls",
        )
