"""The peer the ingest is measured against (bench/ingest_bench.py --peer prometheus): a real
Prometheus scraping the same fleet's same values that bench/loadgen.py sends the aggregator.

A static server (this module run with --serve, its own process, its CPU measured apart) answers
/metrics/NODE for every simulated node with the seven values per GPU the load generator's
reports carry (GPU and memory utilization, HBM used and total, temperature, power and its
limit; bench/loadgen.py build_report), labelled as the collector labels them. Prometheus
(Debian's, as the tests install it) scrapes every node at the load's interval, each node its
own target (the node label becomes the target's metrics path). Its CPU is sampled over the
window, and the samples it appended are read from its own counter
(prometheus_tsdb_head_samples_appended_total), less the five it adds per scrape (up,
scrape_duration_seconds, ...): the values it stored.

The responder is asyncio on raw sockets (HTTP/1.1 keep-alive, one precomputed body per node):
http.server costs several times the CPU per answer, which would crowd Prometheus off the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from loadgen import CpuSampler, bench_node

VALUES = (
    ("gpu_utilization_ratio", 0.87),
    ("memory_utilization_ratio", 0.40),
    ("hbm_used_bytes", float(70 << 30)),
    ("hbm_total_bytes", float(80 << 30)),
    ("temperature_celsius", 61.0),
    ("power_watts", 612.5),
    ("power_limit_watts", 700.0),
)
VALUES_PER_GPU = len(VALUES)
MODEL = "NVIDIA H100 80GB HBM3"
PER_SCRAPE_EXTRA = (
    5  # up, scrape_duration_seconds, scrape_samples_scraped, _post_metric_relabeling, _series_added
)


def body(node: str, gpus: int) -> bytes:
    lines = []
    for name, value in VALUES:
        lines.append(f"# TYPE gpufleet_gpu_{name} gauge")
        for i in range(gpus):
            labels = (
                f'node="{node}",cluster="bench",gpu="{i}",uuid="GPU-{node}-{i}",model="NVIDIA H100 80GB HBM3"'
            )
            lines.append(f"gpufleet_gpu_{name}{{{labels}}} {value:g}")
    return ("\n".join(lines) + "\n").encode()


async def serve(port: int, nodes: int, gpus: int, ready: Path) -> None:
    bodies = {f"/metrics/{bench_node(i)}".encode(): body(bench_node(i), gpus) for i in range(nodes)}
    answers = {
        path: b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
        + str(len(b)).encode()
        + b"\r\n\r\n"
        + b
        for path, b in bodies.items()
    }
    missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                writer.write(answers.get(path, missing))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    ready.write_text(json.dumps({"port": bound}))
    async with server:
        await server.serve_forever()


def _appended(url: str) -> float:
    """Prometheus's own count of samples appended (its /metrics: it does not scrape itself here)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    name = "prometheus_tsdb_head_samples_appended_total"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _query(url: str, q: str) -> float:
    data = json.loads(urllib.request.urlopen(f"{url}/api/v1/query?query={q}", timeout=10).read())
    result = data["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def run_peer(
    nodes: int, gpus: int, interval: float, seconds: float, warmup: float = 20.0
) -> dict[str, float]:
    """Prometheus scraping `nodes` static targets for `seconds` after `warmup`: its CPU % (100 = one
    core), the static server's, values stored per second and CPU-seconds per million values."""
    from ingest_bench import wait_for_file  # bench/ is on sys.path when a bench script runs

    exe = shutil.which("prometheus")
    if exe is None:
        raise SystemExit("prometheus is not installed: scripts/install-test-deps.sh installs Debian's")
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-peer-"))
    ready = tmp / "static.ready.json"
    static = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__)),
            "--serve",
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--ready-file",
            str(ready),
        ]
    )
    prom = None
    try:
        port = wait_for_file(ready, static, 60)["port"]
        interval_s = f"{max(1, round(interval * 1000))}ms"
        config = {
            "global": {"scrape_interval": interval_s, "scrape_timeout": interval_s},
            "scrape_configs": [
                {
                    "job_name": "bench",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}"], "labels": {"bench_node": bench_node(i)}}
                        for i in range(nodes)
                    ],
                    "relabel_configs": [
                        {"source_labels": ["bench_node"], "target_label": "__metrics_path__",
                         "replacement": "/metrics/$1"},
                    ],
                }
            ],
        }  # fmt: skip
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = 19090 + (int(time.time()) % 500)
        url = f"http://127.0.0.1:{web}"
        log = open(tmp / "prometheus.log", "ab")  # noqa: SIM115 (closed with the process)
        prom = subprocess.Popen(
            [exe, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{web}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if _query(url, "count(up==1)") >= nodes:
                    break
            except OSError:
                pass
            time.sleep(0.5)  # polling a starting server, not synchronisation of our own code
        else:
            raise SystemExit(f"Prometheus did not scrape {nodes} targets within 60 s (log {tmp})")
        sampler = CpuSampler([prom.pid])
        static_sampler = CpuSampler([static.pid])
        sampler.start()
        static_sampler.start()
        time.sleep(warmup)  # the load's warm-up: the window starts after it
        start_wall, appended_0 = time.time(), _appended(url)
        time.sleep(seconds)  # the measurement window
        end_wall, appended_1 = time.time(), _appended(url)
        scrapes = _query(url, f"sum(count_over_time(up[{int(seconds)}s]))")
        sampler.stop.set()
        static_sampler.stop.set()
        sampler.join()
        static_sampler.join()
        cpu_pct = sampler.cpu_pct(start_wall, end_wall)
        values = max(0.0, appended_1 - appended_0 - PER_SCRAPE_EXTRA * scrapes)
        window = end_wall - start_wall
        return {
            "cpu_pct": cpu_pct,
            "static_cpu_pct": static_sampler.cpu_pct(start_wall, end_wall),
            "values_per_s": values / window,
            "cpu_s_per_million_values": (cpu_pct / 100 * window) / (values / 1e6) if values else float("nan"),
            "peak_rss_mib": sampler.peak_rss_mib(),
        }
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        static.terminate()
        static.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="store_true", help="be the static server (its own process)")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--ready-file", type=Path)
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(0, args.nodes, args.gpus, args.ready_file))
        return
    print(json.dumps(run_peer(args.nodes, args.gpus, args.interval, args.seconds), indent=2))


if __name__ == "__main__":
    main()
