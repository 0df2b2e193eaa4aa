"""Inference-engine scraping against real HTTP servers on loopback serving realistic /metrics."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.collector.sources.engines.scrape import Endpoint, EngineScraper, parse_endpoints
from harness import engine_fixtures as fx

WRONG_TYPE = fx.VLLM_NEW.replace(
    "# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:kv_cache_usage_perc histogram"
)

PAGES = {
    "/wrong-type": WRONG_TYPE,
    "/vllm": fx.VLLM_NEW,
    "/vllm-old": fx.VLLM_OLD,
    "/sglang": fx.SGLANG,
    "/tgi": fx.TGI,
    "/trtllm": fx.TRTLLM,
    "/garbage": fx.GARBAGE,
    "/truncated": fx.TRUNCATED,
    "/nan": fx.NAN,
    "/range": fx.WRONG_RANGE,
    "/node": fx.NOT_AN_ENGINE,
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    release = threading.Event()
    pages = dict(PAGES)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/hang":
                release.wait(10)  # an engine that accepts and never answers
                return
            if self.path == "/error":
                self.send_error(503, "Service Unavailable")
                return
            body = pages.get(self.path)
            if body is None:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server.pages = pages  # type: ignore[attr-defined]
    yield f"http://127.0.0.1:{httpd.server_port}"
    release.set()
    httpd.shutdown()


def scrape(url: str, gpus: tuple[int, ...] = ()) -> object:
    return EngineScraper([Endpoint(url, gpus)], timeout_s=1.0).scrape_all()[0]


def test_vllm_new_names_with_two_data_parallel_engines(server: str) -> None:
    s = scrape(server + "/vllm", (0, 1))
    assert s.readable and (s.engine, s.model) == ("vllm", "meta-llama/Llama-3.1-8B-Instruct")
    assert s.kv_cache_usage_ratio == pytest.approx(0.8731), "the fullest engine counts"
    assert (s.requests_running, s.requests_waiting, s.preemptions_total) == (21, 3, 21)
    assert s.prefix_cache_hit_ratio == pytest.approx(0.25)
    assert list(s.gpu_indices) == [0, 1] and s.port == int(server.rsplit(":", 1)[1])


def test_vllm_old_name_is_the_fallback(server: str) -> None:
    s = scrape(server + "/vllm-old")
    assert s.readable and s.kv_cache_usage_ratio == pytest.approx(0.42) and s.requests_running == 5
    assert not s.HasField("preemptions_total") and not s.HasField("prefix_cache_hit_ratio")


def test_sglang_per_rank_series_count_each_replica_once(server: str) -> None:
    s = scrape(server + "/sglang")
    assert s.readable and (s.engine, s.model) == ("sglang", "Qwen/Qwen2.5-72B-Instruct")
    assert s.kv_cache_usage_ratio == pytest.approx(0.66), "the fullest rank"
    assert (s.requests_running, s.requests_waiting) == (31, 7), "rank 0 only, not once per rank"
    assert s.prefix_cache_hit_ratio == pytest.approx(0.37) and s.preemptions_total == 2


def test_tgi_uses_the_token_budget_as_kv_proxy(server: str) -> None:
    s = scrape(server + "/tgi")
    assert s.readable and s.engine == "tgi" and s.model == "unknown"
    assert s.kv_cache_usage_ratio == pytest.approx(0.75)
    assert (s.requests_running, s.requests_waiting) == (16, 4)


def test_trtllm_through_triton(server: str) -> None:
    s = scrape(server + "/trtllm")
    assert s.readable and (s.engine, s.model) == ("trtllm", "tensorrt_llm")
    assert s.kv_cache_usage_ratio == pytest.approx(0.75) and (s.requests_running, s.requests_waiting) == (
        8,
        2,
    )


def test_prefix_hit_ratio_is_over_the_last_interval(server: str) -> None:
    scraper = EngineScraper([Endpoint(server + "/vllm")], timeout_s=1.0)
    assert scraper.scrape_all()[0].prefix_cache_hit_ratio == pytest.approx(0.25)  # since start
    server_pages = server_pages_of(server)
    server_pages["/vllm"] = fx.VLLM_NEW.replace("100000.0", "110000.0").replace("25000.0", "34000.0")
    try:
        assert scraper.scrape_all()[0].prefix_cache_hit_ratio == pytest.approx(0.9)  # 9000 / 10000
    finally:
        server_pages["/vllm"] = fx.VLLM_NEW


def server_pages_of(url: str) -> dict[str, str]:
    return server.pages  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "path,reason",
    [
        ("/garbage", "is not Prometheus exposition format"),
        ("/truncated", "not Prometheus exposition format"),
        ("/nan", "vllm KV cache usage is nan, not a finite number"),
        ("/range", "kv_cache_usage_ratio=87.31 is outside 0..1"),
        ("/node", "exposes no metrics of a known engine"),
        ("/error", "answered HTTP 503"),
        ("/hang", "did not answer within 1 s"),
    ],
)
def test_bad_endpoints_are_unreadable_with_the_reason(server: str, path: str, reason: str) -> None:
    s = scrape(server + path)
    assert not s.readable and reason in s.unreadable_reason and server + path in s.unreadable_reason
    assert not s.HasField("kv_cache_usage_ratio")


def test_an_engine_that_is_down_does_not_hold_up_the_others(server: str) -> None:
    import time

    from harness.processes import free_port

    scraper = EngineScraper(
        [
            Endpoint(server + "/hang"),
            Endpoint(f"http://127.0.0.1:{free_port()}/metrics"),
            Endpoint(server + "/sglang"),
        ],
        timeout_s=1.0,
    )
    t0 = time.monotonic()
    hang, down, ok = scraper.scrape_all()
    assert time.monotonic() - t0 < 2.5, "scraped concurrently, each bounded by the timeout"
    assert "cannot connect" in down.unreadable_reason and not hang.readable and ok.readable


def test_endpoint_lists_parse_and_refuse_nonsense() -> None:
    assert parse_endpoints("http://h:8000/metrics gpus=0,1 pool=llama-prod; http://h:30000/metrics") == [
        Endpoint("http://h:8000/metrics", (0, 1), "llama-prod"),
        Endpoint("http://h:30000/metrics"),
    ]
    for bad, message in [
        ("h:8000/metrics", "is not an http(s) URL"),
        ("http://h:1/m tp=2", "unknown option"),
        ("http://h:1/m gpus=a", "not a list of GPU indices"),
        ("http://h:1/m pool=-x", "is no pool name"),
        ("http://h:1/m pool=", "is no pool name"),
        ("http://h:1/m pool=" + "a" * 64, "is no pool name"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_endpoints(bad)


@pytest.mark.slow
def test_engines_reach_the_store_and_the_cli(server: str, cluster: object) -> None:
    import json
    import os
    import subprocess
    import time

    from gpufleet.aggregator.store import EmbeddedStore
    from harness.processes import free_port, gpufleet_argv
    from harness.waiting import wait_until

    agg = cluster.aggregator()  # type: ignore[attr-defined]
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    cluster.collector(
        "infer-node",
        agg.ingest,
        "--interval-s",
        "0.5",  # type: ignore[attr-defined]
        "--engines",
        f"{server}/vllm gpus=0,1,2,3; {server}/sglang gpus=4,5; {dead}",
    )

    def engine_points() -> list:
        store = EmbeddedStore(agg.data_dir / "store.sqlite3", retention_s=86400)
        try:
            got = store.query_points("engine", 0, time.time_ns() + 10**12)
        finally:
            store.close()
        return got if {p.tags["engine"] for p in got} >= {"vllm", "sglang", "unknown"} else []

    points = wait_until(engine_points, 30, "engine samples in the store")
    vllm = next(p for p in points if p.tags["engine"] == "vllm")
    assert (
        vllm.tags["model"] == "meta-llama/Llama-3.1-8B-Instruct" and vllm.fields["gpu_indices"] == "0,1,2,3"
    )
    assert vllm.fields["kv_cache_usage_ratio"] == pytest.approx(0.8731) and vllm.fields["readable"] == 1
    down = next(p for p in points if p.tags["engine"] == "unknown")
    assert down.fields["readable"] == 0 and "cannot connect" in down.fields["unreadable_reason"]
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],  # type: ignore[attr-defined]
        "GPUFLEET_CLIENT_CONFIG": "/nonexistent",
    }
    detail = json.loads(
        subprocess.run(
            gpufleet_argv("node", "infer-node", "--json"), env=env, capture_output=True, text=True, timeout=60
        ).stdout
    )
    engines = {e["engine"]: e for e in detail["engines"]}
    assert engines["sglang"]["requests_waiting"] == 7 and engines["sglang"]["gpu_indices"] == [4, 5]
    history = json.loads(
        subprocess.run(
            gpufleet_argv("history", "kv_cache_usage_ratio", "--engine", "vllm", "--json"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert history["series"] and history["series"][0]["tags"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_simulated_engine_is_scraped_over_http_and_follows_load(cluster: object) -> None:
    import time

    from gpufleet.aggregator.store import EmbeddedStore
    from harness.waiting import wait_until

    agg = cluster.aggregator()  # type: ignore[attr-defined]
    cluster.collector("sim-infer", agg.ingest, "--interval-s", "0.3", "--sim-engine", "sglang")  # type: ignore[attr-defined]

    def points() -> list:
        store = EmbeddedStore(agg.data_dir / "store.sqlite3", retention_s=86400)
        try:
            return store.query_points("engine", 0, time.time_ns() + 10**12)
        finally:
            store.close()

    got = wait_until(lambda: len(points()) >= 3 and points(), 30, "simulated engine samples")
    assert {p.tags["engine"] for p in got} == {"sglang"}
    assert all(p.fields["readable"] == 1 and 0 <= p.fields["kv_cache_usage_ratio"] <= 1 for p in got)
    assert got[-1].fields["gpu_indices"] == "0,1,2,3,4,5,6,7"


ENGINE_SERVER = r"""
import http.server, json, subprocess, sys, threading
body = open(sys.argv[1], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
# Two GPU workers, as vLLM's VLLM::Worker_TP0/1: children of the API server.
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
print(json.dumps({"port": srv.server_port, "workers": [w.pid for w in workers]}), flush=True)
threading.Thread(target=srv.serve_forever, daemon=True).start()
sys.stdin.read()
for w in workers: w.kill()
"""


def test_engines_are_discovered_from_the_gpus_process_ids(tmp_path: object) -> None:
    import json
    import subprocess
    import sys

    from gpufleet.collector.sources.engines.discovery import EngineDiscovery
    from gpufleet.protos import telemetry_pb2

    def start(text: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
        page = tmp_path / f"page{len(text)}.txt"  # type: ignore[operator]
        page.write_text(text)
        proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE_SERVER, str(page)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return proc, json.loads(proc.stdout.readline())  # type: ignore[union-attr]

    engine, info = start(fx.VLLM_NEW)
    other, other_info = start(fx.NOT_AN_ENGINE)  # listens, but is no engine
    try:
        w0, w1 = info["workers"]  # type: ignore[misc]
        gpus = [
            telemetry_pb2.GpuSample(index=0, processes=[telemetry_pb2.GpuProcess(pid=w0)]),
            telemetry_pb2.GpuSample(index=1, processes=[telemetry_pb2.GpuProcess(pid=w1)]),
            telemetry_pb2.GpuSample(
                index=2, processes=[telemetry_pb2.GpuProcess(pid=other_info["workers"][0])]
            ),  # type: ignore[index]
            telemetry_pb2.GpuSample(index=3, processes=[telemetry_pb2.GpuProcess(pid=999_999_999)]),
        ]  # gone
        discovery = EngineDiscovery(timeout_s=1.0)
        (found,) = discovery.endpoints(gpus)
        assert found.url == f"http://127.0.0.1:{info['port']}/metrics" and found.gpus == (0, 1)
        assert discovery.endpoints(gpus) == [found], "cached while the GPU processes are the same"
        scraped = EngineScraper([], timeout_s=1.0).scrape_all([found])
        assert scraped[0].engine == "vllm" and list(scraped[0].gpu_indices) == [0, 1]
    finally:
        for proc in (engine, other):
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=10)


def test_a_metric_of_the_wrong_type_is_absent_not_misread(server: str) -> None:
    # KV usage declared as a histogram: its samples are not a usage ratio, so it is left out
    # (absent, not 0) while the rest of the engine's metrics are read.
    s = scrape(server + "/wrong-type")
    assert s.readable and not s.HasField("kv_cache_usage_ratio") and s.requests_running == 21


def test_unreadable_scrapes_are_counted_for_the_collectors_health(server: str) -> None:
    scraper = EngineScraper([Endpoint(server + "/garbage"), Endpoint(server + "/vllm")], timeout_s=1.0)
    scraper.scrape_all()
    scraper.scrape_all()
    assert scraper.failed_total == 2


def test_a_replica_that_stops_answering_is_still_reported_as_what_it_served(server: str) -> None:
    """An engine that crashes keeps its engine and model in the reports (its pool counts it
    out); one never read is reported unknown (it is in no pool: repair/serving.py)."""
    pages = server_pages_of(server)
    pages["/flaky"] = fx.VLLM_NEW
    scraper = EngineScraper([Endpoint(server + "/flaky"), Endpoint(server + "/never")], timeout_s=1.0)
    up, never = scraper.scrape_all()
    assert up.readable and up.model != "unknown" and not never.readable and never.model == "unknown"
    del pages["/flaky"]
    down, _ = scraper.scrape_all()
    assert not down.readable and (down.engine, down.model) == (up.engine, up.model)
    assert "404" in down.unreadable_reason or "Not Found" in down.unreadable_reason, down.unreadable_reason
