"""`gpufleet`: one command for every part of the system: the components (collector,
aggregator, dashboard, demo), the SRE's commands on the Fleet API, and local tools. Every
command is listed by `gpufleet --help` (argparse lists the subcommands it was built with), and
`gpufleet COMMAND --help` gives its flags."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.cli import settings
from gpufleet.client.exits import ClientError, Exit, sentence
from gpufleet.common.logsetup import configure as configure_logging
from gpufleet.common.version import __version__
from gpufleet.protos.names import AGGREGATES, HISTORY_EVENT_KINDS

if TYPE_CHECKING:
    from gpufleet.client.fleet import FleetClient

EXIT_CONFIG = Exit.USAGE
DESCRIPTION = (
    "GPU fleet telemetry and health repair: the components, the SRE's commands on the Fleet API, "
    "and local tools. `gpufleet COMMAND --help` gives a command's flags."
)


def _output_flags(p: argparse.ArgumentParser) -> None:
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")


def _client_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("Fleet API connection")
    g.add_argument("--fleet", help="Fleet API address host:port [env GPUFLEET_FLEET]")
    g.add_argument("--token", help="bearer token [env GPUFLEET_TOKEN]")
    g.add_argument("--token-file", help="file holding the bearer token")
    g.add_argument(
        "--allow-plaintext",
        action="store_true",
        help="send the token without TLS to an address off this machine (a network you trust) "
        "[env GPUFLEET_ALLOW_PLAINTEXT=1]",
    )
    return p


# The commands whose flags come from the components' settings (each of their parsers imports the
# settings of every plug-in: ~70 ms of a CLI call's ~210 ms of CPU, for a flag no Fleet API
# command has); `alert` is one too (cli/alert_cmd.py).
COMPONENT_COMMANDS = ("collector", "aggregator", "db", "demo")


def command_of(argv: list[str]) -> str | None:
    """The command a command line names (its first word after the top-level options), or None
    (none, or a top-level --help/--version): the parser is then built whole."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--log-level")
    pre.add_argument("--config")
    pre.add_argument("command", nargs="?")
    known, _ = pre.parse_known_args(argv)
    return known.command


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `only`, the component commands other than that one are
    listed without their flags (built when named)."""
    parser = argparse.ArgumentParser(prog="gpufleet", description=DESCRIPTION, epilog=sentence())
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("GPUFLEET_LOG_LEVEL", "info"))
    parser.add_argument(
        "--config",
        help=f"TOML settings file [env GPUFLEET_CONFIG; default {settings.DEFAULT_CONFIG_FILE} if present]",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _component_parsers(sub, only)
    if only in COMPONENT_COMMANDS:
        # A component's own command line: the Fleet API commands' parsers (and the gRPC client
        # their modules import, ~50 ms of every collector's start) are not built.
        return parser
    from gpufleet.cli import alert_cmd, completion, repair_cmds, replay_cmd, waste_cmd, workloads_cmd

    client = _client_flags()

    dash = sub.add_parser("dashboard", parents=[client], help="serve the Streamlit dashboard")
    dash.add_argument("--port", type=int, default=8501)
    dash.add_argument("--address", default="127.0.0.1")

    p = sub.add_parser("nodes", parents=[client], help="every node with its live state")
    p.add_argument("--cluster", action="append", help="only this cluster (repeatable)")
    p.add_argument("--json", action="store_true")
    add_watch(p)
    p = sub.add_parser(
        "pools", parents=[client], help="serving pools: each model's inference replicas, pressure, headroom"
    )
    p.add_argument("--cluster", action="append", help="only this cluster (repeatable)")
    p.add_argument("--model", default="", help="only this model")
    p.add_argument("--json", action="store_true", help="every figure, and each pool's replicas")
    add_watch(p)
    workloads_cmd.add_parsers(sub, client, add_watch)
    waste_cmd.add_parser(sub, client)
    p = sub.add_parser("node", parents=[client], help="one node's GPUs, engines and events")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("history", parents=[client], help="a metric over time")
    p.add_argument("metric", help="e.g. util_gpu_pct (`gpufleet metrics` lists them)")
    p.add_argument("--node", action="append", help="filter (repeatable)")
    p.add_argument("--gpu", action="append", type=int, help="GPU index filter (repeatable)")
    p.add_argument("--cluster", action="append")
    p.add_argument("--engine", action="append")
    p.add_argument("--model", action="append")
    p.add_argument("--since", default="1h", help="start: 10m, 2h, 7d ago, or ISO time (default 1h)")
    p.add_argument("--until", default="now", help="end (default now)")
    p.add_argument("--step", help="bucket width, e.g. 1m (default: about 300 buckets)")
    p.add_argument("--agg", default="mean", choices=list(AGGREGATES))
    p.add_argument(
        "--group-by",
        help="aggregate across series sharing these tags, comma-separated: cluster, model, node, "
        "engine, gpu (one series per group; default: one per GPU or engine replica); or one owner "
        "of the GPUs: account, namespace, team or partition (docs/workloads.md)",
    )
    _output_flags(p)
    p = sub.add_parser("events", parents=[client], help="stored XIDs, health findings and repair actions")
    p.add_argument("--node", action="append", help="filter (repeatable)")
    p.add_argument("--gpu", action="append", type=int, help="GPU index filter (repeatable)")
    p.add_argument("--xid", action="append", type=int, help="only XIDs with this number (repeatable)")
    p.add_argument(
        "--kind",
        action="append",
        choices=list(HISTORY_EVENT_KINDS),
        help="only this kind (repeatable; default all)",
    )
    p.add_argument("--cluster", action="append")
    p.add_argument("--since", default="24h", help="start: 10m, 2h, 7d ago, or ISO time (default 24h)")
    p.add_argument("--until", default="now", help="end (default now)")
    p.add_argument("--limit", type=int, default=1000, help="the newest this many (default 1000)")
    _output_flags(p)
    replay_cmd.add_arguments(sub, client)
    p = sub.add_parser("metrics", parents=[client], help="the metrics history can query")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("whoami", parents=[client], help="which token the Fleet API sees")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("status", parents=[client], help="the aggregator's store and spool")
    p.add_argument("--json", action="store_true")
    add_watch(p)

    eng = sub.add_parser(
        "engines",
        parents=[client],
        help="every inference-engine replica in the fleet; `engines probe URL` reads one endpoint",
    )
    eng.add_argument("--json", action="store_true", help="every replica's figures")
    eng_sub = eng.add_subparsers(dest="action", required=False)
    p = eng_sub.add_parser("probe", help="scrape one /metrics endpoint and print what was understood")
    p.add_argument("url", help="e.g. http://127.0.0.1:8000/metrics")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    p.add_argument("--json", action="store_true")

    auth = sub.add_parser("auth", help="credentials")
    auth_sub = auth.add_subparsers(dest="action", required=True)
    p = auth_sub.add_parser("init", help="write a new secrets file with fleet tokens")
    p.add_argument("--secrets", required=True, help="path of the secrets file to create")
    p.add_argument("--operator", action="append", default=[], help="name of an operator token")
    p.add_argument("--viewer", action="append", default=[], help="name of a viewer token")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p = auth_sub.add_parser(
        "collector-token", help="issue a credential for one node (its id and expiry go to stderr)"
    )
    p.add_argument("node")
    p.add_argument("--secrets", required=True)
    p.add_argument("--days", type=float, default=365.0, help="how long it is valid (default 365)")
    p = auth_sub.add_parser(
        "revoke", parents=[client], help="revoke one collector token by its id (through the Fleet API)"
    )
    p.add_argument("token_id")
    p.add_argument("--reason", required=True, help="why (it goes in the audit log)")
    p.add_argument("--node", default="", help="the node it was issued for (recorded)")
    p = auth_sub.add_parser("add-token", help="add a fleet token to a secrets file")
    p.add_argument("name")
    p.add_argument("--role", required=True, choices=["viewer", "operator"])
    p.add_argument("--secrets", required=True)

    repair_cmds.add_arguments(sub, client, add_watch)
    alert_cmd.add_arguments(sub, whole=only in (None, "alert"))

    p = sub.add_parser(
        "gpu-reset-helper",
        help="the privileged GPU-reset helper: resets a GPU when the collector asks on a Unix socket",
    )
    p.add_argument(
        "--socket", required=True, help="Unix socket to listen on, e.g. /run/gpufleet/gpu-reset.sock"
    )
    p.add_argument(
        "--reset-command", required=True, help="e.g. 'nvidia-smi --gpu-reset -i {gpu_index}' (no shell)"
    )
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest a reset may run")
    p.add_argument("--min-interval-s", type=float, default=300.0, help="no second reset of a GPU within this")
    p.add_argument(
        "--socket-mode", default="660", help="the socket's mode, octal (default 660: owner and group)"
    )

    cfg = sub.add_parser("config", help="configuration")
    cfg_sub = cfg.add_subparsers(dest="action", required=True)
    cfg_sub.add_parser("reference", help="print every setting as a Markdown table")
    p = cfg_sub.add_parser(
        "check", help="check a settings file as the collector and aggregator would at start (exit 2 if not)"
    )
    p.add_argument("file", help="a TOML settings file, e.g. /etc/gpufleet/gpufleet.toml")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("completion", help="a shell completion script: `source <(gpufleet completion bash)`")
    p.add_argument("shell", choices=completion.SHELLS)
    return parser


def _component_parsers(sub: argparse._SubParsersAction, only: str | None) -> None:
    """The component commands: whole when `only` is None or names them, else listed only."""
    helps = {
        "collector": "the per-node collector",
        "aggregator": "the control-plane aggregator",
        "db": "the control-plane store's schema (SQLite or PostgreSQL)",
        "demo": "run a simulated fleet on this machine",
    }
    for command in COMPONENT_COMMANDS:
        p = sub.add_parser(command, help=helps[command])
        if only is None or only == command:
            _COMPONENT_FLAGS[command](p)


def _collector_flags(col: argparse.ArgumentParser) -> None:
    from gpufleet.collector.config import CollectorConfig

    col_sub = col.add_subparsers(dest="action", required=True)
    settings.add_flags(
        col_sub.add_parser("run", help="sample GPUs and stream to the aggregator"),
        CollectorConfig,
        "collector",
    )
    probe = col_sub.add_parser("probe", help="one sample of this node's GPUs, printed")
    settings.add_flags(probe, CollectorConfig, "collector")
    probe.add_argument("--json", action="store_true")


def _aggregator_flags(agg: argparse.ArgumentParser) -> None:
    from gpufleet.aggregator.config import AggregatorConfig

    agg_sub = agg.add_subparsers(dest="action", required=True)
    settings.add_flags(
        agg_sub.add_parser("run", help="serve ingest and the Fleet API"), AggregatorConfig, "aggregator"
    )


def _db_flags(db: argparse.ArgumentParser) -> None:
    from gpufleet.aggregator.config import AggregatorConfig

    db_sub = db.add_subparsers(dest="action", required=True)
    for name, text in (
        ("migrate", "apply the schema migrations not yet applied (the aggregator also does at start)"),
        ("status", "the schema version applied and the migrations still to apply"),
    ):
        settings.add_flags(db_sub.add_parser(name, help=text), AggregatorConfig, "aggregator")


def _demo_flags(p: argparse.ArgumentParser) -> None:
    from gpufleet.cli import demo

    demo.add_arguments(p)


_COMPONENT_FLAGS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "collector": _collector_flags,
    "aggregator": _aggregator_flags,
    "db": _db_flags,
    "demo": _demo_flags,
}


def add_watch(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--watch",
        type=float,
        metavar="N",
        help="show it again every N seconds until Ctrl-C (an unreachable aggregator is said, not fatal)",
    )


def _run_component(args: argparse.Namespace) -> int:
    # Each component imports only its own settings and modules: a collector does not pay for
    # the aggregator's (~40 ms of every start), nor an aggregator for the collector's (~50 ms).
    path = settings.config_path(args.config, os.environ)
    file_data = settings.load_file(path)
    if args.command == "collector":
        from gpufleet.collector.config import CollectorConfig
        from gpufleet.collector.main import MetricsUnavailable, run_collector
        from gpufleet.collector.simnvml.scenario import ScenarioError
        from gpufleet.collector.sources.nvml import NvmlUnavailable

        config = settings.resolve(CollectorConfig, "collector", args, os.environ, file_data, str(path))
        configure_logging(args.log_level, component="collector", node=config.node)
        try:
            if args.action == "probe":
                from gpufleet.cli.probe import run_probe

                return run_probe(args, config)
            asyncio.run(run_collector(config))
        except (NvmlUnavailable, ScenarioError, MetricsUnavailable) as exc:
            print(f"gpufleet collector: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        return 0
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.aggregator.server import run_aggregator
    from gpufleet.repair.state import StateError

    config = settings.resolve(AggregatorConfig, "aggregator", args, os.environ, file_data, str(path))
    configure_logging(args.log_level, component="aggregator")
    try:
        asyncio.run(run_aggregator(config))
    except (OSError, ValueError, StateError) as exc:
        print(f"gpufleet aggregator: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _run_db(args: argparse.Namespace) -> int:
    """`gpufleet db migrate|status`, with the aggregator's settings (file, environment, flags)."""
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.repair.migrations import MIGRATIONS
    from gpufleet.repair.state import StateError, open_state

    path = settings.config_path(args.config, os.environ)
    config = settings.resolve(
        AggregatorConfig, "aggregator", args, os.environ, settings.load_file(path), str(path)
    )
    try:
        state = open_state(
            config.control_plane,
            str(config.data_path / "repair.sqlite3"),
            migrate=False,
            application_name=f"gpufleet db {args.action}",
        )
    except (StateError, ValueError) as exc:
        print(f"gpufleet db: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.action == "migrate":
            applied = state.migrate()
            for m in MIGRATIONS:
                if m.version in applied:
                    print(f"applied migration {m.version}: {m.description}")
            print(f"schema at version {state.schema_version()} ({len(applied)} applied now)")
            return 0
        pending = state.pending_migrations()
        have = MIGRATIONS[-1].version - len(pending)
        print(f"control plane {state.describe()}: schema version {have} of {MIGRATIONS[-1].version}")
        for m in MIGRATIONS:
            if m.version in pending:
                print(f"  pending {m.version}: {m.description}  (`gpufleet db migrate` applies it)")
        return 1 if pending else 0
    except StateError as exc:
        print(f"gpufleet db: {state.describe()}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        state.close()


def _run_auth(args: argparse.Namespace) -> int:
    import time
    import tomllib

    from gpufleet.aggregator.auth.tokens import (
        fleet_token_entry,
        issue_collector_token,
        new_fleet_token,
        new_secrets_file,
    )
    from gpufleet.common.files import append_private

    path = Path(args.secrets)
    if args.action == "init":
        if path.exists() and not args.force:
            print(
                f"gpufleet auth init: {path} exists; pass --force to replace it "
                "(every collector token changes)",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        names = [(n, "operator") for n in args.operator] + [(n, "viewer") for n in args.viewer]
        issued = new_secrets_file(path, names)
        print(f"wrote {path} (mode 0600)")
        for name, token in issued.items():
            print(f"{name}: {token}")
        return 0
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        print(f"gpufleet auth: cannot read {path}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.action == "collector-token":
        try:
            token, token_id, expires = issue_collector_token(data["collector_secret"], args.node, args.days)
        except ValueError as exc:
            print(f"gpufleet auth collector-token: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        print(token)
        print(
            f"token id {token_id} for node {args.node}, valid until "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(expires))}; revoke it with "
            f"`gpufleet auth revoke {token_id} --reason ...`",
            file=sys.stderr,
        )
        return 0
    token = new_fleet_token(args.role)
    append_private(path, "\n" + "\n".join(fleet_token_entry(args.name, args.role, token)))
    print(token)
    print(
        f"added {args.role} token {args.name!r} to {path}; restart the aggregator to load it", file=sys.stderr
    )
    return 0


def _run_reset_helper(args: argparse.Namespace) -> int:
    from gpufleet.collector.reset_helper import run_reset_helper

    configure_logging(args.log_level, component="gpu-reset-helper")
    try:
        asyncio.run(
            run_reset_helper(
                args.socket, args.reset_command, args.timeout_s, args.min_interval_s, int(args.socket_mode, 8)
            )
        )
    except (OSError, ValueError) as exc:
        print(f"gpufleet gpu-reset-helper: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from gpufleet.cli.demo import run_demo

    return run_demo(args)


def _run_engines(args: argparse.Namespace) -> int:
    from gpufleet.cli.engines import run_engines_probe

    return run_engines_probe(args)


def _run_config(args: argparse.Namespace) -> int:
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.collector.config import CollectorConfig

    components = {"collector": CollectorConfig, "aggregator": AggregatorConfig}
    if args.action == "check":
        from gpufleet.cli import file_kinds

        other = file_kinds.check_other_kind(args.file, components, args.json)
        return other if other is not None else settings.check_file(args.file, components, args.json)
    print(settings.reference(components))
    return 0


def _run_completion(args: argparse.Namespace) -> int:
    from gpufleet.cli import completion

    print(completion.script(build_parser(), args.shell))
    return 0


def _run_dashboard(args: argparse.Namespace) -> int:
    from gpufleet.cli.dashboard import run_dashboard

    return run_dashboard(args)


# Commands that run here (a component, a local tool); every other command speaks the Fleet API.
LOCAL_COMMANDS = {
    "collector": _run_component,
    "aggregator": _run_component,
    "demo": _run_demo,
    "gpu-reset-helper": _run_reset_helper,
    "db": _run_db,
    "engines": _run_engines,
    "config": _run_config,
    "policy": lambda args: _module("repair_cmds").run_policy(args),
    "replay": lambda args: _module("replay_cmd").run(args),
    "dashboard": _run_dashboard,
    "completion": _run_completion,
    "alert": lambda args: _module("alert_cmd").run(args),
}


def _module(name: str) -> Any:
    """A command's module of gpufleet.cli, imported when its command runs."""
    return importlib.import_module(f"gpufleet.cli.{name}")


def _run_revoke(client: FleetClient, args: argparse.Namespace) -> None:
    from gpufleet.client.rpcs import FleetRpc
    from gpufleet.protos import fleet_pb2

    answer = client.call(
        FleetRpc.RevokeCollectorToken,
        fleet_pb2.RevokeTokenRequest(token_id=args.token_id, node=args.node, reason=args.reason),
    )
    state = "revoked" if answer.newly_revoked else "was already revoked"
    print(f"collector token {args.token_id} {state}; {answer.revoked_total} on the revocation list")


def _run_whoami(client: FleetClient, args: argparse.Namespace) -> None:
    from gpufleet.client.rpcs import FleetRpc
    from gpufleet.protos import fleet_pb2

    me = client.call(FleetRpc.WhoAmI, fleet_pb2.WhoAmIRequest())
    if args.json:
        print(json.dumps({"name": me.name, "role": me.role, "fleet": client.settings.fleet}))
        return
    print(f"{me.name} ({me.role}) at {client.settings.fleet}")


def _run_fleet_command(args: argparse.Namespace) -> None:
    from gpufleet.cli import repair_cmds, sre, waste_cmd, workloads_cmd
    from gpufleet.client.fleet import FleetClient, resolve_client

    client = FleetClient(
        resolve_client(args.fleet, args.token, args.token_file, allow_plaintext=args.allow_plaintext)
    )

    def once() -> None:
        if args.command == "whoami":
            _run_whoami(client, args)
        elif args.command == "auth":  # revoke: the other auth actions are local
            _run_revoke(client, args)
        elif args.command in ("cordon", "uncordon", "proceed", "incidents", "audit", "breaker"):
            repair_cmds.run(client, args)
        elif args.command in workloads_cmd.COMMANDS:
            workloads_cmd.run(client, args)
        elif args.command in waste_cmd.COMMANDS:
            waste_cmd.run(client, args)
        else:
            sre.run(client, args)

    try:
        watch(once, getattr(args, "watch", None), bool(getattr(args, "json", False)))
    finally:
        client.close()


def watch(once: Callable[[], None], every_s: float | None, as_json: bool) -> None:
    """once(); with --watch N, again every N seconds until Ctrl-C: a terminal is cleared before
    each (JSON: one document after another, the time on stderr), and an error is said and
    watched through (an aggregator restarting), not fatal."""
    if every_s is None:
        once()
        return
    if not 0.5 <= every_s <= 3600:
        raise ValueError(f"--watch {every_s:g}: give 0.5 to 3600 seconds")
    clear = sys.stdout.isatty() and not as_json
    _end_watch_on_ctrl_c()
    while True:
        if clear:
            print("\033[H\033[2J", end="")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"every {every_s:g} s until Ctrl-C; {stamp}", file=sys.stderr if as_json else sys.stdout)
        try:
            once()
        except ClientError as exc:
            print(f"gpufleet: {exc} (still watching)", file=sys.stderr)
        sys.stdout.flush()
        time.sleep(every_s)  # the refresh period the user asked for


def _end_watch_on_ctrl_c() -> None:
    """Ctrl-C ends a watch at once, with status 0, wherever the main thread is. Nothing is
    unwound: a KeyboardInterrupt raised inside a gRPC call can leave gRPC deadlocked on its way
    out (grpc/grpc#19973: in channel.close(), seen here once in ~30 runs; and once, in a
    whole-suite run, a watch was still running 30 s after Ctrl-C, where it hung unknown), and a
    watch has nothing to keep. Two ways in, so that one works wherever the main thread waits:
    the Python handler (runs in the main thread between bytecodes), and a thread woken by the
    signal's byte on the wakeup pipe, which the C-level handler writes at once (runs while the
    main thread waits in C with the GIL released, as inside a gRPC call)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    signal.signal(signal.SIGINT, lambda signum, frame: _end_watch())
    threading.Thread(target=_end_watch_on_wakeup, args=(read_fd,), name="ctrl-c", daemon=True).start()


def _end_watch_on_wakeup(read_fd: int) -> None:
    while True:
        if signal.SIGINT in os.read(read_fd, 64):  # one byte per signal: its number
            _end_watch()


def _end_watch() -> None:
    """What is printed so far is flushed (a flush the signal interrupted mid-write is skipped),
    then the process ends with status 0."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(command_of(words)).parse_args(words)
    try:
        local = LOCAL_COMMANDS.get(args.command)
        if args.command == "auth" and args.action != "revoke":
            local = _run_auth
        if args.command == "engines" and args.action is None:
            local = None  # the fleet's replicas, from the Fleet API
        if local is not None:
            return local(args)
        _run_fleet_command(args)
    except settings.ConfigError as exc:
        print(f"gpufleet: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ClientError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # bad --since/--step and the like
        print(f"gpufleet: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except BrokenPipeError:  # `gpufleet history ... | head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C ends a --watch
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
