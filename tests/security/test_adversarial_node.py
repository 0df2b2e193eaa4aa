"""One enrolled node's credential touches only that node (docs/security.md, issue 24).

Every attack found by trying the aggregator as the holder of one node's credential, replayed
here against a real aggregator over loopback gRPC, with real simulated collectors and a node
measuring its ack latency beside the attacker the whole time. Repair runs on the hook backend
with a cordon hook that really runs ssh (the command the attack used: a node named
`-oProxyCommand=...` made ssh run a command) behind a wrapper that logs every call, so what
a name can reach is read from the log of what ran. Each attack is refused with a clear status
and message; the honest nodes' acks stay under 2 s and their live view and repairs are theirs.
"""

from __future__ import annotations

import base64
import json
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufleet.protos import fleet_pb2, ingest_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.credentials import NODE_NAME_RE, token_mac
from harness.processes import AggregatorHandle, Cluster, gpufleet_argv
from harness.streams import HealthyNode, RawStream, hello, report, stream_error
from harness.waiting import wait_until

# Names that once reached a shell-less argv and still did harm, and others like them.
CRAFTED = [
    "-oProxyCommand=touch PWNED",  # an option to ssh (or any tool) in the hook's argv
    "gpu[001-128]",  # a Slurm hostlist: one node drained 128
    "gpu201,gpu202",  # a Slurm list: one node drained two
    "../../etc/passwd",  # a path
    "gpu 7",  # two arguments once a hook template is split
    "node\nevil",
    "a" * 254,
]

FAST_POLICY = """
[workflow]
validate_s = 1.0
reset_timeout_s = 60.0
"""


def forge_token(secret: str, node: str, token_id: str = "forged", expires: int | None = None) -> str:
    """A token signed with the fleet's secret for any name at all: what an attacker holds if
    issuance ever let a crafted name through (it does not: the aggregator checks again)."""
    payload = f"{node}|{token_id}|{expires or int(time.time()) + 3600}".encode()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    return f"gfc2_{b64(payload)}.{b64(token_mac(secret, payload))}"


@dataclass
class Env:
    cluster: Cluster
    agg: AggregatorHandle
    hook_log: Path
    pwned: Path
    healthy: HealthyNode

    def token(self, node: str) -> str:
        return self.cluster.secrets.collector_token(node)

    def viewer(self) -> tuple[tuple[str, str], ...]:
        return self.cluster.secrets.metadata()

    def node(self, name: str) -> fleet_pb2.NodeDetail:
        return self.agg.fleet_stub().GetNode(fleet_pb2.GetNodeRequest(node=name), metadata=self.viewer())

    def cli(self, *args: str, token: str = "viewer") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            gpufleet_argv(*args, "--fleet", self.agg.fleet, "--token", self.cluster.secrets.tokens[token]),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def hook_calls(self) -> list[str]:
        return self.hook_log.read_text().splitlines() if self.hook_log.exists() else []


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("adversarial")
    cluster = Cluster(tmp)
    hook_log, pwned = tmp / "hook-calls.log", tmp / "PWNED"
    wrapper = tmp / "logged"
    # Logs the argv it is given, one call a line, then runs it for real (and succeeds whatever
    # ssh answers: the honest nodes' names resolve to no host here).
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {hook_log}\ncd {tmp}\n"$@"\nexit 0\n')
    wrapper.chmod(0o755)
    ssh = f"{wrapper} ssh -o BatchMode=yes -o ConnectTimeout=1 -F /dev/null {{node}} true"
    policy = tmp / "policy.toml"
    policy.write_text(FAST_POLICY)
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--repair-backend",
        "hook",
        "--repair-hook-cordon",
        ssh,
        "--repair-hook-uncordon",
        ssh,
        "--repair-policy-file",
        str(policy),
        "--repair-interval-s",
        "0.2",
        "--repair-max-out-of-service-fraction",
        "1",
        # Its tests put a node of their own into repair each time they run (twenty times in a
        # row, when a run repeats them): the breaker and the cap on nodes out of service,
        # fleet-wide rails, are not what they test.
        "--repair-breaker-nodes",
        "1000",
        "--repair-max-out-of-service",
        "1000",
        "--hello-timeout-s",
        "2",
        "--node-reports-per-s",
        "20",
        "--node-report-burst",
        "50",
    )
    for node in ("honest-a", "honest-b"):
        cluster.collector(node, agg.ingest, "--interval-s", "0.2")
    healthy = HealthyNode(agg.ingest, cluster.secrets.collector_token("healthy-node"))

    def honest_listed() -> bool:
        listed = agg.fleet_stub().ListNodes(fleet_pb2.ListNodesRequest(), metadata=cluster.secrets.metadata())
        return {"honest-a", "honest-b"} <= {n.node for n in listed.nodes}

    # The module's tests count on the honest nodes being in the fleet; in a worker of its own a
    # test can come first (a person's cordon of honest-a once found it not yet known).
    wait_until(honest_listed, 30, "the honest collectors in the fleet")
    e = Env(cluster, agg, hook_log, pwned, healthy)
    try:
        yield e
        healthy.close()
        # Beside every attack, the honest node was acknowledged within 2 s, and nothing died.
        assert not healthy.errors, healthy.errors
        assert healthy.latencies_s and healthy.worst_ack_s < 2.0, max(healthy.latencies_s)
        assert agg.proc.alive()
        assert agg.metric_value("gpufleet_task_restarts_total") == 0
        assert not pwned.exists(), "a crafted name ran a command on the aggregator host"
    finally:
        healthy.close()
        cluster.stop_all()


