"""Dashboard render time: the fleet overview for a synthetic fleet of 1,000 nodes x 8 GPUs
served by a real aggregator, and the history explorer over 7 days of one node.

    python bench/dashboard_bench.py                  # 1,000 nodes, 5 runs each
    python bench/dashboard_bench.py --nodes 2000 --runs 3

Setup (not timed): 7 days of 1-minute history for node hist-node (8 GPUs) written to the
embedded store with its 1 m and 1 h roll-ups, then `gpufleet aggregator run` on that store,
then --nodes nodes each stream one 8-GPU report (a quarter with an inference engine).

Timed, medians of --runs:
- the page's script run, server side (Streamlit's AppTest, the dashboard's own code:
  Fleet API calls, pandas frames, the Altair spec), for the overview and for a 7-day
  history query;
- in headless Chromium (Debian's chromium, when installed): from navigation to the heat map
  drawn and the script idle — what a person waits for;
- baseline, same run: the bare Fleet API call behind each page (ListNodes; QueryHistory
  for 7 days), so the ratio shows what the page adds.
Target: the overview under 2 s for 1,000 nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import grpc
from ingest_bench import aggregator_argv, wait_for_file
from loadgen import build_report

from gpufleet.aggregator.auth.tokens import issue_collector_token, new_secrets_file
from gpufleet.aggregator.fleet import rollups
from gpufleet.aggregator.store import EmbeddedStore, Point
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc, ingest_pb2, telemetry_pb2

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
S = 1_000_000_000


def seed_history(data_dir: Path, days: int = 7) -> None:
    store = EmbeddedStore(data_dir / "store.sqlite3", retention_s=14 * 86400, synchronous="OFF")
    now = time.time_ns() // (60 * S) * 60 * S
    start = now - days * 86400 * S
    batch: list[Point] = []
    for i, t in enumerate(range(start, now, 60 * S)):
        for g in range(8):
            fields = {
                "util_gpu_pct": float((i + g * 7) % 100),
                "temp_gpu_c": 50.0 + g,
                "power_w": 400.0 + i % 300,
                "hbm_used_bytes": (40 + g) << 30,
            }
            batch.append(
                Point(
                    "gpu",
                    {
                        "node": "hist-node",
                        "gpu": str(g),
                        "cluster": "bench",
                        "model": "NVIDIA H100 80GB HBM3",
                        "uuid": f"GPU-hist-{g}",
                    },
                    fields,
                    t,
                )
            )
        if len(batch) >= 20_000:
            store.write(batch)
            batch = []
    store.write(batch)
    for tier in rollups.TIERS:
        rollups.compute(store, tier, start, now)
    store.close()


async def seed_fleet(ingest: str, secret: str, nodes: int) -> None:
    """Each node: hello, one 8-GPU report (every fourth with a vLLM replica), ack, close."""

    async def one(channel: grpc.aio.Channel, i: int) -> None:
        node = f"bench-{i:05d}"
        call = channel.stream_stream(
            "/gpufleet.v1.Ingest/Stream",
            request_serializer=ingest_pb2.CollectorMessage.SerializeToString,
            response_deserializer=ingest_pb2.AggregatorMessage.FromString,
        )(metadata=(("authorization", f"Bearer {issue_collector_token(secret, node)[0]}"),))
        await call.write(
            ingest_pb2.CollectorMessage(
                hello=ingest_pb2.Hello(
                    protocol_version=1,
                    node=node,
                    cluster=f"c{i % 4}",
                    boot_id="bench-boot",
                    interval_s=60.0,
                    gpus=[telemetry_pb2.GpuIdentity(index=g) for g in range(8)],
                )
            )
        )
        await call.read()
        msg = build_report(node, 8)
        msg.report.seq, msg.report.time_unix_ns, msg.report.cluster = 1, time.time_ns(), f"c{i % 4}"
        msg.report.interval_s = 60.0
        if i % 4 == 0:
            msg.report.engines.add(
                engine="vllm",
                model="llama",
                port=8000,
                gpu_indices=list(range(8)),
                readable=True,
                kv_cache_usage_ratio=(i % 100) / 100,
                requests_running=4,
                requests_waiting=i % 3,
                preemptions_total=0,
            )
        await call.write(msg)
        answer = await asyncio.wait_for(call.read(), 30)
        if answer.WhichOneof("body") != "ack":
            raise SystemExit(f"{node}: the aggregator answered {answer} instead of an ack")
        await call.done_writing()

    for first in range(0, nodes, 100):  # grpc aio: open streams in batches (see README)
        async with grpc.aio.insecure_channel(ingest) as channel:
            await asyncio.gather(*(one(channel, i) for i in range(first, min(nodes, first + 100))))


def median_s(fn: object, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from streamlit.testing.v1 import AppTest

    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-dash-bench-"))
    secrets = tmp / "secrets.toml"
    tokens = new_secrets_file(secrets, [("bench", "viewer")])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    (tmp / "data").mkdir()
    t0 = time.perf_counter()
    seed_history(tmp / "data")
    print(f"7 days of history for hist-node written in {time.perf_counter() - t0:.0f} s", flush=True)
    ready = tmp / "ready.json"
    with open(tmp / "aggregator.log", "wb") as log:
        agg = subprocess.Popen(
            aggregator_argv(tmp / "data", secrets, ready), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        bound = wait_for_file(ready, agg, 60)
        asyncio.run(seed_fleet(str(bound["ingest"]), secret, args.nodes))
        stub = fleet_pb2_grpc.FleetStub(grpc.insecure_channel(str(bound["fleet"])))
        meta = (("authorization", f"Bearer {tokens['bench']}"),)
        listed = stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=meta).nodes
        print(
            f"{len(listed)} nodes, {sum(len(n.gpus) for n in listed)} GPUs served by the aggregator",
            flush=True,
        )
        os.environ.update(
            {
                "GPUFLEET_FLEET": str(bound["fleet"]),
                "GPUFLEET_TOKEN": tokens["bench"],
                "GPUFLEET_CLIENT_CONFIG": str(tmp / "none.toml"),
            }
        )
        week = fleet_pb2.HistoryRequest(
            metric="util_gpu_pct", nodes=["hist-node"], start_unix_ns=time.time_ns() - 7 * 86400 * S
        )
        base_list = median_s(lambda: stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=meta), args.runs)
        base_week = median_s(lambda: stub.QueryHistory(week, metadata=meta), args.runs)
        points = sum(len(s.values) for s in stub.QueryHistory(week, metadata=meta).series)

        def overview() -> None:
            at = AppTest.from_file(APP, default_timeout=120).run()
            assert not at.exception and at.metric[0].value == str(len(listed)), at.exception

        def history() -> None:
            at = AppTest.from_file(APP, default_timeout=120).run()
            at.sidebar.radio[0].set_value("History explorer").run()
            at.multiselect[0].set_value(["hist-node"])
            t0 = time.perf_counter()
            at.text_input[0].set_value("7d").run()
            history.last_s = time.perf_counter() - t0  # type: ignore[attr-defined]
            assert not at.exception and len(at.dataframe[0].value) == points, at.exception

        overview_s = median_s(overview, args.runs)
        week_runs = []
        for _ in range(args.runs):
            history()
            week_runs.append(history.last_s)  # type: ignore[attr-defined]
        week_s = statistics.median(week_runs)
        browser_s = browser_overview(str(bound["fleet"]), tokens["bench"], args.runs, tmp)
    finally:
        agg.terminate()
        agg.wait(30)
    print(f"\nfleet overview, {len(listed)} nodes x 8 GPUs:")
    print(f"  page script run (AppTest)      {overview_s * 1e3:8.0f} ms   (target < 2,000 ms)")
    if browser_s is not None:
        print(f"  in Chromium, load to drawn     {browser_s * 1e3:8.0f} ms")
    print(
        f"  baseline: ListNodes alone      {base_list * 1e3:8.0f} ms   "
        f"page/baseline {overview_s / base_list:5.1f}x"
    )
    print(f"history explorer, 1 node x 8 GPUs over 7 days ({points} points at the automatic step):")
    print(f"  page script run (AppTest)      {week_s * 1e3:8.0f} ms")
    print(
        f"  baseline: QueryHistory alone   {base_week * 1e3:8.0f} ms   "
        f"page/baseline {week_s / base_week:5.1f}x"
    )
    print(f"medians of {args.runs} runs; files in {tmp}")


def browser_overview(fleet: str, token: str, runs: int, tmp: Path) -> float | None:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    port_file = tmp / "dash.port"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    port_file.write_text(str(port))
    with open(tmp / "dashboard.log", "wb") as log:
        dash = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet.cli.main",
                "dashboard",
                "--port",
                str(port),
                "--fleet",
                fleet,
                "--token",
                token,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium,
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                ],
            )
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            times = []
            for _ in range(runs + 1):  # the first load also starts Streamlit's session: not counted
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}", timeout=120_000)
                page.get_by_text("GPUs in service").first.wait_for(timeout=120_000)
                page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=120_000)
                page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(
                    timeout=120_000
                )
                times.append(time.perf_counter() - t0)
            browser.close()
            return statistics.median(times[1:])
    finally:
        dash.terminate()
        dash.wait(30)


if __name__ == "__main__":
    main()
