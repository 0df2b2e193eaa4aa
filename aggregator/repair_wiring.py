"""Wires the repair library to the aggregator: node snapshots from the live view, commands
down the ingest streams, the backend, alert sinks and metrics from the configuration."""

from __future__ import annotations

import operator
import time

from prometheus_client import Counter, Gauge

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.fleet_state import FleetState
from gpufleet.aggregator.ingest import IngestService
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.protos import telemetry_pb2
from gpufleet.protos.names import HEALTH_STATES
from gpufleet.repair.alerts import open_sinks
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends import open_backend
from gpufleet.repair.controller import Hooks, Rails, RepairController
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.policy import load_policy
from gpufleet.repair.rules import WATCH_FIELDS
from gpufleet.repair.state import RepairState


def snapshots(fleet: FleetState, only: set[str] | None = None) -> list[NodeSnapshot]:
    now = time.time_ns()
    out = []
    lives = fleet.nodes.values() if only is None else [fleet.nodes[n] for n in only if n in fleet.nodes]
    for live in lives:
        out.append(
            NodeSnapshot(
                node=live.node,
                cluster=live.cluster,
                liveness=fleet.liveness(live, now),
                seconds_since_report=(now - live.last_heard_ns) / 1e9 if live.last_heard_ns else 0.0,
                boot_id=live.boot_id,
                connected=live.connected,
                gpu_count=live.gpu_count,
                gpus=dict(live.gpus),
                events=list(live.events),
                sample_time_ns=live.last_sample_ns,
            )
        )
    return out


class HealthWatch:
    """Pokes the controller for one node when a report carries events or a GPU's health
    signals changed, so a sampled fault is acted on at its report, not at the next full pass.
    The check reads a handful of fields per GPU: cheap enough for every report."""

    FIELDS = WATCH_FIELDS  # declared by the rules themselves (repair/rules/__init__.py)

    def __init__(self, controller: RepairController) -> None:
        self._controller = controller
        self._last: dict[str, tuple[object, ...]] = {}
        # One C call per GPU for every watched field (an absent field reads as its default: a
        # field going absent is seen at the next full pass, not at its report).
        self._fingerprint = operator.attrgetter("index", "lost", *self.FIELDS)

    def on_report(self, report: telemetry_pb2.NodeReport) -> None:
        if report.gpus:
            fingerprint = tuple(map(self._fingerprint, report.gpus))
            changed = self._last.get(report.node) != fingerprint
            self._last[report.node] = fingerprint
        else:
            changed = False
        if changed or report.events:
            self._controller.poke(report.node)


def build_controller(
    config: AggregatorConfig, fleet: FleetState, ingest: IngestService, metrics: AggregatorMetrics
) -> tuple[RepairController, AlertDispatcher, RepairState]:
    policy = load_policy(config.repair_policy_file or None)
    backend = open_backend(
        config.repair_backend,
        slurm_scontrol=config.repair_slurm_scontrol,
        slurm_conf=config.repair_slurm_conf,
        kubeconfig=config.repair_kubeconfig,
        hook_cordon=config.repair_hook_cordon,
        hook_uncordon=config.repair_hook_uncordon,
        hook_drain=config.repair_hook_drain,
        hook_timeout_s=config.repair_hook_timeout_s,
    )
    r = metrics.registry
    alerts = Counter(
        "gpufleet_alerts",
        "alert deliveries by sink and outcome (sent, failed_attempt, dropped)",
        ["sink", "outcome"],
        registry=r,
    )
    actions = Counter(
        "gpufleet_repair_actions", "repair actions by action and outcome", ["action", "outcome"], registry=r
    )
    state = RepairState(config.data_path / "repair.sqlite3")
    dispatcher = AlertDispatcher(
        open_sinks(
            [u.strip() for u in config.alert_webhooks.split(",") if u.strip()],
            config.alert_slack_url,
            config.alert_pagerduty_routing_key,
            config.alert_pagerduty_url,
        ),
        group_wait_s=config.alert_group_wait_s,
        max_age_s=config.alert_max_age_s,
        count=lambda sink, outcome: alerts.labels(sink=sink, outcome=outcome).inc(),
        store=state,
    )
    controller = RepairController(
        policy,
        state,
        backend,
        Rails(
            dry_run=config.repair_dry_run,
            max_out_of_service=config.repair_max_out_of_service,
            max_out_of_service_fraction=config.repair_max_out_of_service_fraction,
            breaker_nodes=config.repair_breaker_nodes,
            breaker_window_s=config.repair_breaker_window_s,
        ),
        Hooks(config.repair_reboot_command, config.repair_ticket_command, config.repair_hook_timeout_s),
        dispatcher,
        lambda only: snapshots(fleet, only),
        ingest.send_command,
        on_action=lambda node, action, outcome: actions.labels(
            action=action, outcome=outcome.split(":")[0]
        ).inc(),
        observe_interval_s=config.repair_observe_interval_s,
        liveness=fleet.liveness_by_node,
    )
    ingest.fanout.on_command_result("repair", controller.on_command_result)
    health_watch = HealthWatch(controller)
    ingest.fanout.on_report("health_watch", lambda report, _received_ns: health_watch.on_report(report))
    nodes_in_state = Gauge(
        "gpufleet_repair_nodes", "nodes in each repair workflow state", ["state"], registry=r
    )
    for name in HEALTH_STATES:
        nodes_in_state.labels(state=name).set_function(
            lambda name=name: float(sum(1 for w in controller.workflows.values() if w.state == name))
        )
    Gauge(
        "gpufleet_repair_breaker_tripped", "1 while the repair breaker is tripped: alert", registry=r
    ).set_function(lambda: float(controller.breaker_tripped))
    Gauge(
        "gpufleet_alerts_held", "incident alerts held while the breaker is tripped", registry=r
    ).set_function(lambda: float(dispatcher.held))
    Gauge(
        "gpufleet_repair_passes", "repair passes run since the aggregator started", registry=r
    ).set_function(lambda: float(controller.passes))
    Gauge(
        "gpufleet_repair_pass_errors", "repair passes that failed with an error (each logged)", registry=r
    ).set_function(lambda: float(controller.pass_errors))
    Gauge(
        "gpufleet_repair_scheduler_reads",
        "reads of the scheduler's view since the aggregator started",
        registry=r,
    ).set_function(lambda: float(controller.scheduler_reads))
    Gauge("gpufleet_repair_last_pass_seconds", "how long the last repair pass took", registry=r).set_function(
        lambda: controller.last_pass_s
    )
    return controller, dispatcher, state
