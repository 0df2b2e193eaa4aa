"""The aggregator's settings. Layering (file, environment, flags) is done by the CLI from
the metadata on each field; here they are typed and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.aggregator.ingest.budget import BudgetLimits
from gpufleet.aggregator.store import Store, open_store
from gpufleet.repair.backends import BACKENDS
from gpufleet.repair.backends import described as described_backends
from gpufleet.repair.backends.names import NameMapError, SchedulerNames


def _setting(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass
class AggregatorConfig:
    ingest_listen: str = _setting("0.0.0.0:7710", "collector ingest gRPC address (port 0: pick a free one)")
    fleet_listen: str = _setting("0.0.0.0:7711", "Fleet API gRPC address for the dashboard and CLI")
    metrics_listen: str = _setting(
        "0.0.0.0:7712",
        "the aggregator's own Prometheus /metrics address; empty disables",
    )
    data_dir: str = _setting("/var/lib/gpufleet", "where the embedded store and state live")
    secrets_file: str = _setting(
        "",
        "TOML with the collector secret and fleet tokens (default: DATA_DIR/secrets.toml)",
    )
    store: str = _setting("embedded", "history store backend: embedded or influxdb")
    influx_url: str = _setting("http://127.0.0.1:8086", "InfluxDB URL (with store = influxdb)")
    influx_database: str = _setting("gpufleet", "InfluxDB 1.x database, or the 2.x/3.x bucket mapped to it")
    influx_retention_policy: str = _setting("", "InfluxDB retention policy to write to (empty: the default)")
    influx_token: str = _setting("", "InfluxDB 2.x/3.x token (sent as 'Authorization: Token ...')")
    influx_username: str = _setting("", "InfluxDB 1.x user")
    influx_password: str = _setting("", "InfluxDB 1.x password (prefer the environment variable)")
    spool_max_bytes: int = _setting(
        1 << 30, "on-disk spool for batches the store cannot take; at this size acknowledgements stop"
    )
    spool_warn_ratio: float = _setting(0.8, "the spool reports itself near its limit past this fraction")
    rollup_1m_retention_s: float = _setting(
        90 * 86400.0, "how long 1-minute roll-ups are kept (InfluxDB: retention policy gpufleet_1m)"
    )
    rollup_1h_retention_s: float = _setting(
        730 * 86400.0, "how long 1-hour roll-ups are kept (InfluxDB: retention policy gpufleet_1h)"
    )
    retention_s: float = _setting(14 * 86400.0, "how long raw history is kept, in seconds")
    tls_cert: str = _setting(
        "",
        "PEM certificate: serve both gRPC ports with TLS (needed to listen on any address but "
        "loopback, unless allow_plaintext)",
    )
    tls_key: str = _setting("", "PEM private key for tls_cert")
    tls_client_ca: str = _setting(
        "",
        "PEM CA bundle that signs collector client certificates (collector_auth = mtls): the ingest "
        "port then requires one, and its CN or DNS name is the node",
    )
    tls_server_name: str = _setting(
        "",
        "the name in the replicas' certificate that one replica checks when it forwards a repair call "
        "to the leader at its pod address (e.g. gpufleet-aggregator.gpufleet.svc); empty: the address",
    )
    allow_plaintext: bool = _setting(
        False,
        "listen on a non-loopback address without TLS (bearer tokens and GPU-reset commands then "
        "cross the network in clear): only on a network you trust",
    )
    max_report_bytes: int = _setting(
        1024 * 1024,
        "largest report accepted; larger ones are rejected with RESOURCE_EXHAUSTED",
    )
    max_clock_skew_s: float = _setting(300.0, "how far ahead of the aggregator's clock a report may be")
    hello_timeout_s: float = _setting(
        20.0, "an authenticated collector stream that sends no hello within this is refused"
    )
    max_streams: int = _setting(
        50_000, "collector streams open at once (authenticated or not); more are refused"
    )
    max_streams_per_peer: int = _setting(
        256, "collector streams open at once from one peer address (a NAT in front of many nodes: raise it)"
    )
    node_reports_per_s: float = _setting(
        50.0, "reports a second one node may send on average; faster, its stream is read more slowly"
    )
    node_report_burst: int = _setting(
        4000, "reports one node may send at once above that rate (a collector replaying its buffer)"
    )
    node_bytes_per_s: float = _setting(262144.0, "report bytes a second one node may send on average")
    node_byte_burst: int = _setting(16 * 1024 * 1024, "report bytes one node may send at once above that")
    max_series_per_node: int = _setting(
        256,
        "distinct series (GPUs by index, uuid, model; engines by name, model, port) one node may make "
        "within series_window_s; a hello or report past it is refused",
    )
    series_window_s: float = _setting(86400.0, "the window of max_series_per_node, in seconds")
    ingest_workers: int = _setting(
        0,
        "processes that decode, validate and store reports (0: the main process does it; N: N "
        "worker processes beside it, for more than one core; a node's reports always go to one)",
    )
    ack_watchdog_s: float = _setting(
        30.0,
        "an accepted report waiting longer than this for its ack makes the aggregator unhealthy "
        "(/ready fails)",
    )
    collector_auth: str = _setting(
        "hmac",
        "how collectors prove their node: hmac (per-node tokens from `gpufleet auth collector-token`), "
        "kubernetes (a projected ServiceAccount token checked with TokenReview and its pod's node), "
        "mtls (a client certificate whose CN or DNS name is the node; needs tls_client_ca), or "
        "several, comma-separated",
    )
    collector_k8s_audience: str = _setting(
        "gpufleet-aggregator", "kubernetes collector auth: the audience the projected token must carry"
    )
    collector_k8s_service_account: str = _setting(
        "system:serviceaccount:gpufleet:gpufleet-collector",
        "kubernetes collector auth: the only ServiceAccount whose tokens are accepted",
    )
    collector_k8s_kubeconfig: str = _setting(
        "", "kubernetes collector auth: kubeconfig for TokenReview (empty: the in-cluster account)"
    )
    stale_after_intervals: float = _setting(
        3.0,
        "a node is stale after this many of its sampling intervals without a report",
    )
    silent_after_intervals: float = _setting(
        10.0,
        "a node is silent after this many intervals without a report",
    )
    repair_backend: str = _setting("none", f"where cordons go: {described_backends()}")
    repair_dry_run: bool = _setting(False, "decide and audit, but cordon, drain, reset and reboot nothing")
    repair_policy_file: str = _setting(
        "", "local health-policy overrides on top of the shipped defaults (`gpufleet policy check`)"
    )
    repair_max_out_of_service: int = _setting(10, "at most this many nodes out of service at once")
    repair_max_out_of_service_fraction: float = _setting(
        0.1, "... and at most this fraction of the fleet (the smaller wins; never below 1 node)"
    )
    repair_breaker_nodes: int = _setting(
        5, "this many nodes failing within repair_breaker_window_s trips the breaker: all automation halts"
    )
    repair_breaker_window_s: float = _setting(600.0, "the breaker's window, in seconds")
    repair_interval_s: float = _setting(1.0, "seconds between repair passes (events trigger one at once)")
    replay_max_days: float = _setting(
        31.0,
        "the longest range `gpufleet replay --since` (and the dashboard's Policy what-if) may read "
        "from the store: a replay reads raw samples node by node",
    )
    repair_observe_interval_s: float = _setting(
        15.0,
        "the whole fleet's scheduler state is read at most this often; nodes with a workflow under "
        "way are read every pass (the polling budget: one small read per pass, one full read per interval)",
    )
    repair_reboot_command: str = _setting(
        "", "command that reboots a node ({node}, {incident}, {gpus}, {reason}); empty: skip reboots"
    )
    repair_ticket_command: str = _setting("", "command that opens a hardware ticket (same placeholders)")
    repair_hook_timeout_s: float = _setting(600.0, "longest a repair hook or scheduler call may run")
    repair_slurm_scontrol: str = _setting("scontrol", "the scontrol program (repair_backend = slurm)")
    repair_slurm_conf: str = _setting("", "SLURM_CONF for scontrol (empty: Slurm's default)")
    repair_kubeconfig: str = _setting(
        "", "kubeconfig for the kubernetes backend (empty: the in-cluster service account)"
    )
    repair_hook_cordon: str = _setting("", "hook backend: command to cordon ({node}, {reason})")
    repair_hook_uncordon: str = _setting("", "hook backend: command to uncordon ({node})")
    repair_hook_drain: str = _setting("", "hook backend: command that exits 0 once {node} is drained")
    scheduler_name_regex: str = _setting(
        "",
        "collector node names the scheduler knows by another name: a regular expression matching the "
        "whole collector name (with scheduler_name_replace), e.g. '(gpu-\\d+)\\..*'",
    )
    scheduler_name_replace: str = _setting(
        "",
        "the scheduler's name for a node scheduler_name_regex matches, in re.sub syntax: '\\1', '\\g<name>'",
    )
    scheduler_names_file: str = _setting(
        "",
        "TOML file whose [nodes] table maps collector node names to scheduler node names (wins over "
        "the pattern); used for every Slurm, Kubernetes and hook call",
    )
    alert_webhooks: str = _setting("", "comma-separated URLs that get every alert as JSON (POST)")
    alert_slack_url: str = _setting("", "Slack (or Mattermost) incoming-webhook URL")
    alert_pagerduty_routing_key: str = _setting("", "PagerDuty Events API v2 routing key")
    alert_pagerduty_url: str = _setting(
        "https://events.pagerduty.com/v2/enqueue", "PagerDuty Events API v2 endpoint"
    )
    alert_group_wait_s: float = _setting(
        10.0, "a new incident's first alert waits this long, so a storm folds into one breaker alert"
    )
    alert_max_age_s: float = _setting(3600.0, "failed alert deliveries are retried for this long")
    control_plane: str = _setting(
        "sqlite",
        "where repair state and the fleet's live view are kept: sqlite (DATA_DIR/repair.sqlite3, one "
        "box) or a postgresql://USER@HOST:5432/DB URL that every replica shares (password in the URL, "
        "PGPASSWORD or ~/.pgpass); replicas elect one repair leader through it",
    )
    replica_id: str = _setting(
        "", "this aggregator's name among replicas (empty: the host name); each replica needs its own"
    )
    replica_advertise: str = _setting(
        "",
        "the Fleet API address other replicas reach this one at, to forward repair actions to the "
        "leader (empty: the bound fleet address, with the host name for 0.0.0.0)",
    )
    leader_lease_s: float = _setting(
        10.0,
        "the repair leader's lease with control_plane = postgresql: a leader that stops renewing it "
        "(killed, paused, cut off) is replaced within this, and its later writes are refused",
    )
    live_sync_s: float = _setting(
        1.0,
        "how often a replica writes the live state of the nodes it holds to the control plane, "
        "reads the other replicas' and passes on commands for its streams",
    )
    ready_file: str = _setting(
        "",
        "write the bound addresses as JSON here once serving (for supervisors and tests)",
    )

    def __post_init__(self) -> None:
        for name in ("ingest_listen", "fleet_listen"):
            if ":" not in getattr(self, name):
                raise ValueError(f"{name}={getattr(self, name)!r} must be host:port")
        if self.metrics_listen and ":" not in self.metrics_listen:
            raise ValueError(f"metrics_listen={self.metrics_listen!r} must be host:port or empty")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.retention_s < 3600:
            raise ValueError(f"retention_s={self.retention_s:g} must be at least 3600 (one hour)")
        if self.spool_max_bytes < 1 << 20:
            raise ValueError(f"spool_max_bytes={self.spool_max_bytes} must be at least 1 MiB")
        if not 0 < self.spool_warn_ratio < 1:
            raise ValueError(f"spool_warn_ratio={self.spool_warn_ratio} must be between 0 and 1")
        if self.max_report_bytes < 1024:
            raise ValueError(f"max_report_bytes={self.max_report_bytes} must be at least 1024")
        if not 0.1 <= self.hello_timeout_s <= 600:
            raise ValueError(f"hello_timeout_s={self.hello_timeout_s:g} must be between 0.1 and 600")
        if not 0 <= self.ingest_workers <= 64:
            raise ValueError(
                f"ingest_workers={self.ingest_workers} must be between 0 (in the main process) and 64"
            )
        if not 1 <= self.ack_watchdog_s <= 3600:
            raise ValueError(f"ack_watchdog_s={self.ack_watchdog_s:g} must be between 1 and 3600")
        modes = self.collector_auth_modes
        if not modes or not modes <= {"hmac", "kubernetes", "mtls"}:
            raise ValueError(
                f"collector_auth={self.collector_auth!r}: use hmac, kubernetes, mtls or several, "
                "comma-separated"
            )
        if ("mtls" in modes) != bool(self.tls_client_ca) or ("mtls" in modes and not self.tls_cert):
            raise ValueError(
                "collector_auth = mtls needs tls_cert, tls_key and tls_client_ca (the CA that signs the "
                "collectors' certificates), and tls_client_ca is only for collector_auth = mtls"
            )
        if not 1 <= self.max_streams_per_peer <= self.max_streams <= 1_000_000:
            raise ValueError(
                f"need 1 <= max_streams_per_peer ({self.max_streams_per_peer}) <= max_streams "
                f"({self.max_streams}) <= 1000000"
            )
        if self.node_reports_per_s <= 0 or self.node_bytes_per_s <= 0:
            raise ValueError("node_reports_per_s and node_bytes_per_s must be more than 0")
        if self.node_report_burst < 1 or self.node_byte_burst < 2 * self.max_report_bytes:
            raise ValueError(
                f"node_report_burst ({self.node_report_burst}) must be at least 1 and node_byte_burst "
                f"({self.node_byte_burst}) at least twice max_report_bytes ({self.max_report_bytes})"
            )
        if not 8 <= self.max_series_per_node <= 100_000 or self.series_window_s < 60:
            raise ValueError(
                f"max_series_per_node={self.max_series_per_node} must be 8..100000 and "
                f"series_window_s={self.series_window_s:g} at least 60"
            )
        if not 1 <= self.stale_after_intervals < self.silent_after_intervals:
            raise ValueError(
                f"need 1 <= stale_after_intervals ({self.stale_after_intervals:g}) < "
                f"silent_after_intervals ({self.silent_after_intervals:g})"
            )

        if self.repair_backend not in BACKENDS:
            raise ValueError(f"repair_backend={self.repair_backend!r}: use one of {', '.join(BACKENDS)}")
        if self.repair_max_out_of_service < 1 or not 0 < self.repair_max_out_of_service_fraction <= 1:
            raise ValueError(
                f"repair_max_out_of_service={self.repair_max_out_of_service} must be ≥ 1 and "
                f"repair_max_out_of_service_fraction={self.repair_max_out_of_service_fraction:g} in (0, 1]"
            )
        if self.repair_breaker_nodes < 1 or self.repair_breaker_window_s <= 0:
            raise ValueError(
                f"repair_breaker_nodes={self.repair_breaker_nodes} must be ≥ 1 and "
                f"repair_breaker_window_s={self.repair_breaker_window_s:g} > 0"
            )
        if not 0 < self.replay_max_days <= 3650:
            raise ValueError(f"replay_max_days={self.replay_max_days:g} must be more than 0 and at most 3650")
        if not 0.05 <= self.repair_interval_s <= 60:
            raise ValueError(f"repair_interval_s={self.repair_interval_s:g} must be between 0.05 and 60")
        if not 0 <= self.repair_observe_interval_s <= 3600:
            raise ValueError(
                f"repair_observe_interval_s={self.repair_observe_interval_s:g} must be between 0 and 3600 "
                "(seconds between whole-fleet scheduler reads)"
            )
        try:
            # Read and checked once, here; the repair wiring uses this one.
            self._scheduler_names = SchedulerNames.from_settings(
                self.scheduler_name_regex, self.scheduler_name_replace, self.scheduler_names_file
            )
        except NameMapError as exc:
            raise ValueError(str(exc)) from exc
        if self.repair_backend == "hook" and not (self.repair_hook_cordon and self.repair_hook_uncordon):
            raise ValueError("repair_backend=hook needs repair_hook_cordon and repair_hook_uncordon")

        if not self.replicated and self.control_plane != "sqlite":
            raise ValueError(
                f"control_plane={self.control_plane!r}: use sqlite or a postgresql://USER@HOST:PORT/DB URL"
            )
        if self.replicated and self.store != "influxdb":
            raise ValueError(
                "control_plane = postgresql (replicas) needs store = influxdb: every replica writes its "
                "streams' telemetry to one shared history (the embedded store is one box's)"
            )
        if not 1 <= self.leader_lease_s <= 300:
            raise ValueError(f"leader_lease_s={self.leader_lease_s:g} must be between 1 and 300 seconds")
        if not 0.05 <= self.live_sync_s <= min(60.0, self.leader_lease_s):
            raise ValueError(
                f"live_sync_s={self.live_sync_s:g} must be between 0.05 and 60 seconds and at most "
                f"leader_lease_s ({self.leader_lease_s:g})"
            )
        if self.replica_advertise and ":" not in self.replica_advertise:
            raise ValueError(f"replica_advertise={self.replica_advertise!r} must be host:port or empty")

    def scheduler_names(self) -> SchedulerNames:
        """collector node name -> the repair backend's (scheduler_name_*, scheduler_names_file),
        as read when these settings were checked."""
        return self._scheduler_names

    @property
    def replicated(self) -> bool:
        """Replicas share a PostgreSQL control plane (else one box, SQLite)."""
        return self.control_plane.startswith(("postgresql://", "postgres://"))

    @property
    def replica_name(self) -> str:
        import socket

        return self.replica_id or socket.gethostname()

    def open_store(self) -> Store:
        """The history store these settings name (the main process and each ingest worker)."""
        return open_store(
            self.store,
            self.data_path,
            self.retention_s,
            rollup_retention={"_1m": self.rollup_1m_retention_s, "_1h": self.rollup_1h_retention_s},
            # The influx_* settings are the InfluxDB store's; no other store takes them.
            **(
                {k: getattr(self, k) for k in vars(self) if k.startswith("influx_")}
                if self.store == "influxdb"
                else {}
            ),
        )

    def section(self, prefix: str) -> dict[str, Any]:
        """The settings that start with prefix, the prefix taken off: what a plug-in's
        from_settings reads (repair_ for backends, alert_ for alert sinks)."""
        return {k.removeprefix(prefix): v for k, v in vars(self).items() if k.startswith(prefix)}

    def budget_limits(self) -> BudgetLimits:
        """What one node may cost the ingest (aggregator/ingest/budget.py)."""
        return BudgetLimits(
            self.node_reports_per_s,
            self.node_report_burst,
            self.node_bytes_per_s,
            self.node_byte_burst,
            self.max_series_per_node,
            self.series_window_s,
        )

    @property
    def collector_auth_modes(self) -> set[str]:
        return {m.strip() for m in self.collector_auth.split(",") if m.strip()}

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def secrets_path(self) -> Path:
        return Path(self.secrets_file) if self.secrets_file else self.data_path / "secrets.toml"
