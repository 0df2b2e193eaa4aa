"""A node's word is not the fleet's, written as the attacks (docs/security.md "Serving pools and
the capacity guard"): real aggregator, real collectors scraping real HTTP engine endpoints for
the victims, and an attacker holding one enrolled node's collector token who sends whatever it
likes over a raw gRPC stream. Which pool a replica is in is the policy's `[serving.pools]`
(repair/placement.py), not the node's `pool=`.

1. fake headroom: the attacker reports idle replicas in the victims' pools → the victims' drains
   stay held, the claimed replicas are listed as unverified;
2. hold-forever: pressure holds a drain at most max_capacity_wait_s, then it goes on with the
   "capacity at risk" alert; and an urgent fault on another node is cordoned at once while the
   fleet is at its cap with a node held for capacity;
3. 4,000 pool names from one node → no pool series on /metrics, the series cap refuses the rest;
4. a pool name with a Slack mention and a link → refused by the name grammar (unverified,
   bad_name), and nothing of it in a Slack message."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufleet.protos import telemetry_pb2
from harness.alert_receiver import AlertReceiver
from harness.engine_endpoint import MODEL, EngineEndpoint
from harness.processes import AggregatorHandle, Cluster
from harness.repair import (
    FAST_POLICY,
    audit,
    declared_pool,
    gpufleet_cli,
    repair_aggregator,
    repair_status,
    xid_scenario,
)
from harness.streams import RawStream, hello, report
from harness.waiting import wait_until

# XID 79 may wait here (a fault whose drain the guard may hold); XID 48 stays urgent as shipped.
MAY_WAIT = FAST_POLICY + "\n[xid.79]\nmay_wait = true\n"


class Attacker:
    """An enrolled node ("evil") streaming reports whose engines claim whatever pools it likes:
    `engines` is what each report carries, resent every interval_s until closed."""

    def __init__(
        self, agg: AggregatorHandle, cluster: Cluster, engines: list[telemetry_pb2.EngineSample]
    ) -> None:
        self.engines = engines
        self.answers = 0
        self._stream = RawStream(agg.ingest, cluster.secrets.collector_token("evil"))
        self._stream.send(hello("evil"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._stop.wait(0.3):
            seq += 1
            msg = report("evil", seq)
            msg.report.engines.extend(self.engines)
            self._stream.send(msg)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._stream.close()


def claimed(
    pool: str, port: int, gpu: int, kv: float = 0.0, running: float = 1.0
) -> telemetry_pb2.EngineSample:
    return telemetry_pb2.EngineSample(
        engine="vllm",
        model=MODEL,
        port=port,
        endpoint=f"http://127.0.0.1:{port}/metrics",
        readable=True,
        kv_cache_usage_ratio=kv,
        requests_running=running,
        requests_waiting=0,
        gpu_indices=[gpu],
        pool=pool,
    )


def pools(agg: AggregatorHandle, cluster: Cluster) -> dict[str, Any]:
    out = gpufleet_cli(agg, cluster, "viewer", "pools", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def drains_started(agg: AggregatorHandle, cluster: Cluster, node: str) -> int:
    return sum(1 for a in audit(agg, cluster, node) if a["action"] == "drain" and a["outcome"] == "started")


def node_state(agg: AggregatorHandle, cluster: Cluster, node: str) -> dict[str, Any]:
    return next((n for n in repair_status(agg, cluster)["nodes"] if n["node"] == node), {})


def waiting_for_capacity(agg: AggregatorHandle, cluster: Cluster, node: str) -> bool:
    return node_state(agg, cluster, node).get("detail", "").startswith("waiting for capacity")


def passes_after(agg: AggregatorHandle, more: int) -> None:
    """Wait until the repair controller has run `more` passes past now."""
    start = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(
        lambda: agg.metric_value("gpufleet_repair_passes_total") >= start + more, 30, f"{more} repair passes"
    )


@pytest.fixture
def endpoints() -> Iterator[dict[str, EngineEndpoint]]:
    made: dict[str, EngineEndpoint] = {}
    yield made
    for endpoint in made.values():
        endpoint.close()


def victim(
    cluster: Cluster,
    agg: AggregatorHandle,
    endpoints: dict[str, EngineEndpoint],
    node: str,
    kv: float,
    pool: str,
    xid: int | None = 79,
) -> None:
    """A serving node: a real collector scraping a real engine endpoint, in `pool`, whose GPU 3
    reports the XID a second after it starts."""
    endpoints[node] = EngineEndpoint(kv)
    scenario = ["--sim-scenario", str(xid_scenario(cluster.tmp / f"{node}.toml", xid))] if xid else []
    cluster.collector(
        node,
        agg.ingest,
        "--interval-s",
        "0.5",
        "--engines",
        f"{endpoints[node].url} gpus=0,1 pool={pool}",
        *scenario,
    )


def test_fake_headroom_from_another_node_starts_no_drain_and_is_listed_unverified(
    cluster: Cluster, endpoints: dict[str, EngineEndpoint]
) -> None:
    """Pool llama-solo: one real replica at 0.60; llama-pair: two at 0.80. Both victims have a
    fault that may wait; draining either takes its pool below the floor. The attacker reports an
    idle-looking replica in each pool (KV 0, a request running): before placement it made room
    for both drains."""
    policy = (
        MAY_WAIT
        + declared_pool("llama-solo", ["solo-1"], models=[MODEL])
        + declared_pool("llama-pair", ["pair-1", "pair-2"], models=[MODEL])
    )
    agg = repair_aggregator(cluster, "--repair-max-out-of-service-fraction", "1", policy=policy)
    attacker = Attacker(agg, cluster, [claimed("llama-solo", 9001, 0), claimed("llama-pair", 9002, 1)])
    try:
        victim(cluster, agg, endpoints, "solo-1", 0.6, "llama-solo")
        victim(cluster, agg, endpoints, "pair-1", 0.8, "llama-pair")
        victim(cluster, agg, endpoints, "pair-2", 0.8, "llama-pair", xid=None)
        for node in ("solo-1", "pair-1"):
            wait_until(
                lambda node=node: waiting_for_capacity(agg, cluster, node), 30, f"{node} held for capacity"
            )
        answer = wait_until(
            lambda: (a := pools(agg, cluster)).get("unverified_total") == 2 and a, 20, "the claims listed"
        )
        passes_after(agg, 10)  # many drain checks with the attacker's replicas in view
        for node in ("solo-1", "pair-1"):
            assert drains_started(agg, cluster, node) == 0, audit(agg, cluster, node)
            assert waiting_for_capacity(agg, cluster, node)
        by_name = {p["model"]: p for p in pools(agg, cluster)["pools"]}
        assert by_name["llama-solo"]["replicas_serving"] == 1, "the attacker's replica is not in the pool"
        assert by_name["llama-pair"]["replicas_serving"] == 2
        unverified = answer["unverified"]
        assert {(u["node"], u["claimed"], u["kind"]) for u in unverified} == {
            ("evil", "llama-solo", "not_placed"),
            ("evil", "llama-pair", "not_placed"),
        }
        assert agg.metric_value("gpufleet_pool_unverified_replicas", reason="not_placed") == 2
        text = gpufleet_cli(agg, cluster, "viewer", "pools")
        assert "unverified replicas" in text.stdout and "evil" in text.stdout, text.stdout
    finally:
        attacker.close()


def test_pressure_holds_a_drain_at_most_max_capacity_wait_then_it_goes_with_capacity_at_risk(
    cluster: Cluster, endpoints: dict[str, EngineEndpoint]
) -> None:
    """The hold-forever attack, bounded: a pool at its floor holds the victim's drain, and the
    attacker's claims of pressure (four replicas at a full cache) cannot extend it; after
    max_capacity_wait_s the drain goes on and Slack hears "capacity at risk" — with nothing of the
    attacker's pool name ("<!channel>", a link) in any message."""
    slack = AlertReceiver()
    policy = (
        MAY_WAIT + "\n[serving]\nmax_capacity_wait_s = 3\n" + declared_pool("llama", ["s1"], models=[MODEL])
    )
    agg = repair_aggregator(
        cluster,
        "--repair-max-out-of-service-fraction",
        "1",
        "--alert-slack-url",
        slack.url,
        "--alert-group-wait-s",
        "0",
        policy=policy,
    )
    hostile = ["<!channel>", "<https://evil.example|click>", "llama"]
    attacker = Attacker(
        agg, cluster, [claimed(name, 9100 + i, i, kv=1.0, running=64) for i, name in enumerate(hostile)]
    )
    try:
        victim(cluster, agg, endpoints, "s1", 0.6, "llama")
        wait_until(lambda: waiting_for_capacity(agg, cluster, "s1"), 30, "s1 held for capacity")
        held_at = time.monotonic()
        wait_until(
            lambda: drains_started(agg, cluster, "s1") == 1, 30, "s1's drain after max_capacity_wait_s"
        )
        assert time.monotonic() - held_at >= 2.0, "it waited (3 s, less the first pass's lag)"
        risk = wait_until(
            lambda: [m for m in slack.received if "capacity at risk" in m.get("text", "")],
            20,
            "the capacity alert",
        )
        assert "max_capacity_wait_s" in risk[0]["text"] and "llama 1 → 0 replicas" in risk[0]["text"]
        kinds = {u["claimed"]: u["kind"] for u in pools(agg, cluster)["unverified"]}
        assert kinds == {
            "<!channel>": "bad_name",
            "<https://evil.example|click>": "bad_name",
            "llama": "not_placed",
        }
        for message in slack.received:
            assert "<!" not in message["text"] and "<https://evil" not in message["text"], message
    finally:
        attacker.close()
        slack.close()


