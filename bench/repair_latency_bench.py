"""Detection latency: from a fault injected at a collector to the cordon call arriving at the
scheduler's API, over the demo's simulated fleet.

    python bench/repair_latency_bench.py                  # 25 nodes x 4 faults = 100
    python bench/repair_latency_bench.py --nodes 50       # 200 faults

Real processes: one `gpufleet aggregator run` with the Kubernetes backend, one `gpufleet
collector run --simulate` per node with a fault scenario (three XIDs, event-driven, and one
uncorrected ECC error, sampled every --interval-s). The scheduler is the Kubernetes API
stand-in from tests/harness/k8s_standin.py, in this process, so the arrival of each cordon PATCH is
timed on the same clock as the collectors' fault logs (ms resolution). After each cordon the
bench uncordons the node through the Fleet API (as an SRE would), so the node's next fault is
timed as well.

Baseline, same run: one cordon PATCH made directly with the official client against the same
stand-in (the floor the backend call itself costs). Targets: XIDs p99 < 1 s; sampled faults
within one sampling interval plus their persistence window (0 s for uncorrected ECC)."""

from __future__ import annotations

import argparse
import datetime as dt
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import grpc
from ingest_bench import aggregator_argv, wait_for_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from k8s_standin import KubeStandin  # noqa: E402  (the stand-in lives with the tests)

from gpufleet.aggregator.auth.tokens import issue_collector_token, new_secrets_file  # noqa: E402
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc  # noqa: E402

FAULTS = [  # (at_s, gpu, kind, xid, sampled)
    (4.0, 0, "xid", 79, False),
    (12.0, 2, "xid", 48, False),
    (20.0, 1, "ecc_uncorrected", 0, True),
    (28.0, 3, "xid", 95, False),
]
_LOG = re.compile(r'ts=(\S+) .*msg="scenario: (\w+) on GPU (\d+)"')


def scenario(path: Path, nodes: list[str], interval_s: float, seed: int = 1) -> Path:
    """One file for every node; each node's faults get a random phase within a sampling
    interval, so a sampled fault waits anywhere from 0 to one interval for its sample."""
    rng = random.Random(seed)
    parts = []
    for node in nodes:
        phase = rng.uniform(0, interval_s)
        for at_s, gpu, kind, xid, _ in FAULTS:
            parts.append(
                f'[[fault]]\nat_s = {at_s + phase:.3f}\nnode = "{node}"\ngpu = {gpu}\nkind = "{kind}"\n'
                + (f"xid = {xid}\n" if xid else "")
            )
    path.write_text("\n".join(parts))
    return path


def parse_ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def baseline_patch_s(kube: KubeStandin, kubeconfig: Path, repeat: int = 50) -> float:
    import kubernetes

    api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))
    kube.add_node("baseline")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        api.patch_node("baseline", {"spec": {"unschedulable": True}})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=25)
    parser.add_argument("--interval-s", type=float, default=1.0, help="collectors' sampling interval")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-repair-bench-"))
    secrets = tmp / "secrets.toml"
    tokens = new_secrets_file(secrets, [("bench", "operator")])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    kube = KubeStandin()
    nodes = [f"bench-node-{i:03d}" for i in range(args.nodes)]
    for node in nodes:
        kube.add_node(node)
    kubeconfig = kube.kubeconfig(tmp / "kubeconfig")
    base_s = baseline_patch_s(kube, kubeconfig)
    kube.requests.clear()

    ready = tmp / "ready.json"
    argv = aggregator_argv(
        tmp / "data",
        secrets,
        ready,
        "--repair-backend",
        "kubernetes",
        "--repair-kubeconfig",
        str(kubeconfig),
        "--repair-max-out-of-service",
        "10000",
        "--repair-max-out-of-service-fraction",
        "1",
        "--repair-breaker-nodes",
        "10000",
        "--repair-interval-s",
        "1",
    )

    def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    procs = [spawn(argv, tmp / "aggregator.log")]
    bound = wait_for_file(ready, procs[0], 60)
    scen = scenario(tmp / "faults.toml", nodes, args.interval_s)
    logs = {}
    try:
        for node in nodes:
            logs[node] = tmp / f"{node}.log"
            procs.append(
                spawn(
                    [
                        sys.executable,
                        "-m",
                        "gpufleet.cli.main",
                        "--log-level",
                        "warning",
                        "collector",
                        "run",
                        "--simulate",
                        "--node",
                        node,
                        "--aggregator",
                        str(bound["ingest"]),
                        "--interval-s",
                        str(args.interval_s),
                        "--metrics-listen",
                        "",
                        "--sim-scenario",
                        str(scen),
                    ],
                    logs[node],
                    {
                        "GPUFLEET_COLLECTOR_TOKEN": issue_collector_token(secret, node)[0],
                        "PATH": "/usr/bin:/bin",
                    },
                )
            )
        stub = fleet_pb2_grpc.FleetStub(grpc.insecure_channel(str(bound["fleet"])))
        meta = (("authorization", f"Bearer {tokens['bench']}"),)
        expected = len(nodes) * len(FAULTS)
        cordons: list[tuple[str, float]] = []  # (node, arrival time)
        seen = 0
        deadline = time.time() + FAULTS[-1][0] + 90
        print(f"{len(nodes)} collectors, {expected} faults; waiting for the cordons ...", flush=True)
        while len(cordons) < expected and time.time() < deadline:
            with kube.lock:
                new = kube.requests[seen:]
                seen = len(kube.requests)
            for r in new:
                body = r["body"] or {}
                if r["verb"] == "PATCH" and body.get("spec", {}).get("unschedulable") is True:
                    node = r["path"].rsplit("/", 1)[-1]
                    cordons.append((node, r["time"]))
                    # The SRE looks and returns it, so its next fault is timed too.
                    stub.Uncordon(
                        fleet_pb2.CordonRequest(node=node, reason="bench: next fault"), metadata=meta
                    )
            time.sleep(0.02)  # polling the stand-in's request log, not synchronisation
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)
        kube.close()

    event_s, sampled_s, missing = [], [], 0
    for node in nodes:
        injected = [(parse_ts(m.group(1)), m.group(2)) for m in _LOG.finditer(logs[node].read_text())]
        arrivals = sorted(t for n, t in cordons if n == node)
        for at, kind in injected:
            after = [t for t in arrivals if t >= at - 0.002]
            if not after:
                missing += 1
                continue
            arrivals.remove(after[0])
            (sampled_s if kind != "xid" else event_s).append(after[0] - at)
    print(
        f"\nfaults injected: {len(event_s) + len(sampled_s) + missing}, cordons timed: "
        f"{len(event_s) + len(sampled_s)}, without a cordon: {missing}"
    )
    print(f"baseline: one cordon PATCH through the official client: {base_s * 1e3:.1f} ms (median of 50)")
    for name, values, target in (
        ("event-driven (XID)", event_s, "p99 < 1 s"),
        ("sampled (uncorrected ECC)", sampled_s, f"within {args.interval_s:g} s interval + 0 s window"),
    ):
        if values:
            p50, p99 = statistics.median(values), pct(values, 0.99)
            print(
                f"{name:28s} n={len(values):3d}  p50 {p50 * 1e3:7.1f} ms  p99 {p99 * 1e3:7.1f} ms  "
                f"max {max(values) * 1e3:7.1f} ms  p50/baseline {p50 / base_s:5.1f}x  (target {target})"
            )
    print(f"logs in {tmp}")


if __name__ == "__main__":
    main()
