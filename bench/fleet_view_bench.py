"""The fleet view at scale: N nodes x 8 GPUs with two inference engines each, put into a real
aggregator over real gRPC (bench/fleet_loader.py), then read back as every client reads it.

    python bench/fleet_view_bench.py                 # 20,000 nodes
    python bench/fleet_view_bench.py --nodes 5000

Prints the machine, the aggregator's memory per node (baseline: its RSS before any node, in
the same run), the largest ListNodes page against gRPC's default 4 MiB client limit, the time to
read every page through the Fleet API, and `gpufleet nodes --json` end to end."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import grpc
from fleet_loader import load  # bench/ is on sys.path when a bench script runs
from ingest_bench import aggregator_argv, wait_for_file
from loadgen import machine

from gpufleet.aggregator.auth.tokens import new_secrets_file
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=20_000)
    args = p.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        secrets = tmp / "secrets.toml"
        viewer = new_secrets_file(secrets, [("viewer", "viewer")])["viewer"]
        secret = tomllib.loads(secrets.read_text())["collector_secret"]
        ready = tmp / "ready.json"
        log = open(tmp / "aggregator.log", "ab")  # noqa: SIM115 (closed below)
        server = subprocess.Popen(
            aggregator_argv(tmp / "data", secrets, ready), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            bound = wait_for_file(ready, server, 60)
            base_kib = rss_kib(server.pid)
            loaded_s = asyncio.run(load(str(bound["ingest"]), secret, args.nodes))
            after_kib = rss_kib(server.pid)
            stub = fleet_pb2_grpc.FleetStub(grpc.insecure_channel(str(bound["fleet"])))
            meta = (("authorization", f"Bearer {viewer}"),)
            started, token, pages, biggest = time.perf_counter(), "", 0, 0
            while True:
                page = stub.ListNodes(
                    fleet_pb2.ListNodesRequest(page_token=token), metadata=meta, timeout=120
                )
                pages, biggest, token = pages + 1, max(biggest, page.ByteSize()), page.next_page_token
                if not token:
                    break
            listed_s = time.perf_counter() - started
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "gpufleet.cli.main", "nodes", "--json", "--fleet", str(bound["fleet"]),
                 "--token", viewer],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            cli_s = time.perf_counter() - started
            listed = len(json.loads(out.stdout)["nodes"]) if out.returncode == 0 else 0
        finally:
            server.terminate()
            server.wait(60)
            log.close()
    print(f"{args.nodes:,} nodes x 8 GPUs, 2 engines each, loaded in {loaded_s:.1f} s")
    per_node = (after_kib - base_kib) / args.nodes
    print(
        f"aggregator RSS: {base_kib / 1024:.0f} MiB before any node (baseline), "
        f"{after_kib / 1024:.0f} MiB after: {per_node:.1f} KiB per node"
    )
    limit = 4 << 20
    print(
        f"ListNodes: {pages} pages, the largest {biggest / 1024:.0f} KiB "
        f"({biggest / limit:.2f}x the 4 MiB limit)"
    )
    print(f"every page through the Fleet API: {listed_s:.2f} s")
    print(f"`gpufleet nodes --json`: {cli_s:.2f} s, {listed:,} nodes")


if __name__ == "__main__":
    main()