def test_an_urgent_fault_is_cordoned_at_once_while_the_cap_is_filled_by_a_node_held_for_capacity(
    cluster: Cluster, endpoints: dict[str, EngineEndpoint]
) -> None:
    """Cap 1; s1 is cordoned and held for capacity (a fault that may wait, its pool at its
    floor). An uncorrectable ECC error (XID 48, urgent) on s2 is cordoned at once: urgent always
    has a slot, as a person's cordon does."""
    policy = MAY_WAIT + declared_pool("llama", ["s1"], models=[MODEL])
    agg = repair_aggregator(
        cluster,
        "--repair-max-out-of-service",
        "1",
        "--repair-max-out-of-service-fraction",
        "1",
        policy=policy,
    )
    victim(cluster, agg, endpoints, "s1", 0.6, "llama")
    wait_until(lambda: waiting_for_capacity(agg, cluster, "s1"), 30, "s1 held for capacity")
    cluster.collector(
        "s2",
        agg.ingest,
        "--interval-s",
        "0.5",
        "--sim-scenario",
        str(xid_scenario(cluster.tmp / "s2.toml", 48)),
    )
    wait_until(
        lambda: node_state(agg, cluster, "s2").get("state") not in (None, "healthy", "suspect", "waiting"),
        30,
        "s2 cordoned for its urgent fault",
    )
    assert not [
        a for a in audit(agg, cluster, "s2") if a["action"] == "cordon" and a["outcome"].startswith("held")
    ]
    assert waiting_for_capacity(agg, cluster, "s1"), "s1 still waits: its fault may"


