"""`gpufleet alert test`: a test alert through every alert sink the aggregator's settings configure
(the same file, environment and flags as `gpufleet aggregator run`), and what each answered.

    gpufleet alert test --config /etc/gpufleet/gpufleet.toml
    gpufleet alert test --resolve          # the same test alert, resolved (PagerDuty, Alertmanager)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

from gpufleet.cli import settings
from gpufleet.client.exits import Exit


def add_arguments(sub: Any, whole: bool = True) -> None:
    """`gpufleet alert`; not whole: listed without its flags (the aggregator's settings, ~30 ms
    to import, built only when the command line names it)."""
    p = sub.add_parser("alert", help="gpufleet's own alerts")
    if not whole:
        return
    from gpufleet.aggregator.config import AggregatorConfig

    a = p.add_subparsers(dest="action", required=True)
    q = a.add_parser(
        "test", help="send a test alert through every configured sink and say what each answered"
    )
    settings.add_flags(q, AggregatorConfig, "aggregator")
    q.add_argument("--resolve", action="store_true", help="send the test alert resolved instead")
    q.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.repair.alerts import open_sinks
    from gpufleet.repair.alerts.base import Alert, links
    from gpufleet.repair.alerts.dispatcher import post

    path = settings.config_path(args.config, os.environ)
    config = settings.resolve(
        AggregatorConfig, "aggregator", args, os.environ, settings.load_file(path), str(path)
    )
    sinks = open_sinks(config)
    if not sinks:
        print(
            "gpufleet alert test: no alert sink is configured (alert_webhooks, alert_slack_url, "
            "alert_pagerduty_routing_key, alert_alertmanager_url)",
            file=sys.stderr,
        )
        return Exit.USAGE
    now = time.time_ns()
    host = socket.gethostname()
    alert = Alert(
        key=f"test-{host}",
        status="resolved" if args.resolve else "firing",
        node="",
        state="test",
        severity="info",
        summary=f"a test alert from `gpufleet alert test` on {host}; nothing is wrong",
        time_ns=now,
        details={"opened_unix_ns": now, "test": True},
    )
    alert.links = links(alert, config.dashboard_url)
    answers = {sink.name: post(sink.request(alert), 10.0) for sink in sinks}
    if args.json:
        print(json.dumps({name: error or "sent" for name, error in answers.items()}))
    else:
        for name, error in answers.items():
            print(f"{name}: {'sent' if error is None else 'FAILED: ' + error}")
    return Exit.OK if all(error is None for error in answers.values()) else Exit.FAILED