def open_stream(env: Env, node: str, boot_id: str = "boot-1", gpus: int = 8) -> RawStream:
    s = RawStream(env.agg.ingest, env.token(node))
    s.send(hello(node, gpus=gpus, boot_id=boot_id))
    assert s.recv().WhichOneof("body") == "welcome"
    return s


def next_body(s: RawStream, wanted: str, timeout_s: float = 30) -> Any:
    """The next message of this kind on the stream (acks and the like before it are passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        msg = s.recv(max(0.1, deadline - time.monotonic()))
        if msg.WhichOneof("body") == wanted:
            return getattr(msg, wanted)


# --- names -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CRAFTED[:4])
def test_no_token_is_issued_for_a_crafted_name(env: Env, name: str) -> None:
    out = subprocess.run(
        gpufleet_argv("auth", "collector-token", name, "--secrets", str(env.cluster.secrets_path)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and not out.stdout, out
    assert "is not usable" in out.stderr and "a letter or digit" in out.stderr, out.stderr


def test_a_crafted_name_is_refused_at_the_hello_and_reaches_no_hook(env: Env) -> None:
    for name in CRAFTED:
        # A token for the name itself, signed with the fleet's secret: refused before the hello.
        err = stream_error(_hello_with(env, forge_token(env.cluster.secrets.secret, name), name))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (name, err)
        assert "malformed" in err.details(), err.details()
        # Another node's good token and the crafted name in the hello: refused by the name.
        err = stream_error(_hello_with(env, env.token("crafty"), name))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, err)
        assert "node name" in err.details() and "is not usable" in err.details(), err.details()
    assert env.agg.metric_value("gpufleet_ingest_rejections_total", reason="bad_name") >= len(CRAFTED)
    # The hook does run, for a real node: a person's cordon of honest-a goes through it.
    out = env.cli("cordon", "honest-a", "--reason", "adversarial test: the hook runs", token="ops")
    assert out.returncode == 0, out.stderr
    wait_until(
        lambda: any(" honest-a true" in c for c in env.hook_calls()), 20, "the cordon hook for honest-a"
    )
    assert env.cli("uncordon", "honest-a", "--reason", "done", token="ops").returncode == 0
    for call in env.hook_calls():
        node = call.split(" -F /dev/null ", 1)[1].rsplit(" true", 1)[0]
        assert NODE_NAME_RE.fullmatch(node), f"the hook ran for {node!r}"
    assert not env.pwned.exists()


def _hello_with(env: Env, token: str, node: str) -> RawStream:
    s = RawStream(env.agg.ingest, token)
    s.send(hello(node))
    return s


# --- commands --------------------------------------------------------------------------------
def test_a_node_cannot_answer_another_nodes_gpu_reset(env: Env) -> None:
    # Nodes of this run's own: a victim from a run before is in repair, its reset answered.
    victim_name, attacker_name = f"victim-{uuid.uuid4().hex[:8]}", f"attacker-{uuid.uuid4().hex[:8]}"
    victim = open_stream(env, victim_name)
    victim.send(report(victim_name, 1, ecc_dbe_volatile=1))
    command = next_body(victim, "command")  # the victim's collector is silent: it never answers
    assert command.reset_gpu.gpu_index == 0
    assert len(command.id.rsplit("~", 1)[1]) == 16, f"{command.id}: no random nonce in the id"
    attacker = open_stream(env, attacker_name)
    refused = env.agg.metric_value("gpufleet_ingest_command_results_refused_total")
    # The attacker knows the id (the worst case: the victim's stream is read) and answers it.
    fake = ingest_pb2.CommandResult(
        id=command.id, outcome=vocabulary_pb2.COMMAND_OUTCOME_SUCCEEDED, detail="ok"
    )
    attacker.send(ingest_pb2.CollectorMessage(command_result=fake))
    wait_until(
        lambda: env.agg.metric_value("gpufleet_ingest_command_results_refused_total") == refused + 1,
        10,
        "the attacker's answer to be refused",
    )
    assert "refused a command result" in env.agg.proc.log() and f"node={attacker_name}" in env.agg.proc.log()
    assert not _reset_outcomes(env, victim_name), "the victim's reset was decided by another node's answer"
    # The victim answers for itself: that is taken, once.
    victim.send(ingest_pb2.CollectorMessage(command_result=fake))
    wait_until(lambda: _reset_outcomes(env, victim_name) == ["ok"], 20, "the victim's own answer")
    victim.send(ingest_pb2.CollectorMessage(command_result=fake))  # the same answer again
    wait_until(
        lambda: env.agg.metric_value("gpufleet_ingest_command_results_refused_total") == refused + 2,
        10,
        "a second answer to be refused",
    )
    victim.close()
    attacker.close()


def _reset_outcomes(env: Env, node: str) -> list[str]:
    out = env.cli("audit", "--json", "--node", node)
    assert out.returncode == 0, out.stderr
    return [
        e["outcome"]
        for e in json.loads(out.stdout)["entries"]
        if e["action"] == "reset_gpu" and e["outcome"] != "started"
    ]


# --- bounded per-node state ------------------------------------------------------------------
def _engines(n: int, first_port: int) -> list[telemetry_pb2.EngineSample]:
    return [
        telemetry_pb2.EngineSample(
            engine="vllm",
            model="m" * 253,
            port=first_port + i,
            endpoint="http://x/" + "e" * 2000,
            readable=False,
            unreadable_reason="r" * 1024,
            gpu_indices=[0],
        )
        for i in range(n)
    ]


def test_one_nodes_engines_cannot_blind_the_fleet_view(env: Env) -> None:
    s = open_stream(env, "blinder")
    answers = []
    for seq in range(1, 31):  # 64 engines of long names a report, renamed every report
        msg = report("blinder", seq)
        msg.report.engines.extend(_engines(64, 1000 + 64 * seq))
        s.send(msg)
        answers.append(s.recv(30))
    bodies = [a.WhichOneof("body") for a in answers]
    assert bodies[:3] == ["ack"] * 3, bodies
    refused = [a.reject for a in answers if a.WhichOneof("body") == "reject"]
    assert len(refused) == 27 and all(r.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] for r in refused)
    assert "the cap is 256 (max_series_per_node)" in refused[0].message, refused[0].message
    # The live view keeps only the last accepted report's engines.
    assert len(env.node("blinder").engines) == 64
    # Everyone's fleet view still works, and stays small.
    out = env.cli("nodes", "--json")
    assert out.returncode == 0, out.stderr
    listed = {n["node"] for n in json.loads(out.stdout)["nodes"]}
    assert {"honest-a", "honest-b", "blinder"} <= listed
    page = env.agg.fleet_stub().ListNodes(fleet_pb2.ListNodesRequest(), metadata=env.viewer())
    assert page.ByteSize() < 1 << 20, page.ByteSize()
    # A report with no engines (the engines went away) empties the node's engine list.
    s.send(report("blinder", 31))
    assert s.recv().WhichOneof("body") == "ack"
    wait_until(lambda: not env.node("blinder").engines, 10, "engines no longer reported to be dropped")
    s.close()


def test_a_node_sending_too_fast_is_slowed_alone(env: Env) -> None:
    s = open_stream(env, "flooder")
    throttled = env.agg.metric_value("gpufleet_ingest_throttled_reports_total")
    started = time.monotonic()
    for seq in range(1, 121):  # burst 50, then 20 a second
        s.send(report("flooder", seq, gpus=8))
    acked: set[int] = set()
    while len(acked) < 120:
        acked |= set(next_body(s, "ack", 30).seqs)
    took_s = time.monotonic() - started
    assert took_s > 2.5, f"120 reports at a 20/s rate and a burst of 50 took only {took_s:.1f} s"
    assert env.agg.metric_value("gpufleet_ingest_throttled_reports_total") > throttled
    assert "node sends faster than its report or byte rate" in env.agg.proc.log()
    s.close()


def test_a_replayed_boot_cannot_freeze_a_nodes_live_view(env: Env) -> None:
    real = wait_until(
        lambda: env.node("honest-b").summary.last_seq > 5 and env.node("honest-b"), 30, "honest-b"
    )
    # What a viewer sees of the collector's boot is a digest, never the id a stream presents.
    boots = {
        line.split("(boot ")[1].split(",")[0]
        for line in env.agg.proc.log().splitlines()
        if line.endswith("node=honest-b") and "collector connected" in line
    }
    assert boots and real.summary.boot_id.startswith("b-") and real.summary.boot_id not in boots
    # A second collector with the node's token and another boot is refused, told nothing of the first.
    err = stream_error(_hello_with(env, env.token("honest-b"), "honest-b"))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and not any(b in err.details() for b in boots)
    # With the real boot id (leaked) the attacker supersedes the stream and sends a far-off seq
    # with values the node does not have.
    boot = sorted(boots)[-1]  # one collector process, one boot id
    s = RawStream(env.agg.ingest, env.token("honest-b"))
    s.send(hello("honest-b", boot_id=boot))
    # Values no simulated GPU has (a byte of HBM in use), to tell the fake report in the view.
    fake = report("honest-b", 2**63 - 1, boot_id=boot, util_gpu_pct=99.0, hbm_used_bytes=1)
    fake.report.cluster = "test"
    for gpu in fake.report.gpus:
        gpu.uuid, gpu.model = real.summary.gpus[gpu.index].uuid, real.summary.gpus[gpu.index].model
    assert s.recv().WhichOneof("body") == "welcome"
    s.send(fake)
    next_body(s, "ack")
    s.close()

    # The real collector reconnects; the view follows its reports again, not the far-off seq.
    def following_the_real_collector() -> bool:
        summary = env.node("honest-b").summary
        return summary.connected and summary.last_seq < 2**62 and summary.gpus[0].hbm_used_bytes != 1

    wait_until(following_the_real_collector, 30, "the live view to follow the real collector again")


def test_a_report_is_bound_to_its_streams_cluster_and_gpus(env: Env) -> None:
    s = open_stream(env, "binder")
    other = report("binder", 1)
    other.report.cluster = "another-cluster"
    s.send(other)
    reject = next_body(s, "reject")
    assert "names cluster 'another-cluster', but this stream's hello named 'test'" in reject.message
    renamed = report("binder", 2)
    renamed.report.gpus[3].uuid = "GPU-someone-else"
    s.send(renamed)
    reject = next_body(s, "reject")
    assert "has GPU 3 as uuid 'GPU-someone-else'" in reject.message, reject.message
    s.close()


# --- before authentication -------------------------------------------------------------------
def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_nothing_is_read_before_the_credential(env: Env) -> None:
    s = RawStream(env.agg.ingest, token=None)
    s.send(b"\xff\xff\xff not protobuf")
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, "the credential is checked before any decode"
    pid = env.agg.proc.popen.pid
    before = _rss_kib(pid)
    big = b"\x0a" + b"\xff" * 5 + b"x" * (15 << 20)
    started = time.monotonic()
    for _ in range(20):
        s = RawStream(env.agg.ingest, token=None)
        s.send(big)
        assert stream_error(s).code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE)
    assert time.monotonic() - started < 60
    grew_mib = (_rss_kib(pid) - before) / 1024
    assert grew_mib < 64, f"20 unauthenticated 15 MiB messages grew the aggregator by {grew_mib:.0f} MiB"
    # Idle unauthenticated streams are not held.
    idle = [RawStream(env.agg.ingest, token=None) for _ in range(100)]
    started = time.monotonic()
    for s in idle:
        assert stream_error(s, timeout_s=10).code() == grpc.StatusCode.UNAUTHENTICATED
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_idle_http_connections_hold_no_thread_for_long(env: Env) -> None:
    pid = env.agg.proc.popen.pid
    host, port = env.agg.metrics.rsplit(":", 1)
    base = _threads(pid)
    conns = [socket.create_connection((host, int(port))) for _ in range(100)]
    try:
        assert _threads(pid) <= base + 64 + 4, "more threads than the connection bound"
        wait_until(lambda: _threads(pid) <= base + 4, 20, "idle connections to be closed")
        import urllib.request

        assert urllib.request.urlopen(f"http://{env.agg.metrics}/metrics", timeout=5).status == 200
    finally:
        for c in conns:
            c.close()


def test_a_peer_has_a_bounded_number_of_streams(cluster: Cluster) -> None:
    agg = cluster.aggregator(
        "aggregator", 0, 0, None, "--max-streams-per-peer", "6", "--hello-timeout-s", "3"
    )
    held = []
    for i in range(6):
        s = RawStream(agg.ingest, cluster.secrets.collector_token(f"peer-{i}"))
        s.send(hello(f"peer-{i}"))
        assert s.recv().WhichOneof("body") == "welcome"
        held.append(s)
    err = stream_error(_raw_hello(agg, cluster, "peer-6"))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "open from ipv4:127.0.0.1 (max_streams_per_peer 6)" in err.details(), err.details()
    held.pop().close()
    wait_until(
        lambda: _welcomed(_raw_hello(agg, cluster, "peer-7")),
        15,
        "a slot to be free again once a stream ends",
    )
    for s in held:
        s.close()


def _raw_hello(agg: AggregatorHandle, cluster: Cluster, node: str) -> RawStream:
    s = RawStream(agg.ingest, cluster.secrets.collector_token(node))
    s.send(hello(node))
    return s


def _welcomed(s: RawStream) -> bool:
    try:
        return s.recv(5).WhichOneof("body") == "welcome"
    except grpc.RpcError:
        return False
    finally:
        s.close()


# --- credentials: expiry, revocation, secrets --------------------------------------------------
def test_an_expired_or_legacy_token_is_refused(env: Env) -> None:
    soon = env.cluster.secrets.collector_token("short-lived", days=4 / 86400)  # four seconds
    s = open_stream_with(env, soon, "short-lived")
    s.send(report("short-lived", 1))
    assert next_body(s, "ack").seqs == [1]
    wait_until(lambda: time.time() > json_expiry(soon) + 0.2, 10, "the token to expire")
    s.send(report("short-lived", 2))
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in err.details()
    err = stream_error(_hello_with(env, soon, "short-lived"))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in err.details()
    err = stream_error(_hello_with(env, "gfc1_" + "A" * 43, "short-lived"))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "version-1 collector token" in err.details()


def json_expiry(token: str) -> int:
    payload = token[len("gfc2_") :].split(".")[0]
    return int(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode().split("|")[2])


def open_stream_with(env: Env, token: str, node: str) -> RawStream:
    s = _hello_with(env, token, node)
    assert s.recv().WhichOneof("body") == "welcome"
    return s


def test_one_token_is_revoked_without_rotating_the_fleet_secret(env: Env) -> None:
    issued = subprocess.run(
        gpufleet_argv("auth", "collector-token", "revoked-node", "--secrets", str(env.cluster.secrets_path)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert issued.returncode == 0, issued.stderr
    token, token_id = issued.stdout.strip(), issued.stderr.split("token id ")[1].split()[0]
    s = open_stream_with(env, token, "revoked-node")
    s.send(report("revoked-node", 1))
    assert next_body(s, "ack").seqs == [1]
    viewer = env.cli("auth", "revoke", token_id, "--reason", "stolen laptop")
    assert viewer.returncode == 4, "a viewer cannot revoke"
    out = env.cli(
        "auth", "revoke", token_id, "--reason", "host reimaged", "--node", "revoked-node", token="ops"
    )
    assert out.returncode == 0 and "revoked" in out.stdout, out
    err = stream_error(s, timeout_s=20)  # the open stream ends within the reload period
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "is revoked" in err.details()
    err = stream_error(_hello_with(env, token, "revoked-node"))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and f"token {token_id}" in err.details()
    # Another token of the same node, and every other node, are unaffected.
    fresh = open_stream_with(env, env.token("revoked-node"), "revoked-node")
    fresh.close()
    entries = json.loads(env.cli("audit", "--json", "--node", "revoked-node").stdout)["entries"]
    assert any(
        e["action"] == "revoke_token" and token_id in e["reason"] and e["actor"] == "ops" for e in entries
    )


def test_auth_init_force_leaves_the_secrets_file_private(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    path.write_text("old")
    path.chmod(0o644)
    out = subprocess.run(
        gpufleet_argv("auth", "init", "--secrets", str(path), "--operator", "alice", "--force"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and "(mode 0600)" in out.stdout, out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    added = subprocess.run(
        gpufleet_argv("auth", "add-token", "bob", "--role", "viewer", "--secrets", str(path)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert added.returncode == 0, added.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert 'name = "bob"' in path.read_text() and 'name = "alice"' in path.read_text()


def test_a_password_in_a_store_url_reaches_no_client_and_no_log(cluster: Cluster) -> None:
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--store",
        "influxdb",
        "--influx-url",
        "http://gpufleet:s3cret-pw@127.0.0.1:9/?token=s3cret-tok",
    )
    meta = cluster.secrets.metadata()
    stub = agg.fleet_stub()
    with pytest.raises(grpc.RpcError) as info:
        stub.QueryHistory(fleet_pb2.HistoryRequest(metric="util_gpu_pct"), metadata=meta, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "gpufleet:***@127.0.0.1:9" in info.value.details(), info.value.details()
    status = stub.GetStatus(fleet_pb2.StatusRequest(), metadata=meta, timeout=10)
    seen = info.value.details() + str(status) + agg.proc.log()
    assert "s3cret" not in seen, "a secret of the store's URL reached a client or the log"


@pytest.mark.parametrize(
    "text,kept,gone",
    [
        ("postgresql://gf:pw1@db:5432/gpufleet", "postgresql://gf:***@db:5432/gpufleet", "pw1"),
        ("http://influx:8086/query?u=a&password=pw2", "http://influx:8086/query?***", "pw2"),
        ("host=db user=gf password=pw3 dbname=x", "password=***", "pw3"),
        ("cannot reach https://u:p%40ss@h/x: refused", "https://u:***@h/x: refused", "p%40ss"),
    ],
)
def test_redact_strips_userinfo_query_strings_and_keyword_passwords(text: str, kept: str, gone: str) -> None:
    from gpufleet.common.redact import redact

    assert kept in redact(text) and gone not in redact(text), redact(text)