def test_four_thousand_pool_names_from_one_node_make_no_pool_series(cluster: Cluster) -> None:
    agg = repair_aggregator(cluster, policy=FAST_POLICY + declared_pool("llama", ["gpu-*"], models=[MODEL]))
    baseline = len(metrics_lines(agg))
    stream = RawStream(agg.ingest, cluster.secrets.collector_token("evil"))
    stream.send(hello("evil"))
    sent = 63  # 63 x 64 = 4,032 distinct pool names
    for seq in range(1, sent + 1):
        msg = report("evil", seq)
        msg.report.engines.extend(
            telemetry_pb2.EngineSample(
                engine="vllm", model=MODEL, port=10_000 + e, readable=True, pool=f"p{seq}-{e}"
            )
            for e in range(64)
        )
        stream.send(msg)
    answers = [stream.recv(20) for _ in range(sent)]
    stream.close()
    refused = [a for a in answers if a.HasField("reject")]
    assert refused and "max_series_per_node" in refused[0].reject.message, "the series cap counts pools"
    lines = metrics_lines(agg)
    assert not [line for line in lines if 'model="p' in line], "no pool series from a node's names"
    assert len(lines) <= baseline + 40, (baseline, len(lines))


def metrics_lines(agg: AggregatorHandle) -> list[str]:
    import urllib.request

    text = urllib.request.urlopen(f"http://{agg.metrics}/metrics", timeout=5).read().decode()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_concurrent_scrapers_share_one_snapshot_and_are_paced(cluster: Cluster) -> None:
    """16 unauthenticated scrapers in a loop (docs/security.md "Serving pools and the capacity
    guard"): the exposition is computed at most once per metrics_snapshot_s however many scrape,
    and answers are paced to metrics_max_scrapes_per_s (a scrape over the pace waits its turn)."""
    import urllib.request

    agg = cluster.aggregator(
        "aggregator", 0, 0, None, "--metrics-snapshot-s", "5", "--metrics-max-scrapes-per-s", "50"
    )
    statuses: list[int] = []
    lock = threading.Lock()

    def scrape_loop() -> None:
        for _ in range(8):
            with urllib.request.urlopen(f"http://{agg.metrics}/metrics", timeout=30) as answer:
                answer.read()
                with lock:
                    statuses.append(answer.status)

    started = time.monotonic()
    scrapers = [threading.Thread(target=scrape_loop) for _ in range(16)]
    for t in scrapers:
        t.start()
    for t in scrapers:
        t.join(60)
    elapsed_s = time.monotonic() - started
    assert statuses == [200] * 128, "every scrape answered: the queue stayed within its bound"
    assert elapsed_s >= 127 / 50, "paced: at most 50 answers a second, all scrapers together"
    computed = agg.metric_value("gpufleet_metrics_snapshots_computed_total")
    assert computed <= elapsed_s / 5 + 2, (computed, elapsed_s)
    assert agg.metric_value("gpufleet_metrics_snapshot_age_seconds") <= 5.5
